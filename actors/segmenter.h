// Cuts one trajectory into replay segments as it grows (docs/design.md#trajectories-and-segments).
//
// The actor feeds every token of an episode in order: context it wrote (observations, turn
// markers) and actions the model sampled (with behaviour log-prob, policy version and experts).
// The segmenter keeps only the tokens not yet cut, so a million-token trajectory never sits in
// memory whole. A segment is cut once more than `segment_tokens` tokens wait:
//
//   tokens waiting:  |<------------- segment_tokens ------------->|x
//   turn boundaries:      ^             ^                 ^
//   cut:                                                  ^  the last boundary in the window,
//                                                            when it keeps at least half of it;
//                                                            else exactly at the window's end
//
// Each segment carries its tokens, roles, behaviour log-probs (0 for context), policy runs, the
// experts of its action tokens, the steps that end inside it (a step spanning a cut belongs to
// the segment where it ends), the state digest recorded at its first token (when the actor had
// one there), the group and sampling settings, and on the last segment the outcome reward and
// end reason. Metadata is set on the last segment only, because only then is the episode's
// status known.
//
// With `route_context`, context tokens get their experts too (AddRouting), from the engine's
// record of the step that fed them, which comes after the actor added them: a segment is cut
// only once every context token in it has its record, or Finish says none will come (the last
// observation, never fed to the model). Those without one are left out of the segment's mask.
//
// Not thread-safe; one per trajectory.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/schema/messages.h"
#include "common/status.h"

namespace strider::actors {

struct SegmenterOptions {
  int64_t segment_tokens = 4096;  // most tokens in one segment (> 0)
  std::string env;                // environment name stamped on every segment
  std::string table;              // replay table; empty: the server's first
  // Routing record layout of action tokens: sparse layers x experts per token (0 x 0 for a
  // model without experts).
  int64_t routing_layers = 0;
  int64_t routing_top_k = 0;
  // Context tokens wait for their records (see the top); false: only actions have records.
  bool route_context = false;
  // Stamped on every segment (schema 1.2).
  schema::TrajectoryId group_id;
  uint32_t group_index = 0;
  uint32_t group_size = 0;  // 0: not in a group
  float temperature = 1.0f;
  float top_p = 1.0f;
  uint32_t top_k = 0;
  // The policy version in force when the trajectory starts: context before its first action
  // (the prompt) carries it, so a trajectory begun after a weight swap is not counted as stale.
  uint64_t policy_version = 0;
};

class Segmenter {
 public:
  Segmenter(SegmenterOptions options, schema::TrajectoryId id);

  // Context tokens (any role that is not an action).
  Status AddContext(std::span<const int32_t> tokens, schema::Role role);
  // An image whose run (image-start, patch placeholders, image-end) the caller adds next with
  // AddContext: its token offset is the current position, and it travels with the segment that
  // holds that position.
  Status AddImage(schema::Image image);
  // One sampled token: `experts` holds routing_layers x routing_top_k ids.
  Status AddAction(int32_t token, schema::Role role, float log_prob, uint64_t policy_version,
                   std::span<const uint16_t> experts);
  // The experts of consecutive positions from `first_position` (routing_layers x routing_top_k
  // ids each), as the engine recorded them when it fed those tokens. Only context positions
  // take them (an action's came with AddAction); a position already cut is an error. Ignored
  // without route_context.
  Status AddRouting(int64_t first_position, std::span<const uint16_t> experts);
  // The current position is a turn boundary (a preferred cut). `digest` is the inference state
  // after every token so far, when the caller has it.
  void MarkTurnBoundary(std::optional<uint64_t> digest);
  // A step (one model turn, its tool call included) ends at the current position; it began at
  // the turn's first action. No reward: the environment gave none (stored as 0, flagged).
  Status EndStep(std::optional<float> process_reward,
                 schema::StepLabel label = schema::StepLabel::kUnknown);

  // Segments cut so far and not yet taken, oldest first.
  std::vector<schema::SegmentData> TakeReady();
  // Cuts everything left (there must be at least one token in the trajectory; context still
  // waiting for routing goes without) and marks the final segment last, with the outcome
  // reward, end reason (not kNone) and metadata. The segmenter is spent after it.
  Result<std::vector<schema::SegmentData>> Finish(
      float outcome_reward, schema::EndReason end_reason,
      std::vector<std::pair<std::string, std::string>> metadata);

  int64_t length() const { return begin_ + static_cast<int64_t>(tokens_.size()); }
  int64_t segments_cut() const { return next_index_; }
  const schema::TrajectoryId& id() const { return id_; }

 private:
  void CutWhileOver();
  // Moves routed_until_ past every position that has its record or needs none.
  void AdvanceRouted();
  // Moves the first `count` waiting tokens into a new segment.
  void Cut(int64_t count);

  SegmenterOptions options_;
  schema::TrajectoryId id_;
  bool finished_ = false;
  uint32_t next_index_ = 0;
  int64_t begin_ = 0;  // absolute position of tokens_[0]
  std::vector<int32_t> tokens_;
  std::vector<schema::Role> roles_;
  std::vector<float> log_probs_;
  std::vector<uint64_t> versions_;  // per token; context tokens repeat the last action's
                                    // (or options_.policy_version before the first)
  std::vector<uint16_t> experts_;   // per waiting token (zeros until its record arrives)
  std::vector<uint8_t> has_record_;  // per waiting token
  bool route_context_ = false;
  int64_t routed_until_ = 0;        // absolute: positions before it are ready to be cut
  std::optional<int64_t> step_begin_;  // absolute: first action of the step in progress
  uint32_t next_step_index_ = 0;
  int64_t last_step_end_ = 0;  // absolute
  uint64_t last_version_ = 0;
  std::vector<std::pair<int64_t, std::optional<uint64_t>>> boundaries_;  // absolute position
  std::vector<std::pair<int64_t, schema::Step>> steps_;  // absolute end; begin is absolute
  std::vector<std::pair<int64_t, schema::Image>> images_;                // absolute offset
  std::optional<uint64_t> start_digest_;                                 // at begin_
  std::vector<schema::SegmentData> ready_;
};

// 128 random bits from the operating system's generator.
schema::TrajectoryId NewTrajectoryId();

}  // namespace strider::actors
