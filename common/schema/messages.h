// The replay service's messages as plain C++ values, and their one validated way in and out.
//
// Encode* functions build a complete frame: the envelope (magic, schema version, payload length,
// CRC32C of the payload) around a Cap'n Proto `Message` (common/schema/replay.capnp). Decode
// checks a frame completely before anything reads it:
//
//   size limit -> header -> schema major version -> payload length -> checksum ->
//   Cap'n Proto structure (traversal and nesting limits) -> required fields ->
//   array lengths that must agree -> token ids, roles and offsets within range
//
// A rejected frame yields a non-OK Status whose message starts with a short reason ("checksum:",
// "version:", ...) that RejectReason() extracts; servers count rejects by it and send it back.
// Decoding never throws and never aborts on hostile input.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace strider::schema {

// Major versions must match exactly; a reader accepts any minor version of its major.
inline constexpr uint16_t kSchemaMajor = 1;
// 1.1: Credit::max_frame_bytes. 1.2: step labels and positions, group, end reason, sampling
// settings and context routing on segments; end reason and conflicts in trajectory summaries.
// 1.3: SampleRequest::rank and world_size (learner ranks sharing one draw per step).
inline constexpr uint16_t kSchemaMinor = 3;
inline constexpr uint32_t kEnvelopeMagic = 0x44525453;  // "STRD" little-endian
inline constexpr size_t kEnvelopeHeaderBytes = 24;

// Reasons a frame is rejected (the prefix of the Status message).
namespace reject {
inline constexpr std::string_view kSize = "size";                // over the message size limit
inline constexpr std::string_view kTruncated = "truncated";      // shorter than it says
inline constexpr std::string_view kMagic = "magic";              // not an envelope at all
inline constexpr std::string_view kVersion = "version";          // unknown schema major version
inline constexpr std::string_view kChecksum = "checksum";        // payload CRC32C differs
inline constexpr std::string_view kMalformed = "malformed";      // not a valid Cap'n Proto message
inline constexpr std::string_view kMissingField = "missing_field";
inline constexpr std::string_view kLengthMismatch = "length_mismatch";
inline constexpr std::string_view kRange = "range";              // token id, role or offset out of range
inline constexpr std::string_view kUnexpected = "unexpected";    // valid, but not on this endpoint
inline constexpr std::string_view kCredit = "credit";            // client exceeded its credit
inline constexpr std::string_view kConflict = "conflict";        // key stored with other bytes
inline constexpr std::string_view kDiskFull = "disk_full";       // no space: send again later
}  // namespace reject

// The reason prefix of a Status made by Decode ("checksum"), or "other".
std::string_view RejectReason(const Status& status);

struct DecodeLimits {
  size_t max_message_bytes = 64ull << 20;
  int32_t max_token_id = 1 << 24;  // token ids must lie in [0, max_token_id)
};

enum class Role : uint8_t { kSystem = 0, kUser, kModel, kToolCall, kToolResult, kImage };
inline constexpr uint8_t kRoleCount = 6;
std::string_view RoleName(Role role);
inline bool IsAction(Role role) { return role == Role::kModel || role == Role::kToolCall; }

struct TrajectoryId {
  std::array<uint8_t, 16> bytes{};

  std::string Hex() const;  // 32 lowercase hex digits
  static Result<TrajectoryId> FromHex(std::string_view hex);
  std::string_view View() const {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }
  auto operator<=>(const TrajectoryId&) const = default;
};

struct SegmentKey {
  TrajectoryId trajectory;
  uint32_t index = 0;
  auto operator<=>(const SegmentKey&) const = default;
  std::string ToString() const;  // "<hex>/<index>"
};

struct PolicyRun {
  uint32_t begin = 0;  // segment offset where this run starts
  uint64_t version = 0;
};

enum class StepLabel : uint8_t { kUnknown = 0, kCorrect, kIncorrect };
std::string_view StepLabelName(StepLabel label);  // "unknown", "correct", "incorrect"

struct Step {
  uint32_t end = 0;  // segment offset one past the step's last token
  float process_reward = 0;  // 0 when !has_reward
  // Since 1.2 (a 1.1 message reads as: label unknown, reward given, index and begin 0).
  StepLabel label = StepLabel::kUnknown;
  bool has_reward = true;
  uint32_t index = 0;  // in the trajectory, from 0
  uint64_t begin = 0;  // trajectory position of the first token; the end is token_begin + end
};

// Which positions of a segment have a routing record (since 1.2; 1.1 segments: kActions).
enum class RoutingCoverage : uint8_t { kActions = 0, kAll, kMasked };
std::string_view RoutingCoverageName(RoutingCoverage coverage);  // "actions", "all", "masked"

struct RoutingRecord {
  uint16_t layers = 0;
  uint16_t top_k = 0;
  std::vector<uint16_t> experts;  // (action tokens, layers, top_k), row-major
  RoutingCoverage coverage = RoutingCoverage::kActions;
  // (context tokens with a record, layers, top_k): every context token under kAll, those whose
  // mask bit is set under kMasked, none under kActions.
  std::vector<uint16_t> context_experts;
  std::vector<uint8_t> mask;  // kMasked: bit i % 8 of byte i / 8 set = token i has a record
};

