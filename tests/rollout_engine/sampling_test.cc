// Sampling: greedy, top-k, top-p, temperature, the never-sampled placeholder, the random stream,
// parameter checks; the sampler's frequencies against the shared distribution, and the log-probs
// the engine stores against that distribution evaluated on the model's logits.
#include "rollout_engine/sampling.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/model/model.h"
#include "common/model/sampling_distribution.h"
#include "common/tokenizer.h"
#include "rollout_engine/engine.h"
#include "tests/shipped_config.h"

namespace strider::rollout {
namespace {

using model::SamplingSettings;

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 0.5f, 3.0f};

SamplingSettings Settings(double temperature, int64_t top_k = 0, double top_p = 1.0,
                          std::vector<int64_t> never = {}) {
  return SamplingSettings{temperature, top_k, top_p, std::move(never)};
}

Sample Draw(const std::vector<float>& logits, const SamplingSettings& s, double uniform) {
  Result<Sample> sample =
      SampleToken(logits.data(), static_cast<int64_t>(logits.size()), s, uniform);
  EXPECT_TRUE(sample.ok()) << sample.status().ToString();
  return sample.ok() ? *sample : Sample{};
}

TEST(Sampling, GreedyPicksTheArgmaxWithTiesToTheLowerIdAtLogProbZero) {
  Sample sample = Draw(kLogits, Settings(0), 0.99);
  EXPECT_EQ(sample.token, 1);
  EXPECT_EQ(sample.log_prob, 0);  // a point mass: log 1, exactly
  EXPECT_EQ(sample.entropy, 0);
  double norm = 0;
  for (float l : kLogits) norm += std::exp(l);
  EXPECT_NEAR(sample.model_log_prob, 3.0 - std::log(norm), 1e-6);
}

TEST(Sampling, TopKAndTopPKeepOnlyTheMostLikely) {
  const SamplingSettings top2 = Settings(1, 2);  // tokens 1 and 4 (equal), each 1/2
  for (double u : {0.0, 0.3, 0.49}) EXPECT_EQ(Draw(kLogits, top2, u).token, 1);
  for (double u : {0.5, 0.9, 0.999}) EXPECT_EQ(Draw(kLogits, top2, u).token, 4);
  Sample sample = Draw(kLogits, top2, 0.1);
  EXPECT_NEAR(sample.log_prob, std::log(0.5), 1e-12);
  EXPECT_NEAR(sample.entropy, std::log(2.0), 1e-12);
  // Only the single most likely token.
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(Draw(kLogits, Settings(1, 0, 0.01), u).token, 1);
}

TEST(Sampling, FrequenciesFollowTheTemperedSoftmax) {
  std::vector<double> p(5);
  double total = 0;
  for (int i = 0; i < 5; ++i) total += p[i] = std::exp(kLogits[i] / 2.0);
  std::vector<int> counts(5, 0);
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) {
    Sample s = Draw(kLogits, Settings(2.0), UniformDraw(7, i));
    ++counts[s.token];
    ASSERT_NEAR(s.log_prob, std::log(p[s.token] / total), 1e-12);
  }
  for (int i = 0; i < 5; ++i) {
    const double expected = p[i] / total;
    EXPECT_NEAR(counts[i] / double(draws), expected, 4 * std::sqrt(expected / draws) + 1e-3);
  }
}

// Pearson's statistic of `counts` against probabilities exp(log_probs) over the ids where they
// are positive (ids where they are zero must have no count; the test checks that separately).
double ChiSquare(const std::vector<int64_t>& counts, const at::Tensor& log_probs, int64_t draws,
                 int64_t* cells) {
  double statistic = 0;
  *cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double q = std::exp(log_probs[i].item<double>());
    if (q == 0) continue;
    ++*cells;
    const double expected = q * static_cast<double>(draws);
    statistic += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return statistic;
}

