// The model-level options a published checkpoint needs (docs/model_math.md#model-level-options):
// plain residual connections in place of attention residuals, an output head tied to the
// embedding table, an explicit per-layer pattern, a configured RMSNorm epsilon and no vision.
// Each holds the two-path contract and its own invariant.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <set>

#include "common/model/config.h"
#include "common/model/model.h"
#include "common/model/ops.h"
#include "common/model/parameters.h"
#include "common/model/two_path_check.h"
#include "common/tokenizer.h"
#include "tests/model/model_helpers.h"
#include "tests/scratch_dir.h"
#include "tests/shipped_config.h"

namespace strider {
namespace {

using testing::FindTensor;
using testing::MakeModel;
using testing::RandomTokens;

// Kimi Linear's model-level shape on tiny's dimensions: KDA, KDA, MLA, KDA, MLA.
ModelConfig PublishedStyleConfig() {
  ModelConfig c = testing::ShippedModelConfig("tiny");
  c.layers = 5;
  c.layer_pattern = "IIGIG";
  c.last_layer = "";
  c.attention_residuals = false;
  c.tie_embeddings = true;
  c.norm_epsilon = 1e-5;
  c.vision.enabled = false;
  return c;
}

TEST(ModelOptions, ParameterTableDropsResidualQueriesAndTheOutputHead) {
  const ModelConfig c = PublishedStyleConfig();
  std::set<std::string> names;
  for (const ParameterSpec& spec : ModelParameterSpecs(c)) names.insert(spec.name);
  EXPECT_FALSE(names.count("residual_queries"));
  EXPECT_FALSE(names.count("output"));
  EXPECT_TRUE(names.count("embedding"));
  EXPECT_FALSE(names.count("vision.patch_projection"));
  EXPECT_TRUE(names.count("layers.2.latent.kv_down"));
  EXPECT_TRUE(names.count("layers.3.incremental.query"));
  const std::vector<char> kinds = c.LayerKinds();
  EXPECT_EQ(std::string(kinds.begin(), kinds.end()), "IIGIG");

  ModelConfig defaults = testing::ShippedModelConfig("tiny");
  const double tied = CountParameters(c).total;
  ModelConfig untied = c;
  untied.tie_embeddings = false;
  EXPECT_EQ(CountParameters(untied).total - tied,
            static_cast<double>(c.vocabulary * c.width));  // the head, counted once when tied
  EXPECT_TRUE(defaults.attention_residuals);
  EXPECT_FALSE(defaults.tie_embeddings);
}

TEST(ModelOptions, TwoPathsAgreeInFp32WithPlainResidualsAndTiedEmbeddings) {
  std::unique_ptr<Model> model = MakeModel(PublishedStyleConfig(), 11);
  ASSERT_NE(model, nullptr);
  Result<TwoPathReport> report = CheckTwoPaths(*model, RandomTokens(2, 300, 12));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_LE(report->max_abs_logprob_diff, 1e-5);
  EXPECT_GE(report->routing_agreement, 0.999);

  ModelConfig untied = PublishedStyleConfig();
  untied.tie_embeddings = false;
  model = MakeModel(untied, 13);
  ASSERT_NE(model, nullptr);
  report = CheckTwoPaths(*model, RandomTokens(1, 200, 14), std::vector<int64_t>(200, 1));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_LE(report->max_abs_logprob_diff, 1e-5);
}

// With every sublayer's output projection at zero a plain residual stream is the embedding
// itself, on both paths: final hidden = RMSNorm(E[tokens]) * final_norm, and the tied head
// gives logits = hidden E^T. Attention residuals would mix in the (zero) sublayer sums and
// scale the embedding, so this tells the two residual forms apart.
TEST(ModelOptions, PlainResidualStreamIsTheEmbeddingWhenSublayersAreSilent) {
  std::unique_ptr<Model> model = MakeModel(PublishedStyleConfig(), 21);
  ASSERT_NE(model, nullptr);
  for (const auto& [name, tensor] : model->tensors()) {
    for (const char* suffix : {".output", ".down", ".latent_up", ".shared_down"}) {
      const std::string s(suffix);
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          name.rfind("layers.", 0) == 0) {
        tensor.detach().zero_();
      }
    }
  }
  const at::Tensor tokens = RandomTokens(1, 40, 22);
  ForwardOptions options;
  options.return_hidden = true;
  Result<ForwardOutput> training = model->Forward({tokens}, options);
  ASSERT_TRUE(training.ok()) << training.status().ToString();
  const at::Tensor embedding = FindTensor(*model, "embedding");
  const at::Tensor expected_hidden =
      model::RmsNorm(at::embedding(embedding, tokens), FindTensor(*model, "final_norm"), 1e-5);
  EXPECT_LE((training->hidden - expected_hidden).abs().max().item<double>(), 1e-6);
  EXPECT_LE(
      (training->logits - at::matmul(expected_hidden, embedding.t())).abs().max().item<double>(),
      1e-5);
  Result<InferenceState> state = model->NewState(1);
  ASSERT_TRUE(state.ok());
  Result<ForwardOutput> inference = model->Append(&*state, {tokens}, options);
  ASSERT_TRUE(inference.ok()) << inference.status().ToString();
  EXPECT_LE((inference->hidden - expected_hidden).abs().max().item<double>(), 1e-6);

