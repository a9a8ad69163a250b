// The feed-forward and router options that express Kimi Linear's MoE
// (docs/model_math.md#kimi-linears-feed-forward): SwiGLU, full-width routed experts, sigmoid or
// softmax scores, optional renormalisation with an epsilon, routed_scaling_factor, grouped top-k
// and a router bias held as loaded. The sparse layer is checked against a per-token loop over the
// experts written here from the published equations (fp64); the router's invariants, the
// two-path contract, routing replay and expert parallelism are checked with the options on.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/kernels/routing.h"
#include "common/model/config.h"
#include "common/model/expert_parallel.h"
#include "common/model/model.h"
#include "common/model/parameters.h"
#include "common/model/sparse_experts.h"
#include "common/model/torch_status.h"
#include "common/model/two_path_check.h"
#include "common/tokenizer.h"
#include "learner/distributed.h"
#include "tests/free_port.h"
#include "tests/model/model_helpers.h"
#include "tests/scratch_dir.h"
#include "tests/shipped_config.h"

namespace strider {
namespace {

using testing::FindTensor;
using testing::MakeModel;
using testing::RandomTokens;

using model::TensorMap;

constexpr int64_t kWidth = 12;

// Kimi Linear's feed-forward on small dimensions: 16 experts in 4 groups, 2 groups kept, 3
// experts per token, one shared expert, SwiGLU, transformers' renormalisation epsilon.
FeedForwardConfig KimiFeedForward() {
  FeedForwardConfig c;
  c.latent_experts = false;
  c.activation = "silu";
  c.routed_experts = 16;
  c.experts_per_token = 3;
  c.expert_hidden = 10;
  c.shared_experts = 1;
  c.shared_hidden = 14;
  c.router_activation = "sigmoid";
  c.renormalize = true;
  c.renormalize_epsilon = 1e-20;
  c.routed_scaling_factor = 2.446;
  c.expert_groups = 4;
  c.groups_per_token = 2;
  c.quantile_balancing = false;
  return c;
}

// Every tensor of one sparse layer, fp64, named as in the parameter table without the prefix.
TensorMap LayerWeights(const FeedForwardConfig& c, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  const int64_t n = c.routed_experts, e = c.expert_hidden, s = c.shared_hidden;
  const int64_t in = c.latent_experts ? c.latent_width : kWidth;
  TensorMap t = {{"router", at::randn({n, kWidth}, g, o) * 0.6},
                 // Large enough to move choices, so selection by scores + bias is exercised.
                 {"router_bias", at::randn({n}, g, o) * 0.15},
                 {"routed_gate", at::randn({n, e, in}, g, o) * 0.4},
                 {"routed_up", at::randn({n, e, in}, g, o) * 0.4},
                 {"routed_down", at::randn({n, in, e}, g, o) * 0.4}};
  if (c.latent_experts) {
    t["latent_down"] = at::randn({c.latent_width, kWidth}, g, o) * 0.3;
    t["latent_norm"] = at::ones({c.latent_width}, o) + at::randn({c.latent_width}, g, o) * 0.1;
    t["latent_up"] = at::randn({kWidth, c.latent_width}, g, o) * 0.3;
  }
  if (c.shared_experts > 0) {
    t["shared_gate"] = at::randn({c.shared_experts, s, kWidth}, g, o) * 0.3;
    t["shared_up"] = at::randn({c.shared_experts, s, kWidth}, g, o) * 0.3;
    t["shared_down"] = at::randn({c.shared_experts, kWidth, s}, g, o) * 0.3;
  }
  return t;
}

model::SparseExpertWeights Bind(const TensorMap& t, const FeedForwardConfig& c) {
  return model::SparseExpertWeights::Bind(t, "", c.shared_experts > 0, c.latent_experts);
}

// ---- The published equations, one token at a time, in plain doubles ----

using Vector = std::vector<double>;

Vector Row(const at::Tensor& matrix, int64_t r) {
  const at::Tensor row = matrix[r].contiguous();
  return Vector(row.data_ptr<double>(), row.data_ptr<double>() + row.numel());
}

// W v for W (rows, cols).
Vector Apply(const at::Tensor& weight, const Vector& v) {
  Vector out(weight.size(0), 0.0);
  for (int64_t r = 0; r < weight.size(0); ++r) {
    const Vector w = Row(weight, r);
    for (size_t j = 0; j < v.size(); ++j) out[r] += w[j] * v[j];
  }
  return out;
}

double Sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }

double Activation(double a, double b, const FeedForwardConfig& c) {
  if (c.activation == "silu") return a * Sigmoid(a) * b;  // SiLU(a) * b
  return c.gate_cap * std::tanh(a / c.gate_cap) * Sigmoid(a) * c.up_cap * std::tanh(b / c.up_cap);
}

// down (act(gate u) * (up u)) for one expert's matrices.
Vector Expert(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
              const Vector& u, const FeedForwardConfig& c) {
  const Vector a = Apply(gate, u), b = Apply(up, u);
  Vector h(a.size());
  for (size_t i = 0; i < a.size(); ++i) h[i] = Activation(a[i], b[i], c);
  return Apply(down, h);
}

// Indices of `values` from the largest down, equal values in ascending index.
std::vector<int64_t> Descending(const Vector& values) {
  std::vector<int64_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t i, int64_t j) { return values[i] > values[j]; });
  return order;
}

