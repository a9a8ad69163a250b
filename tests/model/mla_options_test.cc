// The latent attention options that express Kimi Linear's multi-head latent attention
// (docs/model_math.md#latent-attention): a full-rank query (query_rank 0), no output gate
// (output_gate false), a value width other than the key's, and the normalisations' own epsilon.
//
// The sublayer is checked against a naive softmax attention written here from the published
// equations (transformers' KimiLinearAttention, vLLM's KimiMLAAttention), one query token at a
// time in fp64, reading the published tensor layouts directly (kv_b_proj's rows per head
// [k_nope; v], kv_a_proj_with_mqa's rows [c_kv; k_rope]); then the two-path contract with the
// options on, on the layer (every form and the paged past), the whole model and the rollout
// engine.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/latent_attention.h"
#include "common/model/model.h"
#include "common/model/ops.h"
#include "common/model/parameters.h"
#include "common/model/torch_status.h"
#include "common/model/two_path_check.h"
#include "common/tokenizer.h"
#include "rollout_engine/engine.h"
#include "tests/file_contents.h"
#include "tests/model/model_helpers.h"
#include "tests/scratch_dir.h"
#include "tests/shipped_config.h"

namespace strider {
namespace {

using model::TensorMap;

constexpr char kPrefix[] = "layers.3.latent.";  // tiny's latent layer

at::Tensor Randn(std::vector<int64_t> shape, uint64_t seed, at::ScalarType dtype) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randn(shape, generator, at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

double RelativeError(const at::Tensor& actual, const at::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  return (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>() /
         std::max(scale, 1e-300);
}

// The tiny config with the latent layer as Kimi Linear has it: a full-rank query, no output
// gate, values narrower than the keys' nope part, and the normalisations' epsilon of
// transformers' KimiLinearRMSNorm (1e-6) set apart from the model's.
ModelConfig KimiConfig() {
  ModelConfig config = testing::ShippedModelConfig("tiny");
  config.latent.query_rank = 0;
  config.latent.output_gate = false;
  config.latent.value_dim = 12;
  config.latent.norm_epsilon = 1e-6;
  config.norm_epsilon = 1e-5;
  return config;
}

struct Variant {
  const char* name;
  int64_t query_rank;
  bool output_gate;
};

// Kimi Linear; a full-rank query with Strider's gate; Strider's compressed query without a gate.
const Variant kVariants[] = {{"kimi_linear", 0, false},
                             {"full_query_gated", 0, true},
                             {"compressed_query_ungated", 32, false}};

ModelConfig VariantConfig(const Variant& v) {
  ModelConfig config = KimiConfig();
  config.latent.query_rank = v.query_rank;
  config.latent.output_gate = v.output_gate;
  return config;
}

// The layer's weights from the parameter table, with a random initialisation of order one per
// term (std 1/sqrt(fan_in); norms near one), as model_layers_test.cc does.
TensorMap LayerWeights(const ModelConfig& config, at::ScalarType dtype, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);
  TensorMap map;
  for (const ParameterSpec& spec : ModelParameterSpecs(config)) {
    if (spec.name.rfind(kPrefix, 0) != 0) continue;
    at::Tensor t = spec.init == ParameterInit::kOnes
                       ? 1.0 + 0.2 * at::randn(spec.shape, generator, f64)
                       : at::randn(spec.shape, generator, f64) /
                             std::sqrt(static_cast<double>(spec.shape.back()));
    map[spec.name] = t.to(dtype);
  }
  return map;
}

// RMSNorm as transformers' KimiLinearRMSNorm: x / sqrt(mean(x^2) + eps) * weight.
at::Tensor Rms(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return x / at::sqrt(x.pow(2).mean(-1, true) + eps) * weight;
}

// The published layer, one query token at a time, plain softmax over the keys s <= t:
//   q_t = q_proj x_t, or q_b_proj RMSNorm(q_a_proj x_t) with a q_lora_rank
//   [c_s; k_rope_s] = kv_a_proj_with_mqa x_s,  c_s <- RMSNorm(c_s)
//   [k_nope_{h,s}; v_{h,s}] = (kv_b_proj c_s)_h          (rows per head: Dn then Dv)
//   k_{h,s} = [k_nope_{h,s}; k_rope_s]                     (no rotary embedding)
//   o_{h,t} = sum_s softmax_s(q_{h,t} . k_{h,s} / sqrt(Dn + Dr)) v_{h,s}
//   y_t = o_proj concat_h o_{h,t}, or o_proj (sigmoid(g_proj x_t) * concat_h o_{h,t}) (K3)
at::Tensor NaiveLayer(const TensorMap& w, const LatentAttentionConfig& c, const at::Tensor& x,
                      double eps) {
  const auto get = [&](const std::string& name) { return w.at(kPrefix + name).to(at::kDouble); };
  const at::Tensor input = x.to(at::kDouble);
  const int64_t batch = input.size(0), length = input.size(1);
  const int64_t qk = c.nope_dim + c.rope_dim;
  at::Tensor out = at::zeros({batch, length, get("output").size(0)}, input.options());
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<at::Tensor> latent, rope_key;
    for (int64_t t = 0; t < length; ++t) {
      const at::Tensor xt = input[b][t];
      const at::Tensor kv = at::mv(get("kv_down"), xt);
      latent.push_back(Rms(kv.narrow(0, 0, c.kv_rank), get("kv_norm"), eps));
      rope_key.push_back(kv.narrow(0, c.kv_rank, c.rope_dim));
      const at::Tensor q =
          (c.query_rank > 0
               ? at::mv(get("query_up"), Rms(at::mv(get("query_down"), xt), get("query_norm"), eps))
               : at::mv(get("query"), xt))
              .view({c.heads, qk});
      std::vector<at::Tensor> heads;
      for (int64_t h = 0; h < c.heads; ++h) {
        const at::Tensor kv_up =
            get("kv_up").view({c.heads, c.nope_dim + c.value_dim, c.kv_rank})[h];
        std::vector<double> scores;
        std::vector<at::Tensor> values;
        for (int64_t s = 0; s <= t; ++s) {
          const at::Tensor expanded = at::mv(kv_up, latent[s]);
          const at::Tensor key = at::cat({expanded.narrow(0, 0, c.nope_dim), rope_key[s]});
          scores.push_back(at::dot(q[h], key).item<double>() / std::sqrt(static_cast<double>(qk)));
          values.push_back(expanded.narrow(0, c.nope_dim, c.value_dim));
        }
        const double top = *std::max_element(scores.begin(), scores.end());
        double total = 0;
        for (double& score : scores) total += (score = std::exp(score - top));
        at::Tensor o = at::zeros({c.value_dim}, input.options());
        for (int64_t s = 0; s <= t; ++s) o += (scores[s] / total) * values[s];
        heads.push_back(o);
      }
      at::Tensor concat = at::cat(heads);
      if (c.output_gate) concat = at::sigmoid(at::mv(get("gate"), xt)) * concat;
      out[b][t] = at::mv(get("output"), concat);
    }
  }
  return out;
}

TEST(MlaOptions, ParametersFollowTheOptionsAndTheDefaultsKeepTodaysTable) {
  const ModelConfig tiny = testing::ShippedModelConfig("tiny");
  const ModelConfig kimi = KimiConfig();
  std::map<std::string, std::vector<int64_t>> tiny_shapes, kimi_shapes;
  for (const ParameterSpec& s : ModelParameterSpecs(tiny)) tiny_shapes[s.name] = s.shape;
  for (const ParameterSpec& s : ModelParameterSpecs(kimi)) kimi_shapes[s.name] = s.shape;
  const std::string p = kPrefix;
  const LatentAttentionConfig& a = tiny.latent;
  EXPECT_EQ(tiny_shapes.at(p + "query_down"), (std::vector<int64_t>{a.query_rank, tiny.width}));
  EXPECT_EQ(tiny_shapes.at(p + "query_up"),
            (std::vector<int64_t>{a.heads * (a.nope_dim + a.rope_dim), a.query_rank}));
  EXPECT_EQ(tiny_shapes.at(p + "gate"), (std::vector<int64_t>{a.heads * a.value_dim, tiny.width}));
  EXPECT_EQ(tiny_shapes.count(p + "query"), 0u);

  const LatentAttentionConfig& k = kimi.latent;
  EXPECT_EQ(kimi_shapes.at(p + "query"),
            (std::vector<int64_t>{k.heads * (k.nope_dim + k.rope_dim), kimi.width}));
  for (const char* absent : {"query_down", "query_norm", "query_up", "gate"}) {
    EXPECT_EQ(kimi_shapes.count(p + absent), 0u) << absent;
  }
  EXPECT_EQ(kimi_shapes.at(p + "kv_up"),
            (std::vector<int64_t>{k.heads * (k.nope_dim + k.value_dim), k.kv_rank}));
  EXPECT_EQ(kimi_shapes.at(p + "output"),
            (std::vector<int64_t>{kimi.width, k.heads * k.value_dim}));
  // The cache is what it was: the options change the query and the output only.
  EXPECT_EQ(AccountCaches(kimi).kv_cache_values_per_token_per_layer, k.kv_rank + k.rope_dim);

  EXPECT_EQ(model::LatentAttentionInputNames(tiny.latent, p),
            (std::vector<std::string>{p + "query_down", p + "kv_down", p + "gate"}));
  EXPECT_EQ(model::LatentAttentionInputNames(kimi.latent, p),
            (std::vector<std::string>{p + "query", p + "kv_down"}));
}

TEST(MlaOptions, ConfigReadsTheKeysAndRefusesBadValues) {
  testing::TempDir dir;
  const auto load = [&](const std::string& latent_lines) {
    const std::string path = dir.Sub("model.yaml");
    testing::WriteFileBytes(
        path,
        "model:\n  name: t\n  vocabulary: 288\n  width: 64\n  layers: 4\n  latent_attention:\n" +
            latent_lines);
    return LoadModelConfig(path);
  };
  Result<ModelConfig> defaults = load("    heads: 2\n");
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_EQ(defaults->latent.query_rank, 32);
  EXPECT_TRUE(defaults->latent.output_gate);
  EXPECT_EQ(defaults->latent.norm_epsilon, 0.0);
  Result<ModelConfig> kimi =
      load("    query_rank: 0\n    output_gate: false\n    norm_epsilon: 1.0e-6\n");
  ASSERT_TRUE(kimi.ok()) << kimi.status().ToString();
  EXPECT_EQ(kimi->latent.query_rank, 0);
  EXPECT_FALSE(kimi->latent.output_gate);
  EXPECT_EQ(kimi->latent.norm_epsilon, 1e-6);
  for (const auto& [lines, key] : std::vector<std::pair<std::string, std::string>>{
           {"    query_rank: -1\n", "query_rank"}, {"    norm_epsilon: -1.0\n", "norm_epsilon"}}) {
    Result<ModelConfig> bad = load(lines);
    ASSERT_FALSE(bad.ok()) << lines;
    EXPECT_NE(bad.status().message().find("latent_attention." + key), std::string::npos)
        << bad.status().ToString();
  }
}

// One variant's layer: its config, its weights of `dtype` from `seed`, and an input of two
// sequences of `length` tokens from `seed + 1`.
struct VariantLayer {
  ModelConfig config;
  TensorMap w;
  model::LatentAttentionWeights weights;
  at::Tensor x;
};

VariantLayer MakeVariantLayer(const Variant& v, at::ScalarType dtype, uint64_t seed,
                              int64_t length) {
  VariantLayer layer;
  layer.config = VariantConfig(v);
  layer.w = LayerWeights(layer.config, dtype, seed);
  layer.weights = model::LatentAttentionWeights::Bind(layer.w, kPrefix);
  layer.x = Randn({2, length, layer.config.width}, seed + 1, dtype);
  return layer;
}

TEST(MlaOptions, SublayerEqualsTheNaiveSoftmaxAttentionOfThePublishedEquations) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const auto [config, w, weights, x] = MakeVariantLayer(v, at::kDouble, 21, 9);
    const LatentAttentionConfig& c = config.latent;
    const at::Tensor naive = NaiveLayer(w, c, x, c.norm_epsilon);
    const at::Tensor training =
        model::LatentAttentionForward(weights, c, x, nullptr, config.norm_epsilon);
    const double error = RelativeError(training, naive);
    std::printf("%s: training path vs naive fp64 rel err %.3g\n", v.name, error);
    EXPECT_LT(error, 1e-12);
    // The inference path's two forms, token by token through the cache.
    for (const auto form :
         {model::LatentAttentionForm::kAbsorbed, model::LatentAttentionForm::kExplicit}) {
      auto cache = model::LatentAttentionCache::Empty(c, 2, x.options());
      std::vector<at::Tensor> steps;
      for (int64_t t = 0; t < x.size(1); ++t) {
        steps.push_back(model::LatentAttentionForward(weights, c, x.narrow(1, t, 1), &cache,
                                                      config.norm_epsilon, form));
      }
      EXPECT_LT(RelativeError(at::cat(steps, 1), naive), 1e-12);
    }
  }
  // The layer's own epsilon is the one used: with the model's instead the result moves.
  ModelConfig config = KimiConfig();
  config.latent.norm_epsilon = 0.5;
  const TensorMap w = LayerWeights(config, at::kDouble, 23);
  const auto weights = model::LatentAttentionWeights::Bind(w, kPrefix);
  const at::Tensor x = Randn({1, 6, config.width}, 24, at::kDouble);
  const at::Tensor y = model::LatentAttentionForward(weights, config.latent, x, nullptr, 1e-5);
  EXPECT_LT(RelativeError(y, NaiveLayer(w, config.latent, x, 0.5)), 1e-12);
  EXPECT_GT(RelativeError(y, NaiveLayer(w, config.latent, x, 1e-5)), 1e-3);
  config.latent.norm_epsilon = 0;  // 0: the model's
  EXPECT_LT(RelativeError(model::LatentAttentionForward(weights, config.latent, x, nullptr, 1e-5),
                          NaiveLayer(w, config.latent, x, 1e-5)),
            1e-12);
}

