// The actor service (docs/design.md#processes-and-data-flow, #trajectories-and-segments): plays
// episodes against environments, decodes every live episode's model turns through one rollout
// engine, and streams the trajectories to the replay server as segments.
//
//   main thread (decode loop)                           other threads
//   ────────────────────────────────────────────        ─────────────────────────────────────
//   start groups of G episodes (B live at most)  ─────> env Reset / Step (one thread per call,
//   Engine::Step() for all of them at once              with a time limit; a late or failed
//   turn ended: decode its tokens, parse the call ────>  call ends that episode, no other)
//   env answered: tokenize the observation once,
//     Append it, generate the next turn
//   episode over: last segment, release            ──> sender: replay server / spill directory
//   new weights arrived: SwapWeights between steps <──  weight subscriber: fetch, check, load
//     (synchronous rounds: only once a round's episodes have all ended)
//
// Token in, token out: the trajectory is exactly the ids the engine was fed and sampled; the
// actor appends tokenized environment text and never re-renders the conversation.
//
// Conversation format (the one pretraining teaches, learner/pretrain/data/generators.cc ToolUse):
//   <|begin_of_text|><|system|>description + tool list<|end_of_turn|><|user|>task<|end_of_turn|>
//   <|model|>[sampled: text<|tool_call|>calc(..)<|tool_call_end|><|end_of_turn|>]
//   <|tool_result|>87<|end_of_turn|><|model|>[sampled ...]
// Tokens the actor writes (observations and the <|model|> header that opens each turn) are
// context; sampled tokens are actions, role tool_call from <|tool_call|> to <|tool_call_end|>.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stop_token>
#include <string>

#include "common/model/precision.h"
#include "common/status.h"
#include "common/transport/auth.h"
#include "envs/environment.h"
#include "rollout_engine/sampling.h"

namespace strider {
class Model;  // common/model/model.h
}  // namespace strider

namespace strider::rollout {
struct EngineOptions;  // rollout_engine/engine.h
}  // namespace strider::rollout

namespace strider::actors {

// Which stream of environment seeds an actor's groups reset with. The two never share a seed:
// training seeds have the top bit clear, evaluation seeds have it set (TrainingSeed,
// EvaluationSeed), so a held-out evaluation never plays a seed an actor trains on, whatever
// seeds either was given.
enum class SeedStream { kTraining, kEvaluation };

inline constexpr uint64_t kEvalSeedDomain = 0x6576616c2d686f6cull;  // "eval-hol"
// Group g of an actor with `seed` resets its environments with DeriveSeed(seed, g), top bit clear.
uint64_t TrainingSeed(uint64_t seed, int64_t group);
// Problem i of an evaluation with `seed`: DeriveSeed(DeriveSeed(kEvalSeedDomain, seed), i), top
// bit set.
uint64_t EvaluationSeed(uint64_t seed, int64_t problem);

// One finished episode, as an in-process episode sink sees it (ActorOptions::episode_sink).
struct EpisodeSummary {
  int64_t index = 0;   // episode index in the run, from 0
  int64_t group = 0;   // group index in the run, from 0 (the problem: members share its seed)
  int64_t member = 0;  // index within the group
  uint64_t seed = 0;   // the environment's reset seed
  // How it ended: "done" (by the environment), "max_turns", "max_tokens", "env_timeout",
  // "env_error", "env_reset", "engine", "bad_image", "stopped", ... (docs/actors.md).
  std::string status;
  std::string error;           // the message of a status other than done
  double outcome_reward = 0;   // the environment's outcome reward when done, else 0
  double step_reward_sum = 0;  // the environment's per-turn rewards, summed
  int64_t turns = 0;           // model turns
  int64_t tokens = 0;          // trajectory length: context and sampled tokens
  int64_t generated_tokens = 0;
  // The sampled tokens chained in order (DeriveSeed): equal digests mean, short of a 64-bit
  // collision, the same actions, so two runs can be compared without their trajectories.
  uint64_t action_digest = 0;
  int64_t tool_calls = 0;
  int64_t malformed_tool_calls = 0;
  uint64_t policy_version = 0;  // the engine's version when the episode ended
  // The episode as text, in order: the first observation, then each model turn (as sampled,
  // without its closing marker) followed by the observation it got back. Filled only for an
  // episode sink, so streaming actors do not pay for it.
  std::vector<std::string> exchange;
};
// Called on the thread running Actor::Run once per finished episode; must not call the actor.
using EpisodeSink = std::function<void(const EpisodeSummary&)>;

struct ActorOptions {
  std::string actor_id = "actor";  // replay client id, metrics and episode metadata

