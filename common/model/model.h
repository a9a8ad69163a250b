// The Strider model: a hybrid sparse MoE transformer with two paths over one set of layers.
//
//   Forward  (training path): whole sequences at once, chunkwise incremental attention, explicit
//                             latent attention; differentiable.
//   Append   (inference path): appends one or many tokens to a per-sequence InferenceState
//                             (recurrent states, conv tails, compressed latent cache).
//
// Contract, tested per layer and for the whole model: with the same weights and tokens the two
// paths give the same log-probabilities (fp32: 1e-5 absolute) when the inference path's expert
// choices are replayed, and the same choices except at exact near-ties when each routes alone.
//
// Layer schedule (docs/model_math.md#layer-schedule): per layer i, read the attention residual
// sources (skipped for layer 0, which reads the embedding), seal the block partial sum every
// `residual_block` layers, attention (I or G by the layer pattern) on its pre-normed input, read
// again, feed-forward (dense for the first layers, latent sparse experts after); a final read, norm
// and output head.
//
// Errors: every public method returns Status/Result; LibTorch exceptions are caught here and
// reported with context, never thrown to callers.
//
// Threads: a Model is shared as `shared_ptr<const Model>` (the rollout engine, the actor).
//   - Const methods (Forward, NewState, Append, Step, CheckInput, config, dtype, tensors) only
//     read the weights and may run concurrently on one Model from any number of threads.
//   - Non-const methods (SetRequiresGrad, ConvertTo, UpdateRoutingBalance) and in-place writes
//     to tensors() (an optimiser step) need the Model to themselves: no other call may run
//     during them. The learner makes them from its one training thread.
//   - Create and Load build a new Model and may run on any thread while other Models are in
//     use (the actor loads new weights on its weight thread while the engine steps the old).
//   - An InferenceState, its copies (which share cache storage until one of them appends) and
//     a RaggedBatch belong to one thread at a time; the engine serialises its steps.
//   - ConfigureThreads and ConfigureRuntime set process-wide LibTorch settings: call them once,
//     before any thread runs the model.
//
// Why plain weight structs and free functions rather than LibTorch modules (torch::nn): the
// weights are one flat table of named tensors fixed by the parameter table (parameters.h), the
// same names as in checkpoints, counted without LibTorch for configs never allocated; each
// layer is a function of (weights, config, input, state) so the training and the inference
// path share one set of weights with the state passed in explicitly, and a const Model holds
// no mutable module state (training flags, hooks) that concurrent readers could disturb; Bind
// can view several weights as row blocks of one matrix for inference without changing the
// parameters; and a faster kernel (common/kernels/) replaces a function without touching the
// model.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/model/config.h"
#include "common/model/incremental_attention.h"
#include "common/model/latent_attention.h"
#include "common/model/parameters.h"
#include "common/model/sparse_experts.h"
#include "common/safetensors.h"
#include "common/status.h"

namespace strider {

struct ImageInput {
  int64_t sequence = 0;  // batch row the image belongs to
  at::Tensor pixels;     // (H, W, C) floating point in [0, 1]
};

struct ModelInput {
  at::Tensor tokens;  // (B, T) int64; image patches are token::kImagePatch placeholders
  // Images in stream order within each sequence; their patch counts must match the
  // placeholders of that sequence's tokens.
  std::vector<ImageInput> images;
};

// Expert choices of every sparse layer, for routing replay and quantile balancing.
struct RoutingRecord {
  struct Layer {
    at::Tensor experts;  // (B, T, k) int64
    at::Tensor scores;   // (B, T, n) router scores, detached
  };
  std::vector<Layer> layers;  // one per sparse layer, in depth order

