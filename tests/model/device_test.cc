// Device independence without a GPU, and the device settings.
//
// The layers run with every weight, input and state on PyTorch's `meta` device, which has
// shapes but no data: a tensor made on the CPU beside them fails (an elementwise op refuses to
// mix devices), and so does a host loop over tensor data (data_ptr and item need storage). What
// passes here makes no tensor on the CPU and reads none on the host, so it runs where the
// weights are. Neither LibTorch (1.13 nor 2.11) has a meta kernel for linalg_solve_triangular, so
// the chunkwise delta rule (training and prefill) is the one layer form not run here; it makes
// its temporaries from its inputs' options, and the GPU check runs it on CUDA.
//
// The sampling cuts and the draw off the CPU are tensor operations that need values, so they are
// checked on the CPU against the CPU's own row loops (sampling_distribution_test for the cuts'
// contract, rollout_engine's sampling_test for the draw).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <limits>
#include <string>
#include <vector>

#include "common/kernels/gated_delta_rule.h"
#include "common/model/config.h"
#include "common/model/incremental_attention.h"
#include "common/model/latent_attention.h"
#include "common/model/model.h"
#include "common/model/ops.h"
#include "common/model/parameters.h"
#include "common/model/sampling_distribution.h"
#include "common/model/sparse_experts.h"
#include "common/model/torch_status.h"

namespace strider {
namespace {

using model::TensorMap;

std::string SourcePath(const std::string& relative) {
  const char* root = std::getenv("STRIDER_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/" + relative;
}

ModelConfig TinyConfig() {
  Result<ModelConfig> config = LoadModelConfig(SourcePath("configs/model/tiny.yaml"));
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? *config : ModelConfig();
}

at::TensorOptions Meta(at::ScalarType type = at::kFloat) {
  return at::TensorOptions().device(at::kMeta).dtype(type);
}

// Every parameter under `prefix`, shaped by the parameter table, on meta.
TensorMap MetaWeights(const ModelConfig& config, const std::string& prefix) {
  TensorMap map;
  for (const ParameterSpec& spec : ModelParameterSpecs(config)) {
    if (spec.name.compare(0, prefix.size(), prefix) == 0) {
      map[spec.name] = at::empty(spec.shape, Meta());
    }
  }
  EXPECT_FALSE(map.empty()) << "no parameter starts with " << prefix;
  return map;
}

std::string LayerPrefix(const ModelConfig& config, char kind) {
  const std::vector<char> kinds = config.LayerKinds();
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i] == kind) return "layers." + std::to_string(i) + ".";
  }
  ADD_FAILURE() << "the tiny config has no layer of kind " << kind;
  return "";
}

void ExpectMeta(const at::Tensor& tensor, std::vector<int64_t> sizes, const std::string& what) {
  ASSERT_TRUE(tensor.defined()) << what;
  EXPECT_TRUE(tensor.is_meta()) << what << " is on " << tensor.device();
  EXPECT_EQ(tensor.sizes().vec(), sizes) << what;
}

