#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "common/schema/crc32c.h"
#include "common/schema/replay.capnp.h"
#include "common/schema/messages.h"
#include "tests/replay/raw_frames.h"
#include "tests/replay/replay_1_1.capnp.h"
#include "tests/replay/test_segments.h"

namespace strider::schema {
namespace {

using strider::testing::MakeSegment;

std::string Encoded(const SegmentData& s) {
  Result<std::string> frame = EncodeSegment(s);
  EXPECT_TRUE(frame.ok()) << frame.status().ToString();
  return frame.ok() ? *frame : std::string();
}

// Re-seals a tampered payload with a correct checksum, so validation past the envelope is tested.
void Reseal(std::string& frame) {
  const uint32_t crc = Crc32c(frame.data() + kEnvelopeHeaderBytes,
                              frame.size() - kEnvelopeHeaderBytes);
  std::memcpy(frame.data() + 16, &crc, 4);
}

// The table loop, bit for bit the definition: the reference for the hardware paths.
uint32_t ReferenceCrc32c(const uint8_t* bytes, size_t size) {
  uint32_t crc = ~0u;
  for (size_t i = 0; i < size; ++i) {
    crc ^= bytes[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
  }
  return ~crc;
}

// Lengths around the three-stream block (3 x 4096 bytes), odd offsets, and continuation.
TEST(Crc32c, AgreesWithTheDefinitionAtEveryBlockBoundary) {
  std::mt19937_64 rng(7);
  std::string data(3 * 4096 * 3 + 64, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  for (size_t size : {size_t{0}, size_t{7}, size_t{8}, size_t{4096}, size_t{12287},
                      size_t{12288}, size_t{12289}, size_t{12295}, size_t{24576},
                      size_t{3 * 4096 * 3 + 63}}) {
    for (size_t offset : {size_t{0}, size_t{1}}) {
      EXPECT_EQ(Crc32c(bytes + offset, size), ReferenceCrc32c(bytes + offset, size))
          << size << " at " << offset;
    }
  }
  const size_t split = 5000;
  EXPECT_EQ(Crc32c(bytes + split, 20000, Crc32c(bytes, split)), ReferenceCrc32c(bytes, 25000));
}

TEST(Crc32c, MatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  std::string long_text(1000, 'x');
  EXPECT_EQ(Crc32c(long_text.data() + 3, 900, Crc32c(long_text.data(), 3)),
            Crc32c(long_text.data(), 903));
}

TEST(SegmentCodec, RoundTripsEveryField) {
  SegmentData s = MakeSegment(7, 3, 1000, 5, true);
  strider::testing::AddImage(s, 10, 4, 3);
  s.table = "main";
  const std::string frame = Encoded(s);
  Result<Message> decoded = Decode(frame);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->kind, MessageKind::kSegment);
  const SegmentData& d = decoded->segment;
  EXPECT_EQ(d.trajectory_id, s.trajectory_id);
  EXPECT_EQ(d.segment_index, 3u);
  EXPECT_TRUE(d.is_last);
  EXPECT_EQ(d.token_begin, s.token_begin);
  EXPECT_EQ(d.tokens, s.tokens);
  EXPECT_EQ(d.roles, s.roles);
  EXPECT_EQ(d.behaviour_logprobs, s.behaviour_logprobs);
  ASSERT_EQ(d.policy_runs.size(), 2u);
  EXPECT_EQ(d.policy_runs[1].version, 6u);
  EXPECT_EQ(d.routing.experts, s.routing.experts);
  ASSERT_EQ(d.steps.size(), s.steps.size());
  EXPECT_EQ(d.steps.back().end, s.steps.back().end);
  EXPECT_EQ(d.outcome_reward, s.outcome_reward);
  ASSERT_EQ(d.images.size(), 1u);
  EXPECT_EQ(d.images[0].pixels, s.images[0].pixels);
  EXPECT_EQ(d.env, "calculator");
  EXPECT_EQ(d.metadata, s.metadata);
  EXPECT_EQ(d.state_digest, s.state_digest);
  EXPECT_EQ(d.table, "main");
  EXPECT_EQ(d.MinPolicyVersion(), 5u);
  EXPECT_EQ(d.MaxPolicyVersion(), 6u);
}

TEST(SegmentCodec, ServiceMessagesRoundTrip) {
  SampleRequest request{"main", "learner-0", 9, 4, 12};
  Result<Message> m = Decode(EncodeSampleRequest(request));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kind, MessageKind::kSampleRequest);
  EXPECT_EQ(m->sample_request.learner_id, "learner-0");
  EXPECT_EQ(m->sample_request.step, 9u);
  EXPECT_EQ(m->sample_request.policy_version, 12u);
  EXPECT_FALSE(m->sample_request.is_fetch());
  EXPECT_EQ(m->sample_request.rank, 0u);
  EXPECT_EQ(m->sample_request.world_size, 1u);  // a 1.2 request: a learner alone

  // Since 1.3: a rank of a learner group; a rank outside the group is refused.
  SampleRequest ranked{"main", "learner-0", 9, 4, 12};
  ranked.rank = 3;
  ranked.world_size = 4;
  m = Decode(EncodeSampleRequest(ranked));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->sample_request.rank, 3u);
  EXPECT_EQ(m->sample_request.world_size, 4u);
  ranked.rank = 4;
  Result<Message> outside = Decode(EncodeSampleRequest(ranked));
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("rank 4"), std::string::npos)
      << outside.status().ToString();