struct NaiveToken {
  Vector y;
  std::vector<int64_t> experts;  // in choice order
  std::set<int64_t> kept_groups;
};

// DeepSeek-V3's router as vLLM's grouped_topk computes it, Kimi's experts and shared expert.
NaiveToken NaiveLayer(const TensorMap& t, const FeedForwardConfig& c, const Vector& x) {
  const int64_t n = c.routed_experts;
  const Vector logits = Apply(t.at("router"), x);
  Vector s(n);
  if (c.router_activation == "softmax") {
    const double top = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (int64_t e = 0; e < n; ++e) sum += std::exp(logits[e] - top);
    for (int64_t e = 0; e < n; ++e) s[e] = std::exp(logits[e] - top) / sum;
  } else {
    for (int64_t e = 0; e < n; ++e) s[e] = Sigmoid(logits[e]);
  }
  const Vector bias = Row(t.at("router_bias").unsqueeze(0), 0);
  Vector choice(n);
  for (int64_t e = 0; e < n; ++e) choice[e] = s[e] + bias[e];
  NaiveToken out;
  // Group score: the sum of the two largest biased scores in the group; keep the best groups.
  const int64_t size = n / c.expert_groups;
  Vector group_score(c.expert_groups);
  for (int64_t g = 0; g < c.expert_groups; ++g) {
    Vector members(choice.begin() + g * size, choice.begin() + (g + 1) * size);
    std::sort(members.begin(), members.end(), std::greater<double>());
    group_score[g] = members[0] + members[1];
  }
  const std::vector<int64_t> groups = Descending(group_score);
  for (int64_t i = 0; i < c.groups_per_token; ++i) out.kept_groups.insert(groups[i]);
  for (int64_t e = 0; e < n; ++e) {
    if (!out.kept_groups.count(e / size)) choice[e] = -std::numeric_limits<double>::infinity();
  }
  const std::vector<int64_t> order = Descending(choice);
  out.experts.assign(order.begin(), order.begin() + c.experts_per_token);
  // Weights from the unbiased scores; renormalised; scaled.
  Vector weight(c.experts_per_token);
  double sum = 0;
  for (int64_t i = 0; i < c.experts_per_token; ++i) sum += (weight[i] = s[out.experts[i]]);
  for (double& w : weight) {
    if (c.renormalize) w /= sum + c.renormalize_epsilon;
    w *= c.routed_scaling_factor;
  }
  const Vector u = c.latent_experts ? Apply(t.at("latent_down"), x) : x;
  Vector routed(u.size(), 0.0);
  for (int64_t i = 0; i < c.experts_per_token; ++i) {
    const int64_t e = out.experts[i];
    const Vector y = Expert(t.at("routed_gate")[e], t.at("routed_up")[e], t.at("routed_down")[e],
                            u, c);
    for (size_t j = 0; j < y.size(); ++j) routed[j] += weight[i] * y[j];
  }
  if (c.latent_experts) {
    double square = 0;
    for (double v : routed) square += v * v;
    const double inverse = 1.0 / std::sqrt(square / routed.size() + 1e-6);
    const Vector scale = Row(t.at("latent_norm").unsqueeze(0), 0);
    for (size_t j = 0; j < routed.size(); ++j) routed[j] *= inverse * scale[j];
    routed = Apply(t.at("latent_up"), routed);
  }
  out.y = routed;
  for (int64_t j = 0; j < c.shared_experts; ++j) {
    const Vector y =
        Expert(t.at("shared_gate")[j], t.at("shared_up")[j], t.at("shared_down")[j], x, c);
    for (size_t i = 0; i < y.size(); ++i) out.y[i] += y[i];
  }
  return out;
}

at::Tensor Tokens(int64_t batch, int64_t length, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randn({batch, length, kWidth}, g, at::TensorOptions().dtype(at::kDouble));
}

