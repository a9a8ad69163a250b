// The learner component: what every training mode (pretraining, RL) shares. Start reading here.
//
//   Trainer       one model under training: AdamW with gradient clipping and a learning-rate
//                 schedule, the router learning-rate scale, quantile routing balance and MaxVio,
//                 a seeded random generator, checkpoints and progress lines. A mode owns one (or
//                 one per stage) and decides what a step's batch and loss are.
//   RunChunkedPass
//                 one pass over a batch of equal-length sequences, chunk by chunk along the
//                 inference path (Model::Append, the rollout engine's path) or in one chunk along
//                 the training path (Model::Forward, equal to it by the model's two-path
//                 contract). It starts from a given state, can force each position's experts
//                 (routing replay), hands each chunk's logits (and value-head outputs or final
//                 hidden states) to an objective callback and backpropagates the loss the
//                 callback returns, with the graph cut at chunk boundaries or kept whole.
//
// Modes live beside this header: learner/pretrain/ (stages, data, retrieval evaluation) and
// learner/rl/ (advantages and policy losses). Checkpoints: learner/checkpoint.h; the
// next-token loss on the chunked pass: learner/language_model_loss.h. docs/learner.md has the
// design and the checkpoint format.
//
// Threads: a Trainer, its Model and its generator belong to one training thread; none of its
// methods may run concurrently, nor may anything else run the model while ZeroGrad, Step or
// BalanceRouting update it (model.h). RunChunkedPass only reads the model (the gradients it
// accumulates are written to the parameters' .grad, so two passes that backpropagate must not
// run at once either).
//
// Errors: Status/Result; LibTorch exceptions are caught here and returned with context.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/model/model.h"
#include "common/status.h"
#include "learner/checkpoint.h"
#include "learner/optimizer.h"
#include "learner/progress.h"
#include "learner/trainer_config.h"

namespace strider {

// ---------------------------------------------------------------------------------------------
// Trainer
// ---------------------------------------------------------------------------------------------

// Linear warm-up to `peak` over `warmup_steps`, then cosine decay to `min_ratio` of it at
// `total_steps`.
struct LearningRateSchedule {
  double peak = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_ratio = 0.1;

  double At(int64_t step) const;  // the rate of step `step` (0-based)
};

// Where a Trainer's model starts when it has no checkpoint to resume, and which of its experts
// it trains.
struct TrainerStart {
  // Start from these weights (a safetensors file, e.g. `strider model init`'s or a checkpoint's
  // model.safetensors) instead of a fresh model, with a fresh optimiser and generator.
  std::string initial_weights;
  // Without initial weights: the seed of the fresh model's initialisation when it must differ
  // from TrainerConfig::seed (an RL learner starts from the weights its actors were given by
  // their model_seed). Negative: that seed.
  int64_t init_seed = -1;
  // Expert parallelism: this rank trains only its shard of every sparse layer's routed experts
  // (Model::ShardExperts). A checkpoint of a shard resumes as that shard.
  int64_t expert_rank = 0;
  int64_t expert_world_size = 1;
};

// Everything a Trainer is created with: the config's settings (trainer_config.h), where the
// model starts, and the learning-rate schedule.
struct TrainerOptions : TrainerConfig, TrainerStart {
  LearningRateSchedule schedule;
};

// The one place TrainerOptions are put together (pretraining per stage, the RL learner, the
// benchmarks): a run's config settings, the schedule of the run or stage, and where it starts.
TrainerOptions MakeTrainerOptions(const TrainerConfig& config,
                                  const LearningRateSchedule& schedule,
                                  const TrainerStart& start = {});

// What one optimiser step did.
struct TrainerStep {
  double learning_rate = 0;
  double gradient_norm = 0;  // before clipping; NaN when it was not finite
  bool applied = true;       // false: a non-finite gradient, the parameters were left unchanged
};

class Trainer {
 public:
  // A Trainer for `config`: a fresh model from options.seed when `checkpoint` is empty, else
  // the checkpoint directory's weights, with its optimiser state and generator state when it
  // holds them (a weights-only checkpoint starts both afresh). The model's parameters require
  // gradients. The checkpoint's model name must be the config's.
  static Result<std::unique_ptr<Trainer>> Create(const ModelConfig& config,
                                                 const TrainerOptions& options,
                                                 const std::string& checkpoint = "");