  // Joins records of consecutive chunks of the same sequences along T.
  static RoutingRecord Concatenate(const std::vector<RoutingRecord>& parts);
};

struct ForwardOptions {
  const RoutingRecord* replay_routing = nullptr;  // use these experts (T must match the input)
  bool record_routing = false;                    // fill ForwardOutput::routing
  bool compute_values = false;                    // fill ForwardOutput::values
  bool return_hidden = false;                     // fill ForwardOutput::hidden
  // Append only: keep the autograd graph (chunked long-sequence training through the
  // inference path). Forward always records gradients for parameters that require them.
  bool enable_grad = false;
  // Append only: the explicit latent-attention form instead of the absorbed one (for checks).
  bool explicit_latent_attention = false;
  // Append and Step: logits (and values) only for the last position of each row, (B, 1, V).
  // Long prefills need only the next-token distribution; this keeps their output small.
  bool last_position_only = false;
  // Expert parallelism (expert_parallel.h): required, and only allowed, on a model whose
  // experts were sharded (ShardExperts); every rank of the exchange runs the same layers.
  model::ExpertExchange* expert_exchange = nullptr;
};

struct ForwardOutput {
  at::Tensor logits;  // (B, T, V)
  at::Tensor values;  // (B, T) value-head estimates, when asked for
  // (B, T, D) the normed final hidden states the output and value heads read, when asked for
  // (a learner's own heads read them too).
  at::Tensor hidden;
  RoutingRecord routing;
};

// Per-sequence state of the inference path for a batch of B sequences of equal length.
class InferenceState {
 public:
  int64_t batch_size() const { return batch_size_; }
  int64_t length() const { return length_; }  // tokens appended so far
  // Recurrent states and convolution tails of incremental layers: constant in length.
  int64_t StateBytes() const;
  // Compressed latent caches of latent-attention layers: (d_c + d_rope) values per token.
  int64_t CacheBytes() const;
  // Cuts the autograd graph the state carries after Append with enable_grad: later chunks see
  // the same values but gradients stop here (truncated backpropagation for long sequences, so
  // training memory grows with the chunk, not with everything before it).
  void DetachGraph();
  // Room in the latent caches for `tokens` tokens in all (LatentAttentionCache::Reserve): a
  // chunked pass over a sequence of known length allocates its cache once.
  void Reserve(int64_t tokens);

 private:
  friend class Model;
  struct Layer {
    model::IncrementalAttentionState incremental;
    model::LatentAttentionCache latent;
  };
  int64_t batch_size_ = 0;
  int64_t length_ = 0;
  std::vector<Layer> layers_;
};

// A batch of sequences whose lengths differ, for one Model::Step (the rollout engine's decode
// step over continuous batches). The caller owns the per-sequence storage: it stacks the rows'
// incremental states in, supplies each latent layer's past on request, and after a successful
// Step stores the updated states and the new latent rows back.
struct RaggedBatch {
  struct Layer {
    // Incremental layers: (B, ...) stacked states in; the updated states out.
    model::IncrementalAttentionState incremental;
    // Latent layers, out: the new compressed rows (B, T, .) in the past's dtype.
    model::LatentAttentionRows new_rows;
  };
  at::Tensor past_lengths;  // (B) int64: tokens each row has already seen
  // Latent layers: returns layer `layer`'s past, padded (B, P, .) with P >= max past_lengths.
  // Called once per latent layer in depth order, so only one layer's gathered past is alive.
  std::function<model::LatentAttentionPast(int64_t layer)> load_past;
  std::vector<Layer> layers;  // one per model layer
};

// The device `name` names (ValidDeviceName: cpu, cuda, cuda:N), or InvalidArgument naming it
// when this process cannot compute there: a LibTorch built without CUDA, no GPU, or an index
// past the GPUs present. `cuda` is the current CUDA device.
Result<c10::Device> ResolveDevice(const std::string& name);

class Model {
 public:
  // Random initialisation from the parameter table, deterministic in `seed`: drawn on the CPU
  // and placed on config.device tensor by tensor, so one seed gives the same weights on every
  // device.
  static Result<std::unique_ptr<Model>> Create(const ModelConfig& config, uint64_t seed);
  // Weights from a safetensors file written by Save; every tensor must be present with the
  // config's shape and nothing else may be there. Float32 and float64 checkpoints load as
  // stored (dtype() says which); float16 and bfloat16 ones are widened to float32, the
  // narrowest dtype the model computes in. A checkpoint mixing float64 with other dtypes, or
  // holding integer tensors, is refused (InvalidArgument). Each tensor passes through host
  // memory to config.device alone, so the device never holds more than the weights.
  static Result<std::unique_ptr<Model>> Load(const ModelConfig& config, const std::string& path);
  // Load from the bytes of a safetensors file held in memory (a published weight update), with
  // the same checks; `name` stands for the file in errors. The bytes are copied.
  static Result<std::unique_ptr<Model>> LoadFromBytes(const ModelConfig& config,
                                                      std::string_view bytes,
                                                      const std::string& name = "weights");
  // Save, SaveToBytes and SaveWholeToBytes copy the weights to host memory first.
  Status Save(const std::string& path) const;
  // Exactly the bytes Save writes, without a file (what a WeightPublisher publishes).
  Result<std::string> SaveToBytes() const;
  // An expert-parallel rank's weights with its routed experts replaced by the whole tensors
  // (gathered from every rank, keyed by name): what actors load. Unsharded metadata.
  Result<std::string> SaveWholeToBytes(const std::map<std::string, at::Tensor>& whole_experts) const;