  SampleRequest fetch{"main", "learner-0", 0, 1, 0};
  fetch.fetch_group = std::string(strider::testing::MakeTrajectoryId(7).View());
  m = Decode(EncodeSampleRequest(fetch));
  ASSERT_TRUE(m.ok()) << m.status().ToString();  // step 0 is fine for a fetch
  EXPECT_EQ(m->sample_request.fetch_group, fetch.fetch_group);
  EXPECT_TRUE(m->sample_request.fetch_trajectory.empty());
  fetch.fetch_trajectory = fetch.fetch_group;
  EXPECT_FALSE(Decode(EncodeSampleRequest(fetch)).ok());  // not both
  fetch.fetch_group.clear();
  fetch.fetch_trajectory = "short";
  EXPECT_FALSE(Decode(EncodeSampleRequest(fetch)).ok());

  SegmentKey key{strider::testing::MakeTrajectoryId(1), 4};
  m = Decode(EncodeAck({key, key}));
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->ack.size(), 2u);
  EXPECT_EQ(m->ack[1], key);

  m = Decode(EncodeError({"checksum", "bad", true, key}));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->error.reason, "checksum");
  EXPECT_TRUE(m->error.has_key);
  EXPECT_EQ(m->error.key, key);

  SampleReply reply;
  reply.step = 3;
  reply.segments.push_back({42, Encoded(MakeSegment(1, 0, 50)), 2});
  m = Decode(EncodeSampleReply(reply));
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->sample_reply.segments.size(), 1u);
  EXPECT_EQ(m->sample_reply.segments[0].sequence, 42u);
  EXPECT_TRUE(Decode(m->sample_reply.segments[0].envelope).ok());

  TrajectorySummary summary;
  summary.trajectory_id = key.trajectory;
  summary.env = "math";
  summary.complete = true;
  summary.segments_stored = 3;
  summary.outcome_reward = 2.5f;
  Result<TrajectorySummary> back = DecodeTrajectorySummary(EncodeTrajectorySummary(summary));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->env, "math");
  EXPECT_TRUE(back->complete);
  EXPECT_EQ(back->segments_stored, 3u);
  EXPECT_EQ(back->outcome_reward, 2.5f);
}

TEST(SegmentCodec, CreditCarriesTheFrameLimit) {
  Result<Message> m = Decode(EncodeCredit({1 << 20, 77, 64 << 20}));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->credit.bytes, 1u << 20);
  EXPECT_EQ(m->credit.server_instance, 77u);
  EXPECT_EQ(m->credit.max_frame_bytes, 64u << 20);
}

TEST(SegmentCodec, EnvelopesBackToBackAreFoundOneByOne) {
  const std::string first = Encoded(MakeSegment(1, 0, 100));
  const std::string second = Encoded(MakeSegment(2, 0, 30));
  const std::string frame = first + second;
  Result<size_t> size = LeadingEnvelopeBytes(frame);
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(*size, first.size());
  EXPECT_TRUE(Decode(std::string_view(frame).substr(0, *size)).ok());
  size = LeadingEnvelopeBytes(std::string_view(frame).substr(first.size()));
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, second.size());
  // A whole frame is not one envelope.
  EXPECT_EQ(RejectReason(Decode(frame).status()), reject::kTruncated);
  // What cannot be framed says why.
  for (size_t cut : {size_t{0}, size_t{10}, second.size() - 8}) {
    Result<size_t> cut_size = LeadingEnvelopeBytes(std::string_view(second).substr(0, cut));
    ASSERT_FALSE(cut_size.ok()) << cut;
    EXPECT_EQ(RejectReason(cut_size.status()), reject::kTruncated);
  }
  std::string wrong_version = second;
  wrong_version[4] = 9;
  EXPECT_EQ(RejectReason(LeadingEnvelopeBytes(wrong_version).status()), reject::kVersion);
  EXPECT_EQ(RejectReason(LeadingEnvelopeBytes(std::string(64, 'x')).status()), reject::kMagic);
}

