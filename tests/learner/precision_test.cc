// Precision chosen in config (common/model/precision.h, docs/cuda.md "Precision"): TF32 off for
// fp32, an actor's engine sampling from bf16 weights, a bf16 learner step that keeps fp32
// masters, gradients and AdamW moments, and the learner/behaviour mismatch a bf16 fleet sees.
#include "common/model/precision.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "learner/language_model_loss.h"
#include "learner/learner.h"
#include "learner/rl/rl_config.h"
#include "learner/rl/scoring_options.h"
#include "rollout_engine/engine.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

std::string SourceDir();

ModelConfig TinyConfig() {
  Result<ModelConfig> config = LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return *config;
}

TEST(Precision, NamesRoundTripAndOthersAreRefused) {
  for (Precision p : {Precision::kFloat32, Precision::kBFloat16}) {
    Result<Precision> back = ParsePrecision(PrecisionName(p));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, p);
  }
  EXPECT_FALSE(ParsePrecision("float16").ok());
  EXPECT_FALSE(ParsePrecision("bf16").ok());
}

std::string SourceDir() {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return source ? source : ".";
}

// `precision:` of an RL learner config: float32 by default; bfloat16 brings the bf16 mismatch
// threshold unless scoring names one; anything else is refused by its key.
TEST(Precision, TheRlLearnerConfigChoosesItAndABf16ThresholdComesWithIt) {
  Result<rl::RlLearnerConfig> fp32 =
      rl::LoadRlLearnerConfig(SourceDir() + "/configs/rl/calculator.yaml");
  ASSERT_TRUE(fp32.ok()) << fp32.status().ToString();
  EXPECT_EQ(fp32->trainer.precision, Precision::kFloat32);
  EXPECT_EQ(fp32->scoring.mismatch_threshold, 1e-4);
  Result<rl::RlLearnerConfig> bf16 =
      rl::LoadRlLearnerConfig(SourceDir() + "/configs/rl/calculator_bf16.yaml");
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  EXPECT_EQ(bf16->trainer.precision, Precision::kBFloat16);
  EXPECT_EQ(bf16->scoring.mismatch_threshold, rl::kBFloat16MismatchThreshold);
  EXPECT_TRUE(bf16->objective.loss.token_mask);

  strider::testing::TempDir dir;
  const std::string model = SourceDir() + "/configs/model/tiny.yaml";
  const auto load = [&](const std::string& extra) {
    std::ofstream(dir.Sub("rl.yaml")) << "mode: rl\nmodel_config: " << model << "\n" << extra;
    return rl::LoadRlLearnerConfig(dir.Sub("rl.yaml"));
  };
  Result<rl::RlLearnerConfig> defaulted = load("precision: bfloat16\n");
  ASSERT_TRUE(defaulted.ok()) << defaulted.status().ToString();
  EXPECT_EQ(defaulted->scoring.mismatch_threshold, rl::kBFloat16MismatchThreshold);
  Result<rl::RlLearnerConfig> own =
      load("precision: bfloat16\nscoring: {mismatch_threshold: 0.25}\n");
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  EXPECT_EQ(own->scoring.mismatch_threshold, 0.25);
  Result<rl::RlLearnerConfig> bad = load("precision: float16\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("precision: must be float32 or bfloat16, got 'float16'"),
            std::string::npos)
      << bad.status().ToString();
}

TEST(Precision, Float32TurnsTf32OffForMatmulsAndConvolutions) {
  // As a process that ran something else first might have left them.
#if TORCH_VERSION_MAJOR >= 2
  at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL,
                                          at::Float32Precision::TF32);
  at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV,
                                          at::Float32Precision::TF32);
#else
  at::globalContext().setAllowTF32CuBLAS(true);
  at::globalContext().setAllowTF32CuDNN(true);
#endif
  ASSERT_TRUE(Tf32AllowedForMatmul());
  ASSERT_TRUE(Tf32AllowedForConvolution());
  ConfigurePrecision(Precision::kFloat32);
  EXPECT_FALSE(Tf32AllowedForMatmul());
  EXPECT_FALSE(Tf32AllowedForConvolution());