TEST(Sampling, FrequenciesPassAChiSquareTestAgainstTheSharedDistribution) {
  // 12 ids, one never sampled (and the most likely), top-k 9 then top-p 0.9 at temperature 0.7:
  // every stage of the distribution cuts something here.
  const std::vector<float> logits = {0.3f, 1.1f,  2.5f, -0.4f, 0.9f,  0.0f,
                                     1.6f, -1.2f, 0.7f, 1.3f,  -0.8f, 0.2f};
  const int64_t vocabulary = static_cast<int64_t>(logits.size());
  const SamplingSettings s = Settings(0.7, 9, 0.9, {2});
  const at::Tensor row = at::tensor(logits, at::kFloat).view({1, vocabulary});
  const at::Tensor q = model::SamplingLogProbs(row.to(at::kDouble), s)[0].contiguous();
  const std::vector<double> qv(q.data_ptr<double>(), q.data_ptr<double>() + vocabulary);

  const int64_t batch = 1000, rounds = 100, draws = batch * rounds;
  const at::Tensor rows = row.expand({batch, vocabulary}).contiguous();
  std::vector<int64_t> counts(vocabulary, 0);
  for (int64_t r = 0; r < rounds; ++r) {
    std::vector<double> uniforms;
    for (int64_t b = 0; b < batch; ++b) uniforms.push_back(UniformDraw(2024, r * batch + b));
    Result<std::vector<Sample>> samples =
        SampleTokens(rows, std::vector<SamplingSettings>(batch, s), uniforms);
    ASSERT_TRUE(samples.ok()) << samples.status().ToString();
    for (const Sample& sample : *samples) {
      ++counts[sample.token];
      ASSERT_EQ(sample.log_prob, qv[sample.token]);
    }
  }
  int64_t cut = 0;
  for (int64_t i = 0; i < vocabulary; ++i) {
    if (std::isinf(qv[i])) {
      ++cut;
      EXPECT_EQ(counts[i], 0) << "id " << i << " has probability 0";
    }
  }
  EXPECT_GE(cut, 4);  // the banned id, three past top-k, at least one past top-p
  int64_t cells = 0;
  const double statistic = ChiSquare(counts, q, draws, &cells);
  // Upper 0.1% points of chi-square with cells - 1 degrees of freedom.
  const double critical[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12};
  ASSERT_GE(cells, 2);
  ASSERT_LE(cells, 9);
  EXPECT_LT(statistic, critical[cells - 1]) << cells << " cells";
  // The same counts against the distribution without the temperature fail by far, so the test
  // can tell distributions this close apart.
  const at::Tensor untempered =
      model::SamplingLogProbs(row.to(at::kDouble), Settings(1, 9, 0.9, {2}));
  int64_t other_cells = 0;
  EXPECT_GT(ChiSquare(counts, untempered[0], draws, &other_cells), 10 * critical[8]);
}

TEST(Sampling, PlaceholderIsNeverSampledEvenAsTheMostLikelyToken) {
  std::vector<float> logits(token::kVocabularySize, 0.0f);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 0.01f * static_cast<float>(i % 17);
  logits[token::kImagePatch] = 8.0f;  // nearly all of the model's mass
  SamplingParams params;
  for (double temperature : {1.0, 0.7}) {
    params.temperature = temperature;
    const SamplingSettings s = TurnDistribution(params);
    for (int i = 0; i < 2000; ++i) {
      ASSERT_NE(Draw(logits, s, UniformDraw(3, i)).token, token::kImagePatch);
    }
    const at::Tensor q =
        model::SamplingLogProbs(at::tensor(logits, at::kDouble).view({1, -1}), s)[0];
    EXPECT_EQ(q[token::kImagePatch].item<double>(), -std::numeric_limits<double>::infinity());
  }
  params.temperature = 0;
  Sample greedy = Draw(logits, TurnDistribution(params), 0.5);
  EXPECT_NE(greedy.token, token::kImagePatch);
  EXPECT_EQ(greedy.log_prob, 0);
  // model_log_prob stays the model's own distribution, where the placeholder still counts.
  double norm = 0;
  for (float l : logits) norm += std::exp(double(l));
  EXPECT_NEAR(greedy.model_log_prob, logits[greedy.token] - std::log(norm), 1e-6);
}