// The layer on both of its forms (grouped by expert with autograd, bucketed on the host without)
// against the loop, token by token: outputs to fp64 rounding and the same experts in order.
void ExpectLayerMatchesLoop(const FeedForwardConfig& c, uint64_t seed) {
  const TensorMap weights = LayerWeights(c, seed);
  const at::Tensor x = Tokens(2, 9, seed + 1);
  const at::Tensor flat = x.reshape({-1, kWidth});
  std::vector<NaiveToken> naive;
  for (int64_t m = 0; m < flat.size(0); ++m) naive.push_back(NaiveLayer(weights, c, Row(flat, m)));
  for (bool grad : {true, false}) {
    at::AutoGradMode mode(grad);
    model::RoutingRecordEntry record;
    const at::Tensor y =
        model::SparseExpertForward(Bind(weights, c), c, x, at::Tensor(), &record, 1e-6)
            .reshape({-1, kWidth});
    for (int64_t m = 0; m < flat.size(0); ++m) {
      const std::string where = std::string(grad ? "training" : "inference") + " form, token " +
                                std::to_string(m);
      const Vector got = Row(y.detach(), m);
      for (int64_t j = 0; j < kWidth; ++j) EXPECT_NEAR(got[j], naive[m].y[j], 1e-12) << where;
      for (int64_t i = 0; i < c.experts_per_token; ++i) {
        EXPECT_EQ(record.experts[m][i].item<int64_t>(), naive[m].experts[i]) << where;
      }
    }
  }
}

TEST(MoeOptions, KimiLayerMatchesAPerTokenLoopOverTheExperts) {
  const FeedForwardConfig c = KimiFeedForward();
  ExpectLayerMatchesLoop(c, 5);

  // The case is one where grouping decides: some tokens' best k by biased score lie partly
  // outside their kept groups, so a router without grouping would choose otherwise.
  const TensorMap weights = LayerWeights(c, 5);
  const at::Tensor flat = Tokens(2, 9, 6).reshape({-1, kWidth});
  FeedForwardConfig ungrouped = c;
  ungrouped.expert_groups = 1;
  ungrouped.groups_per_token = 1;
  int64_t differ = 0;
  for (int64_t m = 0; m < flat.size(0); ++m) {
    const NaiveToken grouped = NaiveLayer(weights, c, Row(flat, m));
    const NaiveToken plain = NaiveLayer(weights, ungrouped, Row(flat, m));
    differ += grouped.experts != plain.experts;
  }
  EXPECT_GT(differ, 0);
}

TEST(MoeOptions, SoftmaxScoresWithoutRenormalisationMatchTheLoop) {
  FeedForwardConfig c = KimiFeedForward();
  c.router_activation = "softmax";
  c.renormalize = false;
  c.routed_scaling_factor = 1.5;
  c.expert_groups = 1;
  c.groups_per_token = 1;
  c.shared_experts = 0;
  ExpectLayerMatchesLoop(c, 7);
}

TEST(MoeOptions, LatentExpertsWithSwigluAndGroupsMatchTheLoop) {
  FeedForwardConfig c = KimiFeedForward();
  c.latent_experts = true;
  c.latent_width = 8;
  c.shared_experts = 2;
  ExpectLayerMatchesLoop(c, 9);
  c.activation = "situ";  // SiTU-GLU experts with Kimi's router
  c.gate_cap = 0.8;       // small caps, so the loop's tanh caps matter
  c.up_cap = 0.5;
  ExpectLayerMatchesLoop(c, 10);
}

TEST(MoeOptions, DenseFeedForwardUsesTheConfiguredActivation) {
  FeedForwardConfig c = KimiFeedForward();
  at::Generator g = at::detail::createCPUGenerator(3);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  TensorMap t = {{"gate", at::randn({20, kWidth}, g, o) * 0.5},
                 {"up", at::randn({20, kWidth}, g, o) * 0.5},
                 {"down", at::randn({kWidth, 20}, g, o) * 0.5}};
  const auto w = model::DenseFeedForwardWeights::Bind(t, "");
  const at::Tensor x = Tokens(1, 4, 4);
  for (const char* activation : {"silu", "situ"}) {
    c.activation = activation;
    c.gate_cap = 0.7;
    const at::Tensor y = model::DenseFeedForward(w, c, x).reshape({-1, kWidth});
    const at::Tensor flat = x.reshape({-1, kWidth});
    for (int64_t m = 0; m < flat.size(0); ++m) {
      const Vector expected = Expert(t.at("gate"), t.at("up"), t.at("down"), Row(flat, m), c);
      const Vector got = Row(y, m);
      for (int64_t j = 0; j < kWidth; ++j) EXPECT_NEAR(got[j], expected[j], 1e-12) << activation;
    }
  }
}

// ---- The router's invariants (docs/model_math.md#kimi-linears-feed-forward) ----

at::Tensor Scores(int64_t m, int64_t n, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::sigmoid(at::randn({m, n}, g, at::TensorOptions().dtype(at::kDouble)));
}

