// An imported Kimi Linear checkpoint runs as a Strider model (common/model/hf_checkpoint.h):
// the weights an import writes load with the config it writes, the training and inference paths
// agree within 1e-5 in fp32 on the imported config, the in-memory conversion behind
// `model eval --from-hf` gives the same log-probs as the files, and export from the loaded
// model's own Save, whole or as expert-parallel ranks' shards, gives the published bf16 tensors
// back.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "common/model/hf_checkpoint.h"
#include "common/model/model.h"
#include "common/model/two_path_check.h"
#include "tests/file_contents.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::ReadFileBytes;
using strider::testing::WriteFileBytes;

// KDA, KDA, MLA, KDA, MLA (1-based 3 and 5 full attention); one dense layer; 8 experts, 2
// active, one shared; grouped top-k over 2 groups; tied embeddings.
constexpr const char* kConfig = R"({
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

uint16_t Bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Random weights in the published layout: bf16, A_log and dt_bias fp32; norms near one.
void WriteCheckpoint(const std::string& dir) {
  std::filesystem::create_directories(dir);
  WriteFileBytes(dir + "/config.json", kConfig);
  Result<KimiLinearConfig> config = ParseKimiLinearConfig(kConfig, "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<TensorView> views;
  const std::vector<KimiTensor> tensors = KimiLinearTensors(*config);
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
  ASSERT_TRUE(WriteShardedSafetensors(dir, views, 20000, {{"format", "pt"}}).ok());
}

at::Tensor RandomTokens(int64_t batch, int64_t length, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randint(0, 320, {batch, length}, generator, at::kLong);
}

TEST(HfImport, ImportedModelHoldsTheTwoPathContractAndExportsBack) {
  ConfigureRuntime(2);
  testing::TempDir dir;
  const std::string source = dir.Sub("kimi_tiny");
  WriteCheckpoint(source);
  Result<HfImportReport> report = ImportHfCheckpoint(source, dir.Sub("imported"));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  Result<ModelConfig> config = LoadModelConfig(report->config_path);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->tie_embeddings);
  EXPECT_FALSE(config->attention_residuals);
  EXPECT_EQ(config->layer_pattern, "IIGIG");
  Result<std::unique_ptr<Model>> model = Model::Load(*config, report->weights_path);
  ASSERT_TRUE(model.ok()) << model.status().ToString();

  Result<TwoPathReport> two = CheckTwoPaths(**model, RandomTokens(2, 200, 3));
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_LE(two->max_abs_logprob_diff, 1e-5);
  EXPECT_GE(two->routing_agreement, 0.99);

  // In fp64 the two paths agree to rounding: any difference in fp32 is precision, not math.
  Result<std::unique_ptr<Model>> wide = Model::Load(*config, report->weights_path);
  ASSERT_TRUE(wide.ok());
  ASSERT_TRUE((*wide)->ConvertTo(at::kDouble).ok());
  Result<TwoPathReport> two64 = CheckTwoPaths(**wide, RandomTokens(2, 200, 3));
  ASSERT_TRUE(two64.ok()) << two64.status().ToString();
  EXPECT_LE(two64->max_abs_logprob_diff, 1e-10);

  // The in-memory conversion (model eval --from-hf) is the same model.
  Result<HfModelWeights> loaded = LoadHfCheckpoint(source);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  Result<std::unique_ptr<Model>> in_memory = Model::LoadFromBytes(loaded->config, loaded->weights);
  ASSERT_TRUE(in_memory.ok()) << in_memory.status().ToString();
  const at::Tensor tokens = RandomTokens(1, 64, 4);
  Result<ForwardOutput> a = (*model)->Forward({tokens});
  Result<ForwardOutput> b = (*in_memory)->Forward({tokens});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(at::equal(a->logits, b->logits));
  EXPECT_TRUE(at::isfinite(a->logits).all().item<bool>());

  // What the model itself saves (a learner's checkpoint) exports to the published tensors.
  ASSERT_TRUE((*model)->Save(dir.Sub("saved.safetensors")).ok());
  Result<HfExportReport> exported = ExportStriderWeightsToHf(
      *config, {dir.Sub("saved.safetensors")}, report->layout_directory, dir.Sub("exported"));
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  Result<HfCheckpoint> original = OpenHfCheckpoint(source);
  ASSERT_TRUE(original.ok());
  for (const std::string& shard : original->shards) {
    EXPECT_EQ(ReadFileBytes(dir.Sub("exported/") + shard), ReadFileBytes(source + "/" + shard))
        << shard;
  }

  // An expert-parallel learner's ranks save their own slices of the routed experts
  // (Model::ShardExperts, metadata expert_shard); the export gathers them back.
  std::vector<std::string> ranks;
  for (int64_t rank = 0; rank < 2; ++rank) {
    Result<std::unique_ptr<Model>> part = Model::Load(*config, report->weights_path);
    ASSERT_TRUE(part.ok());
    ASSERT_TRUE((*part)->ShardExperts(rank, 2).ok());
    ranks.push_back(dir.Sub("rank" + std::to_string(rank) + ".safetensors"));
    ASSERT_TRUE((*part)->Save(ranks.back()).ok());
  }
  Result<HfExportReport> gathered =
      ExportStriderWeightsToHf(*config, ranks, report->layout_directory, dir.Sub("exported_ep"));
  ASSERT_TRUE(gathered.ok()) << gathered.status().ToString();
  for (const std::string& shard : original->shards) {
    EXPECT_EQ(ReadFileBytes(dir.Sub("exported_ep/") + shard), ReadFileBytes(source + "/" + shard))
        << shard;
  }
}