TEST(MetaDevice, LatentAttentionRunsEveryFormWhereItsTensorsAre) {
  const ModelConfig config = TinyConfig();
  const LatentAttentionConfig& c = config.latent;
  const std::string p = LayerPrefix(config, 'G') + "latent.";
  const auto w = model::LatentAttentionWeights::Bind(MetaWeights(config, p), p);
  const int64_t batch = 2, length = 5, past = 7;
  const at::Tensor x = at::empty({batch, length, config.width}, Meta());
  const double eps = config.norm_epsilon;
  at::NoGradGuard no_grad;

  // Training path: explicit scores and the causal mask.
  ExpectMeta(model::LatentAttentionForward(w, c, x, nullptr, eps,
                                           model::LatentAttentionForm::kExplicit),
             {batch, length, config.width}, "explicit form");

  // Inference path into a cache: a prefill, then one decoded token over the cached past.
  model::LatentAttentionCache cache = model::LatentAttentionCache::Empty(c, batch, Meta());
  ExpectMeta(model::LatentAttentionForward(w, c, x, &cache, eps), {batch, length, config.width},
             "absorbed prefill");
  ExpectMeta(model::LatentAttentionForward(w, c, x.narrow(1, 0, 1), &cache, eps),
             {batch, 1, config.width}, "absorbed decode");
  ExpectMeta(cache.Latent(), {batch, length + 1, c.kv_rank}, "cached latent rows");

  // Ragged rows over a padded past with per-row lengths, in both forms.
  model::LatentAttentionPast padded;
  padded.latent = at::empty({batch, past, c.kv_rank}, Meta());
  padded.rope_key = at::empty({batch, past, c.rope_dim}, Meta());
  padded.lengths = at::empty({batch}, Meta(at::kLong));
  for (model::LatentAttentionForm form :
       {model::LatentAttentionForm::kAbsorbed, model::LatentAttentionForm::kExplicit}) {
    model::LatentAttentionRows rows;
    ExpectMeta(model::LatentAttentionForwardRagged(w, c, x, padded, eps, form, &rows),
               {batch, length, config.width}, "ragged over a padded past");
    ExpectMeta(rows.latent, {batch, length, c.kv_rank}, "ragged new rows");
  }

  // Ragged rows over pages (the engine's paged cache), decode and prefill lengths.
  model::LatentAttentionPast paged;
  paged.pages.resize(batch);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t n : {int64_t{4}, 3 + b}) {
      paged.pages[b].push_back({at::empty({n, c.kv_rank}, Meta()),
                                at::empty({n, c.rope_dim}, Meta())});
    }
  }
  for (int64_t tokens : {int64_t{1}, length}) {
    for (model::LatentAttentionForm form :
         {model::LatentAttentionForm::kAbsorbed, model::LatentAttentionForm::kExplicit}) {
      model::LatentAttentionRows rows;
      const at::Tensor out = model::LatentAttentionForwardRagged(w, c, x.narrow(1, 0, tokens),
                                                                 paged, eps, form, &rows);
      ExpectMeta(out, {batch, tokens, config.width}, "ragged over pages");
    }
  }
}

TEST(MetaDevice, LatentAttentionRecordingGradientsRunsTheBlockwiseKernel) {
  const ModelConfig config = TinyConfig();
  const std::string p = LayerPrefix(config, 'G') + "latent.";
  TensorMap weights = MetaWeights(config, p);
  for (auto& [name, tensor] : weights) tensor.requires_grad_(true);
  const auto w = model::LatentAttentionWeights::Bind(weights, p);
  model::LatentAttentionCache cache =
      model::LatentAttentionCache::Empty(config.latent, 1, Meta());
  const at::Tensor x = at::empty({1, 6, config.width}, Meta());
  for (int chunk = 0; chunk < 2; ++chunk) {
    const at::Tensor out =
        model::LatentAttentionForward(w, config.latent, x, &cache, config.norm_epsilon);
    ExpectMeta(out, {1, 6, config.width}, "blockwise chunk " + std::to_string(chunk));
    EXPECT_TRUE(out.requires_grad());
  }
}

TEST(MetaDevice, IncrementalAttentionDecodesWhereItsStateIs) {
  const ModelConfig config = TinyConfig();
  const IncrementalAttentionConfig& c = config.incremental;
  const std::string p = LayerPrefix(config, 'I') + "incremental.";
  const auto w = model::IncrementalAttentionWeights::Bind(MetaWeights(config, p), p);
  at::NoGradGuard no_grad;
  model::IncrementalAttentionState state =
      model::IncrementalAttentionState::Zeros(c, 3, Meta());
  ExpectMeta(state.recurrent, {3, c.heads, c.key_dim, c.value_dim}, "initial state");
  // One token at a time: the recurrent delta rule, out of place off the CPU.
  const at::Tensor x = at::empty({3, 1, config.width}, Meta());
  ExpectMeta(model::IncrementalAttentionForward(w, c, x, &state, config.norm_epsilon),
             {3, 1, config.width}, "decode");
  ExpectMeta(state.recurrent, {3, c.heads, c.key_dim, c.value_dim}, "updated state");
  ExpectMeta(state.conv_tail, {3, c.conv_width - 1, c.heads * (2 * c.key_dim + c.value_dim)},
             "updated conv tail");
}