// How a trajectory ended (since 1.2; kNone on segments before the last and on 1.1 segments).
enum class EndReason : uint8_t {
  kNone = 0,
  kFinished,         // the environment said done
  kTruncatedTurns,   // the turn limit
  kTruncatedLength,  // the episode's token limit
  kFailed,           // an environment, engine or actor error
  kAbandoned,        // its actor gave up on it (stopped); reserved for the service too
};
inline constexpr uint8_t kEndReasonCount = 6;
// "none", "finished", "truncated_turns", "truncated_length", "failed", "abandoned".
std::string_view EndReasonName(EndReason reason);

struct Image {
  uint32_t token_offset = 0;
  uint32_t width = 0;
  uint32_t height = 0;
  uint8_t channels = 0;
  std::string pixels;  // width * height * channels bytes
};

// One contiguous token range of a trajectory (docs/design.md#trajectories-and-segments).
struct SegmentData {
  TrajectoryId trajectory_id;
  uint32_t segment_index = 0;
  bool is_last = false;
  uint64_t token_begin = 0;
  std::vector<int32_t> tokens;
  std::vector<Role> roles;                // one per token
  std::vector<float> behaviour_logprobs;  // one per token; 0 for context tokens
  std::vector<PolicyRun> policy_runs;     // at least one, the first at offset 0
  RoutingRecord routing;                  // empty (layers 0) when the model has no experts
  std::vector<Step> steps;
  float outcome_reward = 0;  // meaningful when is_last
  std::vector<Image> images;
  std::string env;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::string state_digest;
  std::string table;  // empty: the server's first table
  // Since 1.2. Every segment carries the group and the sampling settings; the last one the end
  // reason (segments before it leave before the end is known).
  TrajectoryId group_id;       // shared by the trajectories sampled from one prompt
  uint32_t group_index = 0;    // from 0
  uint32_t group_size = 0;     // 0: not in a group (1.1 segments)
  EndReason end_reason = EndReason::kNone;
  float temperature = 1.0f;    // the sampling distribution of the behaviour log-probs; 0: greedy
  float top_p = 1.0f;
  uint32_t top_k = 0;          // 0: no cut
  // The minor schema version of the frame it was decoded from (kSchemaMinor for one built
  // here): below 2, the 1.2 fields above and in Step and RoutingRecord are defaults, not data.
  uint16_t schema_minor = kSchemaMinor;

  SegmentKey key() const { return {trajectory_id, segment_index}; }
  uint64_t MinPolicyVersion() const;
  uint64_t MaxPolicyVersion() const;
  size_t ActionTokens() const;
};

// Checks the rules Decode applies to a segment; encoders call it so bad data never leaves.
Status ValidateSegment(const SegmentData& segment, const DecodeLimits& limits);

// The experts of every position of a segment, as routing replay takes them: (tokens, layers,
// top_k) row-major, zeros where a position has no record; `has_record` (when not null) gets one
// flag per token. Under kActions only action tokens have records. The segment must be valid.
std::vector<uint16_t> ExpertsByPosition(const SegmentData& segment,
                                        std::vector<bool>* has_record = nullptr);

// What a server needs of a segment besides its bytes (index record, trajectory summary). Decode
// fills it for every segment, in either SegmentDecoding mode.
struct SegmentFacts {
  SegmentKey key;
  std::string table;  // as sent; empty: the server's first table
  std::string env;
  uint64_t min_policy_version = 0;
  uint64_t max_policy_version = 0;
  uint64_t tokens = 0;
  uint32_t steps = 0;
  float process_reward_sum = 0;
  bool is_last = false;
  float outcome_reward = 0;
  EndReason end_reason = EndReason::kNone;
  // Since 1.2 (group_size 0 on 1.1 segments): what trajectory and group tables complete on.
  TrajectoryId group_id;
  uint32_t group_index = 0;
  uint32_t group_size = 0;
};

enum class ClientRole : uint8_t { kActor = 0, kLearner = 1 };

struct Hello {
  std::string client_id;
  ClientRole role = ClientRole::kActor;
};

struct Credit {
  uint64_t bytes = 0;
  uint64_t server_instance = 0;
  // The server reads frames holding several envelopes back to back, up to this many bytes in
  // all; 0 (servers before 1.1): one envelope per frame.
  uint64_t max_frame_bytes = 0;
};

struct SampleRequest {
  std::string table;
  std::string learner_id;
  uint64_t step = 0;  // from 1
  uint32_t count = 1;
  uint64_t policy_version = 0;
  // Since 1.2, fetch by key: when one is set (16 bytes), the reply holds every stored segment
  // of that trajectory, or of that group's trajectories, in order, and nothing is sampled:
  // step and count are ignored and no draw is recorded.
  std::string fetch_trajectory;
  std::string fetch_group;
  // Since 1.3: this learner's rank in a group of world_size ranks sharing the learner id; the
  // step's draw is shared and each rank gets its slice of the units (replay.capnp).
  uint32_t rank = 0;
  uint32_t world_size = 1;
  bool is_fetch() const { return !fetch_trajectory.empty() || !fetch_group.empty(); }
};

