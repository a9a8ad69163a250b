#include "common/model/hf_kimi_linear.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

namespace strider {
namespace {

using Json = nlohmann::json;
using C = KimiLinearConfig;
using Shape = std::vector<int64_t>;

int64_t Projection(const C& c) { return c.kda_heads * c.kda_head_dim; }
int64_t MlaQuery(const C& c) {
  return c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim);
}

// Why rows do not map yet: each names the configuration option the model lacks.
// The KDA gates map under incremental_attention's Kimi options (decay_gate: softplus, decay_rank
// and gate_rank = head_dim; docs/model_math.md#kimi-linears-kda-layer).
constexpr std::string_view kKdaGate =
    "decay gate with decay_gate: softplus and decay_rank = head_dim: "
    "g = -exp(A_log) softplus(f_b(f_a(x)) + dt_bias)";
constexpr std::string_view kKdaLogScale =
    "decay gate's A_h with decay_gate: softplus; [1, 1, H, 1] reshaped to [H]";
constexpr std::string_view kKdaOutputGate =
    "low-rank output gate with gate_rank = head_dim: sigmoid(g_b_proj g_a_proj x)";
constexpr std::string_view kMlaFullQuery =
    "full-rank MLA query with latent_attention.query_rank: 0 (q_lora_rank null)";
// The feed-forward maps under feed_forward's Kimi options (activation: silu, latent_experts:
// false; docs/model_math.md#kimi-linears-feed-forward).
constexpr std::string_view kSiluMlp = "SwiGLU with feed_forward.activation: silu";
constexpr std::string_view kRoutedGate =
    "full-width experts (feed_forward.latent_experts: false): expert E's w1 [E_h, d] is "
    "routed_gate[E], stacked to [n, E_h, d]";
constexpr std::string_view kRoutedDown =
    "full-width experts (feed_forward.latent_experts: false): expert E's w2 [d, E_h] is "
    "routed_down[E], stacked to [n, d, E_h]";
constexpr std::string_view kRoutedUp =
    "full-width experts (feed_forward.latent_experts: false): expert E's w3 [E_h, d] is "
    "routed_up[E], stacked to [n, E_h, d]";
constexpr std::string_view kSharedInput =
    "one shared expert (shared_experts: 1, shared_hidden: num_shared_experts * "
    "moe_intermediate_size, activation: silu): [S, d] gains a leading axis, [1, S, d]";
constexpr std::string_view kSharedDown =
    "one shared expert (shared_experts: 1, shared_hidden: num_shared_experts * "
    "moe_intermediate_size, activation: silu): [d, S] gains a leading axis, [1, d, S]";
constexpr std::string_view kLatentExperts =
    "latent experts (Kimi K3's routed_expert_hidden_size): no published tensor name is known "
    "yet; Kimi Linear's experts are full width (feed_forward.latent_experts: false)";

// One row per tensor reads better than the formatter's layout of these lambdas.
// clang-format off
const std::vector<KimiTensorRule>& Table() {
  static const auto* table = new std::vector<KimiTensorRule>{
      {KimiPart::kModel, "model.embed_tokens.weight", "embedding", true, "embeddings",
       [](const C& c) { return Shape{c.vocab_size, c.hidden_size}; }, ""},
      {KimiPart::kLayer, "model.layers.{L}.input_layernorm.weight", "layers.{L}.attention_norm",
       true, "norms", [](const C& c) { return Shape{c.hidden_size}; }, ""},
      // KDA (Kimi Delta Attention) layers.
      {KimiPart::kKda, "model.layers.{L}.self_attn.q_proj.weight", "layers.{L}.incremental.query",
       true, "kda_attention", [](const C& c) { return Shape{Projection(c), c.hidden_size}; }, ""},
      {KimiPart::kKda, "model.layers.{L}.self_attn.k_proj.weight", "layers.{L}.incremental.key",
       true, "kda_attention", [](const C& c) { return Shape{Projection(c), c.hidden_size}; }, ""},
      {KimiPart::kKda, "model.layers.{L}.self_attn.v_proj.weight", "layers.{L}.incremental.value",
       true, "kda_attention", [](const C& c) { return Shape{Projection(c), c.hidden_size}; }, ""},
      {KimiPart::kKda, "model.layers.{L}.self_attn.q_conv1d.weight",
       "layers.{L}.incremental.query_conv", true, "kda_attention",
       [](const C& c) { return Shape{Projection(c), 1, c.kda_conv_width}; },
       "[P, 1, w] reshaped to [P, w]"},
      {KimiPart::kKda, "model.layers.{L}.self_attn.k_conv1d.weight",
       "layers.{L}.incremental.key_conv", true, "kda_attention",
       [](const C& c) { return Shape{Projection(c), 1, c.kda_conv_width}; },
       "[P, 1, w] reshaped to [P, w]"},
      {KimiPart::kKda, "model.layers.{L}.self_attn.v_conv1d.weight",
       "layers.{L}.incremental.value_conv", true, "kda_attention",
       [](const C& c) { return Shape{Projection(c), 1, c.kda_conv_width}; },
       "[P, 1, w] reshaped to [P, w]"},
      {KimiPart::kKda, "model.layers.{L}.self_attn.A_log", "layers.{L}.incremental.decay_log_scale",
       true, "kda_attention", [](const C& c) { return Shape{1, 1, c.kda_heads, 1}; },
       kKdaLogScale},
      {KimiPart::kKda, "model.layers.{L}.self_attn.f_a_proj.weight",
       "layers.{L}.incremental.decay_down", true, "kda_attention",
       [](const C& c) { return Shape{c.kda_head_dim, c.hidden_size}; }, kKdaGate},
      {KimiPart::kKda, "model.layers.{L}.self_attn.f_b_proj.weight",
       "layers.{L}.incremental.decay_up", true, "kda_attention",
       [](const C& c) { return Shape{Projection(c), c.kda_head_dim}; }, kKdaGate},
      {KimiPart::kKda, "model.layers.{L}.self_attn.dt_bias", "layers.{L}.incremental.decay_bias",
       true, "kda_attention", [](const C& c) { return Shape{Projection(c)}; }, kKdaGate},
      {KimiPart::kKda, "model.layers.{L}.self_attn.b_proj.weight", "layers.{L}.incremental.beta",
       true, "kda_attention", [](const C& c) { return Shape{c.kda_heads, c.hidden_size}; }, ""},
      {KimiPart::kKda, "model.layers.{L}.self_attn.g_a_proj.weight",
       "layers.{L}.incremental.gate_down", true, "kda_attention",
       [](const C& c) { return Shape{c.kda_head_dim, c.hidden_size}; }, kKdaOutputGate},
      {KimiPart::kKda, "model.layers.{L}.self_attn.g_b_proj.weight",
       "layers.{L}.incremental.gate_up", true, "kda_attention",
       [](const C& c) { return Shape{Projection(c), c.kda_head_dim}; }, kKdaOutputGate},
      {KimiPart::kKda, "model.layers.{L}.self_attn.o_norm.weight",
       "layers.{L}.incremental.output_norm", true, "kda_attention",
       [](const C& c) { return Shape{c.kda_head_dim}; }, ""},
      {KimiPart::kKda, "model.layers.{L}.self_attn.o_proj.weight", "layers.{L}.incremental.output",
       true, "kda_attention", [](const C& c) { return Shape{c.hidden_size, Projection(c)}; }, ""},
      // MLA layers: no rotary embedding (mla_use_nope), as Strider's latent layers.
      {KimiPart::kMlaFullQuery, "model.layers.{L}.self_attn.q_proj.weight",
       "layers.{L}.latent.query", true, "mla_attention",
       [](const C& c) { return Shape{MlaQuery(c), c.hidden_size}; }, kMlaFullQuery},
      {KimiPart::kMlaLowRankQuery, "model.layers.{L}.self_attn.q_a_proj.weight",
       "layers.{L}.latent.query_down", true, "mla_attention",
       [](const C& c) { return Shape{c.q_lora_rank, c.hidden_size}; }, ""},
      {KimiPart::kMlaLowRankQuery, "model.layers.{L}.self_attn.q_a_layernorm.weight",
       "layers.{L}.latent.query_norm", true, "mla_attention",
       [](const C& c) { return Shape{c.q_lora_rank}; }, ""},
      {KimiPart::kMlaLowRankQuery, "model.layers.{L}.self_attn.q_b_proj.weight",
       "layers.{L}.latent.query_up", true, "mla_attention",
       [](const C& c) { return Shape{MlaQuery(c), c.q_lora_rank}; }, ""},
      {KimiPart::kMla, "model.layers.{L}.self_attn.kv_a_proj_with_mqa.weight",
       "layers.{L}.latent.kv_down", true, "mla_attention",
       [](const C& c) { return Shape{c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size}; }, ""},
      {KimiPart::kMla, "model.layers.{L}.self_attn.kv_a_layernorm.weight",
       "layers.{L}.latent.kv_norm", true, "mla_attention",
       [](const C& c) { return Shape{c.kv_lora_rank}; }, ""},
      {KimiPart::kMla, "model.layers.{L}.self_attn.kv_b_proj.weight", "layers.{L}.latent.kv_up",
       true, "mla_attention",
       [](const C& c) {
         return Shape{c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank};
       },
       ""},
      {KimiPart::kMlaOutputGate, "model.layers.{L}.self_attn.g_proj.weight",
       "layers.{L}.latent.gate", true, "mla_attention",
       [](const C& c) { return Shape{c.num_attention_heads * c.v_head_dim, c.hidden_size}; },
       "Kimi K3's mla_use_output_gate: o_proj(sigmoid(g_proj x) * attention), Strider's gate"},
      {KimiPart::kMla, "model.layers.{L}.self_attn.o_proj.weight", "layers.{L}.latent.output",
       true, "mla_attention",
       [](const C& c) { return Shape{c.hidden_size, c.num_attention_heads * c.v_head_dim}; }, ""},
      {KimiPart::kLayer, "model.layers.{L}.post_attention_layernorm.weight",
       "layers.{L}.feed_forward_norm", true, "norms",
       [](const C& c) { return Shape{c.hidden_size}; }, ""},
      // Dense MLP layers.
      {KimiPart::kDenseMlp, "model.layers.{L}.mlp.gate_proj.weight", "layers.{L}.dense.gate", true,
       "dense_mlp", [](const C& c) { return Shape{c.intermediate_size, c.hidden_size}; },
       kSiluMlp},
      {KimiPart::kDenseMlp, "model.layers.{L}.mlp.up_proj.weight", "layers.{L}.dense.up", true,
       "dense_mlp", [](const C& c) { return Shape{c.intermediate_size, c.hidden_size}; },
       kSiluMlp},
      {KimiPart::kDenseMlp, "model.layers.{L}.mlp.down_proj.weight", "layers.{L}.dense.down", true,
       "dense_mlp", [](const C& c) { return Shape{c.hidden_size, c.intermediate_size}; },
       kSiluMlp},
      // MoE layers: sigmoid router with a selection-only bias, as Strider's.
      {KimiPart::kMoe, "model.layers.{L}.block_sparse_moe.gate.weight", "layers.{L}.experts.router",
       true, "router", [](const C& c) { return Shape{c.num_experts, c.hidden_size}; }, ""},
      {KimiPart::kMoe, "model.layers.{L}.block_sparse_moe.gate.e_score_correction_bias",
       "layers.{L}.experts.router_bias", true, "router",
       [](const C& c) { return Shape{c.num_experts}; }, ""},
      {KimiPart::kRoutedExpert, "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight",
       "layers.{L}.experts.routed_gate", true, "routed_experts",
       [](const C& c) { return Shape{c.moe_intermediate_size, c.hidden_size}; }, kRoutedGate},
      {KimiPart::kRoutedExpert, "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight",
       "layers.{L}.experts.routed_down", true, "routed_experts",
       [](const C& c) { return Shape{c.hidden_size, c.moe_intermediate_size}; }, kRoutedDown},
      {KimiPart::kRoutedExpert, "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight",
       "layers.{L}.experts.routed_up", true, "routed_experts",
       [](const C& c) { return Shape{c.moe_intermediate_size, c.hidden_size}; }, kRoutedUp},
      {KimiPart::kSharedExpert, "model.layers.{L}.block_sparse_moe.shared_experts.gate_proj.weight",
       "layers.{L}.experts.shared_gate", true, "shared_experts",
       [](const C& c) {
         return Shape{c.num_shared_experts * c.moe_intermediate_size, c.hidden_size};
       },
       kSharedInput},
      {KimiPart::kSharedExpert, "model.layers.{L}.block_sparse_moe.shared_experts.up_proj.weight",
       "layers.{L}.experts.shared_up", true, "shared_experts",
       [](const C& c) {
         return Shape{c.num_shared_experts * c.moe_intermediate_size, c.hidden_size};
       },
       kSharedInput},
      {KimiPart::kSharedExpert, "model.layers.{L}.block_sparse_moe.shared_experts.down_proj.weight",
       "layers.{L}.experts.shared_down", true, "shared_experts",
       [](const C& c) {
         return Shape{c.hidden_size, c.num_shared_experts * c.moe_intermediate_size};
       },
       kSharedDown},
      {KimiPart::kModel, "model.norm.weight", "final_norm", true, "norms",
       [](const C& c) { return Shape{c.hidden_size}; }, ""},
      {KimiPart::kModel, "lm_head.weight", "output", true, "lm_head",
       [](const C& c) { return Shape{c.vocab_size, c.hidden_size}; },
       "absent where tie_word_embeddings is true"},
  };
  return *table;
}
// clang-format on

std::string Substitute(std::string_view pattern, int64_t layer, int64_t expert) {
  std::string out(pattern);
  for (const auto& [key, value] :
       {std::pair<std::string, int64_t>{"{L}", layer}, {"{E}", expert}}) {
    for (size_t at = out.find(key); at != std::string::npos; at = out.find(key)) {
      out.replace(at, key.size(), std::to_string(value));
    }
  }
  return out;
}

// Field readers: each error names the field and the file.
Result<int64_t> Integer(const Json& json, const char* key, const std::string& origin,
                        std::optional<int64_t> fallback = std::nullopt) {
  if (!json.contains(key) || json[key].is_null()) {
    if (fallback) return *fallback;
    return Status::InvalidArgument(fmt::format("{}: missing field '{}'", origin, key));
  }
  const Json& value = json[key];
  if (!value.is_number_integer() || value.get<int64_t>() < 0) {
    return Status::InvalidArgument(
        fmt::format("{}: field '{}' is {}, expected a non-negative "
                    "integer",
                    origin, key, value.dump()));
  }
  return value.get<int64_t>();
}

// Optional fields of other types: absent or null takes `fallback`; a mistyped one is refused.
Result<double> Number(const Json& json, const char* key, const std::string& origin,
                      double fallback) {
  if (!json.contains(key) || json[key].is_null()) return fallback;
  if (!json[key].is_number()) {
    return Status::InvalidArgument(fmt::format("{}: field '{}' is {}, expected a number", origin,
                                               key, json[key].dump()));
  }
  return json[key].get<double>();
}

Result<bool> Flag(const Json& json, const char* key, const std::string& origin, bool fallback) {
  if (!json.contains(key) || json[key].is_null()) return fallback;
  if (!json[key].is_boolean()) {
    return Status::InvalidArgument(
        fmt::format("{}: field '{}' is {}, expected true or false", origin, key, json[key].dump()));
  }
  return json[key].get<bool>();
}

Result<std::string> Text(const Json& json, const char* key, const std::string& origin,
                         const std::string& fallback) {
  if (!json.contains(key) || json[key].is_null()) return fallback;
  if (!json[key].is_string()) {
    return Status::InvalidArgument(
        fmt::format("{}: field '{}' is {}, expected a string", origin, key, json[key].dump()));
  }
  return json[key].get<std::string>();
}

Result<std::vector<int64_t>> LayerList(const Json& json, const char* key,
                                       const std::string& origin) {
  if (!json.contains(key) || !json[key].is_array()) {
    return Status::InvalidArgument(fmt::format(
        "{}: linear_attn_config.{} is missing or not a list of layer numbers", origin, key));
  }
  std::vector<int64_t> layers;
  for (const Json& value : json[key]) {
    if (!value.is_number_integer()) {
      return Status::InvalidArgument(
          fmt::format("{}: linear_attn_config.{} holds {}, expected "
                      "1-based layer numbers",
                      origin, key, value.dump()));
    }
    layers.push_back(value.get<int64_t>());
  }
  return layers;
}

}  // namespace