// An import names the tokenizer the checkpoint came with in the model.yaml it writes: a
// tokenizer.json as it is, a Kimi tiktoken.model with the split pattern its tokenization_kimi.py
// assigns (the raw literals joined by "|"), the chat template from tokenizer_config.json.
TEST(HfImport, NamesTheCheckpointsTokenizerInTheConfig) {
  namespace fs = std::filesystem;
  const char* root = std::getenv("STRIDER_SOURCE_DIR");  // set by ctest
  const std::string source_dir = root != nullptr ? root : ".";
  const std::string fixture = source_dir + "/tests/model/hf_reference/kimi_full_query_f32";
  const std::string data = source_dir + "/tests/tokenizer/data";
  const nlohmann::json meta = nlohmann::json::parse(ReadFileBytes(data + "/ranks_meta.json"));
  const std::string pattern = meta.at("kimi_pattern").get<std::string>();
  const size_t split = pattern.find("]+|") + 2;  // after the first alternative, [\p{Han}]+
  ASSERT_NE(split, std::string::npos + 2);
  const std::string kimi_py =
      "class TikTokenTokenizer:\n    def __init__(self):\n"
      "        pat_str = \"|\".join(\n            [\n"
      "                r\"\"\"" +
      pattern.substr(0, split) +
      "\"\"\",\n"
      "                r\"\"\"" +
      pattern.substr(split + 1) +
      "\"\"\",\n"
      "            ]\n        )\n";
  struct Case {
    std::vector<std::pair<std::string, std::string>> files;  // name, contents
    std::string file, format, pattern;
  };
  const std::string template_config = R"({"chat_template": "{{ messages[0].content }}"})";
  const std::vector<Case> cases = {
      {{{"tokenizer.json", ReadFileBytes(data + "/bpe_gpt2.json")},
        {"tokenizer_config.json", template_config}},
       "hf/tokenizer.json",
       "auto",
       ""},
      {{{"tiktoken.model", ReadFileBytes(data + "/ranks.tiktoken")},
        {"tokenization_kimi.py", kimi_py},
        {"tokenizer_config.json", template_config}},
       "hf/tiktoken.model",
       "tiktoken",
       pattern},
  };
  for (const Case& c : cases) {
    testing::TempDir dir;
    const std::string source = dir.path() + "/checkpoint";
    fs::create_directories(source);
    for (const auto& entry : fs::directory_iterator(fixture)) {
      fs::copy_file(entry.path(), source + "/" + entry.path().filename().string());
    }
    for (const auto& [name, contents] : c.files) WriteFileBytes(source + "/" + name, contents);
    Result<HfImportReport> report = ImportHfCheckpoint(source, dir.path() + "/out");
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->tokenizer_file, c.file);
    Result<ModelConfig> config = LoadModelConfig(report->config_path);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    const tokenizer::TokenizerConfig& t = config->tokenizer;
    EXPECT_EQ(fs::path(t.file), fs::path(dir.path() + "/out/" + c.file));
    EXPECT_TRUE(fs::exists(t.file)) << t.file;
    EXPECT_EQ(t.format, c.format);
    EXPECT_EQ(t.pattern, c.pattern);
    EXPECT_EQ(fs::path(t.chat_template), fs::path(dir.path() + "/out/hf/tokenizer_config.json"));
  }
  // Without tokenizer files the import keeps the byte tokenizer and says so.
  testing::TempDir dir;
  Result<HfImportReport> report = ImportHfCheckpoint(fixture, dir.path() + "/out");
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->tokenizer_file.empty());
  EXPECT_NE(report->tokenizer_note.find("byte tokenizer"), std::string::npos);
  Result<ModelConfig> config = LoadModelConfig(report->config_path);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_FALSE(config->tokenizer.enabled());
}

}  // namespace
}  // namespace strider