TEST(Sampling, RandomStreamIsAPureFunctionOfSeedAndCounter) {
  EXPECT_EQ(UniformDraw(1, 5), UniformDraw(1, 5));
  EXPECT_NE(UniformDraw(1, 5), UniformDraw(1, 6));
  EXPECT_NE(UniformDraw(1, 5), UniformDraw(2, 5));
  EXPECT_NE(DeriveSeed(9, 0), DeriveSeed(9, 1));
  for (int i = 0; i < 1000; ++i) {
    const double u = UniformDraw(3, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(Sampling, InvalidParametersNameTheField) {
  auto message = [](SamplingParams p) { return ValidateSamplingParams(p, 10).message(); };
  SamplingParams p;
  EXPECT_TRUE(ValidateSamplingParams(p, 10).ok());
  p.temperature = -1;
  EXPECT_NE(message(p).find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(message(p).find("top_p"), std::string::npos);
  p = {};
  p.top_k = -3;
  EXPECT_NE(message(p).find("top_k"), std::string::npos);
  p = {};
  p.max_new_tokens = 0;
  EXPECT_NE(message(p).find("max_new_tokens"), std::string::npos);
  p = {};
  p.stop_tokens = {10};
  EXPECT_NE(message(p).find("stop token 10"), std::string::npos);
  p = {};
  p.stop_strings = {""};
  EXPECT_NE(message(p).find("stop string"), std::string::npos);
  // The batched sampler refuses settings out of range and mismatched sizes as values.
  EXPECT_FALSE(SampleTokens(at::zeros({1, 10}), {Settings(1, 0, 1, {10})}, {0.5}).ok());
  EXPECT_FALSE(SampleTokens(at::zeros({2, 10}), {Settings(1)}, {0.5}).ok());
}

// The engine's stored log-probs against the shared function on the training path's logits for
// the same tokens (fp64 model, routing replayed, so the two paths agree far below 1e-6).
std::shared_ptr<const Model> TinyFp64Model() {
  ConfigureRuntime(2);
  Result<std::unique_ptr<Model>> model = Model::Create(testing::ShippedModelConfig("tiny"), 17);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_TRUE((*model)->ConvertTo(at::kDouble).ok());
  return std::shared_ptr<const Model>(std::move(model).value());
}

// Off the CPU the draw is tensor operations on the device (internal::DrawByTensorOps); here both
// run on the CPU's tensors, so the draws must agree token for token.
TEST(Sampling, TensorDrawPicksWhatTheRowLoopPicks) {
  at::Generator generator = at::detail::createCPUGenerator(17);
  // Ties (rounded logits) and a cut that leaves a few tokens, so the walk order matters.
  const at::Tensor logits = (at::randn({48, 40}, generator, at::kDouble) * 3).round() / 2;
  std::vector<double> uniforms;
  for (int64_t b = 0; b < logits.size(0); ++b) uniforms.push_back(UniformDraw(3, b));
  uniforms.back() = std::nextafter(1.0, 0.0);  // the last draw at the top of [0, 1)
  for (const SamplingSettings& s : {Settings(1.0), Settings(0.7, 5), Settings(1.3, 0, 0.8),
                                    Settings(0.0), Settings(1.0, 0, 1.0, {4})}) {
    std::vector<SamplingSettings> rows(logits.size(0), s);
    Result<std::vector<Sample>> loop = SampleTokens(logits, rows, uniforms);
    ASSERT_TRUE(loop.ok()) << loop.status().ToString();
    const at::Tensor x = logits.to(at::kDouble);
    const std::vector<Sample> tensors = internal::DrawByTensorOps(
        model::SamplingLogProbs(x, s), at::log_softmax(x, -1), uniforms);
    ASSERT_EQ(tensors.size(), loop->size());
    for (size_t b = 0; b < tensors.size(); ++b) {
      EXPECT_EQ(tensors[b].token, (*loop)[b].token) << "row " << b;
      EXPECT_EQ(tensors[b].log_prob, (*loop)[b].log_prob) << "row " << b;
      EXPECT_EQ(tensors[b].model_log_prob, (*loop)[b].model_log_prob) << "row " << b;
      EXPECT_NEAR(tensors[b].entropy, (*loop)[b].entropy, 1e-12) << "row " << b;
    }
  }
}

TEST(Sampling, EngineStoresTheSharedLogProbOfItsLogits) {
  std::shared_ptr<const Model> model = TinyFp64Model();
  for (const SamplingSettings& s : {Settings(1), Settings(1, 40, 0.9), Settings(0.7, 0, 0.9),
                                    Settings(0.7, 40, 0.9), Settings(0)}) {
    EngineOptions options;
    options.threads = 2;
    Result<std::unique_ptr<Engine>> engine = Engine::Create(options, model, 1);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    SamplingParams params;
    params.temperature = s.temperature;
    params.top_k = s.top_k;
    params.top_p = s.top_p;
    params.max_new_tokens = 32;
    params.seed = 99;
    std::vector<int64_t> tokens;
    for (int i = 0; i < 20; ++i) tokens.push_back((i * 37 + 11) % token::kByteCount);
    Result<SequenceId> id = (*engine)->Submit({tokens, params});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    std::vector<CompactRouting> routing;
    std::vector<int64_t> positions;
    std::vector<double> stored, model_stored;
    for (int step = 0; step < 100; ++step) {
      Result<StepResult> result = (*engine)->Step();
      ASSERT_TRUE(result.ok()) << result.status().ToString();
      if (result->prefill_tokens == 0 && result->decode_tokens == 0) break;
      for (const SequenceStep& sequence : result->sequences) {
        if (sequence.routing.tokens > 0) routing.push_back(sequence.routing);
        if (!sequence.sampled) continue;
        ASSERT_EQ(sequence.position, static_cast<int64_t>(tokens.size()));
        ASSERT_NE(sequence.token, token::kImagePatch);
        tokens.push_back(sequence.token);
        positions.push_back(sequence.position);
        stored.push_back(sequence.log_prob);
        model_stored.push_back(sequence.model_log_prob);
      }
    }
    ASSERT_EQ(positions.size(), 32u);

    Result<CompactRouting> joined = CompactRouting::Concatenate(routing);
    ASSERT_TRUE(joined.ok()) << joined.status().ToString();
    ASSERT_EQ(joined->tokens, static_cast<int64_t>(tokens.size()));
    RoutingRecord replay = joined->ToRoutingRecord();
    ForwardOptions forward;
    forward.replay_routing = &replay;
    at::NoGradGuard no_grad;
    const at::Tensor input = at::tensor(tokens, at::kLong).view({1, -1});
    Result<ForwardOutput> out = model->Forward(ModelInput{input, {}}, forward);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    // The learner's call: logits of the predicting positions, the sampled ids, the settings
    // stored with the segment.
    const at::Tensor predicting = at::tensor(positions, at::kLong) - 1;
    const at::Tensor logits = out->logits[0].index_select(0, predicting);
    const at::Tensor chosen = input[0].index_select(0, predicting + 1);
    const at::Tensor learner = model::SampledTokenLogProbs(
        logits, chosen, model::RolloutSamplingSettings(s.temperature, s.top_k, s.top_p));
    double worst = 0, moved = 0;
    for (size_t i = 0; i < positions.size(); ++i) {
      worst = std::max(worst, std::abs(learner[i].item<double>() - stored[i]));
      moved = std::max(moved, std::abs(stored[i] - model_stored[i]));
      if (s.temperature == 0) EXPECT_EQ(stored[i], 0);
    }
    EXPECT_LT(worst, 1e-6) << "temperature " << s.temperature << " top_k " << s.top_k << " top_p "
                           << s.top_p;
    // The model's own log-prob is a different number (the placeholder alone moves it), so the
    // comparison above cannot pass by comparing the wrong distribution.
    EXPECT_GT(moved, 1e-4);
  }
}

}  // namespace
}  // namespace strider::rollout
