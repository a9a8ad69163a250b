// The incremental-attention options that express Kimi Linear's KDA layer
// (docs/model_math.md#kimi-linears-kda-layer): the softplus decay gate, the low-rank output
// gate and the output norm's epsilon. The layer with them on is held to a per-token recurrence
// written here from the published equations, in Kimi Linear's tensor names and layouts, and its
// training and inference paths to each other.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/incremental_attention.h"
#include "common/model/model.h"
#include "common/model/ops.h"
#include "common/model/parameters.h"
#include "common/model/two_path_check.h"
#include "common/tokenizer.h"
#include "tests/model/model_helpers.h"

namespace strider {
namespace {

using model::TensorMap;

constexpr char kPrefix[] = "layers.0.incremental.";

at::Generator MakeGenerator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

at::Tensor Randn(std::vector<int64_t> shape, uint64_t seed, at::ScalarType dtype) {
  return at::randn(shape, MakeGenerator(seed), at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

ModelConfig LoadConfig(const std::string& name) {
  const char* root = std::getenv("STRIDER_SOURCE_DIR");
  Result<ModelConfig> config = LoadModelConfig(std::string(root != nullptr ? root : ".") +
                                               "/configs/model/" + name + ".yaml");
  if (!config.ok()) {
    ADD_FAILURE() << config.status().ToString();
    return ModelConfig();
  }
  return config.value();
}

// The tiny model with its incremental layers shaped and gated as Kimi Linear's: one head width
// for keys and values, both low-rank projections through head_dim, the softplus gate, vLLM's
// output norm epsilon (distinct from the model's 1e-6, so a mix-up shows).
ModelConfig KimiConfig() {
  ModelConfig config = LoadConfig("tiny");
  IncrementalAttentionConfig& c = config.incremental;
  c.decay_gate = "softplus";
  c.decay_rank = c.key_dim;
  c.gate_rank = c.key_dim;
  c.value_dim = c.key_dim;
  c.output_norm_epsilon = 1e-5;
  return config;
}

double RelativeError(const at::Tensor& actual, const at::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  return (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>() /
         std::max(scale, 1e-300);
}

// The layer's weights at order-one scale (std 1/sqrt(fan_in), norms around one, A_h spread
// around zero), so every term of the equations matters. dt_bias in [-4, 1]: with the softplus
// gate that spans alpha from near 1 to about 0.25 per step before exp(A_h).
TensorMap RandomWeights(const ModelConfig& config, at::ScalarType dtype, uint64_t seed) {
  return testing::RandomLayerWeights(config, kPrefix, dtype, seed);
}

at::Tensor Weight(const TensorMap& map, const std::string& name) {
  return map.at(std::string(kPrefix) + name);
}

// ------------------------------------------------------------------------------------------
// The reference: Kimi Linear's KDA layer one position at a time, in fp64, from the published
// equations and with the published tensor layouts (conv weights (P, 1, w), A_log (1, 1, H, 1)).
// ------------------------------------------------------------------------------------------

struct KimiKdaWeights {
  at::Tensor q_proj, k_proj, v_proj;        // (H*D, d)
  at::Tensor q_conv1d, k_conv1d, v_conv1d;  // (H*D, 1, w)
  at::Tensor A_log;                         // (1, 1, H, 1)
  at::Tensor f_a_proj, f_b_proj, dt_bias;   // (D, d), (H*D, D), (H*D)
  at::Tensor b_proj;                        // (H, d)
  at::Tensor g_a_proj, g_b_proj;            // (D, d), (H*D, D)
  at::Tensor o_norm;                        // (D)
  at::Tensor o_proj;                        // (d, H*D)
};

// Strider's tensors under Kimi Linear's names: the import's conversion, run backwards.
KimiKdaWeights ToKimi(const TensorMap& t, int64_t heads) {
  auto f64 = [&](const char* name) { return Weight(t, name).to(at::kDouble); };
  KimiKdaWeights w;
  w.q_proj = f64("query");
  w.k_proj = f64("key");
  w.v_proj = f64("value");
  w.q_conv1d = f64("query_conv").unsqueeze(1);
  w.k_conv1d = f64("key_conv").unsqueeze(1);
  w.v_conv1d = f64("value_conv").unsqueeze(1);
  w.A_log = f64("decay_log_scale").view({1, 1, heads, 1});
  w.f_a_proj = f64("decay_down");
  w.f_b_proj = f64("decay_up");
  w.dt_bias = f64("decay_bias");
  w.b_proj = f64("beta");
  w.g_a_proj = f64("gate_down");
  w.g_b_proj = f64("gate_up");
  w.o_norm = f64("output_norm");
  w.o_proj = f64("output");
  return w;
}

// Causal depthwise convolution as torch's Conv1d with padding w-1 cut to the first T outputs,
// then SiLU. x: (B, T, C), weight (C, 1, w).
at::Tensor ShortConvolution(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t width = weight.size(2);
  at::Tensor out = at::conv1d(x.transpose(1, 2), weight, {}, /*stride=*/1,
                              /*padding=*/width - 1, /*dilation=*/1, /*groups=*/x.size(2));
  return at::silu(out.narrow(2, 0, x.size(1)).transpose(1, 2));
}

// x: (B, T, d) fp64. Returns (B, T, d).
at::Tensor KimiKdaReference(const KimiKdaWeights& w, const at::Tensor& x, int64_t heads,
                            double norm_epsilon) {
  const int64_t batch = x.size(0);
  const int64_t length = x.size(1);
  const int64_t dim = w.f_a_proj.size(0);  // head_dim: keys and values alike
  const at::Tensor q_all = ShortConvolution(at::matmul(x, w.q_proj.t()), w.q_conv1d);
  const at::Tensor k_all = ShortConvolution(at::matmul(x, w.k_proj.t()), w.k_conv1d);
  const at::Tensor v_all = ShortConvolution(at::matmul(x, w.v_proj.t()), w.v_conv1d);
  auto l2norm = [](const at::Tensor& a) {
    return a / at::sqrt((a * a).sum(-1, /*keepdim=*/true) + 1e-6);
  };
  at::Tensor state = at::zeros({batch, heads, dim, dim}, x.options());  // S: (B, H, Dk, Dv)
  std::vector<at::Tensor> outputs;
  for (int64_t t = 0; t < length; ++t) {
    const at::Tensor x_t = x.select(1, t);  // (B, d)
    const at::Tensor q =
        l2norm(q_all.select(1, t).view({batch, heads, dim})) / std::sqrt(static_cast<double>(dim));
    const at::Tensor k = l2norm(k_all.select(1, t).view({batch, heads, dim}));
    const at::Tensor v = v_all.select(1, t).view({batch, heads, dim});
    const at::Tensor beta = at::sigmoid(at::matmul(x_t, w.b_proj.t()));  // (B, H)
    const at::Tensor f = (at::matmul(at::matmul(x_t, w.f_a_proj.t()), w.f_b_proj.t()) + w.dt_bias)
                             .view({batch, heads, dim});
    const at::Tensor softplus = at::where(f > 20.0, f, at::log1p(at::exp(f)));
    const at::Tensor g = -at::exp(w.A_log.view({1, heads, 1})) * softplus;  // (B, H, Dk)

    state = state * at::exp(g).unsqueeze(-1);
    const at::Tensor remembered = (state * k.unsqueeze(-1)).sum(-2);  // S^T k: (B, H, Dv)
    const at::Tensor delta = (v - remembered) * beta.unsqueeze(-1);
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2);
    at::Tensor o = (state * q.unsqueeze(-1)).sum(-2);  // S^T q: (B, H, Dv)

    const at::Tensor gate =
        at::matmul(at::matmul(x_t, w.g_a_proj.t()), w.g_b_proj.t()).view({batch, heads, dim});
    o = o * at::rsqrt((o * o).mean(-1, /*keepdim=*/true) + norm_epsilon) * w.o_norm *
        at::sigmoid(gate);
    outputs.push_back(at::matmul(o.reshape({batch, heads * dim}), w.o_proj.t()));
  }
  return at::stack(outputs, 1);
}

// The layer's outputs on the training path, one append of the whole sequence, uneven appends
// (single tokens, chunks across kernel-chunk borders) and token by token; and the final states.
struct LayerPaths {
  at::Tensor training, whole, chunked, tokens;
  model::IncrementalAttentionState whole_state, chunked_state, token_state;
};

LayerPaths RunPaths(const ModelConfig& config, const TensorMap& tensors, const at::Tensor& x) {
  const IncrementalAttentionConfig& c = config.incremental;
  const auto w = model::IncrementalAttentionWeights::Bind(tensors, kPrefix);
  const double eps = config.norm_epsilon;
  const int64_t batch = x.size(0);
  const at::TensorOptions options = x.options();
  LayerPaths p;
  p.training = model::IncrementalAttentionForward(w, c, x, nullptr, eps);
  p.whole_state = model::IncrementalAttentionState::Zeros(c, batch, options);
  p.whole = model::IncrementalAttentionForward(w, c, x, &p.whole_state, eps);
  p.chunked_state = model::IncrementalAttentionState::Zeros(c, batch, options);
  std::vector<at::Tensor> outs;
  int64_t start = 0;
  for (int64_t n : {1, 7, 40, 1, 51}) {
    const int64_t take = std::min<int64_t>(n, x.size(1) - start);
    if (take <= 0) break;
    outs.push_back(
        model::IncrementalAttentionForward(w, c, x.narrow(1, start, take), &p.chunked_state, eps));
    start += take;
  }
  if (start < x.size(1)) {
    outs.push_back(model::IncrementalAttentionForward(w, c, x.narrow(1, start, x.size(1) - start),
                                                      &p.chunked_state, eps));
  }
  p.chunked = at::cat(outs, 1);
  p.token_state = model::IncrementalAttentionState::Zeros(c, batch, options);
  outs.clear();
  for (int64_t t = 0; t < x.size(1); ++t) {
    outs.push_back(
        model::IncrementalAttentionForward(w, c, x.narrow(1, t, 1), &p.token_state, eps));
  }
  p.tokens = at::cat(outs, 1);
  return p;
}

void ExpectPathsMatchReference(at::ScalarType dtype, double tolerance) {
  const ModelConfig config = KimiConfig();
  const TensorMap tensors = RandomWeights(config, dtype, 41);
  const at::Tensor x = Randn({2, 100, config.width}, 42, dtype);  // 100: not a chunk multiple
  const at::Tensor expected =
      KimiKdaReference(ToKimi(tensors, config.incremental.heads), x.to(at::kDouble),
                       config.incremental.heads, config.incremental.output_norm_epsilon);
  const LayerPaths p = RunPaths(config, tensors, x);
  const double training = RelativeError(p.training, expected);
  const double whole = RelativeError(p.whole, expected);
  const double chunked = RelativeError(p.chunked, expected);
  const double tokens = RelativeError(p.tokens, expected);
  std::printf("kimi kda %s vs reference: training %.3g whole %.3g chunks %.3g tokens %.3g\n",
              dtype == at::kDouble ? "fp64" : "fp32", training, whole, chunked, tokens);
  EXPECT_LT(training, tolerance);
  EXPECT_LT(whole, tolerance);
  EXPECT_LT(chunked, tolerance);
  EXPECT_LT(tokens, tolerance);
}

TEST(KdaOptions, KimiLayerMatchesPerTokenRecurrenceFp64) {
  ExpectPathsMatchReference(at::kDouble, 1e-10);
}

TEST(KdaOptions, KimiLayerMatchesPerTokenRecurrenceFp32) {
  ExpectPathsMatchReference(at::kFloat, 1e-5);
}

// Both kernels agree with the options on, also where the unbounded gate decays hard: channels
// with g near -12 per step put the chunk's cumulative log decay near -380, far past where
// exp underflows in fp32.
TEST(KdaOptions, TrainingAndInferencePathsAgreeUnderStrongDecayFp32) {
  const ModelConfig config = KimiConfig();
  TensorMap tensors = RandomWeights(config, at::kFloat, 51);
  at::Tensor bias = tensors.at(std::string(kPrefix) + "decay_bias");
  bias.narrow(0, 0, bias.size(0) / 2).add_(12.0);
  const at::Tensor x = Randn({2, 100, config.width}, 52, at::kFloat);
  const LayerPaths p = RunPaths(config, tensors, x);
  for (const at::Tensor* out : {&p.whole, &p.chunked, &p.tokens}) {
    EXPECT_TRUE(at::isfinite(*out).all().item<bool>());
    EXPECT_LT(RelativeError(*out, p.training), 1e-5);
  }
  EXPECT_LT(RelativeError(p.chunked_state.recurrent, p.whole_state.recurrent), 1e-5);
  EXPECT_LT(RelativeError(p.token_state.recurrent, p.whole_state.recurrent), 1e-5);
  EXPECT_GT(p.whole_state.recurrent.abs().max().item<double>(), 1e-2);
  model::IncrementalAttentionTrace trace;
  model::IncrementalAttentionForward(model::IncrementalAttentionWeights::Bind(tensors, kPrefix),
                                     config.incremental, x, nullptr, config.norm_epsilon, &trace);
  EXPECT_LT(trace.log_decay.min().item<double>(), -10.0);  // below any sigmoid gate's g_min
}

TEST(KdaOptions, SoftplusGateValues) {
  const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);
  const int64_t heads = 2, width = 2 * 3;
  // At A = 0 and z = 0: g = -log 2, alpha = 1/2.
  at::Tensor g =
      model::SoftplusDecayGate(at::zeros({1, 2, width}, f64), at::zeros({heads}, f64), heads);
  EXPECT_EQ(g.sizes().vec(), (std::vector<int64_t>{1, 2, width}));
  EXPECT_NEAR(g.min().item<double>(), -std::log(2.0), 1e-15);
  EXPECT_NEAR(g.max().item<double>(), -std::log(2.0), 1e-15);
  // A_h scales its own head's channels by exp(A_h); above 20 softplus passes z through, and
  // there is no lower bound.
  const at::Tensor z = at::tensor({1.0, -30.0, 30.0, 1.0, 0.5, 100.0}, f64).view({1, 1, width});
  g = model::SoftplusDecayGate(z, at::tensor({0.0, std::log(3.0)}, f64), heads);
  auto softplus = [](double v) { return std::log1p(std::exp(v)); };
  EXPECT_NEAR(g[0][0][0].item<double>(), -softplus(1.0), 1e-15);
  EXPECT_NEAR(g[0][0][1].item<double>(), -softplus(-30.0), 1e-25);
  EXPECT_EQ(g[0][0][2].item<double>(), -30.0);
  EXPECT_NEAR(g[0][0][3].item<double>(), -3.0 * softplus(1.0), 1e-14);
  EXPECT_NEAR(g[0][0][4].item<double>(), -3.0 * softplus(0.5), 1e-14);
  EXPECT_NEAR(g[0][0][5].item<double>(), -300.0, 1e-12);
  EXPECT_LT(g.max().item<double>(), 0.0);
  // Kimi Linear's A_log layout (1, 1, H, 1) gives the same gate as (H).
  EXPECT_TRUE(at::equal(model::SoftplusDecayGate(
                            z, at::tensor({0.0, std::log(3.0)}, f64).view({1, 1, heads, 1}), heads),
                        g));

  // The layer wires z = W_up W_down x + b into this gate, not the sigmoid one: with those
  // weights and A zero, every channel of every position has g = -log 2.
  const ModelConfig config = KimiConfig();
  TensorMap tensors = RandomWeights(config, at::kDouble, 61);
  for (const char* name : {"decay_down", "decay_up", "decay_bias", "decay_log_scale"}) {
    tensors.at(std::string(kPrefix) + name).zero_();
  }
  model::IncrementalAttentionTrace trace;
  model::IncrementalAttentionForward(
      model::IncrementalAttentionWeights::Bind(tensors, kPrefix), config.incremental,
      Randn({1, 5, config.width}, 62, at::kDouble), nullptr, config.norm_epsilon, &trace);
  EXPECT_NEAR(trace.log_decay.min().item<double>(), -std::log(2.0), 1e-15);
  EXPECT_NEAR(trace.log_decay.max().item<double>(), -std::log(2.0), 1e-15);
}

// A low-rank output gate is the full-rank layer with gate = W_gate_up W_gate_down.
TEST(KdaOptions, LowRankGateEqualsFullRankGateOfItsProduct) {
  const ModelConfig low = KimiConfig();
  ModelConfig full = low;
  full.incremental.gate_rank = 0;
  const TensorMap low_tensors = RandomWeights(low, at::kDouble, 71);
  TensorMap full_tensors = low_tensors;
  full_tensors.erase(std::string(kPrefix) + "gate_down");
  full_tensors.erase(std::string(kPrefix) + "gate_up");
  full_tensors[std::string(kPrefix) + "gate"] =
      at::matmul(Weight(low_tensors, "gate_up"), Weight(low_tensors, "gate_down"));
  const at::Tensor x = Randn({2, 37, low.width}, 72, at::kDouble);
  const at::Tensor low_out = model::IncrementalAttentionForward(
      model::IncrementalAttentionWeights::Bind(low_tensors, kPrefix), low.incremental, x, nullptr,
      low.norm_epsilon);
  const at::Tensor full_out = model::IncrementalAttentionForward(
      model::IncrementalAttentionWeights::Bind(full_tensors, kPrefix), full.incremental, x, nullptr,
      full.norm_epsilon);
  EXPECT_LT(RelativeError(low_out, full_out), 1e-12);
}

// output_norm_epsilon 0 is the model's norm_epsilon; any other value replaces it.
TEST(KdaOptions, OutputNormEpsilonReplacesTheModelsOnlyWhenSet) {
  ModelConfig config = KimiConfig();
  const TensorMap tensors = RandomWeights(config, at::kDouble, 81);
  const auto w = model::IncrementalAttentionWeights::Bind(tensors, kPrefix);
  const at::Tensor x = Randn({1, 20, config.width}, 82, at::kDouble);
  auto run = [&](double output_epsilon, double model_epsilon) {
    IncrementalAttentionConfig c = config.incremental;
    c.output_norm_epsilon = output_epsilon;
    return model::IncrementalAttentionForward(w, c, x, nullptr, model_epsilon);
  };
  EXPECT_TRUE(at::equal(run(0.0, 1e-2), run(1e-2, 1e-6)));
  EXPECT_TRUE(at::equal(run(1e-5, 1e-2), run(1e-5, 1e-6)));
  EXPECT_GT(RelativeError(run(1e-5, 1e-6), run(0.0, 1e-2)), 1e-6);
}

TEST(KdaOptions, GradientsReachEveryParameter) {
  const ModelConfig config = KimiConfig();
  TensorMap tensors = RandomWeights(config, at::kDouble, 91);
  for (auto& [name, tensor] : tensors) tensor.requires_grad_(true);
  const at::Tensor x = Randn({1, 40, config.width}, 92, at::kDouble);
  model::IncrementalAttentionForward(model::IncrementalAttentionWeights::Bind(tensors, kPrefix),
                                     config.incremental, x, nullptr, config.norm_epsilon)
      .pow(2)
      .sum()
      .backward();
  for (const auto& [name, tensor] : tensors) {
    ASSERT_TRUE(tensor.grad().defined()) << name;
    EXPECT_GT(tensor.grad().abs().max().item<double>(), 0.0) << name;
    EXPECT_TRUE(at::isfinite(tensor.grad()).all().item<bool>()) << name;
  }
}

// The options compute where the weights are: nothing is read back to the host or made on the
// CPU beside them (the meta device has no data, so either would fail). Decode only, as
// MetaDevice.IncrementalAttentionDecodesWhereItsStateIs: LibTorch has no meta kernel for the
// chunkwise form's triangular solve.
TEST(KdaOptions, RunOnTheMetaDevice) {
  const ModelConfig config = KimiConfig();
  const IncrementalAttentionConfig& c = config.incremental;
  const at::TensorOptions meta = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  TensorMap tensors;
  for (const ParameterSpec& spec : ModelParameterSpecs(config)) {
    if (spec.name.rfind(kPrefix, 0) == 0) tensors[spec.name] = at::empty(spec.shape, meta);
  }
  const auto w = model::IncrementalAttentionWeights::Bind(tensors, kPrefix);
  at::NoGradGuard no_grad;
  auto state = model::IncrementalAttentionState::Zeros(c, 2, meta);
  for (int step = 0; step < 2; ++step) {
    const at::Tensor out = model::IncrementalAttentionForward(
        w, c, at::empty({2, 1, config.width}, meta), &state, config.norm_epsilon);
    EXPECT_TRUE(out.is_meta());
    EXPECT_EQ(out.sizes().vec(), (std::vector<int64_t>{2, 1, config.width}));
  }
  EXPECT_TRUE(state.recurrent.is_meta());
}

// A whole model with the options on keeps the two-path contract (Model::Bind joins gate_down
// into the inference path's one input product).
TEST(KdaOptions, ModelTwoPathsHoldWithKimiOptionsFp32) {
  Result<std::unique_ptr<Model>> created = Model::Create(KimiConfig(), 101);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<Model> model = std::move(created).value();
  {
    at::NoGradGuard no_grad;
    at::Generator generator = MakeGenerator(102);
    for (const auto& [name, tensor] : model->tensors()) {
      at::Tensor t = tensor;
      if (name.find("decay_log_scale") != std::string::npos) t.normal_(0.0, 0.3, generator);
      if (name == "residual_queries") t.normal_(0.0, 0.3, generator);
    }
  }
  at::Tensor tokens = at::randint(0, token::kByteCount, {1, 300}, MakeGenerator(103), at::kLong);
  Result<TwoPathReport> report = CheckTwoPaths(*model, tokens);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  std::printf("kimi kda model: max |logprob diff| %.3g\n", report->max_abs_logprob_diff);
  EXPECT_LE(report->max_abs_logprob_diff, 1e-5);
  EXPECT_GE(report->routing_agreement, 0.99);
}

TEST(KdaOptions, DefaultsAreTheShippedModel) {
  const IncrementalAttentionConfig defaults;
  EXPECT_EQ(defaults.decay_gate, "sigmoid");
  EXPECT_EQ(defaults.gate_rank, 0);
  EXPECT_EQ(defaults.output_norm_epsilon, 0.0);
  const ModelConfig tiny = LoadConfig("tiny");
  bool full_gate = false;
  for (const ParameterSpec& spec : ModelParameterSpecs(tiny)) {
    if (spec.name.rfind(kPrefix, 0) != 0) continue;
    EXPECT_EQ(spec.name.find("gate_"), std::string::npos) << spec.name;
    full_gate = full_gate || spec.name == std::string(kPrefix) + "gate";
  }
  EXPECT_TRUE(full_gate);
  const ModelConfig kimi = KimiConfig();
  int low_rank = 0;
  for (const ParameterSpec& spec : ModelParameterSpecs(kimi)) {
    if (spec.name == std::string(kPrefix) + "gate") ADD_FAILURE() << "full-rank gate kept";
    if (spec.name == std::string(kPrefix) + "gate_down") {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{kimi.incremental.key_dim, kimi.width}));
      ++low_rank;
    }
    if (spec.name == std::string(kPrefix) + "gate_up") {
      EXPECT_EQ(spec.shape,
                (std::vector<int64_t>{kimi.incremental.heads * kimi.incremental.value_dim,
                                      kimi.incremental.key_dim}));
      ++low_rank;
    }
  }
  EXPECT_EQ(low_rank, 2);
}

TEST(KdaOptions, ConfigRefusesBadValuesNamingTheKey) {
  auto refused = [](void (*edit)(IncrementalAttentionConfig&), const std::string& key) {
    ModelConfig config = KimiConfig();
    edit(config.incremental);
    const Status status = ValidateModelConfig(config, "test.yaml");
    EXPECT_FALSE(status.ok()) << key;
    EXPECT_NE(status.ToString().find("incremental_attention." + key), std::string::npos)
        << status.ToString();
  };
  refused([](IncrementalAttentionConfig& c) { c.decay_gate = "exp"; }, "decay_gate");
  refused([](IncrementalAttentionConfig& c) { c.gate_rank = -1; }, "gate_rank");
  refused([](IncrementalAttentionConfig& c) { c.output_norm_epsilon = -1e-5; },
          "output_norm_epsilon");
  refused([](IncrementalAttentionConfig& c) { c.output_norm_epsilon = std::nan(""); },
          "output_norm_epsilon");
  EXPECT_TRUE(ValidateModelConfig(KimiConfig(), "test.yaml").ok());
}

}  // namespace
}  // namespace strider
