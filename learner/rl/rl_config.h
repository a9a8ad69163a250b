// The RL learner's configuration (`mode: rl`, configs/rl/*.yaml), read strictly: an unknown key
// is an error naming the file, line and dotted key. docs/rl_learner.md describes every key; the
// defaults are those of the structs below. No LibTorch here, so configs are checked without it.
#pragma once

#include <cstdint>
#include <string>

#include "common/model/config.h"
#include "common/status.h"
#include "common/transport/auth.h"
#include "learner/rl/objective_config.h"
#include "learner/rl/scoring_options.h"
#include "learner/trainer_config.h"
#include "reward/shaping.h"

namespace strider::rl {

struct RlReplayConfig {
  std::string endpoint = "tcp://127.0.0.1:5556";  // the server's learner endpoint (--replay wins)
  std::string table;                              // empty: the server's first table
  std::string learner_id = "learner-0";           // the server keys durable sample steps by it
  // Units (groups, or trajectories in a trajectory table) per learner step.
  int64_t units_per_step = 4;
  // How long one step waits for the table to become ready before the learner gives up (the
  // actors are gone or too slow): an error naming the server's reason.
  double sample_timeout_s = 600;
  // CURVE to the replay server (`replay.auth`, docs/fleet.md): this learner's key pair and the
  // server's public key; empty: none.
  transport::ClientAuth auth;
};

struct RlPublishConfig {
  // A WeightPublisher endpoint the actors' `weights.endpoint` names (--publish wins); empty:
  // nothing is published (an offline learner).
  std::string endpoint = "tcp://127.0.0.1:5557";
  int64_t every_steps = 1;  // publish after every N-th update
  int64_t chunk_bytes = 1 << 20;
  int64_t keep_versions = 2;
  // CURVE on the publisher (`publish.auth`): its key pair and the actors let in; without keys a
  // non-loopback endpoint needs insecure: true.
  transport::ServerAuth auth;
};

struct RlTrainConfig {
  int64_t steps = 100;       // learner steps (each: one sampled batch, its epochs and updates)
  int64_t ppo_epochs = 1;    // passes over each sampled batch
  int64_t minibatches = 1;   // optimiser updates per epoch (the batch's trajectories split)
  // Positions per Model::Append in the scoring and update passes.
  int64_t chunk_tokens = ScoringOptions().chunk_tokens;
  // full: the update backpropagates through the state carried across chunks (exact gradient,
  // memory grows with the trajectory); truncated: backward per chunk, the state detached at
  // chunk boundaries (memory bounded by the chunk).
  std::string backprop = "truncated";
  // Rollout and training take turns: the learner asks for trajectories of its newest published
  // version only, and publishes after every update. Needs a table with max_staleness: 0 and
  // actors with weight_stream.sync (docs/rl_learner.md).
  bool sync = false;
  int64_t warmup_steps = 0;          // optimiser updates of linear warm-up
  double min_learning_rate_ratio = 1.0;  // cosine decay to this ratio over the run (1: constant)
};

// `scoring:`: replay_routing and mismatch_threshold are the scoring pass's own options, read
// into them; the learner sets the rest (chunk_tokens from train, values, rounds).
struct RlScoringConfig : ScoringOptions {
  // The reference policy of the KL penalty and of implicit process rewards: "initial" (the
  // weights the run started from), a safetensors file, or "none".
  std::string reference = "initial";
};

// Data-parallel learner ranks (learner/distributed.h, docs/fleet.md): world_size processes with
// one config, each told its rank (`--rank`), meeting at rank 0's TCPStore (`--rendezvous`);
// the command-line flags win over these keys.
struct RlDistributedConfig {
  int64_t world_size = 1;
  int64_t rank = 0;
  std::string rendezvous = "127.0.0.1:29500";  // HOST:PORT rank 0 listens on
  // The network interface Gloo's connections use (eth0, ib0); empty: the address of this
  // host's name, or loopback when the rendezvous host is a loopback address.
  std::string interface;
  double timeout_s = 120;  // rendezvous, and any one collective: a lost rank's bound
  double bucket_mb = 25;  // gradients all-reduced in buckets of about this size (MiB)
  // Shard every sparse layer's routed experts over the ranks (common/model/expert_parallel.h):
  // rank r trains experts [r n/W, (r+1) n/W); the rest stays replicated and data-parallel.
  bool expert_parallel = false;
  // Which process groups carry the gradient all-reduce and the expert all-to-all of a learner
  // on a GPU: auto (NCCL on CUDA, Gloo on the CPU), nccl, or gloo. NCCL refuses two ranks on one
  // device, so ranks sharing a GPU take gloo, which moves their CUDA tensors through host memory.
  std::string collectives = "auto";
};

// `implicit_prm:`: PRIME's implicit process reward model (learner/rl/implicit_prm.h), a model of
// its own trained online on the outcomes, used when objective.advantages.estimator is
// implicit_process or reward.implicit_weight is not 0.
struct ImplicitPrmConfig {
  // The scale of the log-ratio to the reference, in the cross-entropy loss and in the process
  // reward alike (PRIME's beta_train).
  double beta = 0.05;
  // The weights pi_phi starts from: empty for the policy's own starting weights (`init`, or the
  // fresh model of init_seed), else a safetensors file (a checkpoint's model.safetensors).
  std::string init;
  // batch: every token reward divided by the largest |return| (sum of the rewards from a token
  // to the end of its trajectory) in the step's batch, as PRIME's recipe does (prime_norm:
  // batch_norm); none: as they are.
  std::string normalize = "batch";
  // Its own AdamW (`implicit_prm.optimizer:`), a constant rate. PRIME's: 1e-6, no weight decay,
  // clipping at 1.
  AdamWOptions optimizer = {.learning_rate = 1e-6, .weight_decay = 0.0, .clip_norm = 1.0};
};

struct RlLearnerConfig {
  std::string origin;             // the file it came from
  std::string model_config_path;  // resolved
  ModelConfig model;
  // The weights the run starts from: a safetensors file, or empty for a fresh model from
  // init_seed (the actors' model_seed, so both sides start from the same weights).
  std::string init;
  int64_t init_seed = 0;
  int64_t threads = 0;  // 0: the model config's
  // `seed` (mini-batch order), `optimizer:`, and `balance:` (enabled: routing balance of the
  // router biases from each update's routing; router_learning_rate_scale).
  TrainerConfig trainer;
  RlReplayConfig replay;
  RlPublishConfig publish;
  RlTrainConfig train;
  RlScoringConfig scoring;
  ObjectiveConfig objective;
  reward::ShapingConfig reward;
  // reward.process_model: a checkpoint directory of `strider reward train-prm`, whose step
  // scores are the learned process rewards (required when reward.process_model_weight != 0).
  std::string process_model;
  ImplicitPrmConfig implicit_prm;
  int64_t checkpoint_every_steps = 0;  // 0: only at exit
  RlDistributedConfig distributed;
};

struct Rendezvous {
  std::string host;  // without brackets for IPv6
  uint16_t port = 0;
};
// HOST:PORT ([::1]:PORT for IPv6), the port in [1, 65535].
Result<Rendezvous> ParseRendezvous(const std::string& text);

// Whether the run scores implicit process rewards (and so trains an implicit PRM).
bool UsesImplicitRewards(const RlLearnerConfig& config);

// Reads a `mode: rl` learner config. Paths (model_config, init, scoring.reference) are resolved
// against the working directory, then the config file's directory and its parents.
Result<RlLearnerConfig> LoadRlLearnerConfig(const std::string& path);

}  // namespace strider::rl