TEST(SegmentCodec, DecodesFromUnalignedMemory) {
  const std::string frame = Encoded(MakeSegment(2, 0, 100));
  std::string shifted = " " + frame;
  EXPECT_TRUE(Decode(std::string_view(shifted).substr(1)).ok());
}

TEST(BadInput, TruncatedFrameIsRejected) {
  const std::string frame = Encoded(MakeSegment(1, 0, 100));
  for (size_t cut : {size_t{0}, size_t{10}, kEnvelopeHeaderBytes, frame.size() - 8}) {
    Result<Message> m = Decode(std::string_view(frame).substr(0, cut));
    ASSERT_FALSE(m.ok()) << cut;
    EXPECT_EQ(RejectReason(m.status()), reject::kTruncated) << m.status().ToString();
  }
}

TEST(BadInput, UnknownMajorVersionIsRejectedWithBothVersions) {
  std::string frame = Encoded(MakeSegment(1, 0, 100));
  const uint16_t major = kSchemaMajor + 1;
  std::memcpy(frame.data() + 4, &major, 2);
  Result<Message> m = Decode(frame);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(RejectReason(m.status()), reject::kVersion);
  const std::string both = std::to_string(kSchemaMajor + 1) + "." + std::to_string(kSchemaMinor);
  EXPECT_NE(m.status().message().find(both), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("major version " + std::to_string(kSchemaMajor)),
            std::string::npos)
      << m.status().message();
}

TEST(BadInput, NewerMinorVersionIsAccepted) {
  std::string frame = Encoded(MakeSegment(1, 0, 100));
  const uint16_t minor = kSchemaMinor + 3;
  std::memcpy(frame.data() + 6, &minor, 2);
  EXPECT_TRUE(Decode(frame).ok());
}

TEST(BadInput, FlippedPayloadBitFailsTheChecksum) {
  std::string frame = Encoded(MakeSegment(1, 0, 100));
  frame[frame.size() / 2] ^= 0x10;
  Result<Message> m = Decode(frame);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(RejectReason(m.status()), reject::kChecksum);
}

TEST(BadInput, OversizedMessageIsRejectedBeforeParsing) {
  const std::string frame = Encoded(MakeSegment(1, 0, 5000));
  DecodeLimits limits;
  limits.max_message_bytes = 4096;
  Result<Message> m = Decode(frame, limits);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(RejectReason(m.status()), reject::kSize);
  // The encoder refuses to produce it too.
  EXPECT_FALSE(EncodeSegment(MakeSegment(1, 0, 5000), limits).ok());
}

TEST(BadInput, MismatchedArrayLengthsAreNamed) {
  SegmentData s = MakeSegment(1, 0, 100);
  s.roles.pop_back();
  Status status = ValidateSegment(s, DecodeLimits());
  EXPECT_EQ(RejectReason(status), reject::kLengthMismatch);
  EXPECT_NE(status.message().find("roles"), std::string::npos);

  s = MakeSegment(1, 0, 100);
  s.behaviour_logprobs.push_back(0);
  EXPECT_EQ(RejectReason(ValidateSegment(s, DecodeLimits())), reject::kLengthMismatch);

  s = MakeSegment(1, 0, 100);
  s.routing.experts.pop_back();
  status = ValidateSegment(s, DecodeLimits());
  EXPECT_EQ(RejectReason(status), reject::kLengthMismatch);
  EXPECT_NE(status.message().find("routing"), std::string::npos);

  s = MakeSegment(1, 0, 100);
  strider::testing::AddImage(s, 5, 4, 4);
  s.images[0].pixels.pop_back();
  EXPECT_EQ(RejectReason(ValidateSegment(s, DecodeLimits())), reject::kLengthMismatch);
}

// The decoder must catch bad arrays even from a sender that skipped validation: build the wire
// message by hand with Cap'n Proto, roles shorter than tokens.
TEST(BadInput, DecoderChecksArrayLengthsOfHandBuiltMessages) {
  Result<Message> m = Decode(strider::testing::MismatchedRolesFrame());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(RejectReason(m.status()), reject::kLengthMismatch) << m.status().ToString();
  EXPECT_NE(m.status().message().find("4 tokens but 3 roles"), std::string::npos);
}

TEST(BadInput, TokenOutOfRangeIsRejected) {
  SegmentData s = MakeSegment(1, 0, 100);
  s.tokens[7] = -1;
  Status status = ValidateSegment(s, DecodeLimits());
  EXPECT_EQ(RejectReason(status), reject::kRange);
  DecodeLimits small;
  small.max_token_id = 100;
  s = MakeSegment(1, 0, 100);
  EXPECT_EQ(RejectReason(ValidateSegment(s, small)), reject::kRange);
}

