// Routing and quantile balancing (docs/model_math.md#sparse-experts-and-routing,
// #quantile-balancing and #expert-and-routing-invariants).
#include "common/kernels/routing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

namespace strider::kernels {
namespace {

constexpr int64_t kTokens = 4096;
constexpr int64_t kExperts = 64;
constexpr int64_t kTopK = 4;

at::Generator MakeGenerator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// A skewed router: sigmoid(logit + skew_j) with one fixed per-expert skew (the "distribution")
// and fresh logits per batch. With skew ~ N(0, 1) a few experts win most tokens.
class SkewedRouter {
 public:
  SkewedRouter(int64_t tokens, int64_t experts, at::ScalarType dtype)
      : tokens_(tokens), experts_(experts), dtype_(dtype) {
    skew_ = at::randn({experts}, MakeGenerator(1), at::TensorOptions().dtype(at::kDouble));
  }
  at::Tensor Batch(uint64_t seed) const {  // (M, N)
    at::Tensor logits =
        at::randn({tokens_, experts_}, MakeGenerator(seed), at::TensorOptions().dtype(at::kDouble));
    return at::sigmoid(logits + skew_).to(dtype_);
  }

 private:
  int64_t tokens_;
  int64_t experts_;
  at::ScalarType dtype_;
  at::Tensor skew_;  // (N)
};

double BalanceOf(const at::Tensor& scores, const at::Tensor& bias) {
  return MaxViolation(RouteTopK(scores, bias, kTopK).experts, kExperts);
}

TEST(QuantileBalance, ThreeUpdatesBalanceASkewedRouter) {
  SkewedRouter router(kTokens, kExperts, at::kFloat);
  const at::Tensor batch = router.Batch(10);
  const std::vector<uint64_t> fresh_seeds = {101, 102, 103};
  at::Tensor bias = at::zeros({kExperts}, at::kFloat);
  const double initial = BalanceOf(batch, bias);
  std::printf("MaxVio before balancing: batch %.4f\n", initial);
  ASSERT_GT(initial, 3.0) << "the router is not skewed enough for this test to mean anything";

  double same = 0;
  double fresh_worst = 0;
  for (int update = 1; update <= 3; ++update) {
    bias = QuantileBalanceBias(batch, bias, kTopK);
    EXPECT_NEAR(bias.mean().item<double>(), 0.0, 1e-6);
    same = BalanceOf(batch, bias);
    fresh_worst = 0;
    std::printf("MaxVio after %d update(s): batch %.4f, fresh", update, same);
    for (uint64_t seed : fresh_seeds) {
      const double fresh = BalanceOf(router.Batch(seed), bias);
      fresh_worst = std::max(fresh_worst, fresh);
      std::printf(" %.4f", fresh);
    }
    std::printf("\n");
  }
  EXPECT_LT(same, 0.15);
  EXPECT_LT(fresh_worst, 0.4);
}

// Sign convention: the busiest expert must get a negative bias and the idlest a positive one.
TEST(QuantileBalance, PenalisesOverloadedExperts) {
  SkewedRouter router(kTokens, kExperts, at::kDouble);
  const at::Tensor batch = router.Batch(10);
  const at::Tensor zero = at::zeros({kExperts}, at::kDouble);
  const at::Tensor bias = QuantileBalanceBias(batch, zero, kTopK);
  at::Tensor load = at::bincount(RouteTopK(batch, zero, kTopK).experts.reshape({-1}), {}, kExperts);
  const int64_t busiest = load.argmax().item<int64_t>();
  const int64_t idlest = load.argmin().item<int64_t>();
  EXPECT_LT(bias[busiest].item<double>(), 0.0);
  EXPECT_GT(bias[idlest].item<double>(), 0.0);
  EXPECT_LT(bias[busiest].item<double>(), bias[idlest].item<double>());
}

// The dual objective D(bias) = sum_i (sum of the k largest s_ij + bias_j) - (M k / N) sum_j
// bias_j (routing.h) must never increase under repeated updates on the same batch, including
// when M k / N is not an integer (q = floor) and from a nonzero starting bias.
TEST(QuantileBalance, DualObjectiveNeverIncreases) {
  struct Case {
    int64_t tokens, experts, k;
  };
  for (const Case& c : {Case{kTokens, kExperts, kTopK}, Case{1000, 48, 3}, Case{777, 10, 2}}) {
    SCOPED_TRACE(testing::Message()
                 << c.tokens << " tokens, " << c.experts << " experts, k " << c.k);
    SkewedRouter router(c.tokens, c.experts, at::kDouble);
    const at::Tensor batch = router.Batch(20);
    at::Tensor bias = 0.3 * at::randn({c.experts}, MakeGenerator(5), at::kDouble);
    double previous = RoutingDualObjective(batch, bias, c.k);
    double first = previous;
    for (int update = 0; update < 12; ++update) {
      bias = QuantileBalanceBias(batch, bias, c.k);
      const double current = RoutingDualObjective(batch, bias, c.k);
      EXPECT_LE(current, previous + 1e-9 * std::abs(previous)) << "update " << update;
      previous = current;
    }
    EXPECT_LT(previous, first) << "the updates did not move the dual at all";
  }
}

// Centring is free: D is invariant to a common shift of the bias because (M k / N) N = M k.
TEST(QuantileBalance, DualObjectiveIgnoresACommonShift) {
  SkewedRouter router(1000, 48, at::kDouble);
  const at::Tensor batch = router.Batch(30);
  const at::Tensor bias = 0.2 * at::randn({48}, MakeGenerator(6), at::kDouble);
  const double base = RoutingDualObjective(batch, bias, 3);
  EXPECT_NEAR(RoutingDualObjective(batch, bias + 0.37, 3), base, 1e-9 * std::abs(base));
  // And a non-uniform change does move it: the check above is not vacuous.
  EXPECT_GT(
      std::abs(RoutingDualObjective(batch, bias + 0.05 * at::arange(48, at::kDouble), 3) - base),
      1e-3);
}

// Reference top-k by stable sort of plain doubles: the lower expert id wins ties.
std::vector<int64_t> ReferenceTopK(const std::vector<double>& biased, int64_t k) {
  std::vector<int64_t> ids(biased.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int64_t a, int64_t b) { return biased[a] > biased[b]; });
  ids.resize(k);
  return ids;
}

TEST(RouteTopK, MatchesAReferenceAndSumsToOne) {
  const int64_t m = 32, n = 16, k = 4;
  at::Tensor scores = at::rand({m, n}, MakeGenerator(7), at::kDouble);
  at::Tensor bias = 0.2 * at::randn({n}, MakeGenerator(8), at::kDouble);
  RoutingDecision decision = RouteTopK(scores, bias, k);
  ASSERT_EQ(decision.experts.sizes(), (at::IntArrayRef{m, k}));
  ASSERT_EQ(decision.experts.scalar_type(), at::kLong);
  for (int64_t i = 0; i < m; ++i) {
    std::vector<double> biased(n);
    for (int64_t j = 0; j < n; ++j) {
      biased[j] = scores[i][j].item<double>() + bias[j].item<double>();
    }
    const std::vector<int64_t> expected = ReferenceTopK(biased, k);
    double chosen_sum = 0;
    for (int64_t r = 0; r < k; ++r) chosen_sum += scores[i][expected[r]].item<double>();
    for (int64_t r = 0; r < k; ++r) {
      EXPECT_EQ(decision.experts[i][r].item<int64_t>(), expected[r]);
      EXPECT_NEAR(decision.weights[i][r].item<double>(),
                  scores[i][expected[r]].item<double>() / chosen_sum, 1e-15);
    }
  }
  EXPECT_TRUE(at::allclose(decision.weights.sum(1), at::ones({m}, at::kDouble), 0, 1e-14));
}

TEST(RouteTopK, TiesGoToTheLowerExpertId) {
  at::Tensor scores = at::tensor({0.5, 0.2, 0.5, 0.5, 0.5, 0.2}, at::kDouble).view({1, 6});
  at::Tensor bias = at::zeros({6}, at::kDouble);
  for (int repeat = 0; repeat < 5; ++repeat) {
    at::Tensor experts = RouteTopK(scores, bias, 3).experts;
    EXPECT_EQ(experts[0][0].item<int64_t>(), 0);
    EXPECT_EQ(experts[0][1].item<int64_t>(), 2);
    EXPECT_EQ(experts[0][2].item<int64_t>(), 3);
  }
  // A larger tied batch must route identically on every call.
  at::Tensor tied = at::floor(at::rand({512, 64}, MakeGenerator(9)) * 4) / 4;  // 4 distinct levels
  at::Tensor first = RouteTopK(tied, at::zeros({64}), 8).experts;
  for (int repeat = 0; repeat < 3; ++repeat) {
    EXPECT_TRUE(at::equal(RouteTopK(tied, at::zeros({64}), 8).experts, first));
  }
}

// loss = sum_i sum_r weights_ir * coefficient[i, expert_ir]: a function of the weights keyed by
// expert id, so permuting a token's chosen experts leaves it and its gradient unchanged.
at::Tensor KeyedLoss(const RoutingDecision& decision, const at::Tensor& coefficient) {
  return (decision.weights * coefficient.gather(1, decision.experts)).sum();
}

// Gradient of KeyedLoss wrt a fresh leaf copy of `scores` for the routing `route` performs.
template <typename Route>
at::Tensor KeyedLossGradient(const at::Tensor& scores, const at::Tensor& coefficient, Route route) {
  at::Tensor leaf = scores.detach().clone().requires_grad_(true);
  KeyedLoss(route(leaf), coefficient).backward();
  return leaf.grad();
}

at::Tensor Rows(const at::Tensor& values, const at::Tensor& row_mask) {
  return values.index_select(0, row_mask.nonzero().squeeze(1));
}

TEST(RouteTopK, BiasChangesTheChoiceNeverTheWeightsOrGradients) {
  const int64_t m = 256, n = 16, k = 4;
  at::Tensor scores = at::rand({m, n}, MakeGenerator(11), at::kDouble);
  at::Tensor coefficient = at::randn({m, n}, MakeGenerator(12), at::kDouble);
  at::Tensor bias_a = at::zeros({n}, at::kDouble);
  at::Tensor bias_b = 0.08 * at::randn({n}, MakeGenerator(13), at::kDouble);

  RoutingDecision a = RouteTopK(scores, bias_a, k);
  at::Tensor grad_a = KeyedLossGradient(
      scores, coefficient, [&](const at::Tensor& s) { return RouteTopK(s, bias_a, k); });
  RoutingDecision b = RouteTopK(scores, bias_b, k);
  at::Tensor grad_b = KeyedLossGradient(
      scores, coefficient, [&](const at::Tensor& s) { return RouteTopK(s, bias_b, k); });

  // Compare per token as sets: order inside the chosen set follows the biased score.
  auto [ids_a, order_a] = a.experts.sort(1);
  auto [ids_b, order_b] = b.experts.sort(1);
  at::Tensor w_a = a.weights.detach().gather(1, order_a);
  at::Tensor w_b = b.weights.detach().gather(1, order_b);
  at::Tensor same_set = (ids_a == ids_b).all(1);  // (M)
  const int64_t same = same_set.sum().item<int64_t>();
  ASSERT_GT(same, 0) << "no token kept its experts: the comparison below is empty";
  ASSERT_LT(same, m) << "the bias changed no choice: make it larger";

  EXPECT_TRUE(at::allclose(Rows(w_a, same_set), Rows(w_b, same_set), 0, 1e-15));
  EXPECT_TRUE(at::allclose(Rows(grad_a, same_set), Rows(grad_b, same_set), 0, 1e-14));
  // The tokens whose set changed do get different weights: the bias did act on them.
  EXPECT_FALSE(at::allclose(Rows(w_a, same_set.logical_not()), Rows(w_b, same_set.logical_not())));
  // Where the choice differs the formula is still s_e / sum over the chosen set.
  at::Tensor chosen = scores.detach().gather(1, b.experts);
  EXPECT_TRUE(at::allclose(b.weights.detach(), chosen / chosen.sum(1, true), 0, 1e-15));
  // The gradient reaches only the chosen scores of each token.
  at::Tensor mask = at::zeros({m, n}, at::kBool).scatter_(1, b.experts, true);
  EXPECT_EQ(grad_b.masked_select(mask.logical_not()).abs().max().item<double>(), 0.0);
  // And never the bias: it is not in the graph even when it requires a gradient.
  at::Tensor leaf_scores = scores.clone().requires_grad_(true);
  at::Tensor leaf_bias = bias_b.clone().requires_grad_(true);
  KeyedLoss(RouteTopK(leaf_scores, leaf_bias, k), coefficient).backward();
  EXPECT_TRUE(leaf_scores.grad().defined());
  EXPECT_FALSE(leaf_bias.grad().defined());
}

TEST(RouteWithExperts, ReplaysRouteTopK) {
  const int64_t m = 64, n = 32, k = 6;
  at::Tensor scores = at::rand({m, n}, MakeGenerator(14), at::kFloat);
  at::Tensor bias = 0.1 * at::randn({n}, MakeGenerator(15), at::kFloat);
  at::Tensor coefficient = at::randn({m, n}, MakeGenerator(16), at::kFloat);
  RoutingDecision live = RouteTopK(scores, bias, k);
  RoutingDecision replay = RouteWithExperts(scores, live.experts);
  EXPECT_TRUE(at::equal(replay.experts, live.experts));
  EXPECT_TRUE(at::equal(replay.weights, live.weights));
  at::Tensor grad_live = KeyedLossGradient(
      scores, coefficient, [&](const at::Tensor& s) { return RouteTopK(s, bias, k); });
  at::Tensor grad_replay = KeyedLossGradient(
      scores, coefficient, [&](const at::Tensor& s) { return RouteWithExperts(s, live.experts); });
  EXPECT_TRUE(at::equal(grad_live, grad_replay));
  // Replay of int32 ids (as they come off the wire) gives the same result.
  EXPECT_TRUE(at::equal(RouteWithExperts(scores, live.experts.to(at::kInt)).weights, live.weights));
}

TEST(MaxViolation, MatchesHandCount) {
  // 4 experts, 3 tokens x 2 choices: loads {3, 2, 1, 0}, mean 1.5, MaxVio (3 - 1.5) / 1.5 = 1.
  at::Tensor experts = at::tensor({0, 1, 0, 2, 0, 1}, at::kLong).view({3, 2});
  EXPECT_DOUBLE_EQ(MaxViolation(experts, 4), 1.0);
  at::Tensor balanced = at::tensor({0, 1, 2, 3}, at::kLong).view({2, 2});
  EXPECT_DOUBLE_EQ(MaxViolation(balanced, 4), 0.0);
}

// Largest difference between two biases up to the common shift that routing ignores (routing.h):
// min_c max_j |a_j - b_j - c|.
double BiasDistance(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor d = a.to(at::kDouble) - b.to(at::kDouble);
  return 0.5 * (d.max() - d.min()).item<double>();
}

TEST(QuantileBalanceHistogram, AgreesWithExactWithinOneBinWidth) {
  SkewedRouter router(kTokens, kExperts, at::kDouble);
  const at::Tensor batch = router.Batch(40);
  // Start from a nonzero bias (one exact update) so the range and the shift both matter.
  const at::Tensor bias = QuantileBalanceBias(batch, at::zeros({kExperts}, at::kDouble), kTopK);
  const at::Tensor exact = QuantileBalanceBias(batch, bias, kTopK);
  for (int64_t bins : {32, 256, 2048}) {
    SCOPED_TRACE(testing::Message() << bins << " bins");
    const MarginHistogramSpec spec = DefaultMarginHistogramSpec(bias, bins);
    const double width = (spec.high - spec.low) / bins;
    at::Tensor histogram = QuantileMarginHistogram(batch, bias, kTopK, spec);
    ASSERT_EQ(histogram.sizes(), (at::IntArrayRef{kExperts, bins}));
    EXPECT_TRUE((histogram.sum(1) == kTokens).all().item<bool>());
    at::Tensor approx = QuantileBalanceBiasFromHistogram(histogram, bias, kTopK, spec);
    const double error = BiasDistance(approx, exact);
    std::printf("histogram with %ld bins: max |bias error| %.3g, bin width %.3g\n",
                static_cast<long>(bins), error, width);
    EXPECT_LE(error, width);
    EXPECT_NEAR(approx.mean().item<double>(), 0.0, 1e-12);
  }
}

// Two "ranks" each histogram half the batch; the sum (what an all-reduce returns) must give
// the same bias as one rank holding the whole batch, and stay within a bin of the exact one.
TEST(QuantileBalanceHistogram, SummedRankHistogramsEqualOneRank) {
  SkewedRouter router(kTokens, kExperts, at::kFloat);
  const at::Tensor batch = router.Batch(50);
  const at::Tensor bias = QuantileBalanceBias(batch, at::zeros({kExperts}), kTopK);
  const MarginHistogramSpec spec = DefaultMarginHistogramSpec(bias, 1024);
  const double width = (spec.high - spec.low) / spec.num_bins;
  at::Tensor whole = QuantileMarginHistogram(batch, bias, kTopK, spec);
  at::Tensor summed =
      QuantileMarginHistogram(batch.narrow(0, 0, 1500), bias, kTopK, spec) +
      QuantileMarginHistogram(batch.narrow(0, 1500, kTokens - 1500), bias, kTopK, spec);
  EXPECT_TRUE(at::equal(summed, whole));
  at::Tensor from_ranks = QuantileBalanceBiasFromHistogram(summed, bias, kTopK, spec);
  EXPECT_LE(BiasDistance(from_ranks, QuantileBalanceBias(batch, bias, kTopK)), width + 1e-6);
}

TEST(QuantileBalanceHistogram, BalancesLikeTheExactUpdate) {
  SkewedRouter router(kTokens, kExperts, at::kFloat);
  const at::Tensor batch = router.Batch(10);
  at::Tensor bias = at::zeros({kExperts}, at::kFloat);
  for (int update = 0; update < 3; ++update) {
    const MarginHistogramSpec spec = DefaultMarginHistogramSpec(bias, 256);
    bias = QuantileBalanceBiasFromHistogram(QuantileMarginHistogram(batch, bias, kTopK, spec), bias,
                                            kTopK, spec);
  }
  const double same = BalanceOf(batch, bias);
  const double fresh = BalanceOf(router.Batch(101), bias);
  std::printf("histogram (256 bins) updates x3: MaxVio batch %.4f, fresh %.4f\n", same, fresh);
  EXPECT_LT(same, 0.15);
  EXPECT_LT(fresh, 0.4);
}

}  // namespace
}  // namespace strider::kernels
