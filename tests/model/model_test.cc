// Whole-model tests: the two-path contract (docs/design.md#two-paths-one-model,
// docs/model_math.md#whole-model-invariants), the inference state's error handling, and quantile
// balancing through the model.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/model/config.h"
#include "common/model/model.h"
#include "common/model/two_path_check.h"
#include "common/tokenizer.h"
#include "tests/shipped_config.h"

namespace strider {
namespace {

ModelConfig TinyConfig() { return testing::ShippedModelConfig("tiny"); }

std::unique_ptr<Model> TinyModel(uint64_t seed) {
  ConfigureRuntime(2);
  Result<std::unique_ptr<Model>> model = Model::Create(TinyConfig(), seed);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return std::move(model).value();
}

at::Tensor RandomTokens(int64_t batch, int64_t length, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randint(0, token::kByteCount, {batch, length}, generator, at::kLong);
}

TEST(TwoPaths, Fp32TinyModelOver2048Tokens) {
  std::unique_ptr<Model> model = TinyModel(1);
  Result<TwoPathReport> report = CheckTwoPaths(*model, RandomTokens(1, 2048, 2));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_LE(report->max_abs_logprob_diff, 1e-5);
  EXPECT_GE(report->routing_agreement, 0.999);
  EXPECT_EQ(report->routing_decisions, 2048 * 3);  // three sparse layers in tiny
}

TEST(TwoPaths, Fp64BatchOfTwoInUnevenChunks) {
  std::unique_ptr<Model> model = TinyModel(3);
  ASSERT_TRUE(model->ConvertTo(at::kDouble).ok());
  Result<TwoPathReport> report = CheckTwoPaths(*model, RandomTokens(2, 300, 4));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_LE(report->max_abs_logprob_diff, 1e-10);
  EXPECT_EQ(report->routing_agreement, 1.0);
}

TEST(TwoPaths, Fp64TokenByToken) {
  std::unique_ptr<Model> model = TinyModel(5);
  ASSERT_TRUE(model->ConvertTo(at::kDouble).ok());
  const int64_t length = 120;
  Result<TwoPathReport> report =
      CheckTwoPaths(*model, RandomTokens(1, length, 6), std::vector<int64_t>(length, 1));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_LE(report->max_abs_logprob_diff, 1e-10);
}

TEST(TwoPaths, HoldAfterQuantileBalancingMovesTheBiases) {
  std::unique_ptr<Model> model = TinyModel(7);
  at::Tensor tokens = RandomTokens(2, 256, 8);
  ForwardOptions record;
  record.record_routing = true;
  {
    at::NoGradGuard no_grad;
    Result<ForwardOutput> out = model->Forward({tokens, {}}, record);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    Result<std::vector<double>> violations = model->UpdateRoutingBalance(out->routing);
    ASSERT_TRUE(violations.ok()) << violations.status().ToString();
    EXPECT_EQ(violations->size(), 3u);
  }
  double bias_magnitude = 0;
  for (const auto& [name, tensor] : model->tensors()) {
    if (name.find("router_bias") != std::string::npos) {
      bias_magnitude += tensor.abs().sum().item<double>();
    }
  }
  EXPECT_GT(bias_magnitude, 0.0);
  Result<TwoPathReport> report = CheckTwoPaths(*model, RandomTokens(1, 512, 9));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_LE(report->max_abs_logprob_diff, 1e-5);
  EXPECT_GE(report->routing_agreement, 0.999);
}

TEST(QuantileBalancing, ModelUpdatesBringASkewedRouterTowardBalance) {
  std::unique_ptr<Model> model = TinyModel(11);
  // Start every sparse layer from a bias that pushes most tokens to experts 0 and 1, as a stale
  // or badly initialised bias would.
  for (const auto& [name, tensor] : model->tensors()) {
    if (name.find("router_bias") != std::string::npos) {
      at::NoGradGuard no_grad;
      tensor.narrow(0, 0, 2).fill_(1.0);
    }
  }
  at::Tensor tokens = RandomTokens(2, 512, 12);
  ForwardOptions record;
  record.record_routing = true;
  at::NoGradGuard no_grad;
  std::vector<double> first, last;
  for (int step = 0; step < 3; ++step) {
    Result<ForwardOutput> out = model->Forward({tokens, {}}, record);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    Result<std::vector<double>> violations = model->UpdateRoutingBalance(out->routing);
    ASSERT_TRUE(violations.ok());
    if (step == 0) first = *violations;
    last = *violations;
  }
  for (size_t layer = 0; layer < first.size(); ++layer) {
    EXPECT_GT(first[layer], 1.0) << "layer " << layer << " was not skewed to begin with";
    EXPECT_LT(last[layer], 0.3) << "layer " << layer;
  }
}

TEST(Append, RejectsBadRequestsAndLeavesTheStateUsable) {
  std::unique_ptr<Model> model = TinyModel(13);
  Result<InferenceState> state = model->NewState(1);
  ASSERT_TRUE(state.ok());
  at::Tensor tokens = RandomTokens(1, 40, 14);
  ASSERT_TRUE(model->Append(&*state, {tokens.narrow(1, 0, 20), {}}).ok());

  Result<ForwardOutput> wrong_batch = model->Append(&*state, {RandomTokens(2, 3, 1), {}});
  ASSERT_FALSE(wrong_batch.ok());
  EXPECT_NE(wrong_batch.status().message().find("batch"), std::string::npos);

  at::Tensor out_of_vocabulary = at::full({1, 2}, 5000, at::kLong);
  Result<ForwardOutput> bad_token = model->Append(&*state, {out_of_vocabulary, {}});
  ASSERT_FALSE(bad_token.ok());
  EXPECT_NE(bad_token.status().message().find("vocabulary"), std::string::npos);

  Result<ForwardOutput> orphan_patch =
      model->Append(&*state, {at::full({1, 3}, token::kImagePatch, at::kLong), {}});
  ASSERT_FALSE(orphan_patch.ok());
  EXPECT_NE(orphan_patch.status().message().find("image-patch"), std::string::npos);

  Result<ForwardOutput> too_long =
      model->Append(&*state, {RandomTokens(1, model->config().context, 15), {}});
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("model.context"), std::string::npos);
  EXPECT_EQ(state->length(), 20);