// Two paths in fp32: the training path against the cache in uneven chunks (one token takes the
// decode kernel, longer chunks the prefill kernel), in both forms, within 1e-6 relative.
TEST(MlaOptions, CachedChunksInBothFormsEqualTheTrainingPathInFp32) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const auto [config, w, weights, x] = MakeVariantLayer(v, at::kFloat, 31, 40);
    const LatentAttentionConfig& c = config.latent;
    const double eps = config.norm_epsilon;
    const at::Tensor training = model::LatentAttentionForward(weights, c, x, nullptr, eps);
    for (const auto form :
         {model::LatentAttentionForm::kAbsorbed, model::LatentAttentionForm::kExplicit}) {
      auto cache = model::LatentAttentionCache::Empty(c, 2, x.options());
      std::vector<at::Tensor> chunks;
      int64_t start = 0;
      for (int64_t n : {5, 1, 1, 17, 3, 13}) {
        at::NoGradGuard no_grad;
        chunks.push_back(
            model::LatentAttentionForward(weights, c, x.narrow(1, start, n), &cache, eps, form));
        start += n;
      }
      ASSERT_EQ(start, x.size(1));
      const double error = RelativeError(at::cat(chunks, 1), training);
      std::printf("%s %s: cached chunks vs training path fp32 rel err %.3g\n", v.name,
                  form == model::LatentAttentionForm::kAbsorbed ? "absorbed" : "explicit", error);
      EXPECT_LT(error, 1e-6);
    }
  }
}

