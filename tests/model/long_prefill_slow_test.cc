// The two-path contract after a long real prefill (docs/model_math.md#latent-attention): 63K tokens
// prefilled into latent attention's cache by the prefill kernel, then the last 1K queries in the
// absorbed form (the inference path, and the blockwise kernel under autograd) against the explicit
// form over the same cache. fp32; `slow` because the prefill alone is 2 x 10^9 query-key pairs.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "common/model/config.h"
#include "common/model/latent_attention.h"
#include "common/model/model.h"

namespace strider {
namespace {

double RelativeError(const at::Tensor& actual, const at::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  return (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>() / scale;
}

TEST(LongPrefill, LastThousandQueriesAfter63KTokensEqualTheExplicitForm) {
  const char* root = std::getenv("STRIDER_SOURCE_DIR");
  Result<ModelConfig> config =
      LoadModelConfig(std::string(root != nullptr ? root : ".") + "/configs/model/tiny.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Result<std::unique_ptr<Model>> model = Model::Create(*config, 7);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  model::TensorMap tensors;
  for (const auto& [name, tensor] : (*model)->tensors()) tensors[name] = tensor;
  const std::string prefix = "layers.3.latent.";  // tiny: IIIG
  const auto weights = model::LatentAttentionWeights::Bind(tensors, prefix);
  const LatentAttentionConfig& c = config->latent;
  const double eps = config->norm_epsilon;
  at::manual_seed(8);
  constexpr int64_t kPast = 63 * 1024, kQueries = 1024;
  // Inputs of unit scale, as the layer sees after its norm.
  const at::Tensor past_x = at::randn({1, kPast, config->width});
  const at::Tensor x = at::randn({1, kQueries, config->width});
  auto cache = model::LatentAttentionCache::Empty(c, 1, at::TensorOptions().dtype(at::kFloat));
  {
    at::NoGradGuard no_grad;
    for (int64_t begin = 0; begin < kPast; begin += 8192) {  // chunked prefill, as the engine
      const int64_t n = std::min<int64_t>(8192, kPast - begin);
      model::LatentAttentionForward(weights, c, past_x.narrow(1, begin, n), &cache, eps);
    }
  }
  ASSERT_EQ(cache.length, kPast);
  at::Tensor inference, explicit_form;
  {
    at::NoGradGuard no_grad;
    model::LatentAttentionCache a = cache, b = cache;
    inference = model::LatentAttentionForward(weights, c, x, &a, eps,
                                              model::LatentAttentionForm::kAbsorbed);
    explicit_form = model::LatentAttentionForward(weights, c, x, &b, eps,
                                                  model::LatentAttentionForm::kExplicit);
  }
  model::LatentAttentionCache d = cache;
  const at::Tensor input = x.clone().requires_grad_(true);
  const at::Tensor training = model::LatentAttentionForward(
      weights, c, input, &d, eps, model::LatentAttentionForm::kAbsorbed);  // blockwise
  const double prefill_error = RelativeError(inference, explicit_form);
  const double blockwise_error = RelativeError(training.detach(), explicit_form);
  std::printf("after %lld tokens: prefill kernel %.3g, blockwise kernel %.3g (relative)\n",
              static_cast<long long>(kPast), prefill_error, blockwise_error);
  EXPECT_LT(prefill_error, 1e-5);
  EXPECT_LT(blockwise_error, 1e-5);
}

}  // namespace
}  // namespace strider