// The flat checks run in blocks of 64 tokens plus a tail: a bad value must be found in either,
// with the same message the exact loop gives, and every value the rule allows must pass.
TEST(BadInput, EveryBadTokenValueIsFoundInBlocksAndTail) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  const float kDenormal = std::numeric_limits<float>::denorm_min();
  for (size_t at : {size_t{0}, size_t{63}, size_t{64}, size_t{129}, size_t{130}}) {
    for (float bad : {kNan, -kNan, kInf, -kInf, kDenormal, 0.5f}) {
      SegmentData s = MakeSegment(1, 0, 131);
      s.behaviour_logprobs[at] = bad;
      Status status = ValidateSegment(s, DecodeLimits());
      EXPECT_EQ(RejectReason(status), reject::kRange) << at << " " << bad;
      EXPECT_NE(status.message().find("log-prob " + std::to_string(at) + " "), std::string::npos)
          << status.message();
    }
    for (int32_t bad : {-1, 1 << 24, std::numeric_limits<int32_t>::min()}) {
      SegmentData s = MakeSegment(1, 0, 131);
      s.tokens[at] = bad;
      Status status = ValidateSegment(s, DecodeLimits());
      EXPECT_EQ(RejectReason(status), reject::kRange) << at << " " << bad;
      EXPECT_NE(status.message().find("token " + std::to_string(at) + " has id"),
                std::string::npos)
          << status.message();
    }
    SegmentData s = MakeSegment(1, 0, 131);
    s.roles[at] = static_cast<Role>(kRoleCount);
    EXPECT_EQ(RejectReason(ValidateSegment(s, DecodeLimits())), reject::kRange) << at;
  }
  SegmentData edge = MakeSegment(1, 0, 131);
  edge.behaviour_logprobs[3] = -0.0f;
  edge.behaviour_logprobs[70] = std::numeric_limits<float>::lowest();
  edge.behaviour_logprobs[130] = -kDenormal;
  edge.tokens[5] = (1 << 24) - 1;
  edge.tokens[100] = 0;
  EXPECT_TRUE(ValidateSegment(edge, DecodeLimits()).ok());
}

// The server's path: validated in place, only the facts filled, same verdicts as a full decode.
TEST(SegmentCodec, FactsOnlyDecodingValidatesAndSummarises) {
  SegmentData s = MakeSegment(9, 4, 700, 3, /*is_last=*/true);
  s.table = "side";
  const std::string frame = Encoded(s);
  Result<Message> m = Decode(frame, DecodeLimits(), SegmentDecoding::kFactsOnly);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->kind, MessageKind::kSegment);
  EXPECT_TRUE(m->segment.tokens.empty());  // nothing copied
  const SegmentFacts& facts = m->segment_facts;
  EXPECT_EQ(facts.key, s.key());
  EXPECT_EQ(facts.table, "side");
  EXPECT_EQ(facts.env, s.env);
  EXPECT_EQ(facts.min_policy_version, 3u);
  EXPECT_EQ(facts.max_policy_version, 4u);
  EXPECT_EQ(facts.tokens, 700u);
  EXPECT_EQ(facts.steps, s.steps.size());
  float reward_sum = 0;
  for (const Step& step : s.steps) reward_sum += step.process_reward;
  EXPECT_EQ(facts.process_reward_sum, reward_sum);
  EXPECT_TRUE(facts.is_last);
  EXPECT_EQ(facts.outcome_reward, s.outcome_reward);
  EXPECT_EQ(facts.group_id, s.group_id);
  EXPECT_EQ(facts.group_index, s.group_index);
  EXPECT_EQ(facts.group_size, 4u);
  // The full decode fills the same facts.
  Result<Message> full = Decode(frame);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->segment_facts.key, facts.key);
  EXPECT_EQ(full->segment.tokens, s.tokens);

  Result<Message> bad = Decode(strider::testing::MismatchedRolesFrame(), DecodeLimits(),
                               SegmentDecoding::kFactsOnly);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(RejectReason(bad.status()), reject::kLengthMismatch);
  DecodeLimits small;
  small.max_token_id = 100;
  EXPECT_EQ(RejectReason(Decode(frame, small, SegmentDecoding::kFactsOnly).status()),
            reject::kRange);
}

