#include "common/schema/trajectory.h"

#include <algorithm>

#include "common/tokenizer.h"

namespace strider::schema {

Result<StoredTrajectory> JoinSegments(std::span<const SegmentData> segments) {
  if (segments.empty()) return Status::InvalidArgument("trajectory: no segments");
  std::vector<const SegmentData*> ordered;
  for (const SegmentData& segment : segments) ordered.push_back(&segment);
  std::sort(ordered.begin(), ordered.end(),
            [](const auto* a, const auto* b) { return a->segment_index < b->segment_index; });
  StoredTrajectory out;
  out.id = ordered.front()->trajectory_id;
  out.env = ordered.front()->env;
  const std::string name = out.id.Hex();
  for (size_t i = 0; i < ordered.size(); ++i) {
    const SegmentData& s = *ordered[i];
    const std::string where = "trajectory " + name + ": segment " + std::to_string(s.segment_index);
    if (s.trajectory_id != out.id) {
      return Status::InvalidArgument(where + " belongs to trajectory " + s.trajectory_id.Hex());
    }
    if (s.segment_index != i) {
      return Status::InvalidArgument(where + " where segment " + std::to_string(i) +
                                     " should be (missing or repeated)");
    }
    if (s.token_begin != out.tokens.size()) {
      return Status::InvalidArgument(where + " begins at token " + std::to_string(s.token_begin) +
                                     ", the previous ones end at " +
                                     std::to_string(out.tokens.size()));
    }
    if (s.is_last != (i + 1 == ordered.size())) {
      return Status::InvalidArgument(s.is_last ? where + " is marked last but is not the last"
                                               : where + " is the last stored but not marked last");
    }
    for (const Step& step : s.steps) {
      StoredStep stored;
      stored.begin = out.steps.empty() ? 0 : out.steps.back().end;
      stored.end = s.token_begin + step.end;
      stored.stored_reward = step.process_reward;
      if (s.schema_minor >= 2) {
        stored.has_reward = step.has_reward;
        stored.label = step.label;
      }
      out.steps.push_back(stored);
    }
    for (Image image : s.images) {
      image.token_offset += static_cast<uint32_t>(s.token_begin);
      out.images.push_back(std::move(image));
    }
    out.tokens.insert(out.tokens.end(), s.tokens.begin(), s.tokens.end());
    out.roles.insert(out.roles.end(), s.roles.begin(), s.roles.end());
    if (s.is_last) {
      out.outcome = s.outcome_reward;
      out.end_reason = s.end_reason;
      for (const auto& [key, value] : s.metadata) out.metadata[key] = value;
    }
  }
  for (StoredStep& step : out.steps) {
    if (step.end <= step.begin || step.end > out.tokens.size()) {
      return Status::InvalidArgument("trajectory " + name + ": a step ends at " +
                                     std::to_string(step.end) + " after one ending at " +
                                     std::to_string(step.begin));
    }
    std::vector<int32_t> turn;
    for (uint64_t t = step.begin; t < step.end; ++t) {
      if (IsAction(out.roles[t])) turn.push_back(out.tokens[t]);
    }
    // The actor hands the environment the turn without its closing token (actors/actor.cc).
    if (!turn.empty() && (turn.back() == token::kEndOfTurn || turn.back() == token::kEndOfText)) {
      turn.pop_back();
    }
    step.turn_text = Tokenizer::Decode(turn);
  }
  const uint64_t answered = out.steps.empty() ? 0 : out.steps.back().end;
  for (uint64_t t = answered; t < out.tokens.size(); ++t) {
    if (IsAction(out.roles[t])) ++out.unanswered_action_tokens;
  }
  auto status = out.metadata.find("status");
  if (status != out.metadata.end()) out.status = status->second;
  return out;
}

}  // namespace strider::schema
