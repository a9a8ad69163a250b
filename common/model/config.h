// The model's configuration: every dimension of the hybrid sparse MoE transformer
// (docs/model_math.md).
//
// Plain structs with in-class defaults; LoadModelConfig reads them strictly from YAML and
// ValidateModelConfig checks the relations between fields. No LibTorch here: parameter counting
// and cache accounting run on the reference config without allocating it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/tokenizer_config.h"

namespace strider {

class ConfigReader;

// Incremental attention: gated delta rule, per-channel decay (docs/model_math.md#gated-delta-rule).
struct IncrementalAttentionConfig {
  int64_t heads = 2;
  int64_t key_dim = 32;        // d_k
  int64_t value_dim = 32;      // d_v
  int64_t conv_width = 4;      // causal depthwise convolution on q, k, v
  int64_t decay_rank = 16;     // rank of W_up W_down in the decay gate
  // The decay gate's function of z = W_up W_down x + b: "sigmoid", g = g_min sigmoid(exp(A_h) z),
  // bounded below by min_log_decay (flash-linear-attention's lower-bound gate); "softplus",
  // g = -exp(A_h) softplus(z), unbounded (Kimi Linear: A_log, dt_bias, decay_rank = head_dim).
  std::string decay_gate = "sigmoid";
  double min_log_decay = -5.0; // g_min: g = g_min * sigmoid(...) in (g_min, 0)
  int64_t chunk_size = 64;     // training and prefill kernel chunk length
  // Rank of the output gate: 0 for a full-rank `gate`; r > 0 for gate_up gate_down through r
  // channels (Kimi Linear's g_b_proj g_a_proj, r = head_dim).
  int64_t gate_rank = 0;
  // Epsilon of the gated output norm; 0 takes the model's norm_epsilon. vLLM's KDA layer uses
  // 1e-5 whatever rms_norm_eps says, transformers' kimi_linear rms_norm_eps.
  double output_norm_epsilon = 0.0;
};

// Gated multi-head latent attention (docs/model_math.md#latent-attention).
struct LatentAttentionConfig {
  int64_t heads = 2;
  // Rank of the query compression; 0 for a full-rank query projection (Kimi Linear's q_proj,
  // q_lora_rank null) in place of query_down, query_norm and query_up.
  int64_t query_rank = 32;
  int64_t kv_rank = 16;        // d_c: cached compressed keys and values
  int64_t nope_dim = 16;       // per-head key part computed from c_kv
  int64_t rope_dim = 8;        // shared key part, cached; unrotated in the hybrid
  int64_t value_dim = 16;      // per-head value width; may differ from nope_dim
  // The sigmoid gate on the heads' output before W_o (Kimi K3's mla_use_output_gate); Kimi
  // Linear's layer has none.
  bool output_gate = true;
  // Epsilon of the query and kv normalisations; 0 takes the model's norm_epsilon, as the serving
  // engines do (rms_norm_eps). transformers' kimi_linear uses 1e-6 whatever rms_norm_eps says.
  double norm_epsilon = 0.0;
};

// Feed-forward layers: dense SiTU-GLU for the first layers, latent sparse experts after
// (docs/model_math.md#sparse-experts-and-routing). The options after the dimensions express Kimi
// Linear's feed-forward (SwiGLU, full-width experts, its router); their defaults are Strider's.
struct FeedForwardConfig {
  int64_t dense_layers = 1;        // the first layers use a dense feed-forward
  int64_t dense_hidden = 128;
  // Routed experts in a shared latent space (latent_down, latent_norm, latent_up around them);
  // false: full-width experts on x as Kimi Linear's w1, w3, w2, and no latent projections.
  bool latent_experts = true;
  int64_t latent_width = 32;       // l: routed experts work in this shared latent space
  int64_t expert_hidden = 32;
  int64_t routed_experts = 8;      // n
  int64_t experts_per_token = 2;   // k
  int64_t shared_experts = 1;      // full width, always active
  int64_t shared_hidden = 64;
  // The gated activation of every feed-forward block (dense, shared, routed): "situ" (SiTU-GLU)
  // or "silu" (SwiGLU, silu(a) * b: Kimi Linear's hidden_act).
  std::string activation = "situ";
  double gate_cap = 4.0;           // SiTU c1
  double up_cap = 25.0;            // SiTU c2
  // Router scores from the logits W_r x: "sigmoid" or "softmax" (moe_router_activation_func).
  std::string router_activation = "sigmoid";
  bool renormalize = true;         // chosen scores / their sum (moe_renormalize)
  double renormalize_epsilon = 0;  // added to that sum; transformers' kimi_linear adds 1e-20
  double routed_scaling_factor = 1.0;  // multiplies the routed experts' weights
  // Grouped top-k (DeepSeek-V3's, Kimi's num_expert_group and topk_group): the n experts form
  // `expert_groups` groups of consecutive ids, each token keeps the `groups_per_token` groups
  // with the largest sum of their two best biased scores, and picks its k experts there.
  int64_t expert_groups = 1;
  int64_t groups_per_token = 1;
  // Whether UpdateRoutingBalance moves the router bias (quantile balancing); false holds it as
  // loaded (an imported e_score_correction_bias). The bias takes part in selection either way.
  bool quantile_balancing = true;
};

// Native vision input by patch embedding (docs/model_math.md#vision-input).
struct VisionConfig {
  bool enabled = true;
  int64_t patch_size = 4;       // P: an image is cut into P x P patches
  int64_t max_grid_rows = 8;    // largest image is max_grid_rows * P pixels high
  int64_t max_grid_columns = 8;
  int64_t channels = 3;
};

struct ModelConfig {
  std::string name = "tiny";
  int64_t vocabulary = 288;
  int64_t width = 64;              // d
  int64_t layers = 4;
  // Layer kinds, I for incremental and G for gated latent attention. Repeated cyclically to
  // `layers` unless it is exactly `layers` long; `last_layer` then overrides the final one
  // (the reference ends with two latent layers: ...IIIG G).
  std::string layer_pattern = "IIIG";
  std::string last_layer;          // "", "I" or "G"
  // Attention residuals (docs/model_math.md#attention-residuals): every sublayer reads a
  // learned mix of the earlier outputs, sealed in blocks of `residual_block` layers. false: plain
  // residual connections, h <- h + sublayer(norm(h)), and no residual_queries (Kimi Linear).
  bool attention_residuals = true;
  int64_t residual_block = 2;      // attention residuals: layers per block
  // The output head reuses the embedding table (logits = h E^T) instead of its own `output`.
  bool tie_embeddings = false;
  int64_t context = 4096;          // longest sequence the model is meant for
  double init_std = 0.02;
  double norm_epsilon = 1e-6;
  std::string cache_dtype = "float32";   // latent cache storage: float32 | bfloat16
  int64_t threads = 0;             // intra-op threads; 0 = all cores
  // Where the weights live and the model computes: cpu, cuda or cuda:N (ValidDeviceName). A
  // command's --device and the device: key of an actor, learner or pretraining config override
  // it; whether the device exists is checked when a model is made (model.h, ResolveDevice).
  std::string device = "cpu";