  // --- Model ---
  std::string model_config;     // path of a model config (configs/model/tiny.yaml); required
  std::string weights;          // safetensors from `strider model init` or a learner; empty:
  uint64_t model_seed = 0;      //   random initialisation with this seed
  // Weights already loaded for model_config (fetched from a publisher); when set, wins over
  // weights and model_seed.
  std::shared_ptr<const Model> model;
  uint64_t policy_version = 0;  // version of the initial weights
  int64_t threads = 0;          // LibTorch intra-op threads (0: all cores)
  // cpu, cuda or cuda:N for the weights, the engine's cache and sampling; empty: the model
  // config's device:. Several actors and a learner may share one GPU.
  std::string device;
  // float32, or bfloat16: the weights (the initial ones and every published version) are held
  // and computed with in bf16 (common/model/precision.h); the latent cache keeps the model
  // config's cache_dtype. A `model` handed in is used as it is.
  Precision precision = Precision::kFloat32;

  // --- Episodes ---
  envs::EnvironmentConfig env;
  int64_t episodes_in_flight = 8;     // B: live episodes decoded together
  int64_t group_size = 1;             // G: episodes sharing a prompt (engine fork); divides B
  int64_t episodes = 0;               // episodes to run, then stop; 0: until stopped
  int64_t max_turns = 0;              // model turns per episode; 0: the environment's limit
  int64_t max_episode_tokens = 8192;  // an episode that would grow past this ends (truncated)
  uint64_t seed = 0;                  // group g resets its environments with a seed from (seed, g)
  SeedStream seed_stream = SeedStream::kTraining;
  rollout::SamplingParams sampling;   // per turn; stop tokens are set by the actor

  // --- Engine ---
  int64_t cache_budget_bytes = int64_t{256} << 20;
  // > 0: the engine's page pool takes at most this, whatever cache_budget_bytes says: a fleet's
  // share of a GPU the actor shares (`--cache-budget-mb`, the fleet file's gpu_budget).
  int64_t cache_budget_cap_bytes = 0;
  int64_t block_tokens = 256;
  int64_t max_batch = 64;
  int64_t prefill_chunk_tokens = 4096;
  // An observation longer than this is fed over several engine steps, its segments cut and
  // sent as its routing comes back (EngineOptions::prefill_tokens_per_step; 0: one step).
  int64_t prefill_tokens_per_step = 65536;

  // --- Segments and streaming ---
  // Exactly one of replay_endpoint and episode_sink. With a sink the actor plays in-process
  // (evaluation): each finished episode is summarised to the sink and no segment leaves the
  // process, so the replay and spill fields are unused.
  EpisodeSink episode_sink;
  int64_t segment_tokens = 4096;
  std::string replay_endpoint;  // required unless episode_sink
  std::string table;            // empty: the server's first table
  std::string spill_dir;        // required with replay_endpoint: segments wait here while the
                                // server is away
  int64_t spill_max_bytes = int64_t{1} << 30;
  int64_t spill_after_ms = 3000;                     // no progress from the server this long: spill
  int64_t send_queue_max_bytes = int64_t{64} << 20;  // over this, no new episodes start
  // CURVE to the replay server (`replay.auth`): this actor's key pair and the server's public
  // key; empty: none. A refused key is logged and its segments wait in the spill directory.
  transport::ClientAuth replay_auth;

  // --- Weights ---
  std::string weights_endpoint;  // a WeightPublisher; empty: keep the initial weights
  int64_t weights_poll_ms = 1000;
  transport::ClientAuth weights_auth;  // `weight_stream.auth`: as replay_auth, for the publisher
  // Synchronous on-policy rounds (a learner with max_staleness 0 takes turns with the actors):
  // a round is `round_groups` groups started under one policy version; once all of them have
  // ended the actor starts nothing until a newer version has arrived, and it swaps weights only
  // there, so no episode of a round sees two versions. Needs weights_endpoint. Off: weights are
  // swapped in between engine steps as they come (the asynchronous default).
  bool weights_sync = false;
  int64_t round_groups = 0;  // with weights_sync; 0: episodes_in_flight / group_size