  // Owned by the Trainer; the references stay valid for its lifetime. model() holds the weights
  // the optimiser updates, saves and publishes (fp32, the masters, in either precision).
  Model& model() { return *model_; }
  const Model& model() const { return *model_; }
  // What the passes run: model() in float32; in bfloat16 a bf16 copy of it, refreshed after
  // every update (SyncComputeWeights), whose gradients reach model()'s .grad in fp32 as
  // backward produces them (so chunks and mini-batches accumulate in fp32).
  Model& compute_model() { return compute_ ? *compute_ : *model_; }
  // After anything but Step, FitRoutingBalance and BalanceRouting (which do it themselves)
  // wrote model()'s weights: copies them into the compute model, on the device.
  Status SyncComputeWeights();
  AdamW& optimizer() { return *optimizer_; }
  // The mode's source of randomness (mini-batch order, sampling), saved with checkpoints so a
  // resumed run draws what an uninterrupted one would.
  at::Generator& generator() { return generator_; }

  void ZeroGrad();
  // Clips the accumulated gradients and applies one AdamW update at schedule.At(step). A
  // non-finite gradient norm skips the update and is reported in the result, not as an error.
  Result<TrainerStep> Step(int64_t step);

  // Fits the router biases to a record made under the current weights (the balance prepass):
  // `sweeps` quantile updates, each continuing from the last.
  Status FitRoutingBalance(const RoutingRecord& record, int64_t sweeps);
  // The MaxVio (largest over sparse layers) of the record's expert choices; with balance on and
  // no prepass, also one quantile update of the biases from the window of the latest records.
  // The record should hold real tokens only (RealTokenRouting).
  Result<double> BalanceRouting(RoutingRecord record);

  // Writes the model, the optimiser state, `extra`'s files and `state`, with state.rng_state set
  // to the generator's state (checkpoint.h: atomic, previous-or-new).
  Status WriteCheckpoint(const std::string& directory, CheckpointState state,
                         const CheckpointExtra& extra = {});

  // Writes a progress line (and redraws the bar) for a step that trained `tokens` tokens:
  // learning rate, gradient norm and MaxVio of the latest Step and BalanceRouting, tokens per
  // second since the Trainer was created. The mode fills the rest of `fields`.
  void Report(Progress* progress, ProgressFields fields, int64_t tokens);

  ~Trainer();

 private:
  Trainer() = default;
  Status MakeComputeModel();

