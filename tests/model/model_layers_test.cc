// Layer-level invariants of docs/model_math.md#invariants and the accounting around the model:
// parameter and cache counts, checkpoints, config validation, and gradient coverage.
//
// Layer tests build their weights from the parameter table (ModelParameterSpecs) with a
// random initialisation larger than the model's (std 1/sqrt(fan_in) instead of 0.02, norms and
// zero-initialised tensors randomised too), so every term of each equation is of order one and
// a wrong weight, a missing norm or a swapped head shows up well above rounding.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/kernels/routing.h"
#include "common/model/attention_residuals.h"
#include "common/model/config.h"
#include "common/model/incremental_attention.h"
#include "common/model/latent_attention.h"
#include "common/model/model.h"
#include "common/model/ops.h"
#include "common/model/parameters.h"
#include "common/model/sparse_experts.h"
#include "common/model/vision.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "tests/model/model_helpers.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using model::TensorMap;

at::Generator MakeGenerator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

at::Tensor Randn(std::vector<int64_t> shape, uint64_t seed, at::ScalarType dtype) {
  return at::randn(shape, MakeGenerator(seed), at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

std::string SourcePath(const std::string& relative) {
  const char* root = std::getenv("STRIDER_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/" + relative;
}

ModelConfig LoadConfig(const std::string& name) {
  Result<ModelConfig> config = LoadModelConfig(SourcePath("configs/model/" + name + ".yaml"));
  if (!config.ok()) {
    ADD_FAILURE() << config.status().ToString();
    return ModelConfig();
  }
  return config.value();
}

// max |a - b| / max |b|: relative to the scale of the reference, so it stays meaningful for
// outputs with near-zero entries.
double RelativeError(const at::Tensor& actual, const at::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  return (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>() /
         std::max(scale, 1e-300);
}

double MaxAbs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Weights of every parameter whose name starts with `prefix`, at order-one scale (see the file
// comment). Decay biases stay negative so the gates span short and long memories.
TensorMap RandomWeights(const ModelConfig& config, const std::string& prefix, at::ScalarType dtype,
                        uint64_t seed) {
  TensorMap map = testing::RandomLayerWeights(config, prefix, dtype, seed);
  EXPECT_FALSE(map.empty()) << "no parameter starts with " << prefix;
  return map;
}

// Moves a freshly created model away from its special starting point (zero residual queries,
// zero router bias, A = 0), so the model-level checks exercise every term.
void Perturb(Model& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  at::Generator generator = MakeGenerator(seed);
  for (const auto& [name, tensor] : model.tensors()) {
    at::Tensor t = tensor;
    if (name == "residual_queries") t.normal_(0.0, 0.3, generator);
    if (name.find("router_bias") != std::string::npos) t.normal_(0.0, 0.05, generator);
    if (name.find("decay_log_scale") != std::string::npos) t.normal_(0.0, 0.3, generator);
    if (name == "vision.patch_bias") t.normal_(0.0, 0.1, generator);
  }
}

std::unique_ptr<Model> MakeTinyModel(uint64_t seed) {
  Result<std::unique_ptr<Model>> created = Model::Create(LoadConfig("tiny"), seed);
  if (!created.ok()) {
    ADD_FAILURE() << created.status().ToString();
    return nullptr;
  }
  std::unique_ptr<Model> model = std::move(created).value();
  Perturb(*model, seed + 1);
  return model;
}

// ------------------------------------------------------------------------------------------
// 1. Incremental attention
// ------------------------------------------------------------------------------------------

struct IncrementalPathErrors {
  double chunked_output = 0;
  double token_output = 0;
  double whole_output = 0;
  double chunked_state = 0;
  double token_state = 0;
  double chunked_tail = 0;
  double token_tail = 0;
};

// The training path (no state) against the inference path fed in uneven chunks and one token
// at a time, and the final states of those against one append of the whole sequence.
IncrementalPathErrors CompareIncrementalPaths(at::ScalarType dtype) {
  const ModelConfig config = LoadConfig("tiny");
  const IncrementalAttentionConfig& c = config.incremental;
  const TensorMap tensors = RandomWeights(config, "layers.0.incremental.", dtype, 11);
  const auto weights = model::IncrementalAttentionWeights::Bind(tensors, "layers.0.incremental.");
  const int64_t batch = 2;
  const int64_t length = 100;  // not a multiple of the chunk size (32 in tiny)
  const at::Tensor x = Randn({batch, length, config.width}, 12, dtype);
  const double eps = config.norm_epsilon;
  const at::TensorOptions options = at::TensorOptions().dtype(dtype);

  const at::Tensor training = model::IncrementalAttentionForward(weights, c, x, nullptr, eps);

  auto whole = model::IncrementalAttentionState::Zeros(c, batch, options);
  const at::Tensor whole_output = model::IncrementalAttentionForward(weights, c, x, &whole, eps);

  // Chunks that cross kernel-chunk borders, include single tokens (the recurrent kernel) and
  // end with a partial kernel chunk.
  const std::vector<int64_t> chunk_lengths = {1, 7, 40, 1, 51};
  auto chunked = model::IncrementalAttentionState::Zeros(c, batch, options);
  std::vector<at::Tensor> chunk_outputs;
  int64_t start = 0;
  for (int64_t n : chunk_lengths) {
    chunk_outputs.push_back(
        model::IncrementalAttentionForward(weights, c, x.narrow(1, start, n), &chunked, eps));
    start += n;
  }
  EXPECT_EQ(start, length);

  auto token = model::IncrementalAttentionState::Zeros(c, batch, options);
  std::vector<at::Tensor> token_outputs;
  for (int64_t t = 0; t < length; ++t) {
    token_outputs.push_back(
        model::IncrementalAttentionForward(weights, c, x.narrow(1, t, 1), &token, eps));
  }

  IncrementalPathErrors errors;
  errors.whole_output = RelativeError(whole_output, training);
  errors.chunked_output = RelativeError(at::cat(chunk_outputs, 1), training);
  errors.token_output = RelativeError(at::cat(token_outputs, 1), training);
  errors.chunked_state = RelativeError(chunked.recurrent, whole.recurrent);
  errors.token_state = RelativeError(token.recurrent, whole.recurrent);
  errors.chunked_tail = RelativeError(chunked.conv_tail, whole.conv_tail);
  errors.token_tail = RelativeError(token.conv_tail, whole.conv_tail);
  // The state must have moved: a zero state would make the state comparisons vacuous.
  EXPECT_GT(whole.recurrent.abs().max().item<double>(), 1e-2);
  std::printf(
      "incremental %s: output rel err whole %.3g chunks %.3g tokens %.3g; state %.3g %.3g; "
      "conv tail %.3g %.3g\n",
      dtype == at::kDouble ? "fp64" : "fp32", errors.whole_output, errors.chunked_output,
      errors.token_output, errors.chunked_state, errors.token_state, errors.chunked_tail,
      errors.token_tail);
  return errors;
}

TEST(IncrementalAttention, TrainingPathEqualsChunkedAndTokenByTokenAppendFp64) {
  const IncrementalPathErrors e = CompareIncrementalPaths(at::kDouble);
  for (double error : {e.whole_output, e.chunked_output, e.token_output, e.chunked_state,
                       e.token_state, e.chunked_tail, e.token_tail}) {
    EXPECT_LT(error, 1e-10);
  }
}

TEST(IncrementalAttention, TrainingPathEqualsChunkedAndTokenByTokenAppendFp32) {
  const IncrementalPathErrors e = CompareIncrementalPaths(at::kFloat);
  for (double error : {e.whole_output, e.chunked_output, e.token_output, e.chunked_state,
                       e.token_state, e.chunked_tail, e.token_tail}) {
    EXPECT_LT(error, 1e-5);
  }
}

TEST(IncrementalAttention, DecayGateAtZeroIsHalfTheLowerBound) {
  const ModelConfig config = LoadConfig("tiny");
  const IncrementalAttentionConfig& c = config.incremental;
  const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor g = model::DecayGate(at::zeros({1, 3, c.heads * c.key_dim}, f64),
                                  at::zeros({c.heads}, f64), c.heads, -5.0);
  EXPECT_EQ(g.sizes().vec(), (std::vector<int64_t>{1, 3, c.heads * c.key_dim}));
  EXPECT_EQ(g.min().item<double>(), -2.5);
  EXPECT_EQ(g.max().item<double>(), -2.5);
  EXPECT_NEAR(g.exp().max().item<double>(), 0.082085, 5e-7);

  // A_h scales its own head's channels: with z = 1 and A = (0, log 2), head 0 has
  // g = -5 sigmoid(1) and head 1 g = -5 sigmoid(2).
  at::Tensor scaled = model::DecayGate(at::ones({1, 1, c.heads * c.key_dim}, f64),
                                       at::tensor({0.0, std::log(2.0)}, f64), c.heads, -5.0);
  auto sigmoid = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  EXPECT_NEAR(scaled[0][0][0].item<double>(), -5.0 * sigmoid(1.0), 1e-14);
  EXPECT_NEAR(scaled[0][0][c.key_dim - 1].item<double>(), -5.0 * sigmoid(1.0), 1e-14);
  EXPECT_NEAR(scaled[0][0][c.key_dim].item<double>(), -5.0 * sigmoid(2.0), 1e-14);

  // The layer wires z = W_up W_down x + b into the gate: with those weights and A zero, every
  // channel of every position has g = g_min / 2.
  TensorMap tensors = RandomWeights(config, "layers.0.incremental.", at::kDouble, 21);
  for (const char* name : {"decay_down", "decay_up", "decay_bias", "decay_log_scale"}) {
    tensors["layers.0.incremental." + std::string(name)].zero_();
  }
  const auto weights = model::IncrementalAttentionWeights::Bind(tensors, "layers.0.incremental.");
  model::IncrementalAttentionTrace trace;
  model::IncrementalAttentionForward(weights, c, Randn({1, 5, config.width}, 22, at::kDouble),
                                     nullptr, config.norm_epsilon, &trace);
  EXPECT_EQ(trace.log_decay.min().item<double>(), c.min_log_decay / 2);
  EXPECT_EQ(trace.log_decay.max().item<double>(), c.min_log_decay / 2);
}

TEST(IncrementalAttention, StateSizeDoesNotDependOnLength) {
  const ModelConfig config = LoadConfig("tiny");
  const IncrementalAttentionConfig& c = config.incremental;
  const TensorMap tensors = RandomWeights(config, "layers.0.incremental.", at::kFloat, 31);
  const auto weights = model::IncrementalAttentionWeights::Bind(tensors, "layers.0.incremental.");
  const at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
  auto bytes = [](const model::IncrementalAttentionState& s) {
    return s.recurrent.nbytes() + s.conv_tail.nbytes();
  };
  auto short_state = model::IncrementalAttentionState::Zeros(c, 1, options);
  auto long_state = model::IncrementalAttentionState::Zeros(c, 1, options);
  const size_t initial = bytes(short_state);
  model::IncrementalAttentionForward(weights, c, Randn({1, 1, config.width}, 32, at::kFloat),
                                     &short_state, config.norm_epsilon);
  model::IncrementalAttentionForward(weights, c, Randn({1, 300, config.width}, 33, at::kFloat),
                                     &long_state, config.norm_epsilon);
  EXPECT_EQ(bytes(short_state), initial);
  EXPECT_EQ(bytes(long_state), initial);
  // And the accounting used by `strider model info` describes exactly this state.
  EXPECT_EQ(static_cast<int64_t>(initial), AccountCaches(config).state_bytes_per_layer);
}

// ------------------------------------------------------------------------------------------
// 2. Latent attention
// ------------------------------------------------------------------------------------------

constexpr char kLatentPrefix[] = "layers.3.latent.";  // tiny: IIIG, layer 3 is latent

// An independent transcription of docs/model_math.md#latent-attention without the gate and W_o: per
// head, explicit keys [k_nope; k_rope], causal softmax, values. Returns (B, T, H*Dv).
at::Tensor ReferenceLatentHeads(const TensorMap& t, const LatentAttentionConfig& c,
                                const at::Tensor& x, double eps) {
  auto get = [&](const char* name) { return t.at(std::string(kLatentPrefix) + name); };
  auto rms = [&](const at::Tensor& v, const at::Tensor& w) {
    return v / at::sqrt(v.pow(2).mean(-1, true) + eps) * w;
  };
  const int64_t batch = x.size(0);
  const int64_t length = x.size(1);
  at::Tensor q =
      at::matmul(rms(at::matmul(x, get("query_down").t()), get("query_norm")), get("query_up").t())
          .view({batch, length, c.heads, c.nope_dim + c.rope_dim});
  at::Tensor kv = at::matmul(x, get("kv_down").t());
  at::Tensor latent = rms(kv.narrow(-1, 0, c.kv_rank), get("kv_norm"));
  at::Tensor rope_key = kv.narrow(-1, c.kv_rank, c.rope_dim);
  at::Tensor expanded =
      at::matmul(latent, get("kv_up").t()).view({batch, length, c.heads, c.nope_dim + c.value_dim});
  at::Tensor future = at::ones({length, length}, at::kBool).triu(1);
  std::vector<at::Tensor> heads;
  for (int64_t h = 0; h < c.heads; ++h) {
    at::Tensor query = q.select(2, h);  // (B, T, Dn+Dr)
    at::Tensor key = at::cat({expanded.select(2, h).narrow(-1, 0, c.nope_dim), rope_key}, -1);
    at::Tensor value = expanded.select(2, h).narrow(-1, c.nope_dim, c.value_dim);
    at::Tensor scores = at::bmm(query, key.transpose(1, 2)) /
                        std::sqrt(static_cast<double>(c.nope_dim + c.rope_dim));
    scores = scores.masked_fill(future, -INFINITY);
    heads.push_back(at::bmm(at::softmax(scores, -1), value));
  }
  return at::cat(heads, -1);
}

TEST(LatentAttention, ZeroGateWeightGivesExactlyHalfTheUngatedOutput) {
  const ModelConfig config = LoadConfig("tiny");
  const LatentAttentionConfig& c = config.latent;
  TensorMap tensors = RandomWeights(config, kLatentPrefix, at::kDouble, 41);
  const at::Tensor x = Randn({2, 9, config.width}, 42, at::kDouble);
  const at::Tensor heads = ReferenceLatentHeads(tensors, c, x, config.norm_epsilon);

  // With the random gate: W_o [sigmoid(W_g x) * heads]. This also checks the explicit form
  // against the independent reference.
  at::Tensor gated_reference = at::matmul(
      at::sigmoid(at::matmul(x, tensors.at(std::string(kLatentPrefix) + "gate").t())) * heads,
      tensors.at(std::string(kLatentPrefix) + "output").t());
  auto weights = model::LatentAttentionWeights::Bind(tensors, kLatentPrefix);
  const at::Tensor gated =
      model::LatentAttentionForward(weights, c, x, nullptr, config.norm_epsilon);
  const double gated_error = RelativeError(gated, gated_reference);
  EXPECT_LT(gated_error, 1e-12);

  // Zero gate weight, and W_o = [I; 0] so the layer's output exposes the gated head outputs
  // themselves: they must be exactly half the ungated ones.
  const int64_t hv = c.heads * c.value_dim;
  ASSERT_GE(config.width, hv);
  tensors[std::string(kLatentPrefix) + "gate"].zero_();
  tensors[std::string(kLatentPrefix) + "output"] = at::eye(config.width, hv, at::kDouble);
  weights = model::LatentAttentionWeights::Bind(tensors, kLatentPrefix);
  const at::Tensor half =
      model::LatentAttentionForward(weights, c, x, nullptr, config.norm_epsilon);
  const double half_error = RelativeError(half.narrow(-1, 0, hv), 0.5 * heads);
  EXPECT_LT(half_error, 1e-12);
  EXPECT_EQ(half.narrow(-1, hv, config.width - hv).abs().max().item<double>(), 0.0);
  std::printf("latent gate: random gate rel err %.3g, zero gate vs half %.3g\n", gated_error,
              half_error);
}

TEST(LatentAttention, AbsorbedDecodeEqualsExplicitAndTrainingPath) {
  const ModelConfig config = LoadConfig("tiny");
  const LatentAttentionConfig& c = config.latent;
  const TensorMap tensors = RandomWeights(config, kLatentPrefix, at::kFloat, 51);
  const auto weights = model::LatentAttentionWeights::Bind(tensors, kLatentPrefix);
  const int64_t batch = 2;
  const int64_t length = 24;
  const at::Tensor x = Randn({batch, length, config.width}, 52, at::kFloat);
  const double eps = config.norm_epsilon;
  const at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);

  const at::Tensor training = model::LatentAttentionForward(weights, c, x, nullptr, eps);
  auto absorbed_cache = model::LatentAttentionCache::Empty(c, batch, options);
  auto explicit_cache = model::LatentAttentionCache::Empty(c, batch, options);
  std::vector<at::Tensor> absorbed, explicit_form;
  double worst_chunk = 0;
  int64_t start = 0;
  for (int64_t n : {5, 1, 1, 17}) {
    const at::Tensor chunk = x.narrow(1, start, n);
    absorbed.push_back(model::LatentAttentionForward(weights, c, chunk, &absorbed_cache, eps,
                                                     model::LatentAttentionForm::kAbsorbed));
    explicit_form.push_back(model::LatentAttentionForward(weights, c, chunk, &explicit_cache, eps,
                                                          model::LatentAttentionForm::kExplicit));
    worst_chunk = std::max(worst_chunk, RelativeError(absorbed.back(), explicit_form.back()));
    start += n;
  }
  const double absorbed_vs_training = RelativeError(at::cat(absorbed, 1), training);
  const double explicit_vs_training = RelativeError(at::cat(explicit_form, 1), training);
  std::printf(
      "latent fp32: absorbed vs explicit %.3g; vs training path: absorbed %.3g, "
      "explicit %.3g\n",
      worst_chunk, absorbed_vs_training, explicit_vs_training);
  EXPECT_LT(worst_chunk, 1e-6);
  EXPECT_LT(absorbed_vs_training, 1e-6);
  EXPECT_LT(explicit_vs_training, 1e-6);

  // The cache holds exactly (d_c + d_rope) values per token, as the accounting says.
  const int64_t per_token = AccountCaches(config).kv_cache_values_per_token_per_layer;
  EXPECT_EQ(per_token, c.kv_rank + c.rope_dim);
  EXPECT_EQ(absorbed_cache.length, length);
  EXPECT_EQ(absorbed_cache.Latent().size(2) + absorbed_cache.RopeKey().size(2), per_token);
  EXPECT_EQ(absorbed_cache.Bytes(), length * batch * per_token * 4);
}

// Chunked training through the absorbed form (the blockwise kernel, under autograd) against
// the explicit form after a prefill longer than the kernels' tiles: outputs and the gradients
// of every weight and of the new chunk's input agree in fp64.
TEST(LatentAttention, BlockwiseTrainingChunkEqualsTheExplicitFormWithGradients) {
  const ModelConfig config = LoadConfig("tiny");
  const LatentAttentionConfig& c = config.latent;
  const TensorMap tensors = RandomWeights(config, kLatentPrefix, at::kDouble, 61);
  const auto weights = model::LatentAttentionWeights::Bind(tensors, kLatentPrefix);
  const double eps = config.norm_epsilon;
  const at::TensorOptions options = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor past_x = Randn({1, 2500, config.width}, 62, at::kDouble);
  const at::Tensor x = Randn({1, 700, config.width}, 63, at::kDouble);
  auto cache = model::LatentAttentionCache::Empty(c, 1, options);
  {
    at::NoGradGuard no_grad;
    model::LatentAttentionForward(weights, c, past_x, &cache, eps);  // the prefill kernel
  }
  std::vector<at::Tensor> leaves;
  for (const auto& [name, tensor] : tensors) {
    if (name.rfind(kLatentPrefix, 0) == 0) leaves.push_back(tensor);
  }
  const at::Tensor upstream = Randn({1, 700, config.width}, 64, at::kDouble);
  const auto [outputs, gradients] =
      testing::BothLatentAttentionForms(weights, c, x, cache, eps, leaves, upstream);
  EXPECT_LT(RelativeError(outputs[0], outputs[1]), 1e-12);
  for (size_t i = 0; i < gradients[0].size(); ++i) {
    EXPECT_LT(RelativeError(gradients[0][i], gradients[1][i]), 1e-10) << "gradient " << i;
  }
}

TEST(LatentAttention, PermutingPastCacheEntriesLeavesCurrentOutputUnchanged) {
  const ModelConfig config = LoadConfig("tiny");
  const LatentAttentionConfig& c = config.latent;
  const TensorMap tensors = RandomWeights(config, kLatentPrefix, at::kFloat, 61);
  const auto weights = model::LatentAttentionWeights::Bind(tensors, kLatentPrefix);
  const double eps = config.norm_epsilon;
  const at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
  const int64_t past = 12;
  const at::Tensor x_past = Randn({1, past, config.width}, 62, at::kFloat);
  const at::Tensor x_now = Randn({1, 1, config.width}, 63, at::kFloat);

  auto cache = model::LatentAttentionCache::Empty(c, 1, options);
  model::LatentAttentionForward(weights, c, x_past, &cache, eps);
  const at::Tensor latent = cache.Latent().clone();
  const at::Tensor rope = cache.RopeKey().clone();
  const at::Tensor permutation = at::randperm(past, MakeGenerator(64), at::kLong);
  ASSERT_FALSE(at::equal(permutation, at::arange(past, at::kLong)));
  auto permuted = model::LatentAttentionCache::Empty(c, 1, options);
  permuted.Append(latent.index_select(1, permutation), rope.index_select(1, permutation));
  // Control: the past matters, so a changed entry must change the output.
  auto altered = model::LatentAttentionCache::Empty(c, 1, options);
  at::Tensor altered_latent = latent.clone();
  altered_latent.narrow(1, 3, 1).mul_(-1);
  altered.Append(altered_latent, rope);

  for (auto form : {model::LatentAttentionForm::kAbsorbed, model::LatentAttentionForm::kExplicit}) {
    auto original_copy = cache;  // shares storage; Append reallocates or writes past `length`
    original_copy.latent = cache.latent.clone();
    original_copy.rope_key = cache.rope_key.clone();
    auto permuted_copy = permuted;
    permuted_copy.latent = permuted.latent.clone();
    permuted_copy.rope_key = permuted.rope_key.clone();
    auto altered_copy = altered;
    altered_copy.latent = altered.latent.clone();
    altered_copy.rope_key = altered.rope_key.clone();
    const at::Tensor reference =
        model::LatentAttentionForward(weights, c, x_now, &original_copy, eps, form);
    const at::Tensor shuffled =
        model::LatentAttentionForward(weights, c, x_now, &permuted_copy, eps, form);
    const at::Tensor changed =
        model::LatentAttentionForward(weights, c, x_now, &altered_copy, eps, form);
    const double error = RelativeError(shuffled, reference);
    std::printf("latent permutation (%s): rel err %.3g, control change %.3g\n",
                form == model::LatentAttentionForm::kAbsorbed ? "absorbed" : "explicit", error,
                RelativeError(changed, reference));
    EXPECT_LT(error, 1e-6);
    EXPECT_GT(RelativeError(changed, reference), 1e-3);
  }
}

// ------------------------------------------------------------------------------------------
// 3. Attention residuals
// ------------------------------------------------------------------------------------------

model::ResidualSources RandomSources(int64_t count, uint64_t seed, at::ScalarType dtype) {
  model::ResidualSources sources(Randn({2, 3, 16}, seed, dtype));
  for (int64_t i = 1; i < count; ++i) {
    // Sources of different magnitudes, as sums of different numbers of sublayers are.
    sources.Add(static_cast<double>(i) * Randn({2, 3, 16}, seed + i, dtype));
    sources.Seal();
  }
  return sources;
}

TEST(AttentionResiduals, ZeroQueryGivesTheMeanOfTheSources) {
  const model::ResidualSources sources = RandomSources(4, 71, at::kFloat);
  ASSERT_EQ(sources.size(), 4u);
  model::ResidualReadTrace trace;
  const at::Tensor read = model::ReadResidual(sources, at::zeros({16}, at::kFloat), 1e-6, &trace);
  EXPECT_LT(MaxAbs(trace.weights, at::full_like(trace.weights, 0.25)), 1e-7);
  EXPECT_LT(RelativeError(read, at::stack(sources.All(), 0).mean(0)), 1e-6);
  EXPECT_EQ(read.scalar_type(), at::kFloat);
}

TEST(AttentionResiduals, WeightsSumToOneAndMatchTheFormula) {
  const model::ResidualSources sources = RandomSources(5, 81, at::kDouble);
  const at::Tensor query = Randn({16}, 82, at::kDouble);
  model::ResidualReadTrace trace;
  const at::Tensor read = model::ReadResidual(sources, query, 1e-6, &trace);
  EXPECT_LT(MaxAbs(trace.weights.sum(0), at::ones_like(trace.weights[0])), 1e-14);
  EXPECT_GT(trace.weights.min().item<double>(), 0.0);
  // Not uniform: the query matters.
  EXPECT_GT(MaxAbs(trace.weights, at::full_like(trace.weights, 0.2)), 1e-2);
  // a_i = softmax_i(w . RMSNorm(v_i)); the output mixes the raw sources.
  const at::Tensor stacked = at::stack(sources.All(), 0);
  const at::Tensor normed = stacked / at::sqrt(stacked.pow(2).mean(-1, true) + 1e-6);
  const at::Tensor weights = at::softmax(at::matmul(normed, query), 0);
  EXPECT_LT(MaxAbs(trace.weights, weights), 1e-14);
  EXPECT_LT(RelativeError(read, (weights.unsqueeze(-1) * stacked).sum(0)), 1e-14);
}

TEST(AttentionResiduals, ScalingOneSourceLeavesTheWeightsUnchanged) {
  const at::Tensor query = Randn({16}, 91, at::kDouble);
  std::vector<at::Tensor> raw;
  for (int i = 0; i < 3; ++i) raw.push_back(Randn({2, 3, 16}, 92 + i, at::kDouble));
  auto read_weights = [&](double scale) {
    model::ResidualSources sources(raw[0]);
    sources.Add(raw[1] * scale);
    sources.Seal();
    sources.Add(raw[2]);
    model::ResidualReadTrace trace;
    model::ReadResidual(sources, query, 1e-6, &trace);
    return trace.weights;
  };
  const at::Tensor reference = read_weights(1.0);
  for (double c : {0.1, 7.0, 1000.0}) {
    // Sources have mean square ~1, so the norm's epsilon moves the weights by ~1e-6 / c^2 at
    // most: 1e-4 covers c = 0.1.
    EXPECT_LT(MaxAbs(read_weights(c), reference), 1e-4) << "c = " << c;
  }
}

// The layer schedule of docs/model_math.md#layer-schedule, written from the document and not from
// Model::Run, over sublayers given as functions. Returns the final read. The test below holds the
// model to it, so the properties checked on this copy (source counts at 93 layers) are the model's
// too.
struct ScheduleSublayers {
  std::function<at::Tensor(const model::ResidualSources&, int64_t query)> read;
  std::function<at::Tensor(int64_t layer, const at::Tensor& h)> attention;
  std::function<at::Tensor(int64_t layer, const at::Tensor& h)> feed_forward;
};

at::Tensor RunDocumentedSchedule(int64_t layers, int64_t block, const at::Tensor& embedding,
                                 const ScheduleSublayers& sublayers) {
  model::ResidualSources sources(embedding);
  for (int64_t i = 0; i < layers; ++i) {
    // Layer 0 reads the embedding alone: its read is skipped.
    at::Tensor h = i == 0 ? embedding : sublayers.read(sources, 2 * i);
    if (i % block == 0) sources.Seal();
    sources.Add(sublayers.attention(i, h));
    h = sublayers.read(sources, 2 * i + 1);
    sources.Add(sublayers.feed_forward(i, h));
  }
  return sublayers.read(sources, 2 * layers);
}

// Model::Forward against the documented schedule over the model's own layer functions and
// weights, in fp64 with the model's expert choices replayed: equal to rounding. A schedule
// change in Model::Run (a seal moved past a sublayer, a read given another query, a sublayer
// skipped or reordered) moves the logits far above that. Block sizes 1, 2 (tiny's) and 3 put
// the seals in different places among tiny's four layers.
TEST(AttentionResiduals, ModelRunsTheDocumentedLayerSchedule) {
  for (int64_t block : {1, 2, 3}) {
    SCOPED_TRACE("residual_block " + std::to_string(block));
    ModelConfig config = LoadConfig("tiny");
    config.residual_block = block;
    Result<std::unique_ptr<Model>> created = Model::Create(config, 41);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    Model& model = *created.value();
    ASSERT_TRUE(model.ConvertTo(at::kDouble).ok());
    Perturb(model, 42);
    // Every norm and zero-initialised output away from its starting value, so that no
    // sublayer's contribution vanishes and each read's mixture matters.
    {
      at::NoGradGuard no_grad;
      at::Generator generator = MakeGenerator(43);
      for (const auto& [name, tensor] : model.tensors()) {
        if (name.find("norm") != std::string::npos) {
          at::Tensor t = tensor;
          t.normal_(1.0, 0.3, generator);
        }
      }
    }
    const at::Tensor tokens = at::randint(0, 256, {2, 40}, MakeGenerator(44), at::kLong);
    ForwardOptions options;
    options.record_routing = true;
    Result<ForwardOutput> forward = model.Forward(ModelInput{tokens, {}}, options);
    ASSERT_TRUE(forward.ok()) << forward.status().ToString();

    TensorMap map;
    for (const auto& [name, tensor] : model.tensors()) map[name] = tensor.detach();
    const double eps = config.norm_epsilon;
    const std::vector<char> kinds = config.LayerKinds();
    const at::Tensor queries = map.at("residual_queries");
    int64_t reads = 0;
    int64_t sparse_index = 0;
    ScheduleSublayers sublayers;
    sublayers.read = [&](const model::ResidualSources& sources, int64_t query) {
      ++reads;
      return model::ReadResidual(sources, queries[query], eps);
    };
    sublayers.attention = [&](int64_t i, const at::Tensor& h) {
      const std::string prefix = "layers." + std::to_string(i) + ".";
      const at::Tensor normed = model::RmsNorm(h, map.at(prefix + "attention_norm"), eps);
      if (kinds[i] == 'I') {
        return model::IncrementalAttentionForward(
            model::IncrementalAttentionWeights::Bind(map, prefix + "incremental."),
            config.incremental, normed, nullptr, eps);
      }
      return model::LatentAttentionForward(
          model::LatentAttentionWeights::Bind(map, prefix + "latent."), config.latent, normed,
          nullptr, eps);
    };
    sublayers.feed_forward = [&](int64_t i, const at::Tensor& h) {
      const std::string prefix = "layers." + std::to_string(i) + ".";
      const at::Tensor normed = model::RmsNorm(h, map.at(prefix + "feed_forward_norm"), eps);
      if (!config.IsMoeLayer(i)) {
        return model::DenseFeedForward(model::DenseFeedForwardWeights::Bind(map, prefix + "dense."),
                                       config.feed_forward, normed);
      }
      const at::Tensor replay = forward.value()
                                    .routing.layers.at(sparse_index++)
                                    .experts.reshape({normed.size(0) * normed.size(1), -1});
      return model::SparseExpertForward(
          model::SparseExpertWeights::Bind(map, prefix + "experts.",
                                           config.feed_forward.shared_experts > 0),
          config.feed_forward, normed, replay, nullptr, eps);
    };
    const at::Tensor embedding = at::embedding(map.at("embedding"), tokens);
    const at::Tensor final_read = RunDocumentedSchedule(config.layers, block, embedding, sublayers);
    const at::Tensor logits =
        model::Linear(model::RmsNorm(final_read, map.at("final_norm"), eps), map.at("output"));
    EXPECT_EQ(reads, 2 * config.layers);  // 2L + 1 queries, layer 0's first read skipped
    EXPECT_EQ(sparse_index, static_cast<int64_t>(forward.value().routing.layers.size()));
    EXPECT_LT(RelativeError(forward.value().logits, logits), 1e-10);
  }
}

TEST(AttentionResiduals, NinetyThreeLayersInBlocksOfTwelveEndWithNineSources) {
  const ModelConfig reference = LoadConfig("reference");
  ASSERT_EQ(reference.layers, 93);
  ASSERT_EQ(reference.residual_block, 12);
  // Sublayers that output ones: the sources count sublayer outputs.
  const at::Tensor one = at::ones({1, 1, 1});
  size_t largest_read = 0;
  size_t final_sources = 0;
  at::Tensor final_sum;
  ScheduleSublayers sublayers;
  sublayers.read = [&](const model::ResidualSources& sources, int64_t query) {
    largest_read = std::max(largest_read, sources.size());
    if (query == 2 * reference.layers) {
      final_sources = sources.size();
      final_sum = at::stack(sources.All(), 0).sum();
    }
    return one;
  };
  sublayers.attention = [&](int64_t, const at::Tensor&) { return one; };
  sublayers.feed_forward = [&](int64_t, const at::Tensor&) { return one; };
  RunDocumentedSchedule(reference.layers, reference.residual_block, one, sublayers);
  EXPECT_EQ(final_sources, 9u);  // embedding, 7 sealed blocks, the partial last block
  EXPECT_EQ(largest_read, 9u);
  // Every sublayer output is in exactly one source: the sources sum to 1 + 2 * 93.
  EXPECT_EQ(final_sum.item<double>(), 1.0 + 2.0 * 93);
}

// ------------------------------------------------------------------------------------------
// 4. Sparse experts and 5. dense SiTU-GLU
// ------------------------------------------------------------------------------------------

constexpr char kExpertPrefix[] = "layers.1.experts.";  // tiny: dense_layers = 1

struct ExpertSetup {
  ModelConfig config;
  TensorMap tensors;
  at::Tensor x;  // (2, 16, d)
  model::SparseExpertWeights Weights() const {
    return model::SparseExpertWeights::Bind(tensors, kExpertPrefix, true);
  }
};

ExpertSetup MakeExpertSetup(uint64_t seed) {
  ExpertSetup setup;
  setup.config = LoadConfig("tiny");
  setup.tensors = RandomWeights(setup.config, kExpertPrefix, at::kDouble, seed);
  setup.tensors[std::string(kExpertPrefix) + "router_bias"].zero_();
  setup.x = Randn({2, 16, setup.config.width}, seed + 1, at::kDouble);
  return setup;
}

std::vector<int64_t> SortedRow(const at::Tensor& experts, int64_t row) {
  at::Tensor r = experts[row].contiguous();
  std::vector<int64_t> ids(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  std::sort(ids.begin(), ids.end());
  return ids;
}

TEST(SparseExperts, RouterBiasChangesTheChoiceButNotTheWeights) {
  ExpertSetup s = MakeExpertSetup(101);
  const FeedForwardConfig& f = s.config.feed_forward;
  const at::Tensor tokens = s.x.reshape({-1, s.config.width});
  const at::Tensor scores =
      at::sigmoid(model::Linear(tokens, s.tensors.at(std::string(kExpertPrefix) + "router")));
  const at::Tensor bias = 0.1 * Randn({f.routed_experts}, 102, at::kDouble);
  const kernels::RoutingDecision plain =
      kernels::RouteTopK(scores, at::zeros({f.routed_experts}, at::kDouble), f.experts_per_token);
  const kernels::RoutingDecision biased = kernels::RouteTopK(scores, bias, f.experts_per_token);
  EXPECT_LT(MaxAbs(plain.weights.sum(-1), at::ones({tokens.size(0)}, at::kDouble)), 1e-14);
  EXPECT_LT(MaxAbs(biased.weights.sum(-1), at::ones({tokens.size(0)}, at::kDouble)), 1e-14);

  const auto weights_plain = s.Weights();
  const at::Tensor y_plain =
      model::SparseExpertForward(weights_plain, f, s.x, at::Tensor(), nullptr, 1e-6)
          .reshape({tokens.size(0), -1});
  s.tensors[std::string(kExpertPrefix) + "router_bias"].copy_(bias);
  const at::Tensor y_biased =
      model::SparseExpertForward(s.Weights(), f, s.x, at::Tensor(), nullptr, 1e-6)
          .reshape({tokens.size(0), -1});

  int64_t same = 0;
  int64_t changed = 0;
  for (int64_t m = 0; m < tokens.size(0); ++m) {
    if (SortedRow(plain.experts, m) != SortedRow(biased.experts, m)) {
      ++changed;
      continue;
    }
    ++same;
    // Same set: the same weight for each expert, whatever order the bias ranks them in.
    for (int64_t j = 0; j < f.experts_per_token; ++j) {
      const int64_t expert = plain.experts[m][j].item<int64_t>();
      const at::Tensor slot = (biased.experts[m] == expert).nonzero().reshape({-1});
      ASSERT_EQ(slot.numel(), 1);
      EXPECT_NEAR(biased.weights[m][slot[0]].item<double>(), plain.weights[m][j].item<double>(),
                  1e-15);
    }
    EXPECT_LT(MaxAbs(y_biased[m], y_plain[m]), 1e-12 * y_plain[m].abs().max().item<double>());
  }
  std::printf("router bias: %lld tokens kept their experts, %lld changed\n",
              static_cast<long long>(same), static_cast<long long>(changed));
  // Both cases must occur for the test to say anything.
  EXPECT_GT(same, 0);
  EXPECT_GT(changed, 0);
}

TEST(SparseExperts, ScalingEveryRoutedExpertOutputLeavesOutputUnchanged) {
  const ExpertSetup s = MakeExpertSetup(111);
  const FeedForwardConfig& f = s.config.feed_forward;
  const double eps = s.config.norm_epsilon;
  const at::Tensor reference =
      model::SparseExpertForward(s.Weights(), f, s.x, at::Tensor(), nullptr, eps);
  for (double c : {0.3, 7.0}) {
    ExpertSetup scaled = s;
    scaled.tensors[std::string(kExpertPrefix) + "routed_down"] =
        s.tensors.at(std::string(kExpertPrefix) + "routed_down") * c;
    // RMSNorm(c v) with epsilon c^2 eps is exactly RMSNorm(v) with eps: this isolates the
    // invariance from the epsilon, so it must hold to rounding.
    const double exact = RelativeError(
        model::SparseExpertForward(scaled.Weights(), f, s.x, at::Tensor(), nullptr, eps * c * c),
        reference);
    // With the config's epsilon the change is of order eps / (c^2 mean square of the combined
    // routed output), ~1e-4 at c = 0.3 here; an unnormalised sum would change y by O(1).
    const double with_epsilon = RelativeError(
        model::SparseExpertForward(scaled.Weights(), f, s.x, at::Tensor(), nullptr, eps),
        reference);
    std::printf("routed_down x %.2f: rel change %.3g (epsilon scaled), %.3g (config epsilon)\n", c,
                exact, with_epsilon);
    EXPECT_LT(exact, 1e-12);
    EXPECT_LT(with_epsilon, 1e-3);
  }
  // Control: scaling the shared up-projection after the norm does change y.
  ExpertSetup control = s;
  control.tensors[std::string(kExpertPrefix) + "latent_up"] =
      s.tensors.at(std::string(kExpertPrefix) + "latent_up") * 2.0;
  EXPECT_GT(RelativeError(
                model::SparseExpertForward(control.Weights(), f, s.x, at::Tensor(), nullptr, eps),
                reference),
            1e-2);
}

TEST(SparseExperts, RoutingReplayReproducesTheOutputAndGradientsReachTheRouter) {
  ExpertSetup s = MakeExpertSetup(121);
  const FeedForwardConfig& f = s.config.feed_forward;
  model::RoutingRecordEntry record;
  const at::Tensor original =
      model::SparseExpertForward(s.Weights(), f, s.x, at::Tensor(), &record, 1e-6);
  ASSERT_EQ(record.experts.sizes().vec(), (std::vector<int64_t>{32, f.experts_per_token}));

  // A different bias would choose differently; replay must ignore it.
  s.tensors[std::string(kExpertPrefix) + "router_bias"].copy_(
      0.5 * Randn({f.routed_experts}, 122, at::kDouble));
  const at::Tensor rerouted =
      model::SparseExpertForward(s.Weights(), f, s.x, at::Tensor(), nullptr, 1e-6);
  EXPECT_GT(RelativeError(rerouted, original), 1e-3) << "the new bias changes no choice";
  const at::Tensor replayed =
      model::SparseExpertForward(s.Weights(), f, s.x, record.experts, nullptr, 1e-6);
  EXPECT_TRUE(at::equal(replayed, original));

  // Gradients reach the router through the weights p, never the bias.
  model::SparseExpertWeights weights = s.Weights();
  weights.router.requires_grad_(true);
  weights.router_bias.requires_grad_(true);
  const at::Tensor y = model::SparseExpertForward(weights, f, s.x, at::Tensor(), nullptr, 1e-6);
  (y * Randn(y.sizes().vec(), 123, at::kDouble)).sum().backward();
  ASSERT_TRUE(weights.router.grad().defined());
  EXPECT_TRUE(at::isfinite(weights.router.grad()).all().item<bool>());
  EXPECT_GT(weights.router.grad().abs().max().item<double>(), 1e-6);
  EXPECT_TRUE(!weights.router_bias.grad().defined() ||
              weights.router_bias.grad().abs().max().item<double>() == 0.0);
}

TEST(DenseFeedForward, MatchesTheSituGluFormula) {
  ModelConfig config = LoadConfig("tiny");
  TensorMap tensors = RandomWeights(config, "layers.0.dense.", at::kDouble, 131);
  const auto weights = model::DenseFeedForwardWeights::Bind(tensors, "layers.0.dense.");
  // Inputs of std 3 put many pre-activations past the caps, where SiTU and SwiGLU differ.
  const at::Tensor x = 3.0 * Randn({2, 5, config.width}, 132, at::kDouble);
  const at::Tensor a = at::matmul(x, weights.gate.t());
  const at::Tensor b = at::matmul(x, weights.up.t());
  for (auto [c1, c2] : {std::pair<double, double>{4.0, 25.0}, {2.0, 3.0}}) {
    config.feed_forward.gate_cap = c1;
    config.feed_forward.up_cap = c2;
    const at::Tensor hidden = c1 * at::tanh(a / c1) / (1.0 + at::exp(-a)) * c2 * at::tanh(b / c2);
    const at::Tensor expected = at::matmul(hidden, weights.down.t());
    const at::Tensor actual = model::DenseFeedForward(weights, config.feed_forward, x);
    EXPECT_LT(RelativeError(actual, expected), 1e-13) << "caps " << c1 << ", " << c2;
    const at::Tensor swiglu = at::matmul(a * at::sigmoid(a) * b, weights.down.t());
    EXPECT_GT(RelativeError(actual, swiglu), 1e-2) << "inputs too small to reach the caps";
  }
}

// ------------------------------------------------------------------------------------------
// 6. Vision
// ------------------------------------------------------------------------------------------

void ExpectInvalid(const Status& status, const std::string& fragment) {
  EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
  EXPECT_NE(status.message().find(fragment), std::string::npos)
      << "message '" << status.message() << "' does not mention '" << fragment << "'";
}

TEST(Vision, ValidateImageRejectsMalformedImages) {
  const VisionConfig config = LoadConfig("tiny").vision;  // P = 4, grid up to 8 x 8, 3 channels
  EXPECT_TRUE(model::ValidateImage(config, at::rand({8, 12, 3})).ok());
  ExpectInvalid(model::ValidateImage(config, at::rand({8, 8, 4})), "4 channels");
  ExpectInvalid(model::ValidateImage(config, at::rand({6, 8, 3})), "multiples of the patch size");
  ExpectInvalid(model::ValidateImage(config, at::rand({8, 0, 3})), "multiples of the patch size");
  ExpectInvalid(model::ValidateImage(config, at::rand({36, 8, 3})), "exceeds the largest patch");
  ExpectInvalid(model::ValidateImage(config, at::rand({8, 36, 3})), "exceeds the largest patch");
  ExpectInvalid(model::ValidateImage(config, at::rand({8, 8})), "(height, width, channels)");
  ExpectInvalid(model::ValidateImage(config, at::rand({1, 8, 8, 3})), "(height, width, channels)");
  ExpectInvalid(model::ValidateImage(config, at::ones({8, 8, 3}, at::kByte)), "floating point");
  VisionConfig disabled = config;
  disabled.enabled = false;
  ExpectInvalid(model::ValidateImage(disabled, at::rand({8, 8, 3})), "disabled");
}

// Two sequences; the first holds an 8 x 12 image (2 x 3 = 6 patches) after three text tokens.
ModelInput MakeImageInput(uint64_t seed) {
  std::vector<int64_t> row0 = {'S', 'e', 'e', token::kImageStart};
  for (int i = 0; i < 6; ++i) row0.push_back(token::kImagePatch);
  row0.push_back(token::kImageEnd);
  for (char ch : std::string(" a cat sit")) row0.push_back(ch);
  std::vector<int64_t> row1;
  for (char ch : std::string("No image in this row.")) row1.push_back(ch);
  EXPECT_EQ(row0.size(), row1.size());
  ModelInput input;
  input.tokens = at::stack({at::tensor(row0, at::kLong), at::tensor(row1, at::kLong)});
  input.images.push_back(
      {0, at::rand({8, 12, 3}, MakeGenerator(seed), at::TensorOptions().dtype(at::kFloat))});
  return input;
}

TEST(Vision, TrainingAndInferencePathsAgreeWithAnImage) {
  std::unique_ptr<Model> model = MakeTinyModel(141);
  ASSERT_NE(model, nullptr);
  const ModelInput input = MakeImageInput(142);
  const int64_t length = input.tokens.size(1);
  const int64_t first = 12;  // the image ends at position 10: inside the first chunk

  Result<InferenceState> state = model->NewState(2);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  ForwardOptions record;
  record.record_routing = true;
  ModelInput head{input.tokens.narrow(1, 0, first), input.images};
  ModelInput tail{input.tokens.narrow(1, first, length - first), {}};
  Result<ForwardOutput> part1 = model->Append(&state.value(), head, record);
  ASSERT_TRUE(part1.ok()) << part1.status().ToString();
  Result<ForwardOutput> part2 = model->Append(&state.value(), tail, record);
  ASSERT_TRUE(part2.ok()) << part2.status().ToString();
  EXPECT_EQ(state->length(), length);
  // The caches hold (d_c + d_rope) values per token per latent layer; the states are fixed.
  const CacheAccounting accounting = AccountCaches(model->config());
  EXPECT_EQ(state->CacheBytes(), 2 * length * accounting.kv_cache_bytes_per_token);
  EXPECT_EQ(state->StateBytes(), 2 * accounting.state_bytes_per_sequence);

  const RoutingRecord routing = RoutingRecord::Concatenate({part1->routing, part2->routing});
  ForwardOptions replay;
  replay.replay_routing = &routing;
  Result<ForwardOutput> full = model->Forward(input, replay);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  const at::Tensor inference = at::cat({part1->logits, part2->logits}, 1);
  const double error = MaxAbs(inference, full->logits);
  std::printf("vision two paths: max abs logit difference %.3g (logit scale %.3g)\n", error,
              full->logits.abs().max().item<double>());
  EXPECT_LT(error, 1e-5);

  // The image is seen: another image changes the logits after it.
  ModelInput other = input;
  other.images[0].pixels = 1.0 - input.images[0].pixels;
  Result<ForwardOutput> changed = model->Forward(other, replay);
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_GT(MaxAbs(changed->logits[0].narrow(0, 11, length - 11),
                   full->logits[0].narrow(0, 11, length - 11)),
            1e-4);
}

TEST(Vision, PlaceholderCountMustMatchTheImages) {
  std::unique_ptr<Model> model = MakeTinyModel(151);
  ASSERT_NE(model, nullptr);
  ModelInput input = MakeImageInput(152);
  input.images[0].pixels = at::rand({8, 8, 3});  // 4 patches for 6 placeholders
  Result<ForwardOutput> forward = model->Forward(input);
  ASSERT_FALSE(forward.ok());
  ExpectInvalid(forward.status(), "6 image-patch tokens but its images give 4 patches");

  Result<InferenceState> state = model->NewState(2);
  ASSERT_TRUE(state.ok());
  Result<ForwardOutput> appended = model->Append(&state.value(), input);
  ASSERT_FALSE(appended.ok());
  EXPECT_TRUE(appended.status().IsInvalidArgument()) << appended.status().ToString();
  EXPECT_EQ(state->length(), 0);

  ModelInput no_image = MakeImageInput(153);
  no_image.images.clear();
  ExpectInvalid(model->Forward(no_image).status(), "but its images give 0 patches");
  ModelInput wrong_row = MakeImageInput(154);
  wrong_row.images[0].sequence = 2;
  ExpectInvalid(model->Forward(wrong_row).status(), "outside the batch");
}

// ------------------------------------------------------------------------------------------
// 7. Parameter and cache accounting
// ------------------------------------------------------------------------------------------

TEST(ParameterAccounting, CountedEqualsAllocatedForTinyAndSmall) {
  for (const char* name : {"tiny", "small"}) {
    const ModelConfig config = LoadConfig(name);
    Result<std::unique_ptr<Model>> model = Model::Create(config, 1);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    double allocated = 0;
    for (const auto& [tensor_name, tensor] : (*model)->tensors()) allocated += tensor.numel();
    const ParameterCounts counts = CountParameters(config);
    std::printf("%s: %.0f parameters counted, %.0f allocated, %.0f active\n", name, counts.total,
                allocated, counts.active);
    EXPECT_EQ(counts.total, allocated) << name;
    // Names and shapes follow the table one to one.
    const std::vector<ParameterSpec> specs = ModelParameterSpecs(config);
    ASSERT_EQ(specs.size(), (*model)->tensors().size());
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(specs[i].name, (*model)->tensors()[i].first);
      EXPECT_EQ(specs[i].shape, (*model)->tensors()[i].second.sizes().vec()) << specs[i].name;
    }
  }
}

TEST(ParameterAccounting, ReferenceMatchesThePublishedTotals) {
  const ModelConfig config = LoadConfig("reference");
  EXPECT_EQ(config.CountLayers('G'), 24);
  EXPECT_EQ(config.CountLayers('I'), 69);
  const ParameterCounts counts = CountParameters(config);
  std::printf("reference: total %.4g, active %.4g\n", counts.total, counts.active);
  EXPECT_NEAR(counts.total / 2.8e12, 1.0, 0.05);
  EXPECT_NEAR(counts.active / 104e9, 1.0, 0.05);
  EXPECT_EQ(counts.total_by_component.at("routed_experts"), 896.0 * 3 * 3584 * 3072 * 92);
  EXPECT_DOUBLE_EQ(counts.active_by_component.at("routed_experts"), 16.0 * 3 * 3584 * 3072 * 92);

  const CacheAccounting caches = AccountCaches(config);
  EXPECT_EQ(caches.kv_cache_values_per_token_per_layer, 576);
  EXPECT_EQ(caches.baseline_kv_values_per_token_per_layer, 24576);
  EXPECT_NEAR(static_cast<double>(caches.baseline_kv_values_per_token_per_layer) /
                  caches.kv_cache_values_per_token_per_layer,
              42.67, 0.01);
  EXPECT_EQ(caches.kv_cache_bytes_per_token, 24 * 576 * 2);  // bfloat16 cache
  // The recurrent state is 6 MiB per layer (96 x 128 x 128 fp32); the convolution tail adds
  // 3 positions of the q, k, v projections.
  EXPECT_EQ(caches.state_bytes_per_layer, 6 * 1024 * 1024 + 3 * 96 * 384 * 4);
}

// ------------------------------------------------------------------------------------------
// 8. Checkpoints
// ------------------------------------------------------------------------------------------

using testing::TempDir;

// Writes the model's tensors with `skip` left out and `reshape` stored as its transpose.
Status WriteAltered(const Model& model, const std::string& path, const std::string& skip,
                    const std::string& reshape) {
  std::vector<at::Tensor> keep;
  std::vector<TensorView> views;
  for (const auto& [name, tensor] : model.tensors()) {
    if (name == skip) continue;
    keep.push_back(name == reshape ? tensor.detach().t().contiguous()
                                   : tensor.detach().contiguous());
    TensorView view;
    view.name = name;
    view.dtype = DType::kF32;
    view.shape = keep.back().sizes().vec();
    view.data = keep.back().data_ptr();
    view.byte_size = keep.back().nbytes();
    views.push_back(view);
  }
  return WriteSafetensors(path, views);
}

TEST(Checkpoint, SaveLoadRoundTripAndRejectsBadFiles) {
  std::unique_ptr<Model> model = MakeTinyModel(161);
  ASSERT_NE(model, nullptr);
  const ModelConfig& config = model->config();
  TempDir dir;
  const std::string path = dir.Sub("tiny.safetensors");
  ASSERT_TRUE(model->Save(path).ok());
  Result<std::unique_ptr<Model>> loaded = Model::Load(config, path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const ModelInput input = MakeImageInput(162);
  Result<ForwardOutput> before = model->Forward(input);
  Result<ForwardOutput> after = (*loaded)->Forward(input);
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_TRUE(at::equal(before->logits, after->logits));
  for (size_t i = 0; i < model->tensors().size(); ++i) {
    EXPECT_TRUE(at::equal(model->tensors()[i].second, (*loaded)->tensors()[i].second))
        << model->tensors()[i].first;
  }

  const std::string missing = dir.Sub("missing.safetensors");
  ASSERT_TRUE(WriteAltered(*model, missing, "layers.2.incremental.key", "").ok());
  Result<std::unique_ptr<Model>> no_key = Model::Load(config, missing);
  ASSERT_FALSE(no_key.ok());
  ExpectInvalid(no_key.status(), "missing tensor 'layers.2.incremental.key'");
  ExpectInvalid(no_key.status(), missing);

  const std::string shaped = dir.Sub("shape.safetensors");
  ASSERT_TRUE(WriteAltered(*model, shaped, "", "layers.1.experts.router").ok());
  Result<std::unique_ptr<Model>> bad_shape = Model::Load(config, shaped);
  ASSERT_FALSE(bad_shape.ok());
  ExpectInvalid(bad_shape.status(), "tensor 'layers.1.experts.router' has shape [64, 8]");

  const std::string truncated = dir.Sub("truncated.safetensors");
  std::filesystem::copy_file(path, truncated);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(path) / 2);
  Result<std::unique_ptr<Model>> cut = Model::Load(config, truncated);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find(truncated), std::string::npos) << cut.status().ToString();

  // A file for another config: the extra tensors are named.
  ModelConfig fewer = config;
  fewer.vision.enabled = false;
  Result<std::unique_ptr<Model>> extra = Model::Load(fewer, path);
  ASSERT_FALSE(extra.ok());
  ExpectInvalid(extra.status(), "tensor 'vision.");
}

TEST(Checkpoint, BytesRoundTripEqualsTheFileRoundTripTensorForTensor) {
  std::unique_ptr<Model> model = MakeTinyModel(163);
  ASSERT_NE(model, nullptr);
  const ModelConfig& config = model->config();
  TempDir dir;
  const std::string path = dir.Sub("tiny.safetensors");
  ASSERT_TRUE(model->Save(path).ok());
  Result<std::string> bytes = model->SaveToBytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(*bytes, file);
  Result<std::unique_ptr<Model>> from_file = Model::Load(config, path);
  Result<std::unique_ptr<Model>> from_bytes = Model::LoadFromBytes(config, *bytes);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  ASSERT_TRUE(from_bytes.ok()) << from_bytes.status().ToString();
  ASSERT_EQ((*from_bytes)->tensors().size(), (*from_file)->tensors().size());
  for (size_t i = 0; i < (*from_file)->tensors().size(); ++i) {
    const auto& [name, expected] = (*from_file)->tensors()[i];
    EXPECT_EQ((*from_bytes)->tensors()[i].first, name);
    EXPECT_TRUE(at::equal((*from_bytes)->tensors()[i].second, expected)) << name;
    EXPECT_EQ((*from_bytes)->tensors()[i].second.scalar_type(), expected.scalar_type()) << name;
  }
  const ModelInput input = MakeImageInput(164);
  Result<ForwardOutput> a = (*from_file)->Forward(input);
  Result<ForwardOutput> b = (*from_bytes)->Forward(input);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(at::equal(a->logits, b->logits));

  // The checks of Load hold for bytes, with the given name in the error.
  Result<std::unique_ptr<Model>> cut =
      Model::LoadFromBytes(config, std::string_view(*bytes).substr(0, bytes->size() / 2), "v9");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("v9"), std::string::npos) << cut.status().ToString();
  ModelConfig fewer = config;
  fewer.vision.enabled = false;
  Result<std::unique_ptr<Model>> extra = Model::LoadFromBytes(fewer, *bytes, "v9");
  ASSERT_FALSE(extra.ok());
  ExpectInvalid(extra.status(), "tensor 'vision.");
}

// ------------------------------------------------------------------------------------------
// 9. Config validation
// ------------------------------------------------------------------------------------------

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// tiny.yaml with the first occurrence of `from` replaced by `to`.
std::string TinyWith(const std::string& from, const std::string& to) {
  std::string text = ReadFile(SourcePath("configs/model/tiny.yaml"));
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "tiny.yaml has no '" << from << "'";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(ModelConfigLoading, LoadRejectsBadFilesNamingTheKeyAndFile) {
  TempDir dir;
  struct Case {
    std::string from, to;
    std::vector<std::string> fragments;  // the message must contain each
  };
  const std::vector<Case> cases = {
      {"    key_dim: 32\n",
       "    key_dim: 32\n    head_count: 2\n",
       {"model.incremental_attention.head_count", "unknown key"}},
      {"  width: 64\n", "  width: wide\n", {"model.width", "expected an integer", "'wide'"}},
      {"  width: 64\n", "", {"model.width", "required"}},
      {"experts_per_token: 2",
       "experts_per_token: 8",
       {"model.feed_forward.experts_per_token", "below"}},
      {"layer_pattern: IIIG", "layer_pattern: IIXG", {"model.layer_pattern", "IIXG"}},
      {"  layers: 4\n", "  layers: 3\n", {"model.layer_pattern", "longer"}},
      {"vocabulary: 288", "vocabulary: 256", {"model.vocabulary", "288"}},
      {"    heads: 2\n    query_rank",
       "    heads: 0\n    query_rank",
       {"model.latent_attention.heads", "positive"}},
      {"min_log_decay: -5.0", "min_log_decay: 0.5", {"model.incremental_attention.min_log_decay"}},
      {"  vision:\n", "  vision:\n    channels: three\n", {"model.vision.channels"}},
      {"dense_layers: 1", "dense_layers: 5", {"model.feed_forward.dense_layers"}},
      // strtod reads "inf" and "nan": non-finite values must not pass the sign checks.
      {"min_log_decay: -5.0",
       "min_log_decay: -inf",
       {"model.incremental_attention.min_log_decay", "finite"}},
      {"  threads: 2\n", "  threads: 2\n  init_std: nan\n", {"model.init_std"}},
      {"  threads: 2\n", "  threads: 2\n  norm_epsilon: inf\n", {"model.norm_epsilon"}},
      // Each SiTU cap is named on its own.
      {"    shared_hidden: 64\n",
       "    shared_hidden: 64\n    up_cap: 0\n",
       {"model.feed_forward.up_cap"}},
  };
  int index = 0;
  for (const Case& c : cases) {
    const std::string path = dir.Sub("case" + std::to_string(index++) + ".yaml");
    std::ofstream(path) << TinyWith(c.from, c.to);
    Result<ModelConfig> config = LoadModelConfig(path);
    ASSERT_FALSE(config.ok()) << "accepted: " << c.to;
    const std::string message = config.status().message();
    EXPECT_TRUE(config.status().IsInvalidArgument()) << config.status().ToString();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const std::string& fragment : c.fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message '" << message << "' does not mention '" << fragment << "'";
    }
  }
  // The unchanged file loads: the failures above come from the edits.
  const std::string good = dir.Sub("good.yaml");
  std::ofstream(good) << ReadFile(SourcePath("configs/model/tiny.yaml"));
  EXPECT_TRUE(LoadModelConfig(good).ok());
}

// ------------------------------------------------------------------------------------------
// 10. Gradients
// ------------------------------------------------------------------------------------------

TEST(Gradients, EveryTrainableTensorGetsAFiniteNonzeroGradient) {
  std::unique_ptr<Model> model = MakeTinyModel(171);
  ASSERT_NE(model, nullptr);
  model->SetRequiresGrad(true);
  ModelInput input = MakeImageInput(172);
  ForwardOptions options;
  options.compute_values = true;
  options.record_routing = true;
  Result<ForwardOutput> out = model->Forward(input, options);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  // The learner's loss: next-token cross-entropy plus a value regression (the value head only
  // gets gradients from the latter).
  const at::Tensor loss =
      -NextTokenLogProbs(out->logits, input.tokens).mean() + (out->values - 1.0).pow(2).mean();
  loss.backward();

  const std::vector<ParameterSpec> specs = ModelParameterSpecs(model->config());
  std::vector<std::string> without;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [name, tensor] = model->tensors()[i];
    if (!specs[i].trainable) {
      EXPECT_FALSE(tensor.requires_grad()) << name;
      continue;
    }
    const at::Tensor grad = tensor.grad();
    if (!grad.defined() || grad.abs().max().item<double>() == 0.0) {
      without.push_back(name);
      continue;
    }
    EXPECT_TRUE(at::isfinite(grad).all().item<bool>()) << name;
    if (name == "residual_queries") {
      // Layer 0 reads the embedding directly: its pre-attention query (row 0) is unused.
      EXPECT_EQ(grad[0].abs().max().item<double>(), 0.0);
      for (int64_t row = 1; row < grad.size(0); ++row) {
        EXPECT_GT(grad[row].abs().max().item<double>(), 0.0) << "residual_queries row " << row;
      }
    }
  }
  // Every routed expert chosen by some token gets a gradient in its own slice.
  int64_t sparse = 0;
  for (int64_t layer = 0; layer < model->config().layers; ++layer) {
    if (!model->config().IsMoeLayer(layer)) continue;
    const at::Tensor chosen = out->routing.layers[sparse++].experts.reshape({-1});
    const std::string name = "layers." + std::to_string(layer) + ".experts.routed_gate";
    for (const auto& [tensor_name, tensor] : model->tensors()) {
      if (tensor_name != name) continue;
      for (int64_t e = 0; e < model->config().feed_forward.routed_experts; ++e) {
        const bool used = (chosen == e).any().item<bool>();
        const bool has_grad = tensor.grad()[e].abs().max().item<double>() > 0.0;
        EXPECT_EQ(used, has_grad) << name << " expert " << e;
      }
    }
  }
  std::string list;
  for (const std::string& name : without) list += " " + name;
  std::printf("tensors without gradient:%s\n", without.empty() ? " none" : list.c_str());
  EXPECT_TRUE(without.empty()) << "no gradient for:" << list;
}

}  // namespace
}  // namespace strider