struct SampledSegment {
  uint64_t sequence = 0;
  std::string envelope;  // a complete frame holding a segment message
  uint32_t times_sampled = 0;
};

struct SampleReply {
  uint64_t step = 0;
  std::vector<SampledSegment> segments;
  std::string not_ready_reason;
  bool replayed = false;
};

struct PriorityUpdate {
  std::string table;
  std::vector<uint64_t> sequences;
  std::vector<double> priorities;
};

struct ErrorReply {
  std::string reason;
  std::string message;
  bool has_key = false;
  SegmentKey key;
};

enum class MessageKind : uint8_t {
  kHello,
  kSegment,
  kAck,
  kCredit,
  kSampleRequest,
  kSampleReply,
  kPriorityUpdate,
  kError,
  kStatsRequest,
  kStats,
};
std::string_view MessageKindName(MessageKind kind);

// A decoded, validated message; only the member named by `kind` is filled.
struct Message {
  MessageKind kind = MessageKind::kStatsRequest;
  Hello hello;
  SegmentData segment;  // empty under SegmentDecoding::kFactsOnly
  SegmentFacts segment_facts;
  std::vector<SegmentKey> ack;
  Credit credit;
  SampleRequest sample_request;
  SampleReply sample_reply;
  PriorityUpdate priority_update;
  ErrorReply error;
  std::string stats_json;
};

// What the store keeps per trajectory (the `trajectories` column family), updated with every
// stored or deleted segment of it.
struct TrajectorySummary {
  TrajectoryId trajectory_id;
  std::string env;
  std::string table;
  bool complete = false;  // the last segment arrived
  // Since 1.2: the replay server closed the trajectory after its actor went silent
  // (ServerOptions::abandon_after_s). Stored as the status `abandoned`; a segment arriving after
  // it may set `complete` too, and the status stays `abandoned`.
  bool abandoned = false;
  uint32_t segments_stored = 0;
  uint64_t tokens = 0;  // tokens in stored segments
  float outcome_reward = 0;
  float process_reward_sum = 0;
  uint32_t steps = 0;
  uint64_t min_policy_version = 0;
  uint64_t max_policy_version = 0;
  uint64_t first_insert_unix_ms = 0;
  EndReason end_reason = EndReason::kNone;  // since 1.2: the last segment's
  // Since 1.2: segments that arrived again under a stored key with different bytes (refused
  // with `conflict`; the stored ones are kept).
  uint32_t conflicts = 0;
};
std::string EncodeTrajectorySummary(const TrajectorySummary& summary);
Result<TrajectorySummary> DecodeTrajectorySummary(std::string_view frame);

// Each returns a complete frame. EncodeSegment fails when ValidateSegment does.
Result<std::string> EncodeSegment(const SegmentData& segment,
                                  const DecodeLimits& limits = DecodeLimits());
std::string EncodeHello(const Hello& hello);
std::string EncodeAck(const std::vector<SegmentKey>& keys);
std::string EncodeCredit(const Credit& credit);
std::string EncodeSampleRequest(const SampleRequest& request);
std::string EncodeSampleReply(const SampleReply& reply);
std::string EncodePriorityUpdate(const PriorityUpdate& update);
std::string EncodeError(const ErrorReply& error);
std::string EncodeStatsRequest();
std::string EncodeStats(const std::string& json);

// kCopy copies a segment's arrays into Message::segment. kFactsOnly validates the segment on the
// Cap'n Proto reader over `frame` with exactly the same checks and fills only segment_facts: for
// a server that stores the received bytes as they are and never needs the arrays.
enum class SegmentDecoding { kCopy, kFactsOnly };

// Validates and decodes one frame (see the top of this file for the order of checks).
Result<Message> Decode(std::string_view frame, const DecodeLimits& limits = DecodeLimits(),
                       SegmentDecoding segment_decoding = SegmentDecoding::kCopy);

// The size limit of a whole frame, one envelope or several back to back: the first check of
// Decode, and of a server splitting a batched frame before it looks inside.
Status CheckFrameSize(std::string_view frame, const DecodeLimits& limits = DecodeLimits());

// The size of the envelope at the start of `bytes`, which may hold more envelopes after it (a
// batched frame). Checks only what finding the envelope's end needs: header, magic, major version,
// and an announced length that `bytes` holds; Decode then checks the envelope itself. Errors carry
// the same reasons as Decode (truncated, magic, version).
Result<size_t> LeadingEnvelopeBytes(std::string_view bytes);

// Only the envelope checks (size, header, version, length, checksum): what `verify` and the
// server's storage path need to trust stored bytes without a full decode.
Status CheckEnvelope(std::string_view frame, const DecodeLimits& limits = DecodeLimits());

}  // namespace strider::schema
