// Strider's Kimi Linear against an independent reference: small random checkpoints made with
// Hugging Face transformers' kimi_linear and written in the published layout, with that
// implementation's per-token log-probs of fixed token sequences (tests/model/hf_reference/:
// make_kimi_fixtures.py says how they were made and with which pinned versions; expected.json
// holds the log-probs). Each checkpoint is read as `strider model eval --from-hf` reads one
// (LoadHfCheckpoint), and both of the model's paths must give the reference's log-probs within
// 1e-4, computing in fp32 from the stored weights (bf16 in one fixture). Every routing decision
// of the sequences clears its runner-up by more than 1e-3 in the reference, so an fp32 model
// that computes the same function picks the same experts; a wrong choice shows as a miss far
// beyond the tolerance.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/model/config.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model.h"
#include "common/model/two_path_check.h"
#include "common/safetensors.h"
#include "common/token_ids.h"
#include "tests/file_contents.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using Json = nlohmann::json;

constexpr double kTolerance = 1e-4;

std::string ReferenceDirectory() {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return std::string(source ? source : ".") + "/tests/model/hf_reference";
}

const Json& Expected() {
  static const Json* expected = [] {
    const std::string path = ReferenceDirectory() + "/expected.json";
    Json parsed = Json::parse(testing::ReadFileBytes(path), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.contains("fixtures")) {
      ADD_FAILURE() << path << " is not the fixtures' record";
      parsed = {{"fixtures", Json::array()}, {"latent_norm_epsilon", 0.0}, {"routing_margin", 0.0}};
    }
    return new Json(std::move(parsed));
  }();
  return *expected;
}

const Json& Fixture(const std::string& name) {
  for (const Json& fixture : Expected()["fixtures"]) {
    if (fixture["name"] == name) return fixture;
  }
  ADD_FAILURE() << "expected.json has no fixture " << name;
  static const Json none = {{"sequences", Json::array()}};
  return none;
}

// The reference is transformers, whose choices differ from the serving engines' (which the
// import follows by default) in two places: its MLA latent norms (q_a_layernorm, kv_a_layernorm)
// use epsilon 1e-6 whatever rms_norm_eps says, and its renormalised routing weights divide by
// sum + 1e-20. The fixtures' latents are large enough that the first moves no log-prob by more
// than 4e-6 (expected.json records by how much), but the comparison is of like with like.
void ComputeAsTheReference(ModelConfig* config) {
  config->latent.norm_epsilon = Expected()["latent_norm_epsilon"].get<double>();
  config->feed_forward.renormalize_epsilon = 1e-20;
}

std::unique_ptr<Model> LoadFixture(const std::string& directory, int64_t chunk_size = 0) {
  Result<HfModelWeights> loaded = LoadHfCheckpoint(directory, DType::kF32);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  if (!loaded.ok()) return nullptr;
  ComputeAsTheReference(&loaded->config);
  if (chunk_size > 0) loaded->config.incremental.chunk_size = chunk_size;
  Result<std::unique_ptr<Model>> model =
      Model::LoadFromBytes(loaded->config, loaded->weights, directory);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return nullptr;
  return std::move(model).value();
}

at::Tensor Tokens(const Json& sequence) {
  const std::vector<int64_t> ids = sequence["tokens"].get<std::vector<int64_t>>();
  return at::tensor(ids, at::kLong).view({1, static_cast<int64_t>(ids.size())});
}

at::Tensor ReferenceLogProbs(const Json& sequence) {
  const std::vector<double> values = sequence["logprobs"].get<std::vector<double>>();
  return at::tensor(values, at::kDouble);
}

// Largest |Strider - reference| over one sequence's next-token log-probs, and where.
struct Miss {
  double value = 0;
  int64_t position = -1;
};
Miss Compare(const at::Tensor& logits, const at::Tensor& tokens, const Json& sequence) {
  const at::Tensor ours = NextTokenLogProbs(logits, tokens).to(at::kDouble).cpu().view({-1});
  const at::Tensor reference = ReferenceLogProbs(sequence);
  EXPECT_EQ(ours.numel(), reference.numel());
  if (ours.numel() != reference.numel()) return {1e9, -1};
  const at::Tensor diff = (ours - reference).abs();
  return {diff.max().item<double>(), diff.argmax().item<int64_t>()};
}