#if TORCH_VERSION_MAJOR < 2
  EXPECT_FALSE(at::globalContext().allowTF32CuBLAS());
  EXPECT_FALSE(at::globalContext().allowTF32CuDNN());
#endif
}

// A batch of four engine sequences, each a prompt and `decode` sampled tokens; returns every
// sequence's tokens and, per sampled position, the engine's model log-prob.
struct Sampled {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::map<int64_t, double>> model_log_probs;
};

Sampled SampleWith(std::shared_ptr<const Model> model, int64_t decode) {
  rollout::EngineOptions options;
  options.threads = 2;
  options.block_tokens = 16;
  options.cache_budget_bytes = int64_t{16} << 20;
  Result<std::unique_ptr<rollout::Engine>> engine = rollout::Engine::Create(options, model, 0);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  Sampled out;
  std::map<rollout::SequenceId, size_t> row;
  for (int s = 0; s < 4; ++s) {
    std::vector<int64_t> prompt;
    for (int i = 0; i < 24 + 5 * s; ++i) prompt.push_back(32 + (i * 7 + s * 13) % 90);
    rollout::SamplingParams turn;
    turn.max_new_tokens = decode;
    turn.seed = 100 + s;
    Result<rollout::SequenceId> id = (*engine)->Submit({prompt, turn, false});
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    row[*id] = out.tokens.size();
    out.tokens.push_back(prompt);
    out.model_log_probs.emplace_back();
  }
  for (int step = 0; step < 4 * decode + 16; ++step) {
    Result<rollout::StepResult> result = (*engine)->Step();
    EXPECT_TRUE(result.ok()) << result.status().ToString();
    if (!result.ok()) break;
    bool any = false;
    for (const rollout::SequenceStep& s : result->sequences) {
      if (!s.sampled) continue;
      any = true;
      const size_t r = row.at(s.id);
      EXPECT_EQ(s.position, static_cast<int64_t>(out.tokens[r].size()));
      EXPECT_TRUE(std::isfinite(s.log_prob) && s.log_prob <= 0) << s.log_prob;
      out.tokens[r].push_back(s.token);
      out.model_log_probs[r][s.position] = s.model_log_prob;
    }
    if (!any && step > 0) break;
  }
  return out;
}

// The learner's log-probs of the sampled positions of one sequence: the scoring pass's shape
// (inference path, each sampled token fed alone as the engine decoded it).
std::map<int64_t, double> ScoreWith(const Model& model, const std::vector<int64_t>& tokens,
                                    const std::map<int64_t, double>& sampled) {
  std::vector<int64_t> positions;
  for (const auto& [p, lp] : sampled) positions.push_back(p);
  ChunkedPassOptions pass;
  pass.path = TrainingPath::kInference;
  pass.chunk_tokens = 512;
  pass.backward = false;
  pass.fed_alone = &positions;
  std::map<int64_t, double> out;
  const at::Tensor input = at::tensor(tokens, at::kLong).unsqueeze(0);
  Result<ChunkedPassResult> result =
      RunChunkedPass(model, {input, {}}, pass, [&](const ChunkView& chunk) -> Result<at::Tensor> {
        const at::Tensor log_probs = at::log_softmax(chunk.logits[0].to(at::kDouble), -1);
        for (int64_t i = 0; i < chunk.count; ++i) {
          const int64_t next = chunk.begin + i + 1;
          if (sampled.count(next) == 0) continue;
          out[next] = log_probs[i][tokens[next]].item<double>();
        }
        return at::Tensor();
      });
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return out;
}

double MaxGap(const Sampled& behaviour, const Model& learner, double* mean) {
  double worst = 0, sum = 0;
  int64_t count = 0;
  for (size_t r = 0; r < behaviour.tokens.size(); ++r) {
    const std::map<int64_t, double> scored =
        ScoreWith(learner, behaviour.tokens[r], behaviour.model_log_probs[r]);
    EXPECT_EQ(scored.size(), behaviour.model_log_probs[r].size());
    for (const auto& [p, lp] : behaviour.model_log_probs[r]) {
      const double gap = std::abs(scored.at(p) - lp);
      worst = std::max(worst, gap);
      sum += gap;
      ++count;
    }
  }
  *mean = count > 0 ? sum / count : 0;
  return worst;
}