  TrainerOptions options_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Model> compute_;  // bfloat16 only
  std::unique_ptr<AdamW> optimizer_;
  at::Generator generator_;
  std::deque<RoutingRecord> balance_window_;
  TrainerStep last_step_;
  double last_violation_ = -1;
  int64_t tokens_ = 0;
  Clock::time_point started_;
};

// The record restricted to positions whose token is not padding, as one row (1, N, .). Padding
// fills the ends of packed or batched sequences and piles onto whichever experts its identical
// inputs prefer, so balancing on it tunes the biases to something inference never sees.
Result<RoutingRecord> RealTokenRouting(const RoutingRecord& record, const at::Tensor& tokens);
// The same for positions given by a mask of `record`'s (B, L): where padding is known by
// position rather than by id (a model's own vocabulary has an ordinary token at the byte
// format's padding id).
Result<RoutingRecord> RoutingAtPositions(const RoutingRecord& record, const at::Tensor& real);

// ---------------------------------------------------------------------------------------------
// Chunked pass
// ---------------------------------------------------------------------------------------------

enum class TrainingPath { kTraining, kInference };

// Expert-parallel ranks exchange routed tokens inside every model call (common/model/
// expert_parallel.h), so their calls must pair up: the same model, both recording a graph or
// neither, the same number of calls. Each call is a round the ranks agree on first; a rank
// whose next call is of another kind, or that has none left, serves the others' round
// (Model::ServeExperts) and asks again. LearnerGroup::ExpertRounds (learner/distributed.h)
// implements it over the group's process group.
class ChunkRounds {
 public:
  virtual ~ChunkRounds() = default;
  virtual model::ExpertExchange& exchange() = 0;
  // Before a chunk's model call: returns once the group's round is this call's kind (`model`,
  // `record`), having served the rounds of other kinds before it.
  virtual Status Enter(const Model& model, bool record) = 0;
  // With no calls left in this phase: serves rounds until every rank is out of calls too. Call
  // it before any other collective of the group.
  virtual Status Drain() = 0;
};

struct ChunkedPassOptions {
  // kInference: Model::Append `chunk_tokens` at a time carrying the state forward; kTraining:
  // one Model::Forward over the whole sequences (one chunk; no initial state).
  TrainingPath path = TrainingPath::kInference;
  int64_t chunk_tokens = 512;
  // Backpropagate the loss the objective returns (into the parameters' .grad). Without it no
  // graph is recorded.
  bool backward = true;
  // kInference with backward: run backward after every chunk and detach the state passed to
  // the next (memory bounded by the chunk, gradients stop at chunk boundaries); otherwise the
  // chunks' losses are summed and backpropagated once through the whole carried state.
  bool truncated = false;
  bool record_routing = false;  // ChunkedPassResult::routing, with router scores
  // Record every n-th position only (positions p with p % n == 0): a routing balance over a
  // long trajectory needs a sample of its positions, not all of them, and a record of every
  // position would grow with the length.
  int64_t record_routing_stride = 1;
  bool values = false;          // ChunkView::values (the model's value head)
  bool hidden = false;          // ChunkView::hidden (final normed hidden states)
  // Experts to force at every position, a record over the whole sequences (B, L, k) per sparse
  // layer; each chunk gets its slice. Borrowed for the call.
  const RoutingRecord* replay_routing = nullptr;
  // kInference: start after the tokens this state has seen (a copy is used; the caller's is
  // left as it is), e.g. the prefix of a trajectory scored earlier. Null: an empty state.
  const InferenceState* initial_state = nullptr;
  bool keep_final_state = false;  // ChunkedPassResult::final_state (detached)
  // kInference with backward and truncated: whether the chunk [begin, begin + count) can give
  // a loss. A chunk that cannot (an RL trajectory's context: a prompt, a document, a tool
  // result) only carries the state forward, and with gradients stopping at chunk boundaries
  // nothing of it would reach a parameter, so it runs without recording a graph; the objective
  // still sees it. Unset: every chunk records.
  std::function<bool(int64_t begin, int64_t count)> chunk_has_loss;
  // Called once, just before the pass's last backward (no later chunk can add a gradient), with
  // the loss it backpropagates: a data-parallel learner starts reducing each gradient bucket
  // as soon as it is complete.
  std::function<void(const at::Tensor& loss)> before_last_backward;
  // Expert-parallel ranks: every chunk's call is a round of these (above), and the model's
  // sparse layers exchange tokens over its exchange.
  ChunkRounds* rounds = nullptr;
  // kInference: positions (ascending) fed in a call of their own, the runs between them in
  // chunks: the tokens an actor sampled, which its engine fed one decode step each. The
  // one-token forms (the recurrent delta rule, the decode attention kernel) and the chunked
  // ones are the same function rounded differently, so a pass that should reproduce the
  // actor's log-probs feeds each token the way the actor did (docs/rl_learner.md). Borrowed.
  const std::vector<int64_t>* fed_alone = nullptr;
};

// What the objective sees of one chunk. Positions are those of the input's sequences.
struct ChunkView {
  int64_t begin = 0;  // first position of the chunk
  int64_t count = 0;  // positions in the chunk
  at::Tensor logits;  // (B, count, V), in the graph when the pass backpropagates
  at::Tensor values;  // (B, count) when asked for
  at::Tensor hidden;  // (B, count, D) when asked for
};

// Returns the chunk's loss (a scalar) to backpropagate, or an undefined tensor when the chunk
// adds nothing. The callback computes its own log-probabilities from the logits: next-token
// log_softmax for the language model, the sampler's distribution for a policy ratio. An error
// ends the pass and is returned.
using ChunkObjective = std::function<Result<at::Tensor>(const ChunkView& chunk)>;

struct ChunkedPassResult {
  RoutingRecord routing;       // (B, L, .) when recorded
  InferenceState final_state;  // when kept
  // One chunk's activations: the most the tensor pool held in live tensors during a chunk that
  // recorded a graph (its forward, objective and backward), beyond what was live when the chunk
  // began (the cache, the state, the caller's data). The largest over the pass's recording
  // chunks; 0 without the pool (tensor_pool.h) or a graph.
  int64_t chunk_activation_bytes = 0;
};

// Runs the model over `input` (tokens (B, L) and their images) and calls `objective` once per
// chunk, in order. The model embeds an image in one call, so a chunk boundary that would cut an
// image's placeholders moves to the image's start (or, for an image longer than a chunk, to its
// end); images of several rows that no boundary clears are refused.
Result<ChunkedPassResult> RunChunkedPass(const Model& model, const ModelInput& input,
                                         const ChunkedPassOptions& options,
                                         const ChunkObjective& objective);

}  // namespace strider