TEST(MoeOptions, GroupedTopKPicksOnlyInsideTheKeptGroups) {
  const kernels::RouterOptions options = model::RouterOptionsOf(KimiFeedForward());
  const int64_t n = 16, size = n / options.groups;
  const at::Tensor scores = Scores(200, n, 1);
  const at::Tensor bias = Scores(1, n, 2).reshape({n}) * 0.2;
  const kernels::RoutingDecision decision = kernels::RouteTopK(scores, bias, 3, options);
  const at::Tensor biased = scores + bias;
  for (int64_t m = 0; m < scores.size(0); ++m) {
    Vector group_score(options.groups);
    for (int64_t g = 0; g < options.groups; ++g) {
      const at::Tensor top = std::get<0>(biased[m].narrow(0, g * size, size).topk(2));
      group_score[g] = top.sum().item<double>();
    }
    std::set<int64_t> used;
    for (int64_t i = 0; i < 3; ++i) used.insert(decision.experts[m][i].item<int64_t>() / size);
    EXPECT_LE(static_cast<int64_t>(used.size()), options.groups_per_token);
    // No group left out scores above a group a chosen expert came from.
    for (int64_t g : used) {
      int64_t better = 0;
      for (int64_t h = 0; h < options.groups; ++h) better += group_score[h] > group_score[g];
      EXPECT_LT(better, options.groups_per_token) << "token " << m;
    }
  }
}

TEST(MoeOptions, WeightsSumToTheScalingFactorAndTheBiasNeverEntersThem) {
  kernels::RouterOptions options = model::RouterOptionsOf(KimiFeedForward());
  const at::Tensor scores = Scores(64, 16, 3);
  const at::Tensor bias = Scores(1, 16, 4).reshape({16}) * 0.3;
  const kernels::RoutingDecision decision = kernels::RouteTopK(scores, bias, 3, options);
  EXPECT_LT((decision.weights.sum(1) - options.scaling).abs().max().item<double>(), 1e-12);
  // Same choice under another bias: the same weights, bit for bit.
  const kernels::RoutingDecision again =
      kernels::RouteWithExperts(scores, decision.experts, options);
  EXPECT_TRUE(at::equal(again.weights, decision.weights));
  const at::Tensor chosen = scores.gather(1, decision.experts);
  EXPECT_LT((decision.weights - chosen / chosen.sum(1, true) * options.scaling)
                .abs()
                .max()
                .item<double>(),
            1e-14);
  options.renormalize = false;
  const kernels::RoutingDecision raw = kernels::RouteTopK(scores, bias, 3, options);
  EXPECT_TRUE(at::equal(raw.experts, decision.experts));
  EXPECT_LT((raw.weights - chosen * options.scaling).abs().max().item<double>(), 1e-15);
}

TEST(MoeOptions, OneGroupAndDefaultOptionsAreTodaysRouterBitForBit) {
  const at::Tensor scores = Scores(100, 8, 5).to(at::kFloat);
  const at::Tensor bias = Scores(1, 8, 6).reshape({8}).to(at::kFloat) * 0.1f;
  const kernels::RoutingDecision before = kernels::RouteTopK(scores, bias, 2);
  const kernels::RoutingDecision defaults =
      kernels::RouteTopK(scores, bias, 2, model::RouterOptionsOf(FeedForwardConfig()));
  EXPECT_TRUE(at::equal(before.experts, defaults.experts));
  EXPECT_TRUE(at::equal(before.weights, defaults.weights));
  // Eight experts in one group, two in all: the one group is always kept.
  kernels::RouterOptions grouped;
  grouped.groups = 2;
  grouped.groups_per_token = 2;
  const kernels::RoutingDecision all = kernels::RouteTopK(scores, bias, 2, grouped);
  EXPECT_TRUE(at::equal(before.experts, all.experts));
}

TEST(MoeOptions, ReplayRecomputesScaledWeightsWithGradients) {
  const kernels::RouterOptions options = model::RouterOptionsOf(KimiFeedForward());
  const at::Tensor scores = Scores(32, 16, 7);
  const at::Tensor live_leaf = scores.clone().requires_grad_(true);
  const at::Tensor replay_leaf = scores.clone().requires_grad_(true);
  const at::Tensor bias = Scores(1, 16, 8).reshape({16}) * 0.2;
  const kernels::RoutingDecision live = kernels::RouteTopK(live_leaf, bias, 3, options);
  const kernels::RoutingDecision replay =
      kernels::RouteWithExperts(replay_leaf, live.experts, options);
  EXPECT_TRUE(at::equal(replay.weights, live.weights));
  const at::Tensor coefficient = Scores(32, 3, 9);
  (live.weights * coefficient).sum().backward();
  (replay.weights * coefficient).sum().backward();
  EXPECT_TRUE(at::equal(live_leaf.grad(), replay_leaf.grad()));
  // Gradients reach only the chosen scores.
  const at::Tensor chosen = at::zeros_like(scores, at::kBool).scatter_(1, live.experts, true);
  EXPECT_EQ(live_leaf.grad().masked_select(chosen.logical_not()).abs().max().item<double>(),
            0.0);
  EXPECT_GT(live_leaf.grad().masked_select(chosen).abs().min().item<double>(), 0.0);
}