class HfReference : public ::testing::TestWithParam<std::string> {
 protected:
  std::string Directory() const { return ReferenceDirectory() + "/" + GetParam(); }
};

// The training path, at the imported chunk length and at one short enough that every sequence
// crosses several chunk boundaries of the incremental kernel.
TEST_P(HfReference, TrainingPathGivesTheReferenceLogProbs) {
  at::NoGradGuard no_grad;
  for (int64_t chunk_size : {int64_t{0}, int64_t{8}}) {
    std::unique_ptr<Model> model = LoadFixture(Directory(), chunk_size);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->dtype(), at::kFloat);
    for (const Json& sequence : Fixture(GetParam())["sequences"]) {
      const at::Tensor tokens = Tokens(sequence);
      Result<ForwardOutput> out = model->Forward({tokens, {}});
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      const Miss miss = Compare(out->logits, tokens, sequence);
      EXPECT_LE(miss.value, kTolerance)
          << GetParam() << ", " << tokens.size(1) << " tokens, chunk "
          << model->config().incremental.chunk_size << ": worst at position " << miss.position;
    }
  }
}

// The inference path: the whole sequence at once, then in uneven appended chunks (single
// tokens, odd sizes) so decode steps and chunked prefill both meet the reference.
TEST_P(HfReference, InferencePathGivesTheReferenceLogProbs) {
  at::NoGradGuard no_grad;
  std::unique_ptr<Model> model = LoadFixture(Directory(), 8);
  ASSERT_NE(model, nullptr);
  for (const Json& sequence : Fixture(GetParam())["sequences"]) {
    const at::Tensor tokens = Tokens(sequence);
    const int64_t length = tokens.size(1);
    for (const std::vector<int64_t>& sizes :
         {std::vector<int64_t>{length}, UnevenChunkSizes(length, 8)}) {
      Result<InferenceState> state = model->NewState(1);
      ASSERT_TRUE(state.ok()) << state.status().ToString();
      std::vector<at::Tensor> logits;
      int64_t begin = 0;
      for (int64_t size : sizes) {
        Result<ForwardOutput> out = model->Append(&*state, {tokens.narrow(1, begin, size), {}});
        ASSERT_TRUE(out.ok()) << out.status().ToString();
        logits.push_back(out->logits);
        begin += size;
      }
      const Miss miss = Compare(at::cat(logits, 1), tokens, sequence);
      EXPECT_LE(miss.value, kTolerance)
          << GetParam() << ", " << length << " tokens in " << sizes.size()
          << " appends: worst at position " << miss.position;
    }
  }
}

// The two paths against each other on the imported model (the contract every model keeps).
TEST_P(HfReference, TwoPathsAgreeOnTheImportedModel) {
  std::unique_ptr<Model> model = LoadFixture(Directory(), 8);
  ASSERT_NE(model, nullptr);
  for (const Json& sequence : Fixture(GetParam())["sequences"]) {
    Result<TwoPathReport> report = CheckTwoPaths(*model, Tokens(sequence));
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_LE(report->max_abs_logprob_diff, 1e-5);
    EXPECT_EQ(report->routing_agreement, 1.0);
  }
}