// Chunked training through the absorbed form (the differentiable blockwise kernel) equals the
// explicit form, outputs and the gradients of every weight (the full-rank query's included)
// and of the input.
TEST(MlaOptions, BlockwiseTrainingChunkEqualsTheExplicitFormWithGradients) {
  const ModelConfig config = KimiConfig();
  const LatentAttentionConfig& c = config.latent;
  const TensorMap w = LayerWeights(config, at::kDouble, 41);
  const auto weights = model::LatentAttentionWeights::Bind(w, kPrefix);
  const double eps = config.norm_epsilon;
  const at::Tensor past_x = Randn({1, 300, config.width}, 42, at::kDouble);
  const at::Tensor x = Randn({1, 150, config.width}, 43, at::kDouble);
  auto cache = model::LatentAttentionCache::Empty(c, 1, x.options());
  {
    at::NoGradGuard no_grad;
    model::LatentAttentionForward(weights, c, past_x, &cache, eps);
  }
  std::vector<at::Tensor> leaves;
  for (const auto& [name, tensor] : w) leaves.push_back(tensor);
  const at::Tensor upstream = Randn({1, 150, config.width}, 44, at::kDouble);
  const auto [outputs, gradients] =
      testing::BothLatentAttentionForms(weights, c, x, cache, eps, leaves, upstream);
  EXPECT_LT(RelativeError(outputs[0], outputs[1]), 1e-12);
  for (size_t i = 0; i < gradients[0].size(); ++i) {
    EXPECT_GT(gradients[0][i].abs().max().item<double>(), 0.0) << "gradient " << i;
    EXPECT_LT(RelativeError(gradients[0][i], gradients[1][i]), 1e-10) << "gradient " << i;
  }
}

