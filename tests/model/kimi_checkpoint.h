// A tiny Kimi Linear checkpoint in the Hugging Face layout (config.json, bf16 safetensors shards
// and their index), written from the import's own tensor table so it holds exactly the tensors
// a published checkpoint of that config does: for tests of the import, in-process
// (tests/model/hf_import_test.cc) and through `strider model import`
// (tests/integration/actor_chat_format_test.cc).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/model/hf_kimi_linear.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "tests/file_contents.h"

namespace strider::testing {

// KDA, KDA, MLA, KDA, MLA (1-based 3 and 5 full attention); one dense layer; 8 experts, 2
// active, one shared; grouped top-k over 2 groups; tied embeddings. Everything the importer
// takes (no rotary MLA, no attention bias, one KV head per query head, every layer after the
// dense one sparse).
inline constexpr const char* kTinyKimiConfig = R"({
  "model_type": "kimi_linear", "vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 5,
  "intermediate_size": 48, "moe_intermediate_size": 16, "num_experts": 8,
  "num_experts_per_token": 2, "num_shared_experts": 1, "first_k_dense_replace": 1,
  "moe_layer_freq": 1, "num_attention_heads": 2, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
  "v_head_dim": 6, "kv_lora_rank": 12, "q_lora_rank": null, "tie_word_embeddings": true,
  "rms_norm_eps": 1e-05, "dtype": "bfloat16", "hidden_act": "silu",
  "moe_router_activation_func": "sigmoid", "moe_renormalize": true,
  "routed_scaling_factor": 2.446, "use_grouped_topk": true, "num_expert_group": 2,
  "topk_group": 1, "mla_use_nope": true, "model_max_length": 4096,
  "linear_attn_config": {"kda_layers": [1, 2, 4], "full_attn_layers": [3, 5], "num_heads": 2,
                         "head_dim": 8, "short_conv_kernel_size": 4}})";

// Round to nearest even, as torch converts fp32 to bf16.
inline uint16_t Bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// `config_json` as dir/config.json and random weights for it in the published layout: bf16,
// A_log and dt_bias fp32; norms near one; shards of about 20 kB, so even a tiny checkpoint is
// sharded as the published ones are. The same config gives the same bytes.
inline Status WriteKimiCheckpoint(const std::string& dir, const std::string& config_json) {
  std::filesystem::create_directories(dir);
  WriteFileBytes(dir + "/config.json", config_json);
  STRIDER_ASSIGN_OR_RETURN(KimiLinearConfig config,
                           ParseKimiLinearConfig(config_json, "config.json"));
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<TensorView> views;
  const std::vector<KimiTensor> tensors = KimiLinearTensors(config);
  buffers.reserve(tensors.size());
  for (const KimiTensor& t : tensors) {
    const bool fp32 = t.hf_name.find("A_log") != std::string::npos ||
                      t.hf_name.find("dt_bias") != std::string::npos;
    const bool norm = t.hf_name.find("norm") != std::string::npos;
    const int64_t fan_in = t.shape.back();
    std::vector<uint8_t>& bytes = buffers.emplace_back(t.Count() * (fp32 ? 4 : 2));
    for (int64_t i = 0; i < t.Count(); ++i) {
      float v = normal(random);
      if (norm) {
        v = 1.0f + 0.1f * v;
      } else if (t.hf_name.find("A_log") != std::string::npos) {
        v = 0.3f * v;
      } else if (t.hf_name.find("dt_bias") != std::string::npos) {
        v = -2.0f + 0.5f * v;
      } else if (t.hf_name.find("e_score_correction_bias") != std::string::npos) {
        v = 0.01f * v;
      } else {
        // Half the scale that keeps activations at unit size: the regime of trained weights
        // (1/sqrt(fan_in) at d = 32 is several times Kimi Linear's initializer_range).
        v *= 0.5f / std::sqrt(static_cast<float>(fan_in));
      }
      if (fp32) {
        std::memcpy(bytes.data() + 4 * i, &v, 4);
      } else {
        const uint16_t h = Bf16(v);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    views.push_back(
        {t.hf_name, fp32 ? DType::kF32 : DType::kBF16, t.shape, bytes.data(), bytes.size()});
  }
  return WriteShardedSafetensors(dir, views, 20000, {{"format", "pt"}}).status();
}

// A tokenization_kimi.py that assigns `pattern` as the published file does: `pat_str` is the
// raw string literals joined by "|", here the pattern's first alternative ([\p{Han}]+) and the
// rest. Only the assignment, which is all an import reads.
inline std::string KimiTokenizationPy(const std::string& pattern) {
  const size_t bar = pattern.find("]+|");
  const size_t split = bar == std::string::npos ? pattern.size() : bar + 2;
  std::string literals = "                r\"\"\"" + pattern.substr(0, split) + "\"\"\",\n";
  if (split < pattern.size()) {
    literals += "                r\"\"\"" + pattern.substr(split + 1) + "\"\"\",\n";
  }
  return "class TikTokenTokenizer:\n    def __init__(self):\n"
         "        pat_str = \"|\".join(\n            [\n" +
         literals + "            ]\n        )\n";
}

}  // namespace strider::testing
