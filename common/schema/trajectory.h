// A stored trajectory read back whole: its segments joined in order, its steps as trajectory
// positions with the model's turn of each, its end as the actor recorded it. A property of the
// segment format (docs/design.md#trajectories-and-segments), so it lives beside it: the
// verifier, reward shaping, the process reward model and the learner's scoring pass all read
// trajectories through it.
//
// Steps as the actor stores them (actors/segmenter.h): a step is one model turn and ends right
// after the turn's last sampled token; it begins where the previous step ended, so it holds the
// context before the turn (the observation answered, the <|model|> header) and the turn's
// action tokens. A step belongs to the segment where it ends.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/schema/messages.h"
#include "common/status.h"

namespace strider::schema {

struct StoredStep {
  uint64_t begin = 0;  // trajectory positions
  uint64_t end = 0;
  float stored_reward = 0;  // as stored (schema 1.1 stores a missing reward as 0)
  // Since schema 1.2: whether the environment gave a reward, and its label (1.1 segments read
  // as rewarded, unknown).
  bool has_reward = true;
  StepLabel label = StepLabel::kUnknown;
  // The model's turn as the environment got it: the step's action tokens decoded, without a
  // closing end-of-turn or end-of-text.
  std::string turn_text;
};

struct StoredTrajectory {
  TrajectoryId id;
  std::string env;
  std::vector<int32_t> tokens;
  std::vector<Role> roles;
  std::vector<Image> images;  // token_offset as a trajectory position
  std::vector<StoredStep> steps;
  // Action tokens after the last step: a turn the environment never answered (a timeout, an
  // engine error, a stop while generating).
  uint64_t unanswered_action_tokens = 0;
  float outcome = 0;
  std::map<std::string, std::string> metadata;  // of the last segment
  std::string status;                           // metadata `status` ("done", "max_turns", ...)
  // The last segment's end reason (schema 1.2; kNone on 1.1 segments, whose end is `status`).
  EndReason end_reason = EndReason::kNone;
};

// Joins the segments of one trajectory, given in any order. Errors (InvalidArgument): no
// segments, segments of different trajectories, a missing or repeated index, token ranges that
// do not follow each other, no last segment or one that is not the highest index, a step that
// does not end after the one before it.
Result<StoredTrajectory> JoinSegments(std::span<const SegmentData> segments);

}  // namespace strider::schema