// A learner of `precision` that starts from the weights Model::Create(config, seed) gives.
std::unique_ptr<Trainer> LearnerOf(const ModelConfig& config, uint64_t seed, Precision precision) {
  TrainerConfig trainer_config;
  trainer_config.seed = seed;
  trainer_config.balance = false;
  trainer_config.precision = precision;
  Result<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(config, MakeTrainerOptions(trainer_config, {.peak = 1e-3}));
  EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
  return trainer.ok() ? std::move(*trainer) : nullptr;
}

TEST(Precision, ActorSamplesFromBf16WeightsAndTheMismatchStaysUnderTheBf16Threshold) {
  ConfigureRuntime(2);
  const ModelConfig config = TinyConfig();
  Result<std::unique_ptr<Model>> actor_fp32 = Model::Create(config, 7);
  Result<std::unique_ptr<Model>> actor_bf16 = Model::Create(config, 7);
  ASSERT_TRUE(actor_fp32.ok() && actor_bf16.ok());
  ASSERT_TRUE(ApplyWeightPrecision(actor_fp32->get(), Precision::kFloat32).ok());
  EXPECT_EQ((*actor_fp32)->dtype(), at::kFloat);
  ASSERT_TRUE(ApplyWeightPrecision(actor_bf16->get(), Precision::kBFloat16).ok());
  EXPECT_EQ((*actor_bf16)->dtype(), at::kBFloat16);
  for (const auto& [name, tensor] : (*actor_bf16)->tensors()) {
    EXPECT_EQ(tensor.scalar_type(), at::kBFloat16) << name;
  }
  std::unique_ptr<Trainer> learner_fp32 = LearnerOf(config, 7, Precision::kFloat32);
  std::unique_ptr<Trainer> learner_bf16 = LearnerOf(config, 7, Precision::kBFloat16);
  ASSERT_TRUE(learner_fp32 && learner_bf16);
  EXPECT_EQ(&learner_fp32->compute_model(), &learner_fp32->model());
  EXPECT_EQ(learner_bf16->model().dtype(), at::kFloat);
  EXPECT_EQ(learner_bf16->compute_model().dtype(), at::kBFloat16);

  const int64_t decode = 24;
  // The fp32 contract first: the same harness gives the learner the behaviour's numbers.
  const Sampled fp32 = SampleWith(std::shared_ptr<const Model>(std::move(*actor_fp32)), decode);
  double fp32_mean = 0;
  const double fp32_max = MaxGap(fp32, learner_fp32->compute_model(), &fp32_mean);
  EXPECT_LE(fp32_max, 1e-5);

  const Sampled bf16 = SampleWith(std::shared_ptr<const Model>(std::move(*actor_bf16)), decode);
  for (const auto& lps : bf16.model_log_probs) EXPECT_EQ(static_cast<int64_t>(lps.size()), decode);
  double bf16_mean = 0;
  const double bf16_max = MaxGap(bf16, learner_bf16->compute_model(), &bf16_mean);
  std::printf("learner/behaviour |log-prob gap| over %lld sampled tokens: fp32 max %.3g mean "
              "%.3g; bf16 max %.3g mean %.3g\n",
              static_cast<long long>(4 * decode), fp32_max, fp32_mean, bf16_max, bf16_mean);
  // The learner's compute copy is the actor's weights to the bit (both round the same fp32
  // masters); what remains is how each side's bf16 products sum, well under the threshold.
  EXPECT_LT(bf16_max, rl::kBFloat16MismatchThreshold / 4);
  // And the fp32 masters themselves, scored by the fp32 learner, are another policy by bf16's
  // rounding: what the actor's bf16 weights cost against an fp32 learner.
  double rounding_mean = 0;
  const double rounding_max = MaxGap(bf16, learner_fp32->compute_model(), &rounding_mean);
  std::printf("bf16 behaviour against fp32 weights: max %.3g mean %.3g\n", rounding_max,
              rounding_mean);
  EXPECT_GT(rounding_max, 1e-5);
}