// The rollout engine's path: a ragged batch whose pasts live in blocks of a paged pool, filled
// with the rows the layer itself returned for the prompts, then new tokens read the pages in
// place. The outputs equal the training path over each whole row (fp32, 1e-6 relative) and the
// explicit form over the same pages.
TEST(MlaOptions, PagedPastInPlaceEqualsTheTrainingPath) {
  const ModelConfig config = KimiConfig();
  const LatentAttentionConfig& c = config.latent;
  const double eps = config.norm_epsilon;
  const TensorMap w = LayerWeights(config, at::kFloat, 51);
  const auto weights = model::LatentAttentionWeights::Bind(w, kPrefix);
  const std::vector<int64_t> past_lengths = {0, 7, 40, 300};
  const int64_t longest = 300;
  const int64_t block = 16;
  at::NoGradGuard no_grad;
  for (int64_t tokens : {1, 3, 37}) {
    SCOPED_TRACE("new tokens " + std::to_string(tokens));
    const int64_t rows = static_cast<int64_t>(past_lengths.size());
    const at::Tensor x = Randn({rows, longest + tokens, config.width}, 52 + tokens, at::kFloat);
    model::LatentAttentionPast past;
    past.pages.resize(rows);
    std::vector<at::Tensor> pools;
    std::vector<at::Tensor> expected;
    for (int64_t b = 0; b < rows; ++b) {
      const int64_t n = past_lengths[b];
      const at::Tensor row_x = x[b].narrow(0, 0, n + tokens).unsqueeze(0);
      expected.push_back(
          model::LatentAttentionForward(weights, c, row_x, nullptr, eps).narrow(1, n, tokens));
      // The prompt's rows as the engine stores them: computed by the layer, copied into blocks.
      const int64_t blocks = std::max<int64_t>((n + block - 1) / block, 1);
      at::Tensor pool = at::zeros({blocks, block, c.kv_rank + c.rope_dim}, x.options());
      if (n > 0) {
        model::LatentAttentionPast empty;
        empty.pages.resize(1);
        model::LatentAttentionRows prompt_rows;
        model::LatentAttentionForwardRagged(weights, c, row_x.narrow(1, 0, n), empty, eps,
                                            model::LatentAttentionForm::kAbsorbed, &prompt_rows);
        at::Tensor joined = at::cat({prompt_rows.latent[0], prompt_rows.rope_key[0]}, -1);
        pool.view({blocks * block, -1}).narrow(0, 0, n).copy_(joined);
      }
      for (int64_t i = 0; i * block < n; ++i) {
        at::Tensor page = pool[i].narrow(0, 0, std::min(block, n - i * block));
        past.pages[b].push_back(
            {page.narrow(1, 0, c.kv_rank), page.narrow(1, c.kv_rank, c.rope_dim)});
      }
      pools.push_back(pool);
    }
    past.lengths = at::tensor(past_lengths, at::kLong);
    at::Tensor new_x = at::stack(
        [&] {
          std::vector<at::Tensor> rows_x;
          for (int64_t b = 0; b < rows; ++b)
            rows_x.push_back(x[b].narrow(0, past_lengths[b], tokens));
          return rows_x;
        }(),
        0);
    model::LatentAttentionRows in_place_rows, explicit_rows;
    const at::Tensor in_place = model::LatentAttentionForwardRagged(
        weights, c, new_x, past, eps, model::LatentAttentionForm::kAbsorbed, &in_place_rows);
    const at::Tensor explicit_form = model::LatentAttentionForwardRagged(
        weights, c, new_x, past, eps, model::LatentAttentionForm::kExplicit, &explicit_rows);
    EXPECT_LT(RelativeError(in_place, explicit_form), 1e-6);
    EXPECT_TRUE(at::equal(in_place_rows.latent, explicit_rows.latent));
    double worst = 0;
    for (int64_t b = 0; b < rows; ++b) {
      worst = std::max(worst, RelativeError(in_place[b].unsqueeze(0), expected[b]));
    }
    std::printf("paged past, %lld new tokens: vs training path fp32 rel err %.3g\n",
                static_cast<long long>(tokens), worst);
    EXPECT_LT(worst, 1e-6);
  }
}