int64_t KimiLinearConfig::CountKdaLayers() const {
  return std::count(kda.begin(), kda.end(), true);
}

int64_t KimiLinearConfig::CountMoeLayers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_hidden_layers; ++i) n += IsMoeLayer(i) ? 1 : 0;
  return n;
}

size_t KimiLinearConfig::DtypeBytes() const {
  if (dtype == "float32") return 4;
  if (dtype == "float64") return 8;
  return 2;
}

Result<KimiLinearConfig> ParseKimiLinearConfig(std::string_view json_text,
                                               const std::string& origin) {
  Json json;
  try {
    json = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& error) {
    return Status::InvalidArgument(fmt::format("{}: not valid JSON: {}", origin, error.what()));
  }
  if (!json.is_object()) {
    return Status::InvalidArgument(fmt::format("{}: expected a JSON object", origin));
  }
  const std::string model_type = json.contains("model_type") && json["model_type"].is_string()
                                     ? json["model_type"].get<std::string>()
                                     : std::string("(none)");
  if (model_type != "kimi_linear") {
    return Status::Unimplemented(fmt::format(
        "{}: model_type '{}' is not supported (supported: kimi_linear)", origin, model_type));
  }
  KimiLinearConfig c;
  STRIDER_ASSIGN_OR_RETURN(c.vocab_size, Integer(json, "vocab_size", origin));
  STRIDER_ASSIGN_OR_RETURN(c.hidden_size, Integer(json, "hidden_size", origin));
  STRIDER_ASSIGN_OR_RETURN(c.num_hidden_layers, Integer(json, "num_hidden_layers", origin));
  STRIDER_ASSIGN_OR_RETURN(c.intermediate_size, Integer(json, "intermediate_size", origin));
  STRIDER_ASSIGN_OR_RETURN(c.num_experts, Integer(json, "num_experts", origin, 0));
  if (c.num_experts > 0) {
    STRIDER_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                             Integer(json, "moe_intermediate_size", origin));
    STRIDER_ASSIGN_OR_RETURN(c.num_experts_per_token,
                             Integer(json, "num_experts_per_token", origin));
    STRIDER_ASSIGN_OR_RETURN(c.num_shared_experts, Integer(json, "num_shared_experts", origin, 0));
    STRIDER_ASSIGN_OR_RETURN(c.first_k_dense_replace,
                             Integer(json, "first_k_dense_replace", origin, 0));
    STRIDER_ASSIGN_OR_RETURN(c.moe_layer_freq, Integer(json, "moe_layer_freq", origin, 1));
  }
  STRIDER_ASSIGN_OR_RETURN(c.num_attention_heads, Integer(json, "num_attention_heads", origin));
  STRIDER_ASSIGN_OR_RETURN(c.qk_nope_head_dim, Integer(json, "qk_nope_head_dim", origin));
  STRIDER_ASSIGN_OR_RETURN(c.qk_rope_head_dim, Integer(json, "qk_rope_head_dim", origin));
  STRIDER_ASSIGN_OR_RETURN(c.v_head_dim, Integer(json, "v_head_dim", origin));
  STRIDER_ASSIGN_OR_RETURN(c.kv_lora_rank, Integer(json, "kv_lora_rank", origin));
  STRIDER_ASSIGN_OR_RETURN(c.q_lora_rank, Integer(json, "q_lora_rank", origin, 0));
  if (json.contains("tie_word_embeddings")) {
    if (!json["tie_word_embeddings"].is_boolean()) {
      return Status::InvalidArgument(
          fmt::format("{}: field 'tie_word_embeddings' is not true or false", origin));
    }
    c.tie_word_embeddings = json["tie_word_embeddings"].get<bool>();
  }
  if (json.contains("rms_norm_eps") && json["rms_norm_eps"].is_number()) {
    c.rms_norm_eps = json["rms_norm_eps"].get<double>();
  }
  STRIDER_ASSIGN_OR_RETURN(c.initializer_range,
                           Number(json, "initializer_range", origin, c.initializer_range));
  for (const char* key : {"model_max_length", "max_position_embeddings"}) {
    if (json.contains(key) && !json[key].is_null()) {
      STRIDER_ASSIGN_OR_RETURN(c.max_length, Integer(json, key, origin));
      break;
    }
  }
  STRIDER_ASSIGN_OR_RETURN(c.hidden_act, Text(json, "hidden_act", origin, c.hidden_act));
  STRIDER_ASSIGN_OR_RETURN(
      c.router_activation,
      Text(json, "moe_router_activation_func", origin, c.router_activation));
  STRIDER_ASSIGN_OR_RETURN(
      c.renormalize,
      Flag(json, json.contains("moe_renormalize") ? "moe_renormalize" : "norm_topk_prob", origin,
           c.renormalize));
  STRIDER_ASSIGN_OR_RETURN(c.routed_scaling_factor, Number(json, "routed_scaling_factor", origin,
                                                           c.routed_scaling_factor));
  STRIDER_ASSIGN_OR_RETURN(c.use_grouped_topk,
                           Flag(json, "use_grouped_topk", origin, c.use_grouped_topk));
  STRIDER_ASSIGN_OR_RETURN(c.num_expert_group, Integer(json, "num_expert_group", origin, 1));
  STRIDER_ASSIGN_OR_RETURN(c.topk_group, Integer(json, "topk_group", origin, 1));
  STRIDER_ASSIGN_OR_RETURN(c.num_key_value_heads, Integer(json, "num_key_value_heads", origin, 0));
  STRIDER_ASSIGN_OR_RETURN(c.attention_bias,
                           Flag(json, "attention_bias", origin, c.attention_bias));
  STRIDER_ASSIGN_OR_RETURN(c.mla_use_nope, Flag(json, "mla_use_nope", origin, c.mla_use_nope));
  STRIDER_ASSIGN_OR_RETURN(c.mla_use_output_gate,
                           Flag(json, "mla_use_output_gate", origin, c.mla_use_output_gate));
  STRIDER_ASSIGN_OR_RETURN(c.use_full_rank_gate,
                           Flag(json, "use_full_rank_gate", origin, c.use_full_rank_gate));
  STRIDER_ASSIGN_OR_RETURN(c.attn_res_block_size,
                           Integer(json, "attn_res_block_size", origin, 0));
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (json.contains(key) && json[key].is_string()) {
      c.dtype = json[key].get<std::string>();
      break;
    }
  }
  if (!json.contains("linear_attn_config") || !json["linear_attn_config"].is_object()) {
    return Status::InvalidArgument(
        fmt::format("{}: missing field 'linear_attn_config' (the KDA layers)", origin));
  }
  const Json& linear = json["linear_attn_config"];
  const std::string linear_origin = origin + ": linear_attn_config";
  STRIDER_ASSIGN_OR_RETURN(c.kda_heads, Integer(linear, "num_heads", linear_origin));
  STRIDER_ASSIGN_OR_RETURN(c.kda_head_dim, Integer(linear, "head_dim", linear_origin));
  STRIDER_ASSIGN_OR_RETURN(c.kda_conv_width,
                           Integer(linear, "short_conv_kernel_size", linear_origin));
  STRIDER_ASSIGN_OR_RETURN(std::vector<int64_t> kda_layers,
                           LayerList(linear, "kda_layers", origin));
  STRIDER_ASSIGN_OR_RETURN(std::vector<int64_t> full_layers,
                           LayerList(linear, "full_attn_layers", origin));
  // Every layer in exactly one list, numbered 1..num_hidden_layers.
  std::vector<int> seen(c.num_hidden_layers, 0);
  c.kda.assign(c.num_hidden_layers, false);
  for (const auto* list : {&kda_layers, &full_layers}) {
    for (int64_t layer : *list) {
      if (layer < 1 || layer > c.num_hidden_layers) {
        return Status::InvalidArgument(fmt::format(
            "{}: linear_attn_config names layer {}, outside 1..{} (the lists are 1-based)", origin,
            layer, c.num_hidden_layers));
      }
      ++seen[layer - 1];
      if (list == &kda_layers) c.kda[layer - 1] = true;
    }
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (seen[i] != 1) {
      return Status::InvalidArgument(fmt::format(
          "{}: layer {} (1-based) appears {} times in linear_attn_config's kda_layers and "
          "full_attn_layers, expected once",
          origin, i + 1, seen[i]));
    }
  }
  return c;
}