TEST(MoeOptions, RouterRunsWhereItsTensorsAre) {
  // On the meta device (shapes, no data): grouped top-k makes nothing on the CPU and reads
  // nothing on the host, so it runs on a GPU as it does here (tests/model/device_test.cc).
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
  const at::Tensor scores = at::empty({5, 16}, meta);
  const at::Tensor bias = at::empty({16}, meta);
  for (bool grad : {false, true}) {
    at::AutoGradMode mode(grad);
    const kernels::RoutingDecision d =
        kernels::RouteTopK(scores, bias, 3, model::RouterOptionsOf(KimiFeedForward()));
    EXPECT_TRUE(d.experts.is_meta());
    EXPECT_TRUE(d.weights.is_meta());
    EXPECT_EQ(d.weights.sizes().vec(), (std::vector<int64_t>{5, 3}));
    const FeedForwardConfig c = KimiFeedForward();
    const at::Tensor x = at::empty({5, kWidth}, meta);
    const at::Tensor y = model::GatedFeedForward(x, at::empty({7, kWidth}, meta),
                                                 at::empty({7, kWidth}, meta),
                                                 at::empty({kWidth, 7}, meta), c);
    EXPECT_TRUE(y.is_meta());
  }
}

// ---- The whole model with the options on ----

// tiny's dimensions with Kimi Linear's feed-forward.
ModelConfig KimiFeedForwardModel() {
  ModelConfig config = testing::ShippedModelConfig("tiny");
  FeedForwardConfig& f = config.feed_forward;
  const FeedForwardConfig kimi = KimiFeedForward();
  f.latent_experts = false;
  f.activation = "silu";
  f.routed_experts = 16;
  f.experts_per_token = 3;
  f.expert_hidden = 24;
  f.shared_experts = 1;
  f.shared_hidden = 24;
  f.renormalize_epsilon = kimi.renormalize_epsilon;
  f.routed_scaling_factor = kimi.routed_scaling_factor;
  f.expert_groups = 4;
  f.groups_per_token = 2;
  f.quantile_balancing = false;
  return config;
}

TEST(MoeOptions, FullWidthExpertsHaveKimisShapesAndNoLatentProjections) {
  const ModelConfig c = KimiFeedForwardModel();
  const FeedForwardConfig& f = c.feed_forward;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ParameterSpec& spec : ModelParameterSpecs(c)) shapes[spec.name] = spec.shape;
  const std::string p = "layers.1.experts.";
  EXPECT_FALSE(shapes.count(p + "latent_down"));
  EXPECT_FALSE(shapes.count(p + "latent_norm"));
  EXPECT_FALSE(shapes.count(p + "latent_up"));
  EXPECT_EQ(shapes.at(p + "routed_gate"),
            (std::vector<int64_t>{f.routed_experts, f.expert_hidden, c.width}));
  EXPECT_EQ(shapes.at(p + "routed_up"),
            (std::vector<int64_t>{f.routed_experts, f.expert_hidden, c.width}));
  EXPECT_EQ(shapes.at(p + "routed_down"),
            (std::vector<int64_t>{f.routed_experts, c.width, f.expert_hidden}));
  EXPECT_EQ(shapes.at("layers.0.dense.gate"), (std::vector<int64_t>{f.dense_hidden, c.width}));
  // Three full-width matrices per routed expert, k of n active.
  const ParameterCounts counts = CountParameters(c);
  const double routed = 3.0 * f.routed_experts * f.expert_hidden * c.width * (c.layers - 1);
  EXPECT_EQ(counts.total_by_component.at("routed_experts"), routed);
  EXPECT_DOUBLE_EQ(counts.active_by_component.at("routed_experts"),
                   routed * f.experts_per_token / f.routed_experts);
  EXPECT_FALSE(counts.total_by_component.count("expert_latent_projections"));
}

TEST(MoeOptions, TwoPathsAgreeInFp32WithKimisFeedForward) {
  ModelConfig config = KimiFeedForwardModel();
  std::unique_ptr<Model> model = MakeModel(config, 31);
  ASSERT_NE(model, nullptr);
  Result<TwoPathReport> report = CheckTwoPaths(*model, RandomTokens(2, 160, 32));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_LE(report->max_abs_logprob_diff, 1e-5);
  EXPECT_GE(report->routing_agreement, 0.99);

  config.feed_forward.router_activation = "softmax";
  config.feed_forward.renormalize = false;
  config.feed_forward.latent_experts = true;
  model = MakeModel(config, 33);
  ASSERT_NE(model, nullptr);
  report = CheckTwoPaths(*model, RandomTokens(1, 120, 34));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_LE(report->max_abs_logprob_diff, 1e-5);
}