  // After the refusals, the state continues exactly as if they never happened.
  ASSERT_TRUE(model->Append(&*state, {tokens.narrow(1, 20, 20), {}}).ok());
  Result<InferenceState> fresh = model->NewState(1);
  ASSERT_TRUE(fresh.ok());
  Result<ForwardOutput> whole = model->Append(&*fresh, {tokens, {}});
  ASSERT_TRUE(whole.ok());
  Result<ForwardOutput> next_a = model->Append(&*state, {tokens.narrow(1, 0, 1), {}});
  Result<ForwardOutput> next_b = model->Append(&*fresh, {tokens.narrow(1, 0, 1), {}});
  ASSERT_TRUE(next_a.ok() && next_b.ok());
  EXPECT_LE((next_a->logits - next_b->logits).abs().max().item<double>(), 1e-5);
}

TEST(InferenceState, CopiesContinueIndependently) {
  std::unique_ptr<Model> model = TinyModel(23);
  at::Tensor prefix = RandomTokens(1, 20, 24);
  at::Tensor first = RandomTokens(1, 5, 25);
  at::Tensor second = RandomTokens(1, 5, 26);
  Result<InferenceState> original = model->NewState(1);
  ASSERT_TRUE(original.ok());
  // Two appends leave spare capacity in the cache storage (doubling), so the copies below share
  // storage with room to write in place.
  ASSERT_TRUE(model->Append(&*original, {prefix.narrow(1, 0, 19), {}}).ok());
  ASSERT_TRUE(model->Append(&*original, {prefix.narrow(1, 19, 1), {}}).ok());
  // Both copies share the latent cache storage; each must see only its own continuation.
  InferenceState copy = *original;
  Result<ForwardOutput> original_out = model->Append(&*original, {first, {}});
  Result<ForwardOutput> copy_out = model->Append(&copy, {second, {}});
  Result<ForwardOutput> original_next = model->Append(&*original, {second.narrow(1, 0, 1), {}});
  ASSERT_TRUE(original_out.ok() && copy_out.ok() && original_next.ok());

  for (const at::Tensor& continuation : {first, second}) {
    Result<InferenceState> fresh = model->NewState(1);
    ASSERT_TRUE(fresh.ok());
    Result<ForwardOutput> expected =
        model->Append(&*fresh, {at::cat({prefix, continuation}, 1), {}});
    ASSERT_TRUE(expected.ok());
    const at::Tensor& got = continuation.equal(first) ? original_out->logits : copy_out->logits;
    EXPECT_LE((expected->logits.narrow(1, 20, 5) - got).abs().max().item<double>(), 1e-5);
  }
  Result<InferenceState> fresh = model->NewState(1);
  Result<ForwardOutput> expected =
      model->Append(&*fresh, {at::cat({prefix, first, second.narrow(1, 0, 1)}, 1), {}});
  ASSERT_TRUE(expected.ok());
  EXPECT_LE((expected->logits.narrow(1, 25, 1) - original_next->logits).abs().max().item<double>(),
            1e-5);
}

TEST(InferenceState, IncrementalStateIsConstantAndLatentCacheGrowsByTheFormula) {
  std::unique_ptr<Model> model = TinyModel(17);
  Result<InferenceState> state = model->NewState(1);
  ASSERT_TRUE(state.ok());
  const int64_t state_bytes = state->StateBytes();
  ASSERT_TRUE(model->Append(&*state, {RandomTokens(1, 100, 18), {}}).ok());
  EXPECT_EQ(state->StateBytes(), state_bytes);
  const ModelConfig& config = model->config();
  const int64_t per_token = config.CountLayers('G') *
                            (config.latent.kv_rank + config.latent.rope_dim) * 4;
  EXPECT_EQ(state->CacheBytes(), 100 * per_token);
  ASSERT_TRUE(model->Append(&*state, {RandomTokens(1, 1, 19), {}}).ok());
  EXPECT_EQ(state->CacheBytes(), 101 * per_token);
  EXPECT_EQ(state->StateBytes(), state_bytes);
}

TEST(ValueHead, GivesOneEstimatePerPositionOnBothPaths) {
  std::unique_ptr<Model> model = TinyModel(21);
  at::Tensor tokens = RandomTokens(2, 33, 22);
  ForwardOptions options;
  options.compute_values = true;
  Result<ForwardOutput> train = model->Forward({tokens, {}}, options);
  ASSERT_TRUE(train.ok());
  EXPECT_EQ(train->values.sizes(), (std::vector<int64_t>{2, 33}));
  Result<InferenceState> state = model->NewState(2);
  Result<ForwardOutput> inference = model->Append(&*state, {tokens, {}}, options);
  ASSERT_TRUE(inference.ok());
  EXPECT_LE((train->values - inference->values).abs().max().item<double>(), 1e-5);
}

}  // namespace
}  // namespace strider