  IncrementalAttentionConfig incremental;
  LatentAttentionConfig latent;
  FeedForwardConfig feed_forward;
  VisionConfig vision;
  // The model's own tokenizer and chat template (`tokenizer:`, docs/tokenizers.md); none: the
  // byte tokenizer and Strider's transcript format.
  tokenizer::TokenizerConfig tokenizer;

  // Derived: the kind of every layer after pattern expansion ('I' or 'G').
  std::vector<char> LayerKinds() const;
  bool IsMoeLayer(int64_t layer) const { return layer >= feed_forward.dense_layers; }
  int64_t CountLayers(char kind) const;
  int64_t CacheDtypeBytes() const { return cache_dtype == "bfloat16" ? 2 : 4; }
};

Status ValidateModelConfig(const ModelConfig& config, const std::string& origin);

// Whether `name` spells a device the model can be placed on: "cpu", "cuda" or "cuda:N" with N a
// device index. Spelling only: whether that device is present is a LibTorch question.
bool ValidDeviceName(const std::string& name);

// Reads the `model:` section of a YAML file (other top-level sections are left to their
// owners; see LoadModelConfigFromReader).
Result<ModelConfig> LoadModelConfig(const std::string& path);
// Reads `model:` from an open document whose other sections someone else consumes; does not call
// Finish on the root.
Result<ModelConfig> LoadModelConfigFromReader(ConfigReader& root);

}  // namespace strider