TEST(MoeOptions, RoutingReplayReproducesAndOverridesTheChoice) {
  std::unique_ptr<Model> model = MakeModel(KimiFeedForwardModel(), 41);
  ASSERT_NE(model, nullptr);
  const at::Tensor tokens = RandomTokens(2, 24, 42);
  ForwardOptions record;
  record.record_routing = true;
  Result<ForwardOutput> live = model->Forward({tokens}, record);
  ASSERT_TRUE(live.ok()) << live.status().ToString();
  ASSERT_EQ(live->routing.layers.size(), 3u);

  // Replaying the record gives the live logits exactly: the weights are recomputed with the
  // same options from the same scores.
  ForwardOptions replay;
  replay.replay_routing = &live->routing;
  Result<ForwardOutput> replayed = model->Forward({tokens}, replay);
  ASSERT_TRUE(replayed.ok()) << replayed.status().ToString();
  EXPECT_TRUE(at::equal(replayed->logits, live->logits));

  // The inference path replays too (the learner's replay of an actor's choices).
  Result<InferenceState> state = model->NewState(2);
  ASSERT_TRUE(state.ok());
  Result<ForwardOutput> appended = model->Append(&*state, {tokens}, replay);
  ASSERT_TRUE(appended.ok()) << appended.status().ToString();
  EXPECT_LT((appended->logits - live->logits).abs().max().item<double>(), 1e-5);

  // Another choice (outside the kept groups, too) is taken as given.
  RoutingRecord other = live->routing;
  for (RoutingRecord::Layer& layer : other.layers) {
    layer.experts = (layer.experts + 5).remainder(16);
  }
  ForwardOptions forced;
  forced.replay_routing = &other;
  forced.record_routing = true;
  Result<ForwardOutput> changed = model->Forward({tokens}, forced);
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_TRUE(at::equal(changed->routing.layers[0].experts, other.layers[0].experts));
  EXPECT_GT((changed->logits - live->logits).abs().max().item<double>(), 1e-6);
}

TEST(MoeOptions, BiasHeldAsLoadedUnlessQuantileBalancingIsOn) {
  ModelConfig config = KimiFeedForwardModel();
  std::unique_ptr<Model> held = MakeModel(config, 51);
  ASSERT_NE(held, nullptr);
  const std::string name = "layers.1.experts.router_bias";
  FindTensor(*held, name).copy_(at::linspace(-0.1, 0.1, 16));
  const at::Tensor before = FindTensor(*held, name).clone();
  ForwardOptions record;
  record.record_routing = true;
  Result<ForwardOutput> out = held->Forward({RandomTokens(2, 64, 52)}, record);
  ASSERT_TRUE(out.ok());
  Result<std::vector<double>> violations = held->UpdateRoutingBalance(out->routing);
  ASSERT_TRUE(violations.ok()) << violations.status().ToString();
  EXPECT_EQ(violations->size(), 3u);
  EXPECT_GT(violations->front(), 0.0);
  EXPECT_TRUE(at::equal(FindTensor(*held, name), before));

  config.feed_forward.quantile_balancing = true;
  std::unique_ptr<Model> balanced = MakeModel(config, 51);
  ASSERT_NE(balanced, nullptr);
  FindTensor(*balanced, name).copy_(before);
  ASSERT_TRUE(balanced->UpdateRoutingBalance(out->routing).ok());
  EXPECT_FALSE(at::equal(FindTensor(*balanced, name), before));
}

