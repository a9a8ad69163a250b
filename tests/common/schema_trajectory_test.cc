// JoinSegments on segments built by hand: a trajectory cut mid-turn into three segments, given
// out of order, joins into the positions, steps, turns and end the actor stored; segments that
// do not make one trajectory are refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/schema/trajectory.h"
#include "common/token_ids.h"

namespace strider::schema {
namespace {

void Append(SegmentData* segment, const std::string& text, Role role) {
  for (char c : text) {
    segment->tokens.push_back(static_cast<unsigned char>(c));
    segment->roles.push_back(role);
  }
}

void AppendEndOfTurn(SegmentData* segment) {
  segment->tokens.push_back(token::kEndOfTurn);
  segment->roles.push_back(Role::kModel);
}

Step MakeStep(uint32_t end, float reward, StepLabel label, bool has_reward) {
  Step step;
  step.end = end;
  step.process_reward = reward;
  step.label = label;
  step.has_reward = has_reward;
  return step;
}

// Positions: 0-1 the user's "hi"; 2-5 the turn "abc" and its end-of-turn, cut after "ab"; 6-7 a
// tool result; 8-9 the turn "d"; 10 a tool result with an image; 11-12 a turn never answered.
std::vector<SegmentData> ThreeSegments() {
  TrajectoryId id;
  id.bytes[0] = 7;
  std::vector<SegmentData> segments(3);
  for (uint32_t i = 0; i < 3; ++i) {
    segments[i].trajectory_id = id;
    segments[i].segment_index = i;
    segments[i].env = "calculator";
  }
  Append(&segments[0], "hi", Role::kUser);
  Append(&segments[0], "ab", Role::kModel);
  segments[1].token_begin = 4;
  Append(&segments[1], "c", Role::kModel);
  AppendEndOfTurn(&segments[1]);
  Append(&segments[1], "42", Role::kToolResult);
  Append(&segments[1], "d", Role::kToolCall);
  AppendEndOfTurn(&segments[1]);
  segments[1].steps = {MakeStep(2, 0.5f, StepLabel::kCorrect, true),
                       MakeStep(6, 0.0f, StepLabel::kIncorrect, false)};
  segments[2].token_begin = 10;
  Append(&segments[2], "7", Role::kToolResult);
  Append(&segments[2], "ef", Role::kModel);
  segments[2].images.push_back({0, 1, 1, 3, std::string(3, '\x7f')});
  segments[2].is_last = true;
  segments[2].outcome_reward = 1.0f;
  segments[2].end_reason = EndReason::kTruncatedTurns;
  segments[2].metadata = {{"status", "max_turns"}, {"seed", "3"}};
  return segments;
}

TEST(JoinSegments, JoinsSegmentsGivenInAnyOrder) {
  const std::vector<SegmentData> segments = ThreeSegments();
  const std::vector<SegmentData> shuffled = {segments[2], segments[0], segments[1]};
  Result<StoredTrajectory> joined = JoinSegments(shuffled);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  EXPECT_EQ(joined->id, segments[0].trajectory_id);
  EXPECT_EQ(joined->env, "calculator");
  ASSERT_EQ(joined->tokens.size(), 13u);
  ASSERT_EQ(joined->roles.size(), 13u);
  EXPECT_EQ(joined->tokens[4], 'c');
  EXPECT_EQ(joined->tokens[5], token::kEndOfTurn);
  EXPECT_EQ(joined->roles[10], Role::kToolResult);

  ASSERT_EQ(joined->steps.size(), 2u);
  // The first step began with the trajectory and ends in the second segment.
  EXPECT_EQ(joined->steps[0].begin, 0u);
  EXPECT_EQ(joined->steps[0].end, 6u);
  EXPECT_EQ(joined->steps[0].turn_text, "abc") << "action tokens of both segments, no end-of-turn";
  EXPECT_FLOAT_EQ(joined->steps[0].stored_reward, 0.5f);
  EXPECT_TRUE(joined->steps[0].has_reward);
  EXPECT_EQ(joined->steps[0].label, StepLabel::kCorrect);
  EXPECT_EQ(joined->steps[1].begin, 6u);
  EXPECT_EQ(joined->steps[1].end, 10u);
  EXPECT_EQ(joined->steps[1].turn_text, "d") << "the tool result before it is context";
  EXPECT_FALSE(joined->steps[1].has_reward);
  EXPECT_EQ(joined->steps[1].label, StepLabel::kIncorrect);

  ASSERT_EQ(joined->images.size(), 1u);
  EXPECT_EQ(joined->images[0].token_offset, 10u) << "a trajectory position";
  EXPECT_EQ(joined->unanswered_action_tokens, 2u);
  EXPECT_FLOAT_EQ(joined->outcome, 1.0f);
  EXPECT_EQ(joined->end_reason, EndReason::kTruncatedTurns);
  EXPECT_EQ(joined->status, "max_turns");
  EXPECT_EQ(joined->metadata.at("seed"), "3");
}

TEST(JoinSegments, ReadsStepsOfSchema11AsRewardedAndUnknown) {
  std::vector<SegmentData> segments = ThreeSegments();
  segments[1].schema_minor = 1;
  Result<StoredTrajectory> joined = JoinSegments(segments);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  ASSERT_EQ(joined->steps.size(), 2u);
  for (const StoredStep& step : joined->steps) {
    EXPECT_TRUE(step.has_reward);
    EXPECT_EQ(step.label, StepLabel::kUnknown);
  }
}

TEST(JoinSegments, RefusesSegmentsThatDoNotMakeOneTrajectory) {
  const std::vector<SegmentData> segments = ThreeSegments();
  ASSERT_TRUE(JoinSegments(segments).ok());
  EXPECT_TRUE(JoinSegments({}).status().IsInvalidArgument());

  std::vector<SegmentData> missing = segments;
  missing.erase(missing.begin() + 1);
  EXPECT_TRUE(JoinSegments(missing).status().IsInvalidArgument());
  std::vector<SegmentData> repeated = segments;
  repeated[2] = repeated[1];
  EXPECT_TRUE(JoinSegments(repeated).status().IsInvalidArgument());
  std::vector<SegmentData> open(segments.begin(), segments.end() - 1);
  EXPECT_TRUE(JoinSegments(open).status().IsInvalidArgument()) << "no last segment";
  std::vector<SegmentData> early_last = segments;
  early_last[1].is_last = true;
  EXPECT_TRUE(JoinSegments(early_last).status().IsInvalidArgument());
  std::vector<SegmentData> gap = segments;
  gap[1].token_begin += 1;
  EXPECT_TRUE(JoinSegments(gap).status().IsInvalidArgument());
  std::vector<SegmentData> foreign = segments;
  foreign[2].trajectory_id.bytes[1] = 1;
  EXPECT_TRUE(JoinSegments(foreign).status().IsInvalidArgument());
  std::vector<SegmentData> empty_step = segments;
  empty_step[1].steps[1].end = empty_step[1].steps[0].end;
  EXPECT_TRUE(JoinSegments(empty_step).status().IsInvalidArgument());
  std::vector<SegmentData> past_end = segments;
  past_end[1].steps[1].end = 40;
  EXPECT_TRUE(JoinSegments(past_end).status().IsInvalidArgument());
}

}  // namespace
}  // namespace strider::schema
