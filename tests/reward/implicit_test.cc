// Implicit process rewards (PRIME) against sums worked out by hand (reward/implicit.h).
#include "reward/implicit.h"

#include <gtest/gtest.h>

#include <limits>

namespace strider::reward {
namespace {

using schema::Role;

// Two steps and a final observation:
//   position  0      1     2      3      4          5            6      7      8
//   role      system user  model  model  tool_call  tool_result  model  model  tool_result
const std::vector<Role> kRoles = {Role::kSystem, Role::kUser,     Role::kModel,
                                  Role::kModel,  Role::kToolCall, Role::kToolResult,
                                  Role::kModel,  Role::kModel,    Role::kToolResult};
// Context positions carry log-probs of their own to show they are ignored.
const std::vector<float> kPolicy = {-9.0f, -9.0f,  -0.5f, -1.25f, -2.0f,
                                    -9.0f, -0.75f, -3.0f, -9.0f};
const std::vector<float> kReference = {-1.0f, -2.0f,  -1.0f, -1.0f, -2.5f,
                                       -1.0f, -0.25f, -2.0f, -1.0f};

TEST(ImplicitProcessRewards, BetaTimesTheLogRatioSummedOverEachStepsActionTokens) {
  const std::vector<uint64_t> ends = {5, 8};
  Result<std::vector<double>> rewards =
      ImplicitProcessRewards(kPolicy, kReference, kRoles, ends, 0.5);
  ASSERT_TRUE(rewards.ok()) << rewards.status().ToString();
  ASSERT_EQ(rewards->size(), 2u);
  // Step 0, positions 2-4: (-0.5+1) + (-1.25+1) + (-2+2.5) = 0.75, times 0.5.
  EXPECT_DOUBLE_EQ((*rewards)[0], 0.375);
  // Step 1, positions 6-7: (-0.75+0.25) + (-3+2) = -1.5, times 0.5. Position 8 is in no step.
  EXPECT_DOUBLE_EQ((*rewards)[1], -0.75);
}

TEST(ImplicitProcessRewards, APolicyEqualToItsReferenceEarnsNothing) {
  Result<std::vector<double>> rewards =
      ImplicitProcessRewards(kPolicy, kPolicy, kRoles, std::vector<uint64_t>{3, 5, 9}, 10.0);
  ASSERT_TRUE(rewards.ok());
  EXPECT_EQ(*rewards, (std::vector<double>{0.0, 0.0, 0.0}));
  Result<std::vector<double>> none =
      ImplicitProcessRewards(kPolicy, kReference, kRoles, std::vector<uint64_t>{}, 1.0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(ImplicitProcessRewards, RefusesArraysThatDoNotLineUp) {
  const std::vector<uint64_t> ends = {5, 8};
  std::vector<float> short_policy(kPolicy.begin(), kPolicy.end() - 1);
  EXPECT_TRUE(ImplicitProcessRewards(short_policy, kReference, kRoles, ends, 1.0)
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(ImplicitProcessRewards(kPolicy, kReference, kRoles, std::vector<uint64_t>{5, 5}, 1.0)
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(ImplicitProcessRewards(kPolicy, kReference, kRoles, std::vector<uint64_t>{0}, 1.0)
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(ImplicitProcessRewards(kPolicy, kReference, kRoles, std::vector<uint64_t>{10}, 1.0)
                  .status()
                  .IsInvalidArgument());
  EXPECT_TRUE(ImplicitProcessRewards(kPolicy, kReference, kRoles, ends,
                                     std::numeric_limits<double>::infinity())
                  .status()
                  .IsInvalidArgument());
}

TEST(ImplicitProcessRewards, ANonFiniteLogProbCountsOnlyOnAnActionToken) {
  const std::vector<uint64_t> ends = {5, 8};
  std::vector<float> policy = kPolicy;
  policy[1] = -std::numeric_limits<float>::infinity();  // context: ignored
  EXPECT_TRUE(ImplicitProcessRewards(policy, kReference, kRoles, ends, 0.5).ok());
  policy[3] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(
      ImplicitProcessRewards(policy, kReference, kRoles, ends, 0.5).status().IsInvalidArgument());
}

}  // namespace
}  // namespace strider::reward
