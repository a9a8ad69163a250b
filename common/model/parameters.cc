#include "common/model/parameters.h"

#include <cmath>

namespace strider {

int64_t ParameterSpec::Count() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

std::vector<ParameterSpec> ModelParameterSpecs(const ModelConfig& c) {
  std::vector<ParameterSpec> specs;
  const int64_t d = c.width;
  // Output projections of residual branches start smaller so the sum over depth stays O(1).
  const double branch_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(c.layers));
  auto add = [&](std::string name, std::vector<int64_t> shape, std::string component,
                 ParameterInit init = ParameterInit::kNormal, double scale = 1.0) {
    ParameterSpec spec;
    spec.name = std::move(name);
    spec.shape = std::move(shape);
    spec.component = std::move(component);
    spec.init = init;
    spec.scale = scale;
    specs.push_back(std::move(spec));
    return &specs.back();
  };

  add("embedding", {c.vocabulary, d}, "embedding");
  if (c.vision.enabled) {
    const auto& v = c.vision;
    add("vision.patch_projection", {d, v.patch_size * v.patch_size * v.channels}, "vision");
    add("vision.patch_bias", {d}, "vision", ParameterInit::kZeros);
    add("vision.row_embedding", {v.max_grid_rows, d}, "vision");
    add("vision.column_embedding", {v.max_grid_columns, d}, "vision");
  }
  // Pseudo-queries of the attention-residual reads: two per layer and the final one. Zero at
  // start, so every read begins as a uniform average of its sources.
  if (c.attention_residuals) {
    add("residual_queries", {2 * c.layers + 1, d}, "attention_residuals", ParameterInit::kZeros);
  }

  const std::vector<char> kinds = c.LayerKinds();
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string layer = "layers." + std::to_string(i) + ".";
    add(layer + "attention_norm", {d}, "norms", ParameterInit::kOnes);
    add(layer + "feed_forward_norm", {d}, "norms", ParameterInit::kOnes);
    if (kinds[i] == 'I') {
      const auto& a = c.incremental;
      const std::string p = layer + "incremental.";
      const int64_t hk = a.heads * a.key_dim;
      const int64_t hv = a.heads * a.value_dim;
      add(p + "query", {hk, d}, "incremental_attention");
      add(p + "key", {hk, d}, "incremental_attention");
      add(p + "value", {hv, d}, "incremental_attention");
      add(p + "query_conv", {hk, a.conv_width}, "incremental_attention");
      add(p + "key_conv", {hk, a.conv_width}, "incremental_attention");
      add(p + "value_conv", {hv, a.conv_width}, "incremental_attention");
      add(p + "beta", {a.heads, d}, "incremental_attention");
      add(p + "decay_down", {a.decay_rank, d}, "incremental_attention");
      add(p + "decay_up", {hk, a.decay_rank}, "incremental_attention");
      add(p + "decay_bias", {hk}, "incremental_attention", ParameterInit::kDecayBias);
      add(p + "decay_log_scale", {a.heads}, "incremental_attention", ParameterInit::kZeros);
      add(p + "output_norm", {a.value_dim}, "incremental_attention", ParameterInit::kOnes);
      if (a.gate_rank > 0) {
        add(p + "gate_down", {a.gate_rank, d}, "incremental_attention");
        add(p + "gate_up", {hv, a.gate_rank}, "incremental_attention");
      } else {
        add(p + "gate", {hv, d}, "incremental_attention");
      }
      add(p + "output", {d, hv}, "incremental_attention", ParameterInit::kNormal, branch_scale);
    } else {
      const auto& a = c.latent;
      const std::string p = layer + "latent.";
      const int64_t query_width = a.heads * (a.nope_dim + a.rope_dim);
      if (a.query_rank > 0) {
        add(p + "query_down", {a.query_rank, d}, "latent_attention");
        add(p + "query_norm", {a.query_rank}, "latent_attention", ParameterInit::kOnes);
        add(p + "query_up", {query_width, a.query_rank}, "latent_attention");
      } else {
        add(p + "query", {query_width, d}, "latent_attention");
      }
      add(p + "kv_down", {a.kv_rank + a.rope_dim, d}, "latent_attention");
      add(p + "kv_norm", {a.kv_rank}, "latent_attention", ParameterInit::kOnes);
      add(p + "kv_up", {a.heads * (a.nope_dim + a.value_dim), a.kv_rank}, "latent_attention");
      if (a.output_gate) add(p + "gate", {a.heads * a.value_dim, d}, "latent_attention");
      add(p + "output", {d, a.heads * a.value_dim}, "latent_attention", ParameterInit::kNormal,
          branch_scale);
    }
    const auto& f = c.feed_forward;
    if (!c.IsMoeLayer(i)) {
      const std::string p = layer + "dense.";
      add(p + "gate", {f.dense_hidden, d}, "dense_feed_forward");
      add(p + "up", {f.dense_hidden, d}, "dense_feed_forward");
      add(p + "down", {d, f.dense_hidden}, "dense_feed_forward", ParameterInit::kNormal,
          branch_scale);
      continue;
    }
    const std::string p = layer + "experts.";
    add(p + "router", {f.routed_experts, d}, "router");
    ParameterSpec* bias = add(p + "router_bias", {f.routed_experts}, "router_bias",
                              ParameterInit::kZeros);
    bias->trainable = false;
    if (f.latent_experts) {
      add(p + "latent_down", {f.latent_width, d}, "expert_latent_projections");
      add(p + "latent_norm", {f.latent_width}, "expert_latent_projections", ParameterInit::kOnes);
      add(p + "latent_up", {d, f.latent_width}, "expert_latent_projections",
          ParameterInit::kNormal, branch_scale);
    }
    // Full-width experts read and write x themselves, so their down projection is the branch's
    // output projection.
    const int64_t expert_input = f.latent_experts ? f.latent_width : d;
    const double down_scale = f.latent_experts ? 1.0 : branch_scale;
    const double routed_fraction =
        static_cast<double>(f.experts_per_token) / static_cast<double>(f.routed_experts);
    for (const char* part : {"routed_gate", "routed_up"}) {
      add(p + part, {f.routed_experts, f.expert_hidden, expert_input}, "routed_experts")
          ->active_fraction = routed_fraction;
    }
    add(p + "routed_down", {f.routed_experts, expert_input, f.expert_hidden}, "routed_experts",
        ParameterInit::kNormal, down_scale)
        ->active_fraction = routed_fraction;
    if (f.shared_experts > 0) {
      add(p + "shared_gate", {f.shared_experts, f.shared_hidden, d}, "shared_experts");
      add(p + "shared_up", {f.shared_experts, f.shared_hidden, d}, "shared_experts");
      add(p + "shared_down", {f.shared_experts, d, f.shared_hidden}, "shared_experts",
          ParameterInit::kNormal, branch_scale);
    }
  }
  add("final_norm", {d}, "norms", ParameterInit::kOnes);
  if (!c.tie_embeddings) add("output", {c.vocabulary, d}, "output");
  add("value_head.weight", {1, d}, "value_head");
  add("value_head.bias", {1}, "value_head", ParameterInit::kZeros);
  return specs;
}