TEST(MoeOptions, SavedFullWidthModelsLoadAndShard) {
  const ModelConfig config = KimiFeedForwardModel();
  std::unique_ptr<Model> model = MakeModel(config, 61);
  ASSERT_NE(model, nullptr);
  const std::string path = testing::ScratchDir("moe_options") + "/weights.safetensors";
  ASSERT_TRUE(model->Save(path).ok());
  Result<std::unique_ptr<Model>> loaded = Model::Load(config, path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const at::Tensor tokens = RandomTokens(1, 12, 62);
  Result<ForwardOutput> a = model->Forward({tokens});
  Result<ForwardOutput> b = (*loaded)->Forward({tokens});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(at::equal(a->logits, b->logits));
  ASSERT_TRUE((*loaded)->ShardExperts(1, 4).ok());
  EXPECT_EQ(FindTensor(**loaded, "layers.2.experts.routed_down").sizes().vec(),
            (std::vector<int64_t>{4, config.width, config.feed_forward.expert_hidden}));
}

// Rank `rank` of a `world`-rank learner group on loopback, one thread a rank.
Result<std::unique_ptr<LearnerGroup>> JoinLoopbackGroup(int rank, int world, uint16_t port) {
  LearnerGroupOptions options;
  options.rank = rank;
  options.world_size = world;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout_s = 60;
  return LearnerGroup::Join(options);
}

// Expert parallelism over real Gloo ranks on loopback (as tests/learner/expert_parallel_test.cc
// does for latent experts): full-width experts sharded over two ranks give the unsharded
// layer's outputs and gradients, fp64.
TEST(MoeOptions, ShardedFullWidthExpertsEqualTheUnshardedLayer) {
  constexpr int kWorld = 2;
  const FeedForwardConfig c = KimiFeedForward();
  const TensorMap full = LayerWeights(c, 71);
  auto leaves = [&](const ExpertShard* shard) {
    TensorMap t;
    for (const auto& [name, tensor] : full) {
      at::Tensor copy = shard != nullptr && name.rfind("routed_", 0) == 0
                            ? tensor.narrow(0, shard->first, shard->count).clone()
                            : tensor.clone();
      t[name] = name == "router_bias" ? copy : copy.requires_grad_(true);
    }
    return t;
  };
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < kWorld; ++r) inputs.push_back(Tokens(1, 5 + 4 * r, 72 + r));

  TensorMap reference = leaves(nullptr);
  std::vector<at::Tensor> reference_y, reference_dx;
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (int r = 0; r < kWorld; ++r) {
    at::Tensor x = inputs[r].clone().requires_grad_(true);
    at::Tensor y =
        model::SparseExpertForward(Bind(reference, c), c, x, at::Tensor(), nullptr, 1e-6);
    loss = loss + (y * y).sum();
    reference_y.push_back(y.detach());
    reference_dx.push_back(x);
  }
  loss.backward();

  const uint16_t port = strider::testing::FreeLoopbackPort();
  std::vector<TensorMap> shards(kWorld);
  std::vector<at::Tensor> ys(kWorld), dxs(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      auto group = JoinLoopbackGroup(r, kWorld, port);
      if (!group.ok()) {
        errors[r] = group.status().ToString();
        return;
      }
      const ExpertShard shard = ExpertShardOf(c.routed_experts, r, kWorld);
      shards[r] = leaves(&shard);
      const Status ran = model::Guarded("expert forward and backward", [&] {
        at::Tensor x = inputs[r].clone().requires_grad_(true);
        at::Tensor y = model::SparseExpertForward(Bind(shards[r], c), c, x, at::Tensor(), nullptr,
                                                  1e-6, &(*group)->experts());
        (y * y).sum().backward();
        ys[r] = y.detach();
        dxs[r] = x.grad();
      });
      if (!ran.ok()) errors[r] = ran.ToString();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(errors[r].empty()) << errors[r];
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_LT((ys[r] - reference_y[r]).abs().max().item<double>(), 1e-10) << "rank " << r;
    EXPECT_LT((dxs[r] - reference_dx[r].grad()).abs().max().item<double>(), 1e-10);
    const ExpertShard shard = ExpertShardOf(c.routed_experts, r, kWorld);
    for (const char* name : {"routed_gate", "routed_up", "routed_down"}) {
      const at::Tensor expected = reference.at(name).grad().narrow(0, shard.first, shard.count);
      EXPECT_LT((shards[r].at(name).grad() - expected).abs().max().item<double>(), 1e-10)
          << name << " on rank " << r;
    }
  }
}

