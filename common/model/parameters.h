// Every parameter of the model as data: name, shape, component, initialisation.
//
// This table is the single source of truth for the model's parameters. The model allocates
// exactly these tensors, checkpoints store them under these names, and `strider model info`
// counts them without allocating anything, so the 2.8T reference is counted by the same code
// that builds the tiny test model.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/model/config.h"

namespace strider {

enum class ParameterInit {
  kNormal,       // N(0, init_std) scaled by `scale`
  kZeros,
  kOnes,
  kDecayBias,    // spread of decay-gate biases so heads start with short and long memories
};

struct ParameterSpec {
  std::string name;              // "layers.3.latent.kv_up"
  std::vector<int64_t> shape;
  std::string component;         // groups for accounting: "routed_experts", "router", ...
  // Fraction of this parameter used for one token: k/n for routed experts, 1 otherwise.
  double active_fraction = 1.0;
  bool trainable = true;         // false for the quantile-balancing router bias
  ParameterInit init = ParameterInit::kNormal;
  double scale = 1.0;            // multiplies init_std for kNormal

  int64_t Count() const;
};

std::vector<ParameterSpec> ModelParameterSpecs(const ModelConfig& config);

struct ParameterCounts {
  double total = 0;    // doubles: the reference has 2.8e12 parameters
  double active = 0;   // per token
  std::map<std::string, double> total_by_component;
  std::map<std::string, double> active_by_component;
};

ParameterCounts CountParameters(const ModelConfig& config);

// Expert parallelism (common/model/expert_parallel.h): rank r of `world_size` holds experts
// [first, first + count) of every sparse layer; routed_experts must be divisible by world_size.
struct ExpertShard {
  int64_t first = 0;
  int64_t count = 0;
};
ExpertShard ExpertShardOf(int64_t routed_experts, int64_t rank, int64_t world_size);
// Whether a parameter is a sparse layer's routed_gate, routed_up or routed_down: the tensors
// expert parallelism splits along their first (expert) dimension.
bool IsRoutedExpertTensor(const std::string& name);

// What one rank holds under expert-parallel degree `degree` (`strider model info
// --expert-parallel N`): the routed experts split, every other parameter whole on each rank.
struct ExpertParallelFootprint {
  int64_t degree = 1;
  double routed_parameters_total = 0;  // every sparse layer's routed experts, unsharded
  double routed_parameters_per_rank = 0;
  double replicated_parameters = 0;    // everything else, on every rank
  double parameters_per_rank = 0;
  double weight_bytes_per_rank = 0;    // at the config's parameter dtype
  // Training with AdamW: weights, gradients and two moments per parameter, fp32.
  double training_bytes_per_rank = 0;
};
ExpertParallelFootprint ExpertParallelFootprintOf(const ModelConfig& config, int64_t degree);

// Memory of the inference state (docs/model_math.md#gated-delta-rule and #latent-attention), from
// the config alone.
struct CacheAccounting {
  // Latent attention: (d_c + d_rope) values per token per latent layer, in the cache dtype.
  int64_t kv_cache_values_per_token_per_layer = 0;
  int64_t kv_cache_bytes_per_token = 0;  // all latent layers
  // Incremental attention: H d_k d_v fp32 state plus the convolution tail, per layer.
  int64_t state_bytes_per_layer = 0;
  int64_t state_bytes_per_sequence = 0;  // all incremental layers; constant in context length
  // An equal-size model with full multi-head attention (same heads and head width) in every
  // attention layer: keys and values cached for every head of every layer.
  int64_t baseline_kv_values_per_token_per_layer = 0;
  int64_t baseline_kv_cache_bytes_per_token = 0;
  // Bytes of one sequence at `context` tokens: state + cache * context.
  double sequence_bytes_at_context = 0;
  double baseline_sequence_bytes_at_context = 0;
};

CacheAccounting AccountCaches(const ModelConfig& config);

}  // namespace strider