ParameterCounts CountParameters(const ModelConfig& config) {
  ParameterCounts counts;
  for (const ParameterSpec& spec : ModelParameterSpecs(config)) {
    const double total = static_cast<double>(spec.Count());
    double active = total * spec.active_fraction;
    // Vision weights run only on image positions, the value head only in the learner: neither
    // is part of the per-token cost of generating text.
    if (spec.component == "vision" || spec.component == "value_head") active = 0;
    counts.total += total;
    counts.active += active;
    counts.total_by_component[spec.component] += total;
    counts.active_by_component[spec.component] += active;
  }
  return counts;
}

CacheAccounting AccountCaches(const ModelConfig& c) {
  CacheAccounting a;
  const int64_t cache_bytes = c.CacheDtypeBytes();
  const int64_t latent_layers = c.CountLayers('G');
  const int64_t incremental_layers = c.CountLayers('I');
  a.kv_cache_values_per_token_per_layer = c.latent.kv_rank + c.latent.rope_dim;
  a.kv_cache_bytes_per_token = latent_layers * a.kv_cache_values_per_token_per_layer * cache_bytes;
  const auto& inc = c.incremental;
  const int64_t conv_channels = inc.heads * (2 * inc.key_dim + inc.value_dim);
  a.state_bytes_per_layer = inc.heads * inc.key_dim * inc.value_dim * 4 +
                            (inc.conv_width - 1) * conv_channels * 4;
  a.state_bytes_per_sequence = incremental_layers * a.state_bytes_per_layer;
  a.baseline_kv_values_per_token_per_layer = 2 * c.latent.heads * c.latent.value_dim;
  a.baseline_kv_cache_bytes_per_token =
      c.layers * a.baseline_kv_values_per_token_per_layer * cache_bytes;
  const double context = static_cast<double>(c.context);
  a.sequence_bytes_at_context = static_cast<double>(a.state_bytes_per_sequence) +
                                static_cast<double>(a.kv_cache_bytes_per_token) * context;
  a.baseline_sequence_bytes_at_context =
      static_cast<double>(a.baseline_kv_cache_bytes_per_token) * context;
  return a;
}

ExpertShard ExpertShardOf(int64_t routed_experts, int64_t rank, int64_t world_size) {
  const int64_t per_rank = routed_experts / world_size;
  return {rank * per_rank, per_rank};
}

bool IsRoutedExpertTensor(const std::string& name) {
  for (const std::string suffix :
       {".experts.routed_gate", ".experts.routed_up", ".experts.routed_down"}) {
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return true;
    }
  }
  return false;
}

ExpertParallelFootprint ExpertParallelFootprintOf(const ModelConfig& config, int64_t degree) {
  ExpertParallelFootprint f;
  f.degree = degree;
  const ParameterCounts counts = CountParameters(config);
  auto routed = counts.total_by_component.find("routed_experts");
  f.routed_parameters_total = routed != counts.total_by_component.end() ? routed->second : 0;
  f.routed_parameters_per_rank = f.routed_parameters_total / static_cast<double>(degree);
  f.replicated_parameters = counts.total - f.routed_parameters_total;
  f.parameters_per_rank = f.replicated_parameters + f.routed_parameters_per_rank;
  f.weight_bytes_per_rank = 4 * f.parameters_per_rank;
  f.training_bytes_per_rank = 16 * f.parameters_per_rank;
  return f;
}

}  // namespace strider
