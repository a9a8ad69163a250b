// Sampling: greedy, top-k, top-p, temperature, the random stream, and parameter checks.
#include "rollout_engine/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace strider::rollout {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 0.5f, 3.0f};

TEST(Sampling, GreedyPicksTheArgmaxWithTiesToTheLowerId) {
  SamplingParams params;
  params.temperature = 0;
  Sample sample = SampleToken(kLogits.data(), 5, params, 0.99);
  EXPECT_EQ(sample.token, 1);
  EXPECT_EQ(sample.log_prob, 0);
  double norm = 0;
  for (float l : kLogits) norm += std::exp(l);
  EXPECT_NEAR(sample.model_log_prob, 3.0 - std::log(norm), 1e-6);
}

TEST(Sampling, TopKAndTopPKeepOnlyTheMostLikely) {
  SamplingParams params;
  params.top_k = 2;  // tokens 1 and 4 (equal logits), each with probability 1/2
  for (double u : {0.0, 0.3, 0.49}) EXPECT_EQ(SampleToken(kLogits.data(), 5, params, u).token, 1);
  for (double u : {0.5, 0.9, 0.999}) EXPECT_EQ(SampleToken(kLogits.data(), 5, params, u).token, 4);
  Sample sample = SampleToken(kLogits.data(), 5, params, 0.1);
  EXPECT_NEAR(sample.log_prob, std::log(0.5), 1e-12);
  EXPECT_NEAR(sample.entropy, std::log(2.0), 1e-12);
  params.top_k = 0;
  params.top_p = 0.01;  // only the single most likely token
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(SampleToken(kLogits.data(), 5, params, u).token, 1);
}

TEST(Sampling, FrequenciesFollowTheTemperedSoftmax) {
  SamplingParams params;
  params.temperature = 2.0;
  std::vector<double> p(5);
  double total = 0;
  for (int i = 0; i < 5; ++i) total += p[i] = std::exp(kLogits[i] / 2.0);
  std::vector<int> counts(5, 0);
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) {
    Sample s = SampleToken(kLogits.data(), 5, params, UniformDraw(7, i));
    ++counts[s.token];
    ASSERT_NEAR(s.log_prob, std::log(p[s.token] / total), 1e-12);
  }
  for (int i = 0; i < 5; ++i) {
    const double expected = p[i] / total;
    EXPECT_NEAR(counts[i] / double(draws), expected, 4 * std::sqrt(expected / draws) + 1e-3);
  }
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
}

}  // namespace
}  // namespace strider::rollout

namespace strider::rollout {
namespace {

TEST(Sampling, BannedTokenIsNeverSampledButCountsInTheModelLogProb) {
  SamplingParams params;
  for (int i = 0; i < 200; ++i) {
    Sample sample = SampleToken(kLogits.data(), 5, params, UniformDraw(1, i), /*banned=*/1);
    ASSERT_NE(sample.token, 1);
  }
  params.temperature = 0;
  Sample greedy = SampleToken(kLogits.data(), 5, params, 0.5, /*banned=*/1);
  EXPECT_EQ(greedy.token, 4);
  double norm = 0;
  for (float l : kLogits) norm += std::exp(double(l));
  EXPECT_NEAR(greedy.model_log_prob, 3.0 - std::log(norm), 1e-6);
}

}  // namespace
}  // namespace strider::rollout