TEST(MlaOptions, MissingWeightsAreNamed) {
  const ModelConfig config = KimiConfig();
  TensorMap w = LayerWeights(config, at::kFloat, 61);
  w.erase(std::string(kPrefix) + "query");
  const auto weights = model::LatentAttentionWeights::Bind(w, kPrefix);
  at::NoGradGuard no_grad;
  const Status status = model::Guarded("latent attention", [&] {
    model::LatentAttentionForward(weights, config.latent, at::zeros({1, 2, config.width}), nullptr,
                                  config.norm_epsilon);
  });
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("query"), std::string::npos) << status.ToString();

  ModelConfig gated = config;
  gated.latent.output_gate = true;  // the weights have no gate
  const auto ungated =
      model::LatentAttentionWeights::Bind(LayerWeights(config, at::kFloat, 62), kPrefix);
  const Status no_gate = model::Guarded("latent attention", [&] {
    model::LatentAttentionForward(ungated, gated.latent, at::zeros({1, 2, config.width}), nullptr,
                                  config.norm_epsilon);
  });
  ASSERT_FALSE(no_gate.ok());
  EXPECT_NE(no_gate.message().find("gate"), std::string::npos) << no_gate.ToString();
}

// Device independence (docs/cuda.md): with the options on, every form runs where its tensors
// are, here the meta device, creating nothing on the CPU beside them.
TEST(MlaOptions, EveryFormRunsOnTheMetaDevice) {
  const ModelConfig config = KimiConfig();
  const LatentAttentionConfig& c = config.latent;
  const at::TensorOptions meta = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
  TensorMap map;
  for (const ParameterSpec& spec : ModelParameterSpecs(config)) {
    if (spec.name.rfind(kPrefix, 0) == 0) map[spec.name] = at::empty(spec.shape, meta);
  }
  const auto w = model::LatentAttentionWeights::Bind(map, kPrefix);
  const int64_t batch = 2, length = 5;
  const at::Tensor x = at::empty({batch, length, config.width}, meta);
  const double eps = config.norm_epsilon;
  const auto expect_meta = [&](const at::Tensor& t, int64_t tokens, const char* what) {
    EXPECT_TRUE(t.is_meta()) << what;
    EXPECT_EQ(t.sizes().vec(), (std::vector<int64_t>{batch, tokens, config.width})) << what;
  };
  {
    at::NoGradGuard no_grad;
    expect_meta(
        model::LatentAttentionForward(w, c, x, nullptr, eps, model::LatentAttentionForm::kExplicit),
        length, "training path");
    auto cache = model::LatentAttentionCache::Empty(c, batch, meta);
    expect_meta(model::LatentAttentionForward(w, c, x, &cache, eps), length, "prefill");
    expect_meta(model::LatentAttentionForward(w, c, x.narrow(1, 0, 1), &cache, eps), 1, "decode");
    model::LatentAttentionPast paged;
    paged.pages.resize(batch);
    for (int64_t b = 0; b < batch; ++b) {
      paged.pages[b].push_back(
          {at::empty({3 + b, c.kv_rank}, meta), at::empty({3 + b, c.rope_dim}, meta)});
    }
    model::LatentAttentionPast padded;
    padded.latent = at::empty({batch, 6, c.kv_rank}, meta);
    padded.rope_key = at::empty({batch, 6, c.rope_dim}, meta);
    padded.lengths = at::empty({batch}, meta.dtype(at::kLong));
    for (const auto& past : {paged, padded}) {
      for (const auto form :
           {model::LatentAttentionForm::kAbsorbed, model::LatentAttentionForm::kExplicit}) {
        model::LatentAttentionRows rows;
        expect_meta(model::LatentAttentionForwardRagged(w, c, x, past, eps, form, &rows), length,
                    "ragged");
      }
    }
  }
  // Recording gradients: the differentiable blockwise kernel.
  for (auto& [name, tensor] : map) tensor.requires_grad_(true);
  const auto recording = model::LatentAttentionWeights::Bind(map, kPrefix);
  auto cache = model::LatentAttentionCache::Empty(c, batch, meta);
  for (int chunk = 0; chunk < 2; ++chunk) {
    const at::Tensor out = model::LatentAttentionForward(recording, c, x, &cache, eps);
    expect_meta(out, length, "blockwise chunk");
    EXPECT_TRUE(out.requires_grad());
  }
}