TEST(BadInput, MissingRequiredFieldsAreNamed) {
  SegmentData s = MakeSegment(1, 0, 100);
  s.env.clear();
  Status status = ValidateSegment(s, DecodeLimits());
  EXPECT_EQ(RejectReason(status), reject::kMissingField);
  EXPECT_NE(status.message().find("env"), std::string::npos);
  s = MakeSegment(1, 0, 100);
  s.policy_runs.clear();
  EXPECT_EQ(RejectReason(ValidateSegment(s, DecodeLimits())), reject::kMissingField);
}

TEST(BadInput, RandomBytesNeverCrashAndAreRejected) {
  std::mt19937_64 rng(1234);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes(rng() % 512, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    EXPECT_FALSE(Decode(bytes).ok());
  }
}

// Garbage behind a valid envelope (correct magic, version, length and checksum) reaches the
// Cap'n Proto reader, which must fail cleanly.
TEST(BadInput, RandomPayloadBehindAValidEnvelopeIsMalformedNotACrash) {
  std::mt19937_64 rng(99);
  const std::string valid = Encoded(MakeSegment(1, 0, 64));
  int rejected = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string frame = valid;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < flips; ++i) {
      const size_t at = kEnvelopeHeaderBytes + rng() % (frame.size() - kEnvelopeHeaderBytes);
      frame[at] = static_cast<char>(rng());
    }
    Reseal(frame);
    Result<Message> m = Decode(frame);
    if (!m.ok()) {
      ++rejected;
      EXPECT_NE(RejectReason(m.status()), "other") << m.status().ToString();
    }
  }
  EXPECT_GT(rejected, 0);
}

// --- Schema 1.2: the fields a learner needs, and both directions of compatibility with 1.1 ---

TEST(SegmentCodec, RoundTripsTheFieldsSince12) {
  SegmentData s = MakeSegment(6, 2, 500, 3, true);
  strider::testing::AddContextRouting(s, /*masked=*/true);
  s.steps[0].has_reward = false;
  s.steps[0].process_reward = 0;
  s.end_reason = EndReason::kTruncatedTurns;
  Result<Message> decoded = Decode(Encoded(s));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  const SegmentData& d = decoded->segment;
  EXPECT_EQ(d.schema_minor, kSchemaMinor);
  EXPECT_EQ(d.group_id, s.group_id);
  EXPECT_EQ(d.group_index, 2u);
  EXPECT_EQ(d.group_size, 4u);
  EXPECT_EQ(d.end_reason, EndReason::kTruncatedTurns);
  EXPECT_EQ(decoded->segment_facts.end_reason, EndReason::kTruncatedTurns);
  EXPECT_EQ(d.temperature, 0.7f);
  EXPECT_EQ(d.top_p, 0.9f);
  EXPECT_EQ(d.top_k, 50u);
  ASSERT_EQ(d.steps.size(), 2u);
  for (size_t i = 0; i < d.steps.size(); ++i) {
    EXPECT_EQ(d.steps[i].label, s.steps[i].label);
    EXPECT_EQ(d.steps[i].has_reward, s.steps[i].has_reward);
    EXPECT_EQ(d.steps[i].index, s.steps[i].index);
    EXPECT_EQ(d.steps[i].begin, s.steps[i].begin);
  }
  EXPECT_EQ(d.steps[1].label, StepLabel::kCorrect);
  EXPECT_FALSE(d.steps[0].has_reward);
  EXPECT_EQ(d.routing.coverage, RoutingCoverage::kMasked);
  EXPECT_EQ(d.routing.context_experts, s.routing.context_experts);
  EXPECT_EQ(d.routing.mask, s.routing.mask);
}

// Routing replay takes one row of experts per position: actions from `experts`, context tokens
// from `context_experts`, in position order, and nothing where the mask has no bit.
TEST(SegmentCodec, ExpertsByPositionInterleavesActionsAndContext) {
  for (bool masked : {false, true}) {
    SegmentData s = MakeSegment(8, 0, 300);
    strider::testing::AddContextRouting(s, masked);
    ASSERT_TRUE(ValidateSegment(s, DecodeLimits()).ok())
        << ValidateSegment(s, DecodeLimits()).ToString();
    std::vector<bool> has_record;
    const std::vector<uint16_t> experts = ExpertsByPosition(s, &has_record);
    ASSERT_EQ(experts.size(), 300u * 4);
    size_t action = 0;
    for (size_t i = 0; i < 300; ++i) {
      const uint16_t* row = experts.data() + 4 * i;
      if (IsAction(s.roles[i])) {
        EXPECT_TRUE(has_record[i]);
        for (size_t j = 0; j < 4; ++j) EXPECT_EQ(row[j], s.routing.experts[4 * action + j]);
        ++action;
      } else if (!masked || i % 3 == 0) {
        EXPECT_TRUE(has_record[i]) << i;
        for (size_t j = 0; j < 4; ++j) EXPECT_EQ(row[j], (i * 7 + j) % 64) << i;
      } else {
        EXPECT_FALSE(has_record[i]) << i;
        for (size_t j = 0; j < 4; ++j) EXPECT_EQ(row[j], 0) << i;
      }
    }
  }
}

