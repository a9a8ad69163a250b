// Reward rises: a real replay server, a real RL learner and a real actor in synchronous rounds
// on the `letter` environment (tests/learner/letter_env.cc: a reply earns the fraction of its
// characters that are "a"). From the tiny model's random weights the policy gradient must raise
// the mean reward measurably within 40 learner steps, with every step trained on its own
// version's trajectories only.
#include <gtest/gtest.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tests/integration/letter_fleet.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::MeanOf;
using strider::testing::TempDir;

TEST(RlRun, RewardRisesOnAnEasyEnvironmentInSyncRounds) {
  TempDir dir;
  strider::testing::LetterFleetOptions options;
  options.letter_env_path = STRIDER_LETTER_ENV_PATH;
  std::vector<nlohmann::json> lines;
  ASSERT_NO_FATAL_FAILURE(strider::testing::RunLetterFleet(dir, options, &lines));
  ASSERT_EQ(lines.size(), 40u);
  for (const nlohmann::json& m : lines) {
    EXPECT_EQ(m["staleness_mean"], 0) << "sync mode trained on another version's trajectories";
    EXPECT_EQ(m["excluded_trajectories"], 0);
    EXPECT_GT(m["trained_trajectories"].get<int64_t>(), 0);
  }
  // Random weights put about 1 / vocabulary of their mass on "a": the first steps earn ~0.005.
  const double first = MeanOf(lines, 0, 10, "reward_mean");
  const double last = MeanOf(lines, 30, 40, "reward_mean");
  std::cout << "reward_mean: first 10 steps " << first << ", last 10 steps " << last
            << "; entropy " << lines.front()["entropy"] << " -> " << lines.back()["entropy"]
            << std::endl;
  EXPECT_GT(last, 3 * first);
  EXPECT_GT(last - first, 0.02);
  EXPECT_LT(lines.back()["entropy"].get<double>(), lines.front()["entropy"].get<double>());
}

}  // namespace
}  // namespace strider