// Import then export gives back the published tensors bit for bit (bf16 ones too, through the
// fp32 weights), so the exported directory serves as the reference's own checkpoint did; and
// it reads back to the same log-probs. (make_kimi_fixtures.py check-export runs transformers
// itself on such a directory.)
TEST_P(HfReference, ExportReproducesThePublishedTensors) {
  const std::string work = testing::ScratchDir("hf_reference_" + GetParam());
  Result<HfImportReport> imported = ImportHfCheckpoint(Directory(), work + "/import");
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  Result<HfCheckpoint> checkpoint = OpenHfCheckpoint(Directory());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  Result<ModelConfig> config = KimiLinearModelConfig(checkpoint->config);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Result<HfExportReport> exported = ExportStriderWeightsToHf(
      *config, {imported->weights_path}, imported->layout_directory, work + "/export");
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();

  for (const auto& entry : std::filesystem::directory_iterator(Directory())) {
    const std::string name = entry.path().filename().string();
    const std::string copy = work + "/export/" + name;
    ASSERT_TRUE(std::filesystem::exists(copy)) << name << " was not exported";
    if (entry.path().extension() != ".safetensors") continue;
    Result<SafetensorsContents> original = ReadSafetensors(entry.path().string());
    Result<SafetensorsContents> back = ReadSafetensors(copy);
    ASSERT_TRUE(original.ok()) << original.status().ToString();
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ASSERT_EQ(original->tensors.size(), back->tensors.size()) << name;
    for (const auto& [tensor, contents] : original->tensors) {
      auto found = back->tensors.find(tensor);
      ASSERT_NE(found, back->tensors.end()) << tensor << " is missing from " << copy;
      EXPECT_EQ(found->second.dtype, contents.dtype) << tensor;
      EXPECT_EQ(found->second.shape, contents.shape) << tensor;
      EXPECT_TRUE(found->second.bytes == contents.bytes) << tensor << " differs";
    }
  }

  at::NoGradGuard no_grad;
  std::unique_ptr<Model> model = LoadFixture(work + "/export");
  ASSERT_NE(model, nullptr);
  for (const Json& sequence : Fixture(GetParam())["sequences"]) {
    const at::Tensor tokens = Tokens(sequence);
    Result<ForwardOutput> out = model->Forward({tokens, {}});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_LE(Compare(out->logits, tokens, sequence).value, kTolerance);
  }
}

// The fixtures are what the script says they are: every one listed, each with sequences whose
// reference log-probs are far from a uniform guess (a model that ignored its weights would not
// pass by luck) and one that holds the image-patch placeholder's id, and stored as described.
TEST(HfReferenceFixtures, AreTheOnesTheScriptMade) {
  const Json& fixtures = Expected()["fixtures"];
  ASSERT_EQ(fixtures.size(), 3u);
  for (const Json& fixture : fixtures) {
    const std::string name = fixture["name"].get<std::string>();
    EXPECT_TRUE(std::filesystem::exists(ReferenceDirectory() + "/" + name + "/config.json"))
        << name;
    EXPECT_GT(
        std::abs(fixture["mean_logprob"].get<double>() - fixture["uniform_logprob"].get<double>()),
        0.5)
        << name;
    bool placeholder = false;
    for (const Json& sequence : fixture["sequences"]) {
      EXPECT_GT(sequence["min_routing_margin"].get<double>(), Expected()["routing_margin"]) << name;
      EXPECT_EQ(sequence["logprobs"].size() + 1, sequence["tokens"].size()) << name;
      for (const Json& id : sequence["tokens"]) placeholder |= id == token::kImagePatch;
    }
    // A text-only model reads the id of Strider's image-patch placeholder as text.
    EXPECT_TRUE(placeholder) << name << " never uses token " << token::kImagePatch;
  }
  Result<SafetensorsHeader> bf16 =
      ReadSafetensorsHeader(ReferenceDirectory() + "/kimi_low_rank_query_bf16/model.safetensors");
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  for (const SafetensorsEntry& entry : bf16->entries) {
    const bool float32 = entry.name.ends_with(".A_log") || entry.name.ends_with(".dt_bias") ||
                         entry.name.ends_with(".e_score_correction_bias");
    EXPECT_EQ(entry.dtype, float32 ? DType::kF32 : DType::kBF16) << entry.name;
  }
  EXPECT_TRUE(std::filesystem::exists(ReferenceDirectory() +
                                      "/kimi_sharded_f32/model.safetensors.index.json"));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfReference,
                         ::testing::Values("kimi_full_query_f32", "kimi_low_rank_query_bf16",
                                           "kimi_sharded_f32"));

}  // namespace
}  // namespace strider
