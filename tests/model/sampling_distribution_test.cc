// The sampling distribution (common/model/sampling_distribution.h) against a scalar reference
// written from its definition, its never-sampled ids, greedy, gradients through the kept set,
// entropy without NaN, row independence and parameter checks.
#include "common/model/sampling_distribution.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/tokenizer.h"

namespace strider::model {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The definition, one row at a time in the plainest form: rank the sampleable ids by logit (ties
// to the lower id), keep the first k, temper, keep while the mass before a token is below top_p,
// normalise.
std::vector<double> Reference(const std::vector<double>& logits, const SamplingSettings& s) {
  const int64_t v = static_cast<int64_t>(logits.size());
  std::vector<int64_t> ranked;
  for (int64_t i = 0; i < v; ++i) {
    if (std::find(s.never_sampled.begin(), s.never_sampled.end(), i) == s.never_sampled.end()) {
      ranked.push_back(i);
    }
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  std::vector<double> out(v, -kInf);
  if (s.temperature == 0) {
    out[ranked[0]] = 0;
    return out;
  }
  if (s.top_k > 0 && s.top_k < static_cast<int64_t>(ranked.size())) ranked.resize(s.top_k);
  double max = logits[ranked[0]] / s.temperature;
  double total = 0;
  for (int64_t id : ranked) total += std::exp(logits[id] / s.temperature - max);
  size_t keep = ranked.size();
  if (s.top_p < 1) {
    double before = 0;
    for (size_t j = 0; j < ranked.size(); ++j) {
      if (before >= s.top_p) {
        keep = j;
        break;
      }
      before += std::exp(logits[ranked[j]] / s.temperature - max) / total;
    }
  }
  ranked.resize(keep);
  double kept = 0;
  for (int64_t id : ranked) kept += std::exp(logits[id] / s.temperature - max);
  for (int64_t id : ranked) out[id] = logits[id] / s.temperature - max - std::log(kept);
  return out;
}

SamplingSettings Settings(double temperature, int64_t top_k, double top_p,
                          std::vector<int64_t> never = {}) {
  return SamplingSettings{temperature, top_k, top_p, std::move(never)};
}

at::Tensor RandomLogits(int64_t rows, int64_t vocabulary, uint64_t seed, double scale = 2.0) {
  at::manual_seed(seed);
  return at::randn({rows, vocabulary}, at::kDouble) * scale;
}

TEST(SamplingDistribution, EqualsTheDefinitionForEverySetting) {
  at::Tensor logits = RandomLogits(16, 23, 1);
  // Ties: two equal logits at the top and a run of equal ones lower down.
  logits[0][3] = logits[0].max().item<double>() + 1;
  logits[0][9] = logits[0][3].item<double>();
  logits[1].narrow(0, 4, 6).fill_(0.25);
  for (const SamplingSettings& s :
       {Settings(1, 0, 1), Settings(0.7, 0, 0.9), Settings(0.7, 5, 1), Settings(1.3, 8, 0.6),
        Settings(0.7, 5, 0.9, {3, 17}), Settings(1, 0, 1, {0}), Settings(0.5, 1, 1),
        Settings(2, 0, 0.01), Settings(0, 0, 1, {3})}) {
    const at::Tensor out = SamplingLogProbs(logits, s);
    for (int64_t r = 0; r < logits.size(0); ++r) {
      at::Tensor row = logits[r].contiguous();
      const std::vector<double> expected =
          Reference(std::vector<double>(row.data_ptr<double>(), row.data_ptr<double>() + 23), s);
      for (int64_t i = 0; i < 23; ++i) {
        const double got = out[r][i].item<double>();
        if (std::isinf(expected[i])) {
          ASSERT_EQ(got, -kInf) << "row " << r << " id " << i << " T " << s.temperature;
        } else {
          ASSERT_NEAR(got, expected[i], 1e-12) << "row " << r << " id " << i;
        }
      }
    }
  }
}

TEST(SamplingDistribution, TiesRankTheLowerIdFirst) {
  // 1 and 4 tie for the top: top-k 1 keeps 1, and top-p that one token's mass reaches keeps 1.
  const at::Tensor logits = at::tensor({1.0, 3.0, 2.0, 0.5, 3.0}, at::kDouble).view({1, 5});
  at::Tensor k1 = SamplingSupport(logits, Settings(1, 1, 1))[0];
  at::Tensor p = SamplingSupport(logits, Settings(1, 0, 0.05))[0];
  at::Tensor greedy = SamplingSupport(logits, Settings(0, 0, 1))[0];
  for (const at::Tensor& support : {k1, p, greedy}) {
    EXPECT_EQ(support.sum().item<int64_t>(), 1);
    EXPECT_TRUE(support[1].item<bool>());
  }
  // Banning 1 moves greedy to 4.
  EXPECT_TRUE(SamplingSupport(logits, Settings(0, 0, 1, {1}))[0][4].item<bool>());
}

TEST(SamplingDistribution, NeverSampledIdsLeaveTheNormalisation) {
  // With no cut, the distribution is the model's softmax over the other ids: the log-prob of
  // every other id rises by -log(1 - p(banned)).
  const at::Tensor logits = RandomLogits(4, token::kVocabularySize, 2);
  const SamplingSettings s = RolloutSamplingSettings(1.0, 0, 1.0);
  ASSERT_EQ(s.never_sampled, std::vector<int64_t>{token::kImagePatch});
  const at::Tensor out = SamplingLogProbs(logits, s);
  const at::Tensor model = at::log_softmax(logits, -1);
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(out[r][token::kImagePatch].item<double>(), -kInf);
    const double shift = -std::log1p(-model[r][token::kImagePatch].exp().item<double>());
    EXPECT_GT(shift, 0);
    at::Tensor others = at::ones({token::kVocabularySize}, at::kBool);
    others[token::kImagePatch] = false;
    EXPECT_NEAR((out[r].masked_select(others) - model[r].masked_select(others) - shift)
                    .abs()
                    .max()
                    .item<double>(),
                0, 1e-12);
  }
}

TEST(SamplingDistribution, GreedyIsLogProbZeroAtTheArgmaxWithZeroGradient) {
  at::Tensor logits = RandomLogits(3, 11, 3).requires_grad_(true);
  const at::Tensor argmax = logits.detach().argmax(-1);
  const SamplingSettings greedy = Settings(0, 0, 1);
  at::Tensor chosen = SampledTokenLogProbs(logits, argmax, greedy);
  EXPECT_EQ(chosen.abs().max().item<double>(), 0);
  at::Tensor out = SamplingLogProbs(logits.detach(), greedy);
  EXPECT_EQ(at::isinf(out).sum().item<int64_t>(), 3 * 10);
  chosen.sum().backward();
  ASSERT_TRUE(logits.grad().defined());
  EXPECT_EQ(logits.grad().abs().max().item<double>(), 0);
  EXPECT_FALSE(at::isnan(logits.grad()).any().item<bool>());
}

TEST(SamplingDistribution, GradientFlowsThroughTheKeptSetOnly) {
  // d log q_c / d x_j = (delta_cj - q_j) / T on the kept set, 0 off it (the cut held fixed).
  const SamplingSettings s = Settings(0.7, 6, 0.8, {2});
  at::Tensor logits = RandomLogits(5, 13, 4).requires_grad_(true);
  const at::Tensor support = SamplingSupport(logits, s);
  const at::Tensor tokens = support.to(at::kDouble).argmax(-1);  // a kept token in every row
  SampledTokenLogProbs(logits, tokens, s).sum().backward();
  const at::Tensor q = SamplingLogProbs(logits.detach(), s).exp();
  const at::Tensor onehot = at::one_hot(tokens, 13).to(at::kDouble);
  const at::Tensor expected = ((onehot - q) / 0.7).masked_fill(support.logical_not(), 0);
  EXPECT_LT((logits.grad() - expected).abs().max().item<double>(), 1e-12);
  EXPECT_EQ(logits.grad().masked_select(support.logical_not()).abs().max().item<double>(), 0);

  // And against central differences of the same function where the cut does not move.
  at::Tensor base = logits.detach().clone();
  const double h = 1e-6;
  for (int64_t j = 0; j < 13; ++j) {
    if (!support[0][j].item<bool>()) continue;
    at::Tensor plus = base.clone(), minus = base.clone();
    plus[0][j].add_(h);
    minus[0][j].sub_(h);
    const double numeric = (SampledTokenLogProbs(plus, tokens, s)[0].item<double>() -
                            SampledTokenLogProbs(minus, tokens, s)[0].item<double>()) /
                           (2 * h);
    EXPECT_NEAR(logits.grad()[0][j].item<double>(), numeric, 1e-6) << "id " << j;
  }
}

TEST(SamplingDistribution, EntropyIgnoresCutTokensAndHasNoNaNGradient) {
  const SamplingSettings s = Settings(1, 3, 1);
  at::Tensor logits = at::tensor({2.0, 1.0, 0.0, -1.0, -2.0}, at::kDouble)
                          .view({1, 5})
                          .clone()
                          .requires_grad_(true);
  at::Tensor entropy = SamplingEntropy(SamplingLogProbs(logits, s));
  const double z = std::exp(2.0) + std::exp(1.0) + 1.0;
  double expected = 0;
  for (double l : {2.0, 1.0, 0.0}) expected -= std::exp(l) / z * (l - std::log(z));
  EXPECT_NEAR(entropy[0].item<double>(), expected, 1e-12);
  entropy.sum().backward();
  EXPECT_FALSE(at::isnan(logits.grad()).any().item<bool>());
  EXPECT_EQ(logits.grad()[0][3].item<double>(), 0);
  EXPECT_NE(logits.grad()[0][0].item<double>(), 0);
}

TEST(SamplingDistribution, RowsDoNotDependOnTheBatchAndAnyLeadingShapeWorks) {
  const SamplingSettings s = Settings(0.7, 40, 0.9, {token::kImagePatch});
  const at::Tensor logits = RandomLogits(24, token::kVocabularySize, 5);
  const at::Tensor batch = SamplingLogProbs(logits, s);
  for (int64_t r : {0, 7, 23}) {
    EXPECT_TRUE(at::equal(SamplingLogProbs(logits.narrow(0, r, 1), s), batch.narrow(0, r, 1)));
  }
  // A learner's chunk is (B, T, V) with tokens (B, T).
  const at::Tensor chunk = logits.view({2, 12, -1});
  const at::Tensor tokens = at::randint(0, 200, {2, 12}, at::kLong);
  const at::Tensor chosen = SampledTokenLogProbs(chunk, tokens, s);
  ASSERT_EQ(chosen.dim(), 2);
  ASSERT_EQ(chosen.size(1), 12);
  EXPECT_TRUE(at::equal(chosen.view({-1}), batch.gather(-1, tokens.view({-1, 1})).view({-1})));
}

TEST(SamplingDistribution, Fp32LogitsAgreeWithFp64) {
  // The learner computes in fp32, the sampler in fp64 from the same fp32 logits.
  const SamplingSettings s = Settings(0.7, 50, 0.9, {token::kImagePatch});
  const at::Tensor logits = RandomLogits(32, token::kVocabularySize, 6).to(at::kFloat);
  const at::Tensor single = SamplingLogProbs(logits, s);
  const at::Tensor dbl = SamplingLogProbs(logits.to(at::kDouble), s);
  EXPECT_EQ(single.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(at::isinf(single), at::isinf(dbl)));
  const at::Tensor finite = at::isfinite(dbl);
  EXPECT_LT((single.to(at::kDouble) - dbl).masked_select(finite).abs().max().item<double>(), 1e-6);
}

TEST(SamplingDistribution, InvalidSettingsNameTheField) {
  auto message = [](const SamplingSettings& s) {
    return ValidateSamplingSettings(s, 10).message();
  };
  EXPECT_TRUE(ValidateSamplingSettings(Settings(0.7, 3, 0.9, {9}), 10).ok());
  EXPECT_NE(message(Settings(-1, 0, 1)).find("temperature"), std::string::npos);
  EXPECT_NE(message(Settings(NAN, 0, 1)).find("temperature"), std::string::npos);
  EXPECT_NE(message(Settings(1, -2, 1)).find("top_k"), std::string::npos);
  EXPECT_NE(message(Settings(1, 0, 1.5)).find("top_p"), std::string::npos);
  EXPECT_NE(message(Settings(1, 0, 1, {10})).find("never-sampled id 10"), std::string::npos);
  std::vector<int64_t> all(10);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_NE(message(Settings(1, 0, 1, all)).find("every id"), std::string::npos);
  // The tensor functions refuse them too (model code throws; callers guard).
  EXPECT_THROW(SamplingLogProbs(at::zeros({1, 10}), Settings(1, 0, 0)), c10::Error);
}

}  // namespace
}  // namespace strider::model