TEST(BadInput, FieldsSince12AreChecked) {
  auto reason = [](const SegmentData& s) { return RejectReason(ValidateSegment(s, {})); };
  SegmentData base = MakeSegment(1, 0, 600, 1, /*is_last=*/true);
  ASSERT_TRUE(ValidateSegment(base, {}).ok()) << ValidateSegment(base, {}).ToString();

  SegmentData s = base;
  s.end_reason = EndReason::kNone;
  EXPECT_EQ(reason(s), reject::kRange) << "the last segment says how the trajectory ended";
  s = MakeSegment(1, 0, 600);
  s.end_reason = EndReason::kFailed;
  EXPECT_EQ(reason(s), reject::kRange) << "no end reason before the end";
  s = base;
  s.steps[1].index += 1;
  EXPECT_EQ(reason(s), reject::kRange);
  s = base;
  s.steps[1].begin = s.steps[0].end - 1;
  EXPECT_EQ(reason(s), reject::kRange) << "steps do not overlap";
  s = base;
  s.steps[0].begin = s.token_begin + s.steps[0].end;
  EXPECT_EQ(reason(s), reject::kRange) << "a step has at least one token";
  s = base;
  s.steps[0].has_reward = false;
  EXPECT_EQ(reason(s), reject::kRange) << "a missing reward is not a number";
  s = base;
  s.steps[0].label = static_cast<StepLabel>(7);
  EXPECT_EQ(reason(s), reject::kRange);
  s = base;
  s.group_index = 4;
  EXPECT_EQ(reason(s), reject::kRange);
  s = base;
  s.group_size = 0;
  EXPECT_EQ(reason(s), reject::kRange) << "an index without a group";
  s = base;
  s.temperature = -1;
  EXPECT_EQ(reason(s), reject::kRange);
  s = base;
  s.top_p = 0;
  EXPECT_EQ(reason(s), reject::kRange);

  s = base;
  strider::testing::AddContextRouting(s, /*masked=*/false);
  s.routing.context_experts.pop_back();
  EXPECT_EQ(reason(s), reject::kLengthMismatch);
  s = base;
  strider::testing::AddContextRouting(s, /*masked=*/true);
  SegmentData unmasked_action = s;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    if (IsAction(s.roles[i])) {
      unmasked_action.routing.mask[i / 8] &= static_cast<uint8_t>(~(1u << (i % 8)));
      break;
    }
  }
  EXPECT_EQ(reason(unmasked_action), reject::kRange);
  SegmentData short_mask = s;
  short_mask.routing.mask.pop_back();
  EXPECT_EQ(reason(short_mask), reject::kLengthMismatch);
  SegmentData extra = s;
  extra.routing.context_experts.insert(extra.routing.context_experts.end(), 4, 1);
  EXPECT_EQ(reason(extra), reject::kLengthMismatch);
  s.routing.coverage = RoutingCoverage::kActions;
  EXPECT_EQ(reason(s), reject::kLengthMismatch) << "context experts under action coverage";
  // The decoder applies the same rules to a frame whose envelope says 1.2.
  const std::string good = Encoded(base);
  std::string payload = good.substr(kEnvelopeHeaderBytes);
  capnp::FlatArrayMessageReader reader(kj::ArrayPtr<const capnp::word>(
      reinterpret_cast<const capnp::word*>(payload.data()), payload.size() / sizeof(capnp::word)));
  capnp::MallocMessageBuilder builder;
  builder.setRoot(reader.getRoot<wire::Message>());
  builder.getRoot<wire::Message>().getSegment().setEndReason(wire::EndReason::NONE);
  std::string frame = strider::testing::SealRaw(builder);
  std::memcpy(frame.data() + 6, &kSchemaMinor, 2);
  Result<Message> m = Decode(frame);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(RejectReason(m.status()), reject::kRange);
}