TEST(MetaDevice, GatedDeltaRuleRecurrentFormRunsOffTheCpuWithAndWithoutGradients) {
  const int64_t b = 2, h = 3, t = 4, dk = 8, dv = 6;
  const at::Tensor q = at::empty({b, h, t, dk}, Meta());
  const at::Tensor v = at::empty({b, h, t, dv}, Meta());
  const at::Tensor beta = at::empty({b, h, t}, Meta());
  for (bool grad : {false, true}) {
    at::AutoGradMode mode(grad);
    const at::Tensor state = at::empty({b, h, dk, dv}, Meta()).requires_grad_(grad);
    const kernels::GatedDeltaRuleOutput out =
        kernels::GatedDeltaRuleRecurrent(q, q, v, q, beta, state);
    ExpectMeta(out.output, {b, h, t, dv}, grad ? "output with grad" : "output");
    ExpectMeta(out.final_state, {b, h, dk, dv}, "final state");
  }
}

TEST(MetaDevice, NormAndDenseLayersRunWhereTheirTensorsAre) {
  const ModelConfig config = TinyConfig();
  const std::string p = "layers.0.dense.";
  const auto w = model::DenseFeedForwardWeights::Bind(MetaWeights(config, p), p);
  const at::Tensor x = at::empty({2, 5, config.width}, Meta());
  const at::Tensor scale = at::empty({config.width}, Meta());
  for (bool grad : {false, true}) {
    at::AutoGradMode mode(grad);
    ExpectMeta(model::RmsNorm(x, scale, config.norm_epsilon), {2, 5, config.width}, "RMSNorm");
    ExpectMeta(model::Linear(x, w.up), {2, 5, config.feed_forward.dense_hidden}, "linear");
    ExpectMeta(model::DenseFeedForward(w, config.feed_forward, x), {2, 5, config.width},
               "dense feed-forward");
  }
}