std::unique_ptr<Model> KimiModel(uint64_t seed) {
  ConfigureRuntime(2);
  Result<std::unique_ptr<Model>> model = Model::Create(KimiConfig(), seed);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return std::move(model).value();
}

at::Tensor RandomTokens(int64_t batch, int64_t length, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randint(0, token::kByteCount, {batch, length}, generator, at::kLong);
}

// The whole model with the options on: the two-path contract of docs/model_math.md
// (#whole-model-invariants), fp32 within 1e-5 and fp64 within 1e-10.
TEST(MlaOptions, WholeModelKeepsTheTwoPathContract) {
  std::unique_ptr<Model> model = KimiModel(71);
  Result<TwoPathReport> report = CheckTwoPaths(*model, RandomTokens(1, 512, 72));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  std::printf("whole model fp32: max |training - inference| log-prob %.3g\n",
              report->max_abs_logprob_diff);
  EXPECT_LE(report->max_abs_logprob_diff, 1e-5);
  EXPECT_GE(report->routing_agreement, 0.999);

  std::unique_ptr<Model> fp64 = KimiModel(73);
  ASSERT_TRUE(fp64->ConvertTo(at::kDouble).ok());
  Result<TwoPathReport> exact = CheckTwoPaths(*fp64, RandomTokens(2, 150, 74));
  ASSERT_TRUE(exact.ok()) << exact.status().ToString();
  EXPECT_LE(exact->max_abs_logprob_diff, 1e-10);
}

