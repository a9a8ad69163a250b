// The learner's tensor code without a GPU, on PyTorch's `meta` device (shapes, no data): a
// tensor made on the CPU beside a device tensor fails there, and so does a read of tensor data
// on the host. Covered where shapes do not depend on data: the routing balance's real-token
// record (picked by at::index, which has a meta kernel in both LibTorch versions, where
// index_select has none) and AdamW's moments beside their parameters (made there, loaded there).
// The passes' action log-probs go through the sampler's distribution, whose cuts read values
// (device_test says why), and the deliberate copies to the host (docs/cuda.md, "Device-to-host
// copies") need values too: scoring_test and rl_step_test run those on the CPU.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/tokenizer.h"
#include "learner/learner.h"
#include "learner/optimizer.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

at::TensorOptions Meta(at::ScalarType type = at::kFloat) {
  return at::TensorOptions().device(at::kMeta).dtype(type);
}


TEST(LearnerMeta, RealTokenRoutingKeepsTheRecordWhereItIs) {
  // Host tokens with padding at the end of the second row; the record is the model's.
  at::Tensor tokens = at::full({2, 5}, 65, at::kLong);
  tokens[1][3] = token::kPad;
  tokens[1][4] = token::kPad;
  RoutingRecord record;
  record.layers.push_back({at::empty({2, 5, 2}, Meta(at::kLong)), at::empty({2, 5, 8}, Meta())});
  record.layers.push_back({at::empty({2, 5, 2}, Meta(at::kLong)), at::Tensor()});
  Result<RoutingRecord> real = RealTokenRouting(record, tokens);
  ASSERT_TRUE(real.ok()) << real.status().ToString();
  ASSERT_EQ(real->layers.size(), 2u);
  EXPECT_TRUE(real->layers[0].experts.is_meta());
  EXPECT_EQ(real->layers[0].experts.sizes().vec(), std::vector<int64_t>({1, 8, 2}));
  EXPECT_TRUE(real->layers[0].scores.is_meta());
  EXPECT_EQ(real->layers[0].scores.sizes().vec(), std::vector<int64_t>({1, 8, 8}));
  EXPECT_FALSE(real->layers[1].scores.defined());
}

TEST(LearnerMeta, AdamWMomentsLiveAndLoadBesideTheirParameters) {
  strider::testing::TempDir dir;
  // Saved from host parameters, as a checkpoint holds them.
  AdamW host({{"w", at::ones({3, 4})}, {"b", at::ones({4})}}, AdamWOptions());
  ASSERT_TRUE(host.Save(dir.Sub("adamw.safetensors")).ok());
  AdamW device({{"w", at::empty({3, 4}, Meta())}, {"b", at::empty({4}, Meta())}}, AdamWOptions());
  for (const at::Tensor& moment : device.MomentTensors()) {
    EXPECT_TRUE(moment.is_meta());
    EXPECT_EQ(moment.scalar_type(), at::kFloat);
  }
  // Loaded through host memory one moment at a time onto the parameters' device.
  ASSERT_TRUE(device.Load(dir.Sub("adamw.safetensors")).ok());
  const std::vector<at::Tensor> moments = device.MomentTensors();
  ASSERT_EQ(moments.size(), 4u);
  for (const at::Tensor& moment : moments) EXPECT_TRUE(moment.is_meta());
  EXPECT_EQ(moments[0].sizes().vec(), std::vector<int64_t>({3, 4}));
}

}  // namespace
}  // namespace strider