  const ModelConfig& config() const { return config_; }
  at::ScalarType dtype() const;
  // Where the weights live: inputs are moved there, outputs and states are made there.
  c10::Device device() const;

  // Every tensor with its name, in parameter-table order; the tensors share storage with the
  // model (in-place updates by an optimiser are seen by the next forward).
  const std::vector<std::pair<std::string, at::Tensor>>& tensors() const { return tensors_; }
  // The subset trained by gradients (everything but the router biases).
  std::vector<at::Tensor> TrainableParameters() const;
  void SetRequiresGrad(bool requires_grad);
  // Converts every tensor (fp64 for reference checks) and rebinds the layers.
  Status ConvertTo(at::ScalarType dtype);

  Result<ForwardOutput> Forward(const ModelInput& input, const ForwardOptions& options = {}) const;
  Result<InferenceState> NewState(int64_t batch_size) const;
  Result<ForwardOutput> Append(InferenceState* state, const ModelInput& input,
                               const ForwardOptions& options = {}) const;
  // The inference path for rows of different past lengths: row b's T new tokens sit at
  // positions past_lengths[b].. . Same layers and kernels as Append. On failure `batch` keeps
  // its inputs. Images name their batch row (ImageInput::sequence) as in Forward.
  Result<ForwardOutput> Step(RaggedBatch* batch, const ModelInput& input,
                             const ForwardOptions& options = {}) const;

  // One quantile-balancing update of every sparse layer's router bias from the scores of a
  // record (docs/model_math.md#quantile-balancing). Returns the MaxVio of each layer's recorded
  // choices; with feed_forward.quantile_balancing false it only measures them.
  Result<std::vector<double>> UpdateRoutingBalance(const RoutingRecord& record);

  Status CheckInput(const ModelInput& input) const;

  // Keeps only rank `rank` of `world_size`'s experts of every sparse layer's routed_* tensors
  // (expert_parallel.h; routed_experts divisible by world_size): what an expert-parallel rank
  // trains. Forward then needs ForwardOptions::expert_exchange. Save writes the shards.
  Status ShardExperts(int64_t rank, int64_t world_size);
  // This model's shard: {0, routed_experts} when not sharded.
  ExpertShard expert_shard() const { return expert_shard_; }
  bool sharded() const { return sharded_; }
  // A rank's part in the other ranks' model call when it has no tokens of its own: every
  // sparse layer's exchanges with no rows to send, its experts computing what the others send;
  // with `backward`, then the reverse exchanges and the experts' gradients. Expert-parallel
  // ranks run their calls in lockstep (learner/distributed.h); a rank out of work serves.
  // Throws c10::Error like the forward.
  void ServeExperts(model::ExpertExchange& exchange, bool backward) const;

  ~Model();

 private:
  struct Layers;
  explicit Model(ModelConfig config);
  static Result<std::unique_ptr<Model>> FromContents(const ModelConfig& config,
                                                     const SafetensorsContents& contents,
                                                     const std::string& path);
  Result<std::vector<TensorView>> Views(std::vector<at::Tensor>* contiguous) const;
  std::map<std::string, std::string> SaveMetadata() const;
  void Bind();
  ForwardOutput Run(const ModelInput& input, InferenceState* state,
                    const ForwardOptions& options, RaggedBatch* ragged = nullptr) const;

  ModelConfig config_;
  std::vector<std::pair<std::string, at::Tensor>> tensors_;
  std::vector<bool> trainable_;
  std::unique_ptr<Layers> layers_;
  ExpertShard expert_shard_;
  bool sharded_ = false;
};

// log p(tokens[t+1] | ..t) from logits (B, T, V) and tokens (B, T): (B, T-1), in fp32 or fp64,
// on the logits' device (tokens may be on the host).
at::Tensor NextTokenLogProbs(const at::Tensor& logits, const at::Tensor& tokens);

// Sets LibTorch's intra-op threads (0 = all cores). Debian's LibTorch defaults to one thread on
// small machines, which halves throughput.
void ConfigureThreads(int64_t threads);

// ConfigureThreads, KeepFreedMemoryInHeap and the tensor pool (common/model/tensor_pool.h):
// the kernels' big temporaries are reused by the next step instead of faulted in again, from a
// pool of their own so nothing else fragments them; malloc's blocks of 1 MiB and more, no
// longer tensors, go back to the kernel on free (ReturnLargeBlocksToKernel).
void ConfigureRuntime(int64_t threads);

}  // namespace strider