  // --- Metrics ---
  std::string metrics_path;  // JSON lines; empty: log only
  double metrics_interval_s = 5;
  bool progress = true;  // a one-line progress display when stderr is a terminal
};

// Reads `actor:` and `env:` of a YAML file strictly (unknown keys and wrong types are errors
// naming the file, line and key); docs/actors.md lists the keys. Ranges and required values are
// checked by ValidateActorOptions (Actor::Create calls it), after any overrides.
Result<ActorOptions> LoadActorConfig(const std::string& path);
Status ValidateActorOptions(const ActorOptions& options);

// The engine an actor runs on these options: the memory and performance fields as given, room
// for every live episode and its forks, queued admission (an episode whose turn does not fit
// the cache waits for others to end) and routing records. Tools that measure the engine under
// an actor's load (bench/actor_bench.cc) build theirs from the same options with it. Callers
// include rollout_engine/engine.h for the definition of EngineOptions.
rollout::EngineOptions EngineOptionsFor(const ActorOptions& options);

struct ActorMetrics {
  double elapsed_s = 0;
  int64_t episodes_started = 0;
  int64_t episodes_finished = 0;  // ended in any way, segments handed to the sender
  int64_t episodes_ok = 0;        // ended by the environment (done)
  int64_t turns = 0;
  int64_t generated_tokens = 0;  // sampled by the model
  int64_t context_tokens = 0;    // written by the actor
  int64_t tool_calls = 0;
  int64_t malformed_tool_calls = 0;
  std::map<std::string, int64_t> errors;  // episode endings other than done, by kind
  int64_t segments = 0;                   // handed to the sender
  uint64_t policy_version = 0;
  int64_t weight_updates = 0;
  // Synchronous rounds only (shown when `sync`): the round playing or last played (from 1), and
  // the time spent with every episode of a round ended, waiting for newer weights.
  bool sync = false;
  int64_t round = 0;
  double weights_wait_s = 0;
  bool waiting_for_weights = false;
  int64_t engine_steps = 0;           // Engine::Step calls
  double engine_step_seconds = 0;     // time inside them (the rest is the actor's own)
  // The same time split by what a step did: a step that fed any appended tokens (a prompt,
  // a tool result, an observation; chunked at prefill_chunk_tokens) counts as prefill, even
  // when it also sampled; a step that only sampled counts as decode.
  int64_t prefill_steps = 0;
  double prefill_step_seconds = 0;
  double decode_step_seconds = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  // Time inside environment calls (making, Reset, Step), summed over calls. They run on their
  // own threads, so with several in flight this can exceed elapsed_s.
  double env_call_seconds = 0;
  // Queue depths now.
  int64_t live_episodes = 0;
  int64_t env_calls_running = 0;
  int64_t engine_sequences = 0;
  uint64_t send_queue_segments = 0;
  uint64_t send_queue_bytes = 0;
  uint64_t in_flight_segments = 0;
  uint64_t acked_segments = 0;
  uint64_t refused_segments = 0;  // refused by the server for good (logged each time)
  uint64_t spill_files = 0;
  uint64_t spill_bytes = 0;
  bool replay_connected = false;

  std::string ToJson() const;  // one line
};

class Actor {
 public:
  // Loads the model and environment config, starts the sender (none with an episode sink) and
  // the weight subscriber. Nothing is played until Run.
  static Result<std::unique_ptr<Actor>> Create(const ActorOptions& options);
  virtual ~Actor() = default;
  // Plays episodes until `episodes` have finished or `stop` is requested (live episodes then end
  // with status "stopped" and are sent as they are), then waits for the replay server to
  // acknowledge everything (what it does not take in time stays in the spill directory).
  // Errors: the model or engine failing as a whole; episode-level failures are metrics.
  virtual Status Run(std::stop_token stop) = 0;
  // Thread-safe snapshot.
  virtual ActorMetrics metrics() const = 0;
};

}  // namespace strider::actors
