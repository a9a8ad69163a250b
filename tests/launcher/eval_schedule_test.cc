// When the launcher's evaluations are due (fleet `evaluation:`): the start weights first, then
// every `every_versions`-th published version, a pause after a failure, none once disabled.
#include "launcher/eval_schedule.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>

namespace strider::launcher {
namespace {

using std::chrono::seconds;

TEST(EvaluationSchedule, StartWeightsFirstThenEveryNthVersion) {
  EvaluationSchedule schedule(/*every_versions=*/5, /*resume=*/false, "warm.safetensors");
  const Clock::time_point now = Clock::now();
  std::optional<EvaluationSchedule::Run> start = schedule.Due(std::nullopt, now);
  ASSERT_TRUE(start.has_value());
  EXPECT_EQ(start->weights, "warm.safetensors");
  EXPECT_EQ(start->version, 0);
  schedule.Done(0);
  EXPECT_FALSE(schedule.Due(4, now).has_value());
  std::optional<EvaluationSchedule::Run> fifth = schedule.Due(5, now);
  ASSERT_TRUE(fifth.has_value());
  EXPECT_EQ(fifth->weights, "");  // the learner's weight stream
  EXPECT_FALSE(fifth->version.has_value());
  // The stream served version 7 by the time the evaluation read it: the next is 10, not 12.
  schedule.Done(7);
  EXPECT_FALSE(schedule.Due(9, now).has_value());
  EXPECT_TRUE(schedule.Due(10, now).has_value());
}

TEST(EvaluationSchedule, WithoutStartWeightsAFreshRunWaitsForTheFirstPublishedVersion) {
  EvaluationSchedule fresh(/*every_versions=*/5, /*resume=*/false, "");
  EXPECT_FALSE(fresh.Due(std::nullopt, Clock::now()).has_value());
  std::optional<EvaluationSchedule::Run> first = fresh.Due(1, Clock::now());
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->weights, "");

  // A resumed learner serves its checkpoint's weights at once.
  EvaluationSchedule resumed(/*every_versions=*/5, /*resume=*/true, "");
  EXPECT_TRUE(resumed.Due(std::nullopt, Clock::now()).has_value());
}

TEST(EvaluationSchedule, AFailureWaitsForTheNextVersionAndAPause) {
  EvaluationSchedule schedule(/*every_versions=*/5, /*resume=*/false, "warm.safetensors");
  const Clock::time_point now = Clock::now();
  ASSERT_TRUE(schedule.Due(std::nullopt, now).has_value());
  schedule.Done(0);
  ASSERT_TRUE(schedule.Due(5, now).has_value());
  schedule.Failed(6, now);
  EXPECT_FALSE(schedule.Due(10, now).has_value());               // version 11 is next
  EXPECT_FALSE(schedule.Due(11, now + seconds(29)).has_value());  // and not within the pause
  EXPECT_TRUE(schedule.Due(11, now + seconds(31)).has_value());
}

TEST(EvaluationSchedule, DisabledIsNeverDue) {
  EvaluationSchedule schedule(/*every_versions=*/5, /*resume=*/false, "warm.safetensors");
  schedule.Disable();
  EXPECT_FALSE(schedule.enabled());
  EXPECT_FALSE(schedule.Due(100, Clock::now()).has_value());
}

TEST(EvaluationSchedule, EveryZeroEvaluatesOnlyTheStart) {
  EvaluationSchedule schedule(/*every_versions=*/0, /*resume=*/false, "warm.safetensors");
  ASSERT_TRUE(schedule.Due(std::nullopt, Clock::now()).has_value());
  schedule.Done(0);
  EXPECT_FALSE(schedule.Due(1000000, Clock::now()).has_value());
}

}  // namespace
}  // namespace strider::launcher
