// An imported Kimi Linear checkpoint runs as a Strider model (common/model/hf_checkpoint.h):
// the weights an import writes load with the config it writes, the training and inference paths
// agree within 1e-5 in fp32 on the imported config, the in-memory conversion behind
// `model eval --from-hf` gives the same log-probs as the files, and export from the loaded
// model's own Save, whole or as expert-parallel ranks' shards, gives the published bf16 tensors
// back.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/model/hf_checkpoint.h"
#include "common/model/model.h"
#include "common/model/two_path_check.h"
#include "tests/file_contents.h"
#include "tests/model/kimi_checkpoint.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::kTinyKimiConfig;
using strider::testing::ReadFileBytes;
using strider::testing::WriteFileBytes;
using strider::testing::WriteKimiCheckpoint;

at::Tensor RandomTokens(int64_t batch, int64_t length, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randint(0, 320, {batch, length}, generator, at::kLong);
}

TEST(HfImport, ImportedModelHoldsTheTwoPathContractAndExportsBack) {
  ConfigureRuntime(2);
  testing::TempDir dir;
  const std::string source = dir.Sub("kimi_tiny");
  const Status written = WriteKimiCheckpoint(source, kTinyKimiConfig);
  ASSERT_TRUE(written.ok()) << written.ToString();
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
  const std::string kimi_py = testing::KimiTokenizationPy(pattern);
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
