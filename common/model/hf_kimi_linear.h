// Moonshot's Kimi Linear (`model_type: kimi_linear`) as published in the Hugging Face layout:
// its config.json, and one table of its tensor names against Strider's parameter names.
//
// The table (hf_kimi_linear.cc) is the one place that knows the published names, in the manner of
// llama.cpp's tensor maps: each row is a name pattern of the checkpoint ({L} a 0-based layer,
// {E} an expert), the Strider parameter it becomes, its shape as a function of the config, and
// whether the two compute the same thing today. A row whose Strider side is missing or differs
// in its math names what the model does not yet express; import refuses those by name rather
// than guessing a conversion. No LibTorch here: `strider model info --from-hf` counts from it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strider {

// The fields of config.json that shape the tensors and the figures. Layer lists are 1-based in
// the file, as published; `kda` below is 0-based.
struct KimiLinearConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t intermediate_size = 0;      // dense MLP hidden width
  int64_t moe_intermediate_size = 0;  // per routed expert; shared experts are S times this
  int64_t num_experts = 0;
  int64_t num_experts_per_token = 0;
  int64_t num_shared_experts = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t num_attention_heads = 0;  // MLA heads
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t kv_lora_rank = 0;
  int64_t q_lora_rank = 0;     // 0 where the file has null: a full-rank q_proj
  int64_t kda_heads = 0;       // linear_attn_config.num_heads
  int64_t kda_head_dim = 0;    // linear_attn_config.head_dim
  int64_t kda_conv_width = 0;  // linear_attn_config.short_conv_kernel_size
  bool tie_word_embeddings = false;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;
  int64_t max_length = 0;  // model_max_length, else max_position_embeddings; 0 where neither
  std::string dtype = "bfloat16";  // dtype (or torch_dtype) of the published weights
  std::vector<bool> kda;           // per layer: KDA (true) or MLA (false)
  // The feed-forward and router (absent fields take the published defaults).
  std::string hidden_act = "silu";
  std::string router_activation = "sigmoid";  // moe_router_activation_func
  bool renormalize = true;                    // moe_renormalize (transformers: norm_topk_prob)
  double routed_scaling_factor = 1.0;
  bool use_grouped_topk = true;
  int64_t num_expert_group = 1;
  int64_t topk_group = 1;
  // MLA: fields Strider does not model are read so that import can refuse them by name.
  int64_t num_key_value_heads = 0;  // 0 where absent: the same as num_attention_heads
  bool attention_bias = false;
  bool mla_use_nope = true;
  // Kimi K3's fields, the seed's own features: an MLA output gate, a full-rank KDA output gate,
  // and attention residuals in blocks of this many layers (0: none, plain residuals).
  bool mla_use_output_gate = false;
  bool use_full_rank_gate = false;
  int64_t attn_res_block_size = 0;

  bool IsMoeLayer(int64_t layer) const {
    return num_experts > 0 && layer >= first_k_dense_replace &&
           layer % std::max<int64_t>(1, moe_layer_freq) == 0;
  }
  int64_t CountKdaLayers() const;
  int64_t CountMoeLayers() const;
  size_t DtypeBytes() const;  // of `dtype`: 2 for bfloat16/float16, 4 for float32
};

// Reads config.json's text. Refuses a model_type other than kimi_linear (naming it), a missing
// or mistyped field (naming it), and layer lists that do not cover every layer exactly once.
// `origin` names the file in errors.
Result<KimiLinearConfig> ParseKimiLinearConfig(std::string_view json_text,
                                               const std::string& origin);

// Where a row of the table applies.
enum class KimiPart {
  kModel,            // once per model
  kLayer,            // every layer
  kKda,              // KDA layers
  kMla,              // MLA layers
  kMlaFullQuery,     // MLA layers with q_lora_rank null
  kMlaLowRankQuery,  // MLA layers with a q_lora_rank
  kMlaOutputGate,    // MLA layers with mla_use_output_gate (Kimi K3)
  kDenseMlp,         // layers before first_k_dense_replace (and off the MoE frequency)
  kMoe,              // MoE layers, once per layer
  kRoutedExpert,     // MoE layers, once per routed expert
  kSharedExpert,     // MoE layers with num_shared_experts > 0
};

struct KimiTensorRule {
  KimiPart part;
  std::string_view hf;         // "model.layers.{L}.self_attn.q_proj.weight"
  std::string_view strider;    // "layers.{L}.incremental.query"; empty: no counterpart at all
  bool maps;                   // the same computation today (a reshape at most)
  std::string_view component;  // for the figures: embeddings, kda_attention, ...
  std::function<std::vector<int64_t>(const KimiLinearConfig&)> shape;
  std::string_view note;  // why it does not map yet, or the reshape
};

// The table, in the order the published checkpoint lists a layer's tensors.
const std::vector<KimiTensorRule>& KimiLinearTensorTable();

// Strider parameters that no published Kimi Linear tensor fills yet (the other half of the
// gap), as name patterns with the reason.
struct StriderOnlyParameter {
  std::string_view strider;
  std::string_view note;
};
const std::vector<StriderOnlyParameter>& StriderParametersWithoutKimiCounterpart();

// One concrete tensor of a checkpoint of `config`.
struct KimiTensor {
  std::string hf_name;
  std::string strider_name;  // empty where the rule has none
  std::vector<int64_t> shape;
  const KimiTensorRule* rule = nullptr;
  int64_t Count() const;
};

// Every tensor a checkpoint of `config` holds, layer by layer.
std::vector<KimiTensor> KimiLinearTensors(const KimiLinearConfig& config);

}  // namespace strider