// A rank with no tokens of its own serves its full-width experts to the others
// (Model::ServeExperts, what the learner's lockstep rounds call): the working rank's logits and
// the serving rank's expert gradients equal the whole model's, fp64.
TEST(MoeOptions, ARankWithoutTokensServesItsFullWidthExperts) {
  constexpr int kWorld = 2;
  const ModelConfig config = KimiFeedForwardModel();
  auto make = [&]() {
    std::unique_ptr<Model> model = MakeModel(config, 81);
    EXPECT_TRUE(model->ConvertTo(at::kDouble).ok());
    model->SetRequiresGrad(true);
    return model;
  };
  const at::Tensor tokens = RandomTokens(1, 14, 82);
  std::unique_ptr<Model> whole = make();
  Result<ForwardOutput> reference = whole->Forward({tokens});
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  NextTokenLogProbs(reference->logits, tokens).sum().backward();

  const uint16_t port = strider::testing::FreeLoopbackPort();
  std::vector<std::unique_ptr<Model>> shards;
  for (int r = 0; r < kWorld; ++r) {
    shards.push_back(make());
    ASSERT_TRUE(shards.back()->ShardExperts(r, kWorld).ok());
  }
  at::Tensor logits;
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      auto group = JoinLoopbackGroup(r, kWorld, port);
      if (!group.ok()) {
        errors[r] = group.status().ToString();
        return;
      }
      const Status ran = model::Guarded("a working and a serving rank", [&] {
        if (r == 1) {
          shards[r]->ServeExperts((*group)->experts(), /*backward=*/true);
          return;
        }
        ForwardOptions forward;
        forward.expert_exchange = &(*group)->experts();
        Result<ForwardOutput> out = shards[r]->Forward({tokens}, forward);
        TORCH_CHECK(out.ok(), out.status().ToString());
        NextTokenLogProbs(out->logits, tokens).sum().backward();
        logits = out->logits.detach();
      });
      if (!ran.ok()) errors[r] = ran.ToString();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(errors[r].empty()) << errors[r];
  EXPECT_LT((logits - reference->logits).abs().max().item<double>(), 1e-10);
  const ExpertShard shard = ExpertShardOf(config.feed_forward.routed_experts, 1, kWorld);
  for (const char* part : {"routed_gate", "routed_up", "routed_down"}) {
    const std::string name = std::string("layers.2.experts.") + part;
    const at::Tensor expected = FindTensor(*whole, name).grad().narrow(0, shard.first, shard.count);
    const at::Tensor served = FindTensor(*shards[1], name).grad();
    ASSERT_TRUE(served.defined()) << name;
    EXPECT_GT(expected.abs().max().item<double>(), 0.0) << name;
    EXPECT_LT((served - expected).abs().max().item<double>(), 1e-10) << name;
  }
}

// ---- The configuration ----

TEST(MoeOptions, ConfigReadsTheKeysAndRefusesWhatTheRouterCannotDo) {
  const std::string dir = testing::ScratchDir("moe_options_config");
  auto load = [&](const std::string& feed_forward) {
    const std::string path = dir + "/model.yaml";
    std::ofstream(path) << "model:\n  vocabulary: 288\n  width: 32\n  layers: 2\n"
                           "  layer_pattern: IG\n  feed_forward:\n    routed_experts: 16\n"
                           "    experts_per_token: 3\n"
                        << feed_forward;
    return LoadModelConfig(path);
  };
  Result<ModelConfig> kimi = load(
      "    latent_experts: false\n    activation: silu\n    router_activation: softmax\n"
      "    renormalize: false\n    renormalize_epsilon: 1.0e-20\n"
      "    routed_scaling_factor: 2.446\n    expert_groups: 4\n    groups_per_token: 2\n"
      "    quantile_balancing: false\n");
  ASSERT_TRUE(kimi.ok()) << kimi.status().ToString();
  const FeedForwardConfig& f = kimi->feed_forward;
  EXPECT_FALSE(f.latent_experts);
  EXPECT_EQ(f.activation, "silu");
  EXPECT_EQ(f.router_activation, "softmax");
  EXPECT_FALSE(f.renormalize);
  EXPECT_EQ(f.renormalize_epsilon, 1e-20);
  EXPECT_EQ(f.routed_scaling_factor, 2.446);
  EXPECT_EQ(f.expert_groups, 4);
  EXPECT_EQ(f.groups_per_token, 2);
  EXPECT_FALSE(f.quantile_balancing);

  const FeedForwardConfig defaults;
  EXPECT_TRUE(defaults.latent_experts);
  EXPECT_EQ(defaults.activation, "situ");
  EXPECT_EQ(defaults.router_activation, "sigmoid");
  EXPECT_TRUE(defaults.renormalize);
  EXPECT_EQ(defaults.renormalize_epsilon, 0.0);
  EXPECT_EQ(defaults.routed_scaling_factor, 1.0);
  EXPECT_EQ(defaults.expert_groups, 1);
  EXPECT_TRUE(defaults.quantile_balancing);

  for (const auto& [yaml, key] : std::vector<std::pair<std::string, std::string>>{
           {"    activation: gelu\n", "feed_forward.activation"},
           {"    router_activation: tanh\n", "feed_forward.router_activation"},
           {"    expert_groups: 3\n", "feed_forward.expert_groups"},
           {"    expert_groups: 16\n", "feed_forward.expert_groups"},
           {"    expert_groups: 4\n    groups_per_token: 5\n", "feed_forward.groups_per_token"},
           {"    expert_groups: 8\n    groups_per_token: 1\n", "feed_forward.experts_per_token"},
           {"    routed_scaling_factor: 0\n", "feed_forward.routed_scaling_factor"},
           {"    renormalize_epsilon: -1\n", "feed_forward.renormalize_epsilon"}}) {
    Result<ModelConfig> refused = load(yaml);
    ASSERT_FALSE(refused.ok()) << yaml;
    EXPECT_NE(refused.status().message().find(key), std::string::npos)
        << yaml << ": " << refused.status().ToString();
  }
}

}  // namespace
}  // namespace strider