// The rollout engine (paged latent cache, batched decode) with the options on gives the
// training path's log-probs for what it samples.
TEST(MlaOptions, RolloutEngineEqualsTheTrainingPath) {
  std::shared_ptr<const Model> model(KimiModel(81));
  rollout::EngineOptions options;
  options.threads = 2;
  options.block_tokens = 16;
  options.prefill_chunk_tokens = 50;
  Result<std::unique_ptr<rollout::Engine>> engine = rollout::Engine::Create(options, model, 1);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  struct History {
    std::vector<int64_t> tokens;
    std::map<int64_t, double> log_probs;
    std::vector<rollout::CompactRouting> routing;
  };
  std::map<rollout::SequenceId, History> histories;
  for (int64_t i = 0; i < 3; ++i) {
    rollout::Request request;
    const at::Tensor prompt = RandomTokens(1, 5 + 40 * i, 82 + i)[0];
    request.tokens.assign(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + prompt.numel());
    rollout::SamplingParams sampling;
    sampling.max_new_tokens = 12;
    sampling.seed = 90 + i;
    request.sampling = sampling;
    Result<rollout::SequenceId> id = (*engine)->Submit(request);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    histories[*id].tokens = request.tokens;
  }
  for (int step = 0; step < 1000; ++step) {
    Result<rollout::StepResult> result = (*engine)->Step();
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    for (const rollout::SequenceStep& s : result->sequences) {
      History& history = histories[s.id];
      if (s.routing.tokens > 0) history.routing.push_back(s.routing);
      if (!s.sampled) continue;
      ASSERT_EQ(s.position, static_cast<int64_t>(history.tokens.size()));
      history.tokens.push_back(s.token);
      history.log_probs[s.position] = s.model_log_prob;
    }
    if (result->prefill_tokens == 0 && result->decode_tokens == 0) break;
  }
  at::NoGradGuard no_grad;
  double worst = 0;
  int64_t checked = 0;
  for (const auto& [id, history] : histories) {
    const int64_t length = static_cast<int64_t>(history.tokens.size());
    const at::Tensor tokens = at::tensor(history.tokens, at::kLong).view({1, length});
    // The engine's expert choices replayed, as the learner does.
    Result<rollout::CompactRouting> routing = rollout::CompactRouting::Concatenate(history.routing);
    ASSERT_TRUE(routing.ok()) << routing.status().ToString();
    ASSERT_EQ(routing->tokens, length);
    RoutingRecord replay = routing->ToRoutingRecord();
    ForwardOptions forward;
    forward.replay_routing = &replay;
    Result<ForwardOutput> out = model->Forward({tokens, {}}, forward);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    const at::Tensor log_probs = NextTokenLogProbs(out->logits, tokens)[0];
    for (const auto& [position, log_prob] : history.log_probs) {
      worst = std::max(worst, std::abs(log_probs[position - 1].item<double>() - log_prob));
      ++checked;
    }
  }
  std::printf("rollout engine: %lld sampled tokens, max |engine - training| log-prob %.3g\n",
              static_cast<long long>(checked), worst);
  EXPECT_EQ(checked, 36);
  EXPECT_LE(worst, 1e-5);
}

}  // namespace
}  // namespace strider