const std::vector<KimiTensorRule>& KimiLinearTensorTable() { return Table(); }

const std::vector<StriderOnlyParameter>& StriderParametersWithoutKimiCounterpart() {
  static const auto* list = new std::vector<StriderOnlyParameter>{
      {"residual_queries",
       "attention residuals (Kimi K3's attn_res_block_size): no published tensor name is known "
       "yet; Kimi Linear has plain residuals (attention_residuals: false)"},
      {"layers.{L}.incremental.gate",
       "a full-rank KDA output gate (Kimi K3's use_full_rank_gate): no published tensor name is "
       "known yet; Kimi Linear's is low rank (gate_rank: head_dim)"},
      {"layers.{L}.experts.latent_down, latent_norm, latent_up", kLatentExperts},
      {"vision.*", "native vision input: Kimi Linear is text only (vision.enabled: false)"},
      {"value_head.*", "the learner's value head: not part of a published checkpoint; an "
                       "import starts it at zero and an export leaves it out"},
  };
  return *list;
}

int64_t KimiTensor::Count() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

std::vector<KimiTensor> KimiLinearTensors(const KimiLinearConfig& c) {
  std::vector<KimiTensor> out;
  auto add = [&](const KimiTensorRule& rule, int64_t layer, int64_t expert) {
    KimiTensor t;
    t.hf_name = Substitute(rule.hf, layer, expert);
    if (!rule.strider.empty()) t.strider_name = Substitute(rule.strider, layer, expert);
    t.shape = rule.shape(c);
    t.rule = &rule;
    out.push_back(std::move(t));
  };
  const auto& table = Table();
  for (const KimiTensorRule& rule : table) {
    if (rule.part != KimiPart::kModel || rule.hf != "model.embed_tokens.weight") continue;
    add(rule, 0, 0);
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool moe = c.IsMoeLayer(i);
    for (const KimiTensorRule& rule : table) {
      bool applies = false;
      switch (rule.part) {
        case KimiPart::kModel:
          break;
        case KimiPart::kLayer:
          applies = true;
          break;
        case KimiPart::kKda:
          applies = c.kda[i];
          break;
        case KimiPart::kMla:
          applies = !c.kda[i];
          break;
        case KimiPart::kMlaFullQuery:
          applies = !c.kda[i] && c.q_lora_rank == 0;
          break;
        case KimiPart::kMlaLowRankQuery:
          applies = !c.kda[i] && c.q_lora_rank > 0;
          break;
        case KimiPart::kMlaOutputGate:
          applies = !c.kda[i] && c.mla_use_output_gate;
          break;
        case KimiPart::kDenseMlp:
          applies = !moe;
          break;
        case KimiPart::kMoe:
          applies = moe;
          break;
        case KimiPart::kSharedExpert:
          applies = moe && c.num_shared_experts > 0;
          break;
        case KimiPart::kRoutedExpert:
          if (moe) {
            for (int64_t e = 0; e < c.num_experts; ++e) add(rule, i, e);
          }
          break;
      }
      if (applies) add(rule, i, 0);
    }
  }
  for (const KimiTensorRule& rule : table) {
    if (rule.part != KimiPart::kModel || rule.hf == "model.embed_tokens.weight") continue;
    if (rule.hf == "lm_head.weight" && c.tie_word_embeddings) continue;
    add(rule, 0, 0);
  }
  return out;
}

}  // namespace strider