  ModelConfig mixed = PublishedStyleConfig();
  mixed.attention_residuals = true;
  std::unique_ptr<Model> other = MakeModel(mixed, 21);
  ASSERT_NE(other, nullptr);
  for (const auto& [name, tensor] : other->tensors()) {
    if (name.rfind("layers.", 0) == 0 && name.find("output") != std::string::npos) {
      tensor.detach().zero_();
    }
  }
  Result<ForwardOutput> mixed_out = other->Forward({tokens}, options);
  ASSERT_TRUE(mixed_out.ok());
  EXPECT_GT((mixed_out->hidden - model::RmsNorm(at::embedding(FindTensor(*other, "embedding"), tokens),
                                                FindTensor(*other, "final_norm"), 1e-5))
                .abs()
                .max()
                .item<double>(),
            1e-3);
}

// The tied head is the embedding table itself: a step on one is a step on the other, and a
// checkpoint of the tied model holds no `output` (one with it is refused by name).
TEST(ModelOptions, TiedHeadSharesTheEmbeddingThroughSaveAndLoad) {
  std::unique_ptr<Model> model = MakeModel(PublishedStyleConfig(), 31);
  ASSERT_NE(model, nullptr);
  const at::Tensor tokens = RandomTokens(1, 16, 32);
  ForwardOptions options;
  options.return_hidden = true;
  FindTensor(*model, "embedding").detach().mul_(2.0);
  Result<ForwardOutput> after = model->Forward({tokens}, options);
  ASSERT_TRUE(after.ok());
  // The head reads the table as it is now, after the in-place step.
  EXPECT_LE((after->logits - at::matmul(after->hidden, FindTensor(*model, "embedding").t()))
                .abs()
                .max()
                .item<double>(),
            1e-5);

  testing::TempDir dir;
  ASSERT_TRUE(model->Save(dir.Sub("tied.safetensors")).ok());
  Result<SafetensorsContents> saved = ReadSafetensors(dir.Sub("tied.safetensors"));
  ASSERT_TRUE(saved.ok());
  EXPECT_FALSE(saved->tensors.count("output"));
  EXPECT_FALSE(saved->tensors.count("residual_queries"));
  Result<std::unique_ptr<Model>> loaded =
      Model::Load(PublishedStyleConfig(), dir.Sub("tied.safetensors"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  Result<ForwardOutput> again = (*loaded)->Forward({tokens}, options);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(at::equal(again->logits, after->logits));

  ModelConfig untied = PublishedStyleConfig();
  untied.tie_embeddings = false;
  std::unique_ptr<Model> separate = MakeModel(untied, 33);
  ASSERT_TRUE(separate->Save(dir.Sub("untied.safetensors")).ok());
  Status refused = Model::Load(PublishedStyleConfig(), dir.Sub("untied.safetensors")).status();
  EXPECT_NE(refused.message().find("'output' is not part of the model config"), std::string::npos)
      << refused.ToString();
}

// The model config a YAML text describes, read through the config file loader.
Result<ModelConfig> LoadModelYaml(const std::string& text) {
  testing::TempDir dir;
  const std::string path = dir.Sub("m.yaml");
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return Status::Internal("cannot write " + path);
  std::fputs(text.c_str(), file);
  std::fclose(file);
  return LoadModelConfig(path);
}

TEST(ModelOptions, YamlKeysReadAndDefaultsStayToday) {
  Result<ModelConfig> c = LoadModelYaml(
      "model:\n  vocabulary: 300\n  width: 16\n  layers: 3\n  layer_pattern: IGI\n"
      "  attention_residuals: false\n  tie_embeddings: true\n  norm_epsilon: 1.0e-5\n"
      "  vision:\n    enabled: false\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->attention_residuals);
  EXPECT_TRUE(c->tie_embeddings);
  EXPECT_EQ(c->norm_epsilon, 1e-5);
  EXPECT_FALSE(c->vision.enabled);
  const std::vector<char> kinds = c->LayerKinds();
  EXPECT_EQ(std::string(kinds.begin(), kinds.end()), "IGI");
}

// Images are the byte format's placeholder ids, which a model's own vocabulary spends on text.
TEST(ModelOptions, VisionWithItsOwnTokenizerIsRefusedByName) {
  Result<ModelConfig> c = LoadModelYaml(
      "model:\n  vocabulary: 300\n  width: 16\n  layers: 3\n  layer_pattern: IGI\n"
      "  tokenizer:\n    file: tokenizer.json\n  vision:\n    enabled: true\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model.vision.enabled"), std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace strider
