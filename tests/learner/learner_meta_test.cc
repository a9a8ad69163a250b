// The learner's tensor code without a GPU, on PyTorch's `meta` device (shapes, no data): a
// tensor made on the CPU beside a device tensor fails there, and so does a read of tensor data
// on the host. Covered where shapes do not depend on data: picking a chunk's action rows and
// their log-probs (the scoring and update passes' objective), the routing balance's real-token
// record, and AdamW's moments beside their parameters (made there, loaded there). The passes'
// deliberate copies to the host (docs/cuda.md, "Device-to-host copies") follow these and need
// values, so they are not run here. LibTorch 1.13 has no meta kernel for index_select, which
// the first two use, so they run in the 2.11 tree only (which CI runs on the CPU too).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <string>
#include <vector>

#include "common/tokenizer.h"
#include "learner/learner.h"
#include "learner/optimizer.h"
#include "learner/rl/scoring.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

at::TensorOptions Meta(at::ScalarType type = at::kFloat) {
  return at::TensorOptions().device(at::kMeta).dtype(type);
}

#if TORCH_VERSION_MAJOR >= 2
constexpr bool kMetaIndexSelect = true;
#else
constexpr bool kMetaIndexSelect = false;
#endif

TEST(LearnerMeta, ActionLogProbsPickTheirRowsWhereTheLogitsAre) {
  if (!kMetaIndexSelect) GTEST_SKIP() << "LibTorch 1.13 has no meta kernel for index_select";
  rl::PreparedTrajectory trajectory;
  // Prepared on the host, as PrepareTrajectory builds it.
  trajectory.input.tokens = at::arange(12, at::kLong).unsqueeze(0);
  trajectory.positions = {3, 4, 5, 9, 10};
  rl::PreparedTrajectory::Distribution distribution;
  distribution.actions = {0, 1, 2, 3, 4};
  trajectory.distributions = {distribution};
  const int64_t vocabulary = 32;
  for (const bool full : {false, true}) {
    // Chunk [0, 8) predicts positions 1..8: the actions at 3, 4 and 5.
    std::vector<int64_t> slots;
    at::Tensor entropy;
    const at::Tensor first = rl::ChunkActionLogProbs(at::empty({1, 8, vocabulary}, Meta()), 0,
                                                     trajectory, &slots, &entropy, full);
    EXPECT_TRUE(first.is_meta());
    EXPECT_EQ(first.sizes().vec(), std::vector<int64_t>({3}));
    EXPECT_EQ(slots, std::vector<int64_t>({0, 1, 2}));
    EXPECT_TRUE(entropy.is_meta());
    EXPECT_EQ(entropy.size(0), 3);
    // Chunk [8, 12): the actions at 9 and 10, no entropy asked.
    const at::Tensor second = rl::ChunkActionLogProbs(at::empty({1, 4, vocabulary}, Meta()), 8,
                                                      trajectory, &slots, nullptr, full);
    EXPECT_TRUE(second.is_meta());
    EXPECT_EQ(second.size(0), 2);
    EXPECT_EQ(slots, std::vector<int64_t>({3, 4}));
  }
  // A chunk that predicts no action gives an empty result on the logits' device.
  std::vector<int64_t> slots;
  at::Tensor entropy;
  const at::Tensor none = rl::ChunkActionLogProbs(at::empty({1, 2, vocabulary}, Meta()), 0,
                                                  trajectory, &slots, &entropy);
  EXPECT_TRUE(none.is_meta() && entropy.is_meta());
  EXPECT_TRUE(slots.empty());
}

TEST(LearnerMeta, RealTokenRoutingKeepsTheRecordWhereItIs) {
  if (!kMetaIndexSelect) GTEST_SKIP() << "LibTorch 1.13 has no meta kernel for index_select";
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