TEST(Precision, Bf16LearnerStepKeepsFp32MastersGradientsAndMomentsAndMatchesFp32) {
  ConfigureRuntime(2);
  const ModelConfig config = TinyConfig();
  at::Tensor tokens = at::randint(0, 200, {2, 48}, at::detail::createCPUGenerator(3), at::kLong);
  TokenBatch batch;
  batch.tokens = tokens;
  batch.loss_mask = at::ones({2, 47});
  std::vector<double> losses;
  std::vector<int64_t> with_gradients;
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (Precision precision : {Precision::kFloat32, Precision::kBFloat16}) {
    std::unique_ptr<Trainer> trainer = LearnerOf(config, 5, precision);
    ASSERT_TRUE(trainer);
    // Chunks of the inference path backpropagated one at a time: the gradients of three
    // chunks per sequence add up on the masters.
    LossOptions options;
    options.path = TrainingPath::kInference;
    options.chunk_tokens = 16;
    options.truncated = true;
    Result<LossResult> loss = LanguageModelLoss(trainer->compute_model(), batch, options);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    losses.push_back(loss->loss);
    // The training path (one Model::Forward) gives the same loss in each precision.
    LossOptions whole;
    whole.path = TrainingPath::kTraining;
    whole.backward = false;
    Result<LossResult> forward = LanguageModelLoss(trainer->compute_model(), batch, whole);
    ASSERT_TRUE(forward.ok()) << forward.status().ToString();
    EXPECT_NEAR(forward->loss, loss->loss, 2e-2 * std::abs(loss->loss));
    int64_t graded = 0;
    for (const auto& [name, tensor] : trainer->model().tensors()) {
      EXPECT_EQ(tensor.scalar_type(), at::kFloat) << name;
      if (!tensor.grad().defined()) continue;
      ++graded;
      EXPECT_EQ(tensor.grad().scalar_type(), at::kFloat) << name;
    }
    with_gradients.push_back(graded);
    Result<TrainerStep> step = trainer->Step(0);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_TRUE(step->applied);
    EXPECT_GT(step->gradient_norm, 0);
    for (const at::Tensor& moment : trainer->optimizer().MomentTensors()) {
      EXPECT_EQ(moment.scalar_type(), at::kFloat);
    }
    // The compute copy follows the update: the new masters rounded to bf16.
    for (size_t i = 0; i < trainer->model().tensors().size(); ++i) {
      const at::Tensor& master = trainer->model().tensors()[i].second;
      const at::Tensor& copy = trainer->compute_model().tensors()[i].second;
      EXPECT_EQ(master.scalar_type(), at::kFloat);
      if (precision == Precision::kBFloat16) {
        EXPECT_EQ(copy.scalar_type(), at::kBFloat16);
        EXPECT_TRUE(at::equal(copy, master.to(at::kBFloat16)))
            << trainer->model().tensors()[i].first;
      }
    }
    trainer->ZeroGrad();
    for (const auto& [name, tensor] : trainer->compute_model().tensors()) {
      EXPECT_FALSE(tensor.grad().defined()) << name;
    }
    trainers.push_back(std::move(trainer));
  }
  std::printf("language-model loss: fp32 %.7f, bf16 %.7f\n", losses[0], losses[1]);
  // Every parameter the fp32 step trained got an fp32 gradient through the bf16 copy.
  EXPECT_GT(with_gradients[0], 0);
  EXPECT_EQ(with_gradients[1], with_gradients[0]);
  // bf16 products really ran (the loss is not fp32's to the bit) and agree to bf16 rounding.
  EXPECT_NE(losses[0], losses[1]);
  EXPECT_NEAR(losses[1], losses[0], 2e-2 * std::abs(losses[0]));
  // The updated masters stay close: one AdamW step moves each weight by about the learning
  // rate whatever the gradient's rounding, so they differ by at most about twice that.
  double worst = 0;
  for (size_t i = 0; i < trainers[0]->model().tensors().size(); ++i) {
    const at::Tensor& a = trainers[0]->model().tensors()[i].second;
    const at::Tensor& b = trainers[1]->model().tensors()[i].second;
    worst = std::max(worst, (a - b).abs().max().item<double>());
  }
  EXPECT_LE(worst, 2.5e-3);
}

}  // namespace
}  // namespace strider