// A reader built before 1.2 reads a 1.2 segment exactly as it always read segments: every field
// it knows holds what it held, and its own length rule for routing (one record per action
// token) still holds although context tokens now have records.
TEST(SchemaVersions, ASegmentOf12ReadsUnchangedUnderThe11Schema) {
  SegmentData s = MakeSegment(7, 3, 1000, 5, true);
  strider::testing::AddContextRouting(s, /*masked=*/true);
  strider::testing::AddImage(s, 10, 4, 3);
  s.table = "main";
  const std::string frame = Encoded(s);
  std::string payload = frame.substr(kEnvelopeHeaderBytes);
  kj::ArrayPtr<const capnp::word> words(reinterpret_cast<const capnp::word*>(payload.data()),
                                        payload.size() / sizeof(capnp::word));
  capnp::FlatArrayMessageReader reader(words);
  auto root = reader.getRoot<wire_1_1::Message>();
  ASSERT_EQ(root.which(), wire_1_1::Message::SEGMENT);
  auto old = root.getSegment();
  EXPECT_EQ(old.getSegmentIndex(), 3u);
  EXPECT_TRUE(old.getIsLast());
  EXPECT_EQ(old.getTokenBegin(), s.token_begin);
  ASSERT_EQ(old.getTokens().size(), s.tokens.size() * 4);
  EXPECT_EQ(std::memcmp(old.getTokens().begin(), s.tokens.data(), s.tokens.size() * 4), 0);
  ASSERT_EQ(old.getRoles().size(), s.roles.size());
  EXPECT_EQ(std::memcmp(old.getBehaviourLogprobs().begin(), s.behaviour_logprobs.data(),
                        s.tokens.size() * 4),
            0);
  ASSERT_EQ(old.getPolicyRuns().size(), s.policy_runs.size());
  EXPECT_EQ(old.getPolicyRuns()[1].getVersion(), 6u);
  auto routing = old.getRouting();
  EXPECT_EQ(routing.getLayers(), 2u);
  EXPECT_EQ(routing.getTopK(), 2u);
  ASSERT_EQ(routing.getExperts().size(), s.ActionTokens() * 2 * 2 * 2);
  EXPECT_EQ(std::memcmp(routing.getExperts().begin(), s.routing.experts.data(),
                        s.routing.experts.size() * 2),
            0);
  ASSERT_EQ(old.getSteps().size(), s.steps.size());
  for (size_t i = 0; i < s.steps.size(); ++i) {
    EXPECT_EQ(old.getSteps()[i].getEnd(), s.steps[i].end);
    EXPECT_EQ(old.getSteps()[i].getProcessReward(), s.steps[i].process_reward);
  }
  EXPECT_EQ(old.getOutcomeReward(), s.outcome_reward);
  ASSERT_EQ(old.getImages().size(), 1u);
  EXPECT_EQ(old.getImages()[0].getPixels().size(), s.images[0].pixels.size());
  EXPECT_EQ(std::string(old.getEnv().cStr()), "calculator");
  ASSERT_EQ(old.getMetadata().size(), s.metadata.size());
  EXPECT_EQ(std::string(old.getMetadata()[0].getValue().cStr()), s.metadata[0].second);
  EXPECT_EQ(old.getStateDigest().size(), s.state_digest.size());
  EXPECT_EQ(std::string(old.getTable().cStr()), "main");

  // A trajectory summary too; `abandoned` is a status the old enum does not name, read as open.
  TrajectorySummary summary;
  summary.trajectory_id = s.trajectory_id;
  summary.env = "math";
  summary.complete = true;
  summary.segments_stored = 3;
  summary.end_reason = EndReason::kFinished;
  summary.conflicts = 2;
  const std::string encoded = EncodeTrajectorySummary(summary);
  std::string summary_payload = encoded.substr(kEnvelopeHeaderBytes);
  capnp::FlatArrayMessageReader summary_reader(
      kj::ArrayPtr<const capnp::word>(reinterpret_cast<const capnp::word*>(summary_payload.data()),
                                      summary_payload.size() / sizeof(capnp::word)));
  auto old_summary = summary_reader.getRoot<wire_1_1::TrajectorySummary>();
  EXPECT_EQ(old_summary.getStatus(), wire_1_1::TrajectoryStatus::COMPLETE);
  EXPECT_EQ(old_summary.getSegmentsStored(), 3u);
  EXPECT_EQ(std::string(old_summary.getEnv().cStr()), "math");
}