TEST(DeviceSetting, NamesAreCheckedAndAMissingGpuIsAUsageErrorNamingIt) {
  EXPECT_TRUE(ValidDeviceName("cpu"));
  EXPECT_TRUE(ValidDeviceName("cuda"));
  EXPECT_TRUE(ValidDeviceName("cuda:1"));
  for (const char* bad : {"", "gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x", "cuda:0:1", "cuda0"}) {
    EXPECT_FALSE(ValidDeviceName(bad)) << bad;
  }
  Result<c10::Device> cpu = ResolveDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(cpu->is_cpu());

  Result<c10::Device> far = ResolveDevice("cuda:99");
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(far.status().message().find("cuda:99"), std::string::npos) << far.status().message();

  Result<c10::Device> cuda = ResolveDevice("cuda");
  EXPECT_EQ(cuda.ok(), torch::cuda::is_available());
  if (!cuda.ok()) {
    EXPECT_EQ(cuda.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(cuda.status().message().find("device cuda"), std::string::npos)
        << cuda.status().message();
    // A model asked for on the missing device is refused before any weight is made.
    ModelConfig config = TinyConfig();
    config.device = "cuda";
    Result<std::unique_ptr<Model>> model = Model::Create(config, 1);
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  }

  ModelConfig config = TinyConfig();
  config.device = "gpu";
  Status invalid = ValidateModelConfig(config, "tiny.yaml");
  EXPECT_EQ(invalid.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(invalid.message().find("device"), std::string::npos) << invalid.message();
}

TEST(DeviceSetting, ModelsAreMadeOnTheirDeviceAndOutputsStayThere) {
  ModelConfig config = TinyConfig();
  config.device = "cpu";
  Result<std::unique_ptr<Model>> model = Model::Create(config, 3);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_TRUE((*model)->device().is_cpu());
  for (const auto& [name, tensor] : (*model)->tensors()) {
    EXPECT_EQ(tensor.device(), (*model)->device()) << name;
  }
  Result<InferenceState> state = (*model)->NewState(1);
  ASSERT_TRUE(state.ok());
  Result<ForwardOutput> out =
      (*model)->Append(&*state, {at::arange(1, 9, at::kLong).view({1, -1}), {}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->logits.device(), (*model)->device());
}

TEST(OutOfMemory, BecomesResourceExhaustedNamingTheSettingToLower) {
  const auto out_of_memory = [] {
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.11 GiB total)");
  };
  Status outside = model::Guarded("rollout step", out_of_memory);
  EXPECT_EQ(outside.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(outside.message().find("rollout step: out of memory; lower the batch size"),
            std::string::npos)
      << outside.message();
  {
    model::OutOfMemoryAdvice advice("engine.max_batch of actor.yaml");
    {
      model::OutOfMemoryAdvice inner("train.chunk_tokens of rl.yaml");
      Status status = model::Guarded("update", out_of_memory);
      EXPECT_NE(status.message().find("lower train.chunk_tokens of rl.yaml"), std::string::npos)
          << status.message();
    }
    Status status = model::Guarded("rollout step", out_of_memory);
    EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
    EXPECT_NE(status.message().find("lower engine.max_batch of actor.yaml"), std::string::npos)
        << status.message();
    EXPECT_NE(status.message().find("Tried to allocate 2.00 GiB"), std::string::npos)
        << status.message();
    // A CUDA call that fails for memory outside the caching allocator reads the same.
    Status library = model::Guarded("matmul", [] {
      TORCH_CHECK(false, "CUDA error: out of memory\nCUDA kernel errors might be asynchronous");
    });
    EXPECT_EQ(library.code(), StatusCode::kResourceExhausted);
    // Other errors keep their code.
    Status other = model::Guarded("shapes", [] { TORCH_CHECK(false, "size mismatch"); });
    EXPECT_EQ(other.code(), StatusCode::kInternal);
  }
}

TEST(SamplingOffTheCpu, TensorCutsKeepWhatTheRowLoopsKeep) {
  at::Generator generator = at::detail::createCPUGenerator(5);
  // Logit ties (rounded values), -inf and NaN entries, and a never-sampled id.
  at::Tensor logits = (at::randn({64, 50}, generator, at::kDouble) * 4).round() / 2;
  logits.index_put_({0, 3}, -std::numeric_limits<double>::infinity());
  logits.index_put_({1, 7}, std::numeric_limits<double>::quiet_NaN());
  logits.index_put_({2}, 1.0);  // one row of nothing but ties
  std::vector<model::SamplingSettings> cases;
  for (double temperature : {0.0, 0.7, 1.0}) {
    for (int64_t top_k : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{49}}) {
      for (double top_p : {1.0, 0.9, 0.3}) {
        model::SamplingSettings s;
        s.temperature = temperature;
        s.top_k = top_k;
        s.top_p = top_p;
        s.never_sampled = {11};
        cases.push_back(s);
      }
    }
  }
  for (const model::SamplingSettings& s : cases) {
    const at::Tensor loops = model::SamplingSupport(logits, s);
    const at::Tensor tensors = model::internal::SupportByTensorOps(logits, s);
    EXPECT_TRUE(at::equal(loops, tensors))
        << "temperature " << s.temperature << ", top_k " << s.top_k << ", top_p " << s.top_p
        << ": " << (loops != tensors).sum().item<int64_t>() << " entries differ";
  }
}

}  // namespace
}  // namespace strider