// A 1.1 writer's segment, built with the frozen schema, decodes under 1.2 with the new fields at
// defaults that mean what the 1.1 message meant, and is not held to the 1.2 rules (its last
// segment has no end reason, its steps no positions).
TEST(SchemaVersions, ASegmentOf11DecodesWithDefaults) {
  capnp::MallocMessageBuilder builder;
  auto segment = builder.initRoot<wire_1_1::Message>().initSegment();
  const TrajectoryId id = strider::testing::MakeTrajectoryId(3);
  segment.setTrajectoryId(capnp::Data::Reader(id.bytes.data(), 16));
  segment.setIsLast(true);
  const int32_t tokens[6] = {1, 2, 3, 4, 5, 6};
  const uint8_t roles[6] = {1, 2, 2, 4, 2, 2};
  const float logprobs[6] = {0, -1, -1, 0, -1, -1};
  const uint16_t experts[4] = {1, 2, 3, 4};  // 4 actions x 1 layer x top-1
  segment.setTokens(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(tokens), 24));
  segment.setRoles(capnp::Data::Reader(roles, 6));
  segment.setBehaviourLogprobs(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(logprobs), 24));
  segment.initPolicyRuns(1)[0].setVersion(4);
  auto routing = segment.initRouting();
  routing.setLayers(1);
  routing.setTopK(1);
  routing.setExperts(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(experts), 8));
  auto steps = segment.initSteps(2);
  steps[0].setEnd(3);
  steps[0].setProcessReward(0.5f);
  steps[1].setEnd(6);
  segment.setOutcomeReward(1);
  segment.setEnv("calculator");
  std::string frame = strider::testing::SealRaw(builder);
  const uint16_t minor = 1;
  std::memcpy(frame.data() + 6, &minor, 2);

  Result<Message> m = Decode(frame);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const SegmentData& d = m->segment;
  EXPECT_EQ(d.schema_minor, 1u);
  EXPECT_EQ(d.tokens.size(), 6u);
  EXPECT_EQ(d.routing.experts, std::vector<uint16_t>({1, 2, 3, 4}));
  EXPECT_EQ(d.routing.coverage, RoutingCoverage::kActions);
  EXPECT_TRUE(d.routing.context_experts.empty());
  EXPECT_EQ(d.end_reason, EndReason::kNone);
  EXPECT_EQ(d.group_size, 0u);
  EXPECT_EQ(d.group_index, 0u);
  EXPECT_EQ(d.temperature, 1.0f);
  EXPECT_EQ(d.top_p, 1.0f);
  EXPECT_EQ(d.top_k, 0u);
  ASSERT_EQ(d.steps.size(), 2u);
  EXPECT_EQ(d.steps[0].process_reward, 0.5f);
  for (const Step& step : d.steps) {
    EXPECT_EQ(step.label, StepLabel::kUnknown);
    EXPECT_TRUE(step.has_reward) << "1.1 readers took the stored value as the reward";
    EXPECT_EQ(step.index, 0u);
    EXPECT_EQ(step.begin, 0u);
  }
  std::vector<bool> has_record;
  ExpertsByPosition(d, &has_record);
  EXPECT_EQ(has_record, std::vector<bool>({false, true, true, false, true, true}));
  // The server's path reads it the same way.
  Result<Message> facts = Decode(frame, DecodeLimits(), SegmentDecoding::kFactsOnly);
  ASSERT_TRUE(facts.ok()) << facts.status().ToString();
  EXPECT_EQ(facts->segment_facts.end_reason, EndReason::kNone);
  EXPECT_EQ(facts->segment_facts.group_size, 0u);

  capnp::MallocMessageBuilder summary_builder;
  auto summary = summary_builder.initRoot<wire_1_1::TrajectorySummary>();
  summary.setTrajectoryId(capnp::Data::Reader(id.bytes.data(), 16));
  summary.setStatus(wire_1_1::TrajectoryStatus::COMPLETE);
  summary.setSegmentsStored(2);
  Result<TrajectorySummary> back =
      DecodeTrajectorySummary(strider::testing::SealRaw(summary_builder));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->complete);
  EXPECT_FALSE(back->abandoned);
  EXPECT_EQ(back->segments_stored, 2u);
  EXPECT_EQ(back->end_reason, EndReason::kNone);
  EXPECT_EQ(back->conflicts, 0u);
}

TEST(SchemaVersions, SummaryKeepsEndReasonStatusAndConflicts) {
  TrajectorySummary summary;
  summary.trajectory_id = strider::testing::MakeTrajectoryId(2);
  summary.abandoned = true;
  summary.end_reason = EndReason::kAbandoned;
  summary.conflicts = 3;
  Result<TrajectorySummary> back = DecodeTrajectorySummary(EncodeTrajectorySummary(summary));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->abandoned);
  EXPECT_FALSE(back->complete);
  EXPECT_EQ(back->end_reason, EndReason::kAbandoned);
  EXPECT_EQ(back->conflicts, 3u);
}

TEST(TrajectoryIdText, HexRoundTrip) {
  const TrajectoryId id = strider::testing::MakeTrajectoryId(5);
  Result<TrajectoryId> back = TrajectoryId::FromHex(id.Hex());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, id);
  EXPECT_FALSE(TrajectoryId::FromHex("xyz").ok());
  EXPECT_FALSE(TrajectoryId::FromHex(std::string(32, 'g')).ok());
}

}  // namespace
}  // namespace strider::schema
