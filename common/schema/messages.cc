#include "common/schema/messages.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/schema/crc32c.h"
#include "common/schema/replay.capnp.h"

static_assert(std::endian::native == std::endian::little,
              "token, log-prob and expert arrays are stored as little-endian bytes");

namespace strider::schema {
namespace {

Status Reject(std::string_view reason, const std::string& detail) {
  const bool bad_request = reason == reject::kMissingField || reason == reject::kLengthMismatch ||
                           reason == reject::kRange || reason == reject::kUnexpected ||
                           reason == reject::kSize;
  std::string message = std::string(reason) + ": " + detail;
  return bad_request ? Status::InvalidArgument(std::move(message))
                     : Status::Corruption(std::move(message));
}

void PutU16(char* out, uint16_t v) { std::memcpy(out, &v, 2); }
void PutU32(char* out, uint32_t v) { std::memcpy(out, &v, 4); }
void PutU64(char* out, uint64_t v) { std::memcpy(out, &v, 8); }
template <typename T>
T Get(const char* in) {
  T v;
  std::memcpy(&v, in, sizeof(T));
  return v;
}

capnp::Data::Reader AsData(const void* data, size_t size) {
  return capnp::Data::Reader(static_cast<const kj::byte*>(data), size);
}
capnp::Data::Reader AsData(std::string_view bytes) { return AsData(bytes.data(), bytes.size()); }
capnp::Text::Reader AsText(const std::string& text) {
  return capnp::Text::Reader(text.data(), text.size());
}

std::string Seal(capnp::MessageBuilder& builder) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  kj::ArrayPtr<const kj::byte> payload = words.asBytes();
  std::string frame(kEnvelopeHeaderBytes + payload.size(), '\0');
  char* header = frame.data();
  PutU32(header, kEnvelopeMagic);
  PutU16(header + 4, kSchemaMajor);
  PutU16(header + 6, kSchemaMinor);
  PutU64(header + 8, payload.size());
  PutU32(header + 16, Crc32c(payload.begin(), payload.size()));
  PutU32(header + 20, 0);
  std::memcpy(frame.data() + kEnvelopeHeaderBytes, payload.begin(), payload.size());
  return frame;
}

void SetKey(wire::SegmentKey::Builder out, const SegmentKey& key) {
  out.setTrajectoryId(AsData(key.trajectory.View()));
  out.setSegmentIndex(key.index);
}

Status ReadKey(wire::SegmentKey::Reader in, SegmentKey* out, const char* where) {
  if (!in.hasTrajectoryId() || in.getTrajectoryId().size() != 16) {
    return Reject(reject::kMissingField, std::string(where) + ": trajectory id must be 16 bytes");
  }
  std::memcpy(out->trajectory.bytes.data(), in.getTrajectoryId().begin(), 16);
  out->index = in.getSegmentIndex();
  return Status::Ok();
}

// A segment's fields as read-only views, over a Cap'n Proto reader or a SegmentData: the one
// thing ValidateView checks, so the decoder and the encoder apply the same rules whether or not
// the arrays are copied.
struct SegmentView {
  SegmentKey key;
  bool is_last = false;
  uint64_t token_begin = 0;
  const char* tokens = nullptr;  // token_count little-endian int32
  size_t token_count = 0;
  const uint8_t* roles = nullptr;  // role_count bytes
  size_t role_count = 0;
  const char* logprobs = nullptr;  // logprob_count little-endian float32
  size_t logprob_count = 0;
  std::vector<PolicyRun> policy_runs;  // short lists: copied
  uint16_t layers = 0;
  uint16_t top_k = 0;
  size_t experts = 0;
  std::vector<Step> steps;
  float outcome_reward = 0;
  struct ImageShape {
    uint32_t token_offset = 0;
    uint32_t width = 0;
    uint32_t height = 0;
    uint8_t channels = 0;
    size_t pixel_bytes = 0;
  };
  std::vector<ImageShape> images;
  std::string_view env;
  std::string_view table;
  // Since 1.2; checked only when the writer's minor version is at least 2.
  uint16_t minor = kSchemaMinor;
  uint8_t coverage = 0;  // RoutingCoverage as sent
  size_t context_experts = 0;
  const uint8_t* mask = nullptr;  // mask_bytes bytes
  size_t mask_bytes = 0;
  size_t group_id_bytes = 0;
  const uint8_t* group_id = nullptr;  // group_id_bytes bytes
  uint32_t group_index = 0;
  uint32_t group_size = 0;
  uint8_t end_reason = 0;  // EndReason as sent
  float temperature = 1.0f;
  float top_p = 1.0f;
  std::vector<uint8_t> step_labels;  // StepLabel as sent, one per step
};

int32_t TokenAt(const SegmentView& v, size_t i) { return Get<int32_t>(v.tokens + 4 * i); }
float LogprobAt(const SegmentView& v, size_t i) { return Get<float>(v.logprobs + 4 * i); }

uint8_t MaxByte(const uint8_t* bytes, size_t size) {
  constexpr size_t kBlock = 64;
  uint8_t max = 0;
  size_t i = 0;
  for (; i + kBlock <= size; i += kBlock) {
    uint8_t block = 0;
    for (size_t j = 0; j < kBlock; ++j) block = std::max(block, bytes[i + j]);
    max = std::max(max, block);
  }
  for (; i < size; ++i) max = std::max(max, bytes[i]);
  return max;
}

// A log-prob must be finite and <= 0. On the bits: not all-ones exponent (inf, NaN), and not a
// positive non-zero value (sign clear and any other bit set: > 0 as a signed integer). -0 passes.
inline uint32_t BadLogprobBits(uint32_t bits) {
  return static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u) |
         static_cast<uint32_t>(static_cast<int32_t>(bits) > 0);
}

// The per-token checks as flat integer passes without early exits, in blocks of a fixed length,
// so the compiler vectorises them; a segment that fails goes through the exact loop in
// ValidateView to name the first bad token. Returns true when every token passes.
bool TokensLookValid(const SegmentView& v, const DecodeLimits& limits) {
  constexpr size_t kBlock = 64;
  const size_t n = v.token_count;
  // One unsigned comparison covers both bounds (max_token_id is positive).
  const uint32_t max_id = static_cast<uint32_t>(limits.max_token_id);
  uint32_t bad = 0;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    uint32_t tokens[kBlock];
    uint32_t logprobs[kBlock];
    std::memcpy(tokens, v.tokens + 4 * i, sizeof(tokens));
    std::memcpy(logprobs, v.logprobs + 4 * i, sizeof(logprobs));
    uint32_t block_bad = 0;
    for (size_t j = 0; j < kBlock; ++j) block_bad |= static_cast<uint32_t>(tokens[j] >= max_id);
    for (size_t j = 0; j < kBlock; ++j) block_bad |= BadLogprobBits(logprobs[j]);
    bad |= block_bad;
  }
  for (; i < n; ++i) {
    bad |= static_cast<uint32_t>(static_cast<uint32_t>(TokenAt(v, i)) >= max_id);
    bad |= BadLogprobBits(Get<uint32_t>(v.logprobs + 4 * i));
  }
  return bad == 0 && MaxByte(v.roles, n) < kRoleCount;
}

// Blocked like TokensLookValid, for the same reason.
size_t ActionTokens(const SegmentView& v) {
  constexpr size_t kBlock = 64;
  static_assert(static_cast<uint8_t>(Role::kToolCall) == static_cast<uint8_t>(Role::kModel) + 1);
  constexpr uint8_t kFirstAction = static_cast<uint8_t>(Role::kModel);
  size_t actions = 0;
  size_t i = 0;
  for (; i + kBlock <= v.role_count; i += kBlock) {
    uint32_t block = 0;
    for (size_t j = 0; j < kBlock; ++j) {
      block += static_cast<uint8_t>(v.roles[i + j] - kFirstAction) < 2 ? 1u : 0u;
    }
    actions += block;
  }
  for (; i < v.role_count; ++i) actions += IsAction(static_cast<Role>(v.roles[i])) ? 1 : 0;
  return actions;
}

// The fields since 1.2: step labels and positions, group, end reason, sampling settings, the
// routing of context tokens.
Status ValidateSince12(const SegmentView& s, const std::string& where, size_t actions) {
  const size_t n = s.token_count;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const Step& step = s.steps[i];
    const std::string name = where + ": step " + std::to_string(i);
    if (s.step_labels[i] > static_cast<uint8_t>(StepLabel::kIncorrect)) {
      return Reject(reject::kRange, name + " has no valid label");
    }
    if (!step.has_reward && step.process_reward != 0) {
      return Reject(reject::kRange, name + " has no reward but a process reward of " +
                                        std::to_string(step.process_reward));
    }
    if (i > 0 && step.index != s.steps[i - 1].index + 1) {
      return Reject(reject::kRange, name + " has index " + std::to_string(step.index) +
                                        ", not the previous step's plus one");
    }
    const uint64_t end = s.token_begin + step.end;
    const uint64_t floor = i > 0 ? s.token_begin + s.steps[i - 1].end : 0;
    if (step.begin >= end || step.begin < floor) {
      return Reject(reject::kRange, name + " begins at " + std::to_string(step.begin) +
                                        ", not in [" + std::to_string(floor) + ", " +
                                        std::to_string(end) + ")");
    }
  }
  if (s.group_size > 0) {
    if (s.group_id_bytes != 16) {
      return Reject(reject::kMissingField, where + ": groupId must be 16 bytes in a group");
    }
    if (s.group_index >= s.group_size) {
      return Reject(reject::kRange, where + ": group index " + std::to_string(s.group_index) +
                                        " is not below the group size " +
                                        std::to_string(s.group_size));
    }
  } else if (s.group_id_bytes != 0 || s.group_index != 0) {
    return Reject(reject::kRange, where + ": group id or index without a group size");
  }
  if (s.end_reason >= kEndReasonCount) {
    return Reject(reject::kRange, where + ": end reason " + std::to_string(s.end_reason) +
                                      " is not a reason");
  }
  if (s.is_last != (s.end_reason != static_cast<uint8_t>(EndReason::kNone))) {
    return Reject(reject::kRange, where + (s.is_last ? ": the last segment has no end reason"
                                                     : ": an end reason before the last segment"));
  }
  if (!std::isfinite(s.temperature) || s.temperature < 0) {
    return Reject(reject::kRange, where + ": temperature is not a finite value >= 0");
  }
  if (!(s.top_p > 0 && s.top_p <= 1)) {
    return Reject(reject::kRange, where + ": top-p is not in (0, 1]");
  }
  const size_t per_token = static_cast<size_t>(s.layers) * s.top_k;
  const std::string routing = where + ": routing record ";
  switch (static_cast<RoutingCoverage>(s.coverage)) {
    case RoutingCoverage::kActions:
      if (s.context_experts != 0 || s.mask_bytes != 0) {
        return Reject(reject::kLengthMismatch,
                      routing + "covers action tokens only but has context experts or a mask");
      }
      return Status::Ok();
    case RoutingCoverage::kAll:
      if (s.mask_bytes != 0 || s.context_experts != (n - actions) * per_token) {
        return Reject(reject::kLengthMismatch,
                      routing + "covers every position but has " +
                          std::to_string(s.context_experts) + " context expert ids, expected " +
                          std::to_string(n - actions) + " context tokens x " +
                          std::to_string(per_token) + (s.mask_bytes != 0 ? ", and a mask" : ""));
      }
      return Status::Ok();
    case RoutingCoverage::kMasked: {
      if (s.mask_bytes != (n + 7) / 8) {
        return Reject(reject::kLengthMismatch, routing + "mask has " +
                                                   std::to_string(s.mask_bytes) +
                                                   " bytes for " + std::to_string(n) + " tokens");
      }
      if ((n % 8) != 0 && (s.mask[n / 8] >> (n % 8)) != 0) {
        return Reject(reject::kRange, routing + "mask has bits set past the last token");
      }
      size_t covered = 0;
      for (size_t i = 0; i < n; ++i) {
        const bool bit = (s.mask[i / 8] >> (i % 8)) & 1;
        if (IsAction(static_cast<Role>(s.roles[i]))) {
          if (!bit) {
            return Reject(reject::kRange, routing + "mask leaves out action token " +
                                              std::to_string(i));
          }
        } else {
          covered += bit ? 1 : 0;
        }
      }
      if (s.context_experts != covered * per_token) {
        return Reject(reject::kLengthMismatch,
                      routing + "has " + std::to_string(s.context_experts) +
                          " context expert ids, expected " + std::to_string(covered) +
                          " masked context tokens x " + std::to_string(per_token));
      }
      return Status::Ok();
    }
  }
  return Reject(reject::kRange, routing + "coverage " + std::to_string(s.coverage) +
                                    " is not a coverage");
}

Status ValidateView(const SegmentView& s, const DecodeLimits& limits) {
  const size_t n = s.token_count;
  const std::string where = "segment " + s.key.ToString();
  if (n == 0) return Reject(reject::kMissingField, where + ": no tokens");
  if (s.env.empty()) return Reject(reject::kMissingField, where + ": env is empty");
  if (s.policy_runs.empty()) return Reject(reject::kMissingField, where + ": no policy runs");
  if (s.role_count != n) {
    return Reject(reject::kLengthMismatch, where + ": " + std::to_string(n) + " tokens but " +
                                               std::to_string(s.role_count) + " roles");
  }
  if (s.logprob_count != n) {
    return Reject(reject::kLengthMismatch,
                  where + ": " + std::to_string(n) + " tokens but " +
                      std::to_string(s.logprob_count) + " behaviour log-probs");
  }
  if (!TokensLookValid(s, limits)) {
    for (size_t i = 0; i < n; ++i) {
      const int32_t token = TokenAt(s, i);
      if (token < 0 || token >= limits.max_token_id) {
        return Reject(reject::kRange, where + ": token " + std::to_string(i) + " has id " +
                                          std::to_string(token) + ", outside [0, " +
                                          std::to_string(limits.max_token_id) + ")");
      }
      if (s.roles[i] >= kRoleCount) {
        return Reject(reject::kRange,
                      where + ": token " + std::to_string(i) + " has no valid role");
      }
      const float lp = LogprobAt(s, i);
      if (!std::isfinite(lp) || lp > 0) {
        return Reject(reject::kRange, where + ": behaviour log-prob " + std::to_string(i) +
                                          " is not a finite value <= 0");
      }
    }
  }
  if (s.token_begin > std::numeric_limits<uint64_t>::max() - n) {
    return Reject(reject::kRange, where + ": tokenBegin overflows");
  }
  if (s.policy_runs.front().begin != 0) {
    return Reject(reject::kRange, where + ": the first policy run must begin at offset 0");
  }
  for (size_t i = 1; i < s.policy_runs.size(); ++i) {
    if (s.policy_runs[i].begin <= s.policy_runs[i - 1].begin || s.policy_runs[i].begin >= n) {
      return Reject(reject::kRange, where + ": policy run " + std::to_string(i) +
                                        " does not begin after the previous one inside the "
                                        "segment");
    }
  }
  uint32_t previous_end = 0;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    if (s.steps[i].end <= previous_end || s.steps[i].end > n) {
      return Reject(reject::kRange, where + ": step " + std::to_string(i) + " ends at " +
                                        std::to_string(s.steps[i].end) +
                                        ", not after the previous step and within " +
                                        std::to_string(n) + " tokens");
    }
    if (!std::isfinite(s.steps[i].process_reward)) {
      return Reject(reject::kRange, where + ": step " + std::to_string(i) +
                                        " has a non-finite process reward");
    }
    previous_end = s.steps[i].end;
  }
  if (!std::isfinite(s.outcome_reward)) {
    return Reject(reject::kRange, where + ": outcome reward is not finite");
  }
  const size_t actions = ActionTokens(s);
  const size_t expected_experts = actions * static_cast<size_t>(s.layers) * s.top_k;
  if (s.experts != expected_experts) {
    return Reject(reject::kLengthMismatch,
                  where + ": routing record has " + std::to_string(s.experts) +
                      " expert ids, expected " + std::to_string(actions) + " action tokens x " +
                      std::to_string(s.layers) + " layers x top-" + std::to_string(s.top_k));
  }
  if (s.minor >= 2) STRIDER_RETURN_IF_ERROR(ValidateSince12(s, where, actions));
  for (size_t i = 0; i < s.images.size(); ++i) {
    const SegmentView::ImageShape& image = s.images[i];
    if (image.token_offset >= n) {
      return Reject(reject::kRange, where + ": image " + std::to_string(i) +
                                        " is placed past the segment's tokens");
    }
    const uint64_t expected = uint64_t{image.width} * image.height * image.channels;
    if (image.pixel_bytes != expected || expected == 0) {
      return Reject(reject::kLengthMismatch,
                    where + ": image " + std::to_string(i) + " has " +
                        std::to_string(image.pixel_bytes) + " pixel bytes, expected " +
                        std::to_string(image.width) + "x" + std::to_string(image.height) + "x" +
                        std::to_string(image.channels));
    }
  }
  return Status::Ok();
}

SegmentView ViewOf(const SegmentData& s) {
  SegmentView v;
  v.key = s.key();
  v.is_last = s.is_last;
  v.token_begin = s.token_begin;
  v.tokens = reinterpret_cast<const char*>(s.tokens.data());
  v.token_count = s.tokens.size();
  v.roles = reinterpret_cast<const uint8_t*>(s.roles.data());
  v.role_count = s.roles.size();
  v.logprobs = reinterpret_cast<const char*>(s.behaviour_logprobs.data());
  v.logprob_count = s.behaviour_logprobs.size();
  v.policy_runs = s.policy_runs;
  v.layers = s.routing.layers;
  v.top_k = s.routing.top_k;
  v.experts = s.routing.experts.size();
  v.steps = s.steps;
  v.outcome_reward = s.outcome_reward;
  for (const Image& image : s.images) {
    v.images.push_back(
        {image.token_offset, image.width, image.height, image.channels, image.pixels.size()});
  }
  v.env = s.env;
  v.table = s.table;
  // What the encoder writes: always the current version.
  v.minor = kSchemaMinor;
  v.coverage = static_cast<uint8_t>(s.routing.coverage);
  v.context_experts = s.routing.context_experts.size();
  v.mask = s.routing.mask.data();
  v.mask_bytes = s.routing.mask.size();
  v.group_id_bytes = s.group_size > 0 ? 16 : 0;
  v.group_id = s.group_id.bytes.data();
  v.group_index = s.group_index;
  v.group_size = s.group_size;
  v.end_reason = static_cast<uint8_t>(s.end_reason);
  v.temperature = s.temperature;
  v.top_p = s.top_p;
  for (const Step& step : s.steps) v.step_labels.push_back(static_cast<uint8_t>(step.label));
  return v;
}

// The structural checks that need the wire form (array byte counts, role values), then a view
// over the reader's memory; nothing is copied. `minor` is the writer's, from the envelope.
Status ReadSegmentView(wire::Segment::Reader in, uint16_t minor, SegmentView* out) {
  out->minor = minor;
  if (!in.hasTrajectoryId() || in.getTrajectoryId().size() != 16) {
    return Reject(reject::kMissingField, "segment.trajectoryId must be 16 bytes");
  }
  std::memcpy(out->key.trajectory.bytes.data(), in.getTrajectoryId().begin(), 16);
  out->key.index = in.getSegmentIndex();
  out->is_last = in.getIsLast();
  out->token_begin = in.getTokenBegin();

  capnp::Data::Reader tokens = in.getTokens();
  if (tokens.size() % 4 != 0) {
    return Reject(reject::kLengthMismatch,
                  "segment.tokens has " + std::to_string(tokens.size()) +
                      " bytes, not a multiple of 4");
  }
  out->tokens = reinterpret_cast<const char*>(tokens.begin());
  out->token_count = tokens.size() / 4;

  capnp::Data::Reader roles = in.getRoles();
  if (MaxByte(roles.begin(), roles.size()) >= kRoleCount) {
    for (size_t i = 0; i < roles.size(); ++i) {
      if (roles[i] >= kRoleCount) {
        return Reject(reject::kRange, "segment.roles[" + std::to_string(i) + "] = " +
                                          std::to_string(roles[i]) + " is not a role");
      }
    }
  }
  out->roles = roles.begin();
  out->role_count = roles.size();

  capnp::Data::Reader logprobs = in.getBehaviourLogprobs();
  if (logprobs.size() % 4 != 0) {
    return Reject(reject::kLengthMismatch, "segment.behaviourLogprobs has " +
                                               std::to_string(logprobs.size()) +
                                               " bytes, not a multiple of 4");
  }
  out->logprobs = reinterpret_cast<const char*>(logprobs.begin());
  out->logprob_count = logprobs.size() / 4;

  for (auto run : in.getPolicyRuns()) out->policy_runs.push_back({run.getBegin(), run.getVersion()});

  auto routing = in.getRouting();
  out->layers = routing.getLayers();
  out->top_k = routing.getTopK();
  capnp::Data::Reader experts = routing.getExperts();
  if (experts.size() % 2 != 0) {
    return Reject(reject::kLengthMismatch, "segment.routing.experts has an odd byte count " +
                                               std::to_string(experts.size()));
  }
  out->experts = experts.size() / 2;
  if (minor >= 2) {
    out->coverage = static_cast<uint8_t>(routing.getCoverage());
    capnp::Data::Reader context = routing.getContextExperts();
    if (context.size() % 2 != 0) {
      return Reject(reject::kLengthMismatch,
                    "segment.routing.contextExperts has an odd byte count " +
                        std::to_string(context.size()));
    }
    out->context_experts = context.size() / 2;
    capnp::Data::Reader mask = routing.getMask();
    out->mask = mask.begin();
    out->mask_bytes = mask.size();
    out->group_id_bytes = in.getGroupId().size();
    out->group_id = in.getGroupId().begin();
    out->group_index = in.getGroupIndex();
    out->group_size = in.getGroupSize();
    out->end_reason = static_cast<uint8_t>(in.getEndReason());
    out->temperature = in.getTemperature();
    out->top_p = in.getTopP();
  }

  for (auto step : in.getSteps()) {
    Step decoded{step.getEnd(), step.getProcessReward()};
    if (minor >= 2) {
      decoded.has_reward = step.getHasReward();
      decoded.index = step.getIndex();
      decoded.begin = step.getBegin();
      out->step_labels.push_back(static_cast<uint8_t>(step.getLabel()));
      decoded.label = static_cast<StepLabel>(out->step_labels.back());
    } else {
      out->step_labels.push_back(0);
    }
    out->steps.push_back(decoded);
  }
  out->outcome_reward = in.getOutcomeReward();
  for (auto image : in.getImages()) {
    out->images.push_back({image.getTokenOffset(), image.getWidth(), image.getHeight(),
                           image.getChannels(), image.getPixels().size()});
  }
  auto env = in.getEnv();
  out->env = std::string_view(env.begin(), env.size());
  auto table = in.getTable();
  out->table = std::string_view(table.begin(), table.size());
  return Status::Ok();
}

SegmentFacts FactsOf(const SegmentView& v) {
  SegmentFacts facts;
  facts.key = v.key;
  facts.table = std::string(v.table);
  facts.env = std::string(v.env);
  facts.min_policy_version = std::numeric_limits<uint64_t>::max();
  for (const PolicyRun& run : v.policy_runs) {
    facts.min_policy_version = std::min(facts.min_policy_version, run.version);
    facts.max_policy_version = std::max(facts.max_policy_version, run.version);
  }
  if (v.policy_runs.empty()) facts.min_policy_version = 0;
  facts.tokens = v.token_count;
  facts.steps = static_cast<uint32_t>(v.steps.size());
  for (const Step& step : v.steps) facts.process_reward_sum += step.process_reward;
  facts.is_last = v.is_last;
  facts.outcome_reward = v.outcome_reward;
  facts.end_reason = static_cast<EndReason>(v.end_reason);
  if (v.group_size > 0 && v.group_id_bytes == 16 && v.group_id != nullptr) {
    std::memcpy(facts.group_id.bytes.data(), v.group_id, 16);
    facts.group_index = v.group_index;
    facts.group_size = v.group_size;
  }
  return facts;
}

// Copies the arrays of a validated segment (SegmentDecoding::kCopy).
void CopySegment(wire::Segment::Reader in, const SegmentView& v, SegmentData* out) {
  out->trajectory_id = v.key.trajectory;
  out->segment_index = v.key.index;
  out->is_last = v.is_last;
  out->token_begin = v.token_begin;
  out->tokens.resize(v.token_count);
  if (v.token_count != 0) std::memcpy(out->tokens.data(), v.tokens, v.token_count * 4);
  out->roles.resize(v.role_count);
  if (v.role_count != 0) std::memcpy(out->roles.data(), v.roles, v.role_count);
  out->behaviour_logprobs.resize(v.logprob_count);
  if (v.logprob_count != 0) {
    std::memcpy(out->behaviour_logprobs.data(), v.logprobs, v.logprob_count * 4);
  }
  out->policy_runs = v.policy_runs;
  out->routing.layers = v.layers;
  out->routing.top_k = v.top_k;
  capnp::Data::Reader experts = in.getRouting().getExperts();
  out->routing.experts.resize(v.experts);
  if (v.experts != 0) std::memcpy(out->routing.experts.data(), experts.begin(), v.experts * 2);
  out->steps = v.steps;
  out->outcome_reward = v.outcome_reward;
  for (auto image : in.getImages()) {
    Image decoded;
    decoded.token_offset = image.getTokenOffset();
    decoded.width = image.getWidth();
    decoded.height = image.getHeight();
    decoded.channels = image.getChannels();
    auto pixels = image.getPixels();
    decoded.pixels.assign(reinterpret_cast<const char*>(pixels.begin()), pixels.size());
    out->images.push_back(std::move(decoded));
  }
  out->env = std::string(v.env);
  for (auto kv : in.getMetadata()) out->metadata.emplace_back(kv.getKey(), kv.getValue());
  auto digest = in.getStateDigest();
  out->state_digest.assign(reinterpret_cast<const char*>(digest.begin()), digest.size());
  out->table = std::string(v.table);
  out->schema_minor = v.minor;
  if (v.minor < 2) return;
  out->routing.coverage = static_cast<RoutingCoverage>(v.coverage);
  capnp::Data::Reader context = in.getRouting().getContextExperts();
  out->routing.context_experts.resize(v.context_experts);
  if (v.context_experts != 0) {
    std::memcpy(out->routing.context_experts.data(), context.begin(), v.context_experts * 2);
  }
  out->routing.mask.assign(v.mask, v.mask + v.mask_bytes);
  if (v.group_id_bytes == 16) std::memcpy(out->group_id.bytes.data(), in.getGroupId().begin(), 16);
  out->group_index = v.group_index;
  out->group_size = v.group_size;
  out->end_reason = static_cast<EndReason>(v.end_reason);
  out->temperature = v.temperature;
  out->top_p = v.top_p;
  out->top_k = in.getTopK();
}

Status ReadSegment(wire::Segment::Reader in, const DecodeLimits& limits,
                   SegmentDecoding decoding, uint16_t minor, Message* out) {
  SegmentView view;
  STRIDER_RETURN_IF_ERROR(ReadSegmentView(in, minor, &view));
  STRIDER_RETURN_IF_ERROR(ValidateView(view, limits));
  // Metadata is not checked but must be readable: a malformed list throws here, inside ReadRoot.
  for (auto kv : in.getMetadata()) {
    (void)kv.getKey();
    (void)kv.getValue();
  }
  (void)in.getStateDigest();
  out->segment_facts = FactsOf(view);
  if (decoding == SegmentDecoding::kCopy) CopySegment(in, view, &out->segment);
  return Status::Ok();
}

Status ReadMessage(wire::Message::Reader root, const DecodeLimits& limits,
                   SegmentDecoding segment_decoding, uint16_t minor, Message* out) {
  switch (root.which()) {
    case wire::Message::HELLO: {
      out->kind = MessageKind::kHello;
      auto hello = root.getHello();
      out->hello.client_id = hello.getClientId();
      if (out->hello.client_id.empty()) {
        return Reject(reject::kMissingField, "hello.clientId is empty");
      }
      out->hello.role = hello.getRole() == wire::ClientRole::LEARNER ? ClientRole::kLearner
                                                                        : ClientRole::kActor;
      return Status::Ok();
    }
    case wire::Message::SEGMENT:
      out->kind = MessageKind::kSegment;
      return ReadSegment(root.getSegment(), limits, segment_decoding, minor, out);
    case wire::Message::ACK:
      out->kind = MessageKind::kAck;
      for (auto key : root.getAck().getKeys()) {
        SegmentKey decoded;
        STRIDER_RETURN_IF_ERROR(ReadKey(key, &decoded, "ack.keys"));
        out->ack.push_back(decoded);
      }
      return Status::Ok();
    case wire::Message::CREDIT:
      out->kind = MessageKind::kCredit;
      out->credit.bytes = root.getCredit().getBytes();
      out->credit.server_instance = root.getCredit().getServerInstance();
      out->credit.max_frame_bytes = root.getCredit().getMaxFrameBytes();
      return Status::Ok();
    case wire::Message::SAMPLE_REQUEST: {
      out->kind = MessageKind::kSampleRequest;
      auto request = root.getSampleRequest();
      SampleRequest& r = out->sample_request;
      r.table = request.getTable();
      r.learner_id = request.getLearnerId();
      r.step = request.getStep();
      r.count = request.getCount();
      r.policy_version = request.getPolicyVersion();
      r.rank = request.getRank();
      r.world_size = std::max<uint32_t>(1, request.getWorldSize());
      if (request.hasFetchTrajectory()) {
        auto key = request.getFetchTrajectory();
        r.fetch_trajectory.assign(reinterpret_cast<const char*>(key.begin()), key.size());
      }
      if (request.hasFetchGroup()) {
        auto key = request.getFetchGroup();
        r.fetch_group.assign(reinterpret_cast<const char*>(key.begin()), key.size());
      }
      if (r.is_fetch()) {
        if (!r.fetch_trajectory.empty() && !r.fetch_group.empty()) {
          return Reject(reject::kRange, "sampleRequest: fetch a trajectory or a group, not both");
        }
        if (r.fetch_trajectory.size() + r.fetch_group.size() != 16) {
          return Reject(reject::kRange, "sampleRequest: a fetch key must be 16 bytes");
        }
        return Status::Ok();
      }
      if (r.learner_id.empty()) return Reject(reject::kMissingField, "sampleRequest.learnerId");
      if (r.step == 0) return Reject(reject::kRange, "sampleRequest.step must start at 1");
      if (r.count == 0 || r.count > 65536) {
        return Reject(reject::kRange, "sampleRequest.count must be in [1, 65536], got " +
                                          std::to_string(r.count));
      }
      if (r.world_size > 65536 || r.rank >= r.world_size) {
        return Reject(reject::kRange, "sampleRequest.rank " + std::to_string(r.rank) +
                                          " is not below worldSize " +
                                          std::to_string(r.world_size) + " (at most 65536)");
      }
      return Status::Ok();
    }
    case wire::Message::SAMPLE_REPLY: {
      out->kind = MessageKind::kSampleReply;
      auto reply = root.getSampleReply();
      out->sample_reply.step = reply.getStep();
      out->sample_reply.not_ready_reason = reply.getNotReadyReason();
      out->sample_reply.replayed = reply.getReplayed();
      for (auto sampled : reply.getSegments()) {
        SampledSegment decoded;
        decoded.sequence = sampled.getSequence();
        decoded.times_sampled = sampled.getTimesSampled();
        auto bytes = sampled.getSegment();
        decoded.envelope.assign(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
        out->sample_reply.segments.push_back(std::move(decoded));
      }
      return Status::Ok();
    }
    case wire::Message::PRIORITY_UPDATE: {
      out->kind = MessageKind::kPriorityUpdate;
      auto update = root.getPriorityUpdate();
      out->priority_update.table = update.getTable();
      for (uint64_t s : update.getSequences()) out->priority_update.sequences.push_back(s);
      for (double p : update.getPriorities()) {
        if (!std::isfinite(p) || p < 0) {
          return Reject(reject::kRange, "priorityUpdate.priorities must be finite and >= 0");
        }
        out->priority_update.priorities.push_back(p);
      }
      if (out->priority_update.sequences.size() != out->priority_update.priorities.size()) {
        return Reject(reject::kLengthMismatch,
                      "priorityUpdate has " +
                          std::to_string(out->priority_update.sequences.size()) +
                          " sequences but " +
                          std::to_string(out->priority_update.priorities.size()) + " priorities");
      }
      return Status::Ok();
    }
    case wire::Message::ERROR: {
      out->kind = MessageKind::kError;
      auto error = root.getError();
      out->error.reason = error.getReason();
      out->error.message = error.getMessage();
      if (error.hasKey() && error.getKey().hasTrajectoryId()) {
        out->error.has_key = ReadKey(error.getKey(), &out->error.key, "error.key").ok();
      }
      return Status::Ok();
    }
    case wire::Message::STATS_REQUEST:
      out->kind = MessageKind::kStatsRequest;
      return Status::Ok();
    case wire::Message::STATS:
      out->kind = MessageKind::kStats;
      out->stats_json = root.getStats().getJson();
      return Status::Ok();
  }
  return Reject(reject::kMalformed, "unknown message kind " +
                                        std::to_string(static_cast<int>(root.which())) +
                                        " (a newer minor version?)");
}

}  // namespace

std::string_view RejectReason(const Status& status) {
  static constexpr std::string_view kAll[] = {
      reject::kSize,         reject::kTruncated,      reject::kMagic, reject::kVersion,
      reject::kChecksum,     reject::kMalformed,      reject::kMissingField,
      reject::kLengthMismatch, reject::kRange,        reject::kUnexpected, reject::kCredit,
      reject::kConflict,     reject::kDiskFull};
  std::string_view message = status.message();
  for (std::string_view reason : kAll) {
    if (message.size() > reason.size() && message.substr(0, reason.size()) == reason &&
        message[reason.size()] == ':') {
      return reason;
    }
  }
  return "other";
}

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kSystem: return "system";
    case Role::kUser: return "user";
    case Role::kModel: return "model";
    case Role::kToolCall: return "tool_call";
    case Role::kToolResult: return "tool_result";
    case Role::kImage: return "image";
  }
  return "unknown";
}

std::string_view StepLabelName(StepLabel label) {
  switch (label) {
    case StepLabel::kUnknown: return "unknown";
    case StepLabel::kCorrect: return "correct";
    case StepLabel::kIncorrect: return "incorrect";
  }
  return "unknown";
}

std::string_view RoutingCoverageName(RoutingCoverage coverage) {
  switch (coverage) {
    case RoutingCoverage::kActions: return "actions";
    case RoutingCoverage::kAll: return "all";
    case RoutingCoverage::kMasked: return "masked";
  }
  return "unknown";
}

std::string_view EndReasonName(EndReason reason) {
  switch (reason) {
    case EndReason::kNone: return "none";
    case EndReason::kFinished: return "finished";
    case EndReason::kTruncatedTurns: return "truncated_turns";
    case EndReason::kTruncatedLength: return "truncated_length";
    case EndReason::kFailed: return "failed";
    case EndReason::kAbandoned: return "abandoned";
  }
  return "unknown";
}

std::string_view MessageKindName(MessageKind kind) {
  switch (kind) {
    case MessageKind::kHello: return "hello";
    case MessageKind::kSegment: return "segment";
    case MessageKind::kAck: return "ack";
    case MessageKind::kCredit: return "credit";
    case MessageKind::kSampleRequest: return "sample_request";
    case MessageKind::kSampleReply: return "sample_reply";
    case MessageKind::kPriorityUpdate: return "priority_update";
    case MessageKind::kError: return "error";
    case MessageKind::kStatsRequest: return "stats_request";
    case MessageKind::kStats: return "stats";
  }
  return "unknown";
}

std::string TrajectoryId::Hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(32, '0');
  for (size_t i = 0; i < 16; ++i) {
    hex[2 * i] = kDigits[bytes[i] >> 4];
    hex[2 * i + 1] = kDigits[bytes[i] & 0xF];
  }
  return hex;
}

Result<TrajectoryId> TrajectoryId::FromHex(std::string_view hex) {
  if (hex.size() != 32) {
    return Status::InvalidArgument("trajectory id '" + std::string(hex) +
                                   "' must be 32 hex digits");
  }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  TrajectoryId id;
  for (size_t i = 0; i < 16; ++i) {
    const int high = nibble(hex[2 * i]);
    const int low = nibble(hex[2 * i + 1]);
    if (high < 0 || low < 0) {
      return Status::InvalidArgument("trajectory id '" + std::string(hex) +
                                     "' has a character that is not a hex digit");
    }
    id.bytes[i] = static_cast<uint8_t>(high * 16 + low);
  }
  return id;
}

std::string SegmentKey::ToString() const { return trajectory.Hex() + "/" + std::to_string(index); }

uint64_t SegmentData::MinPolicyVersion() const {
  uint64_t v = std::numeric_limits<uint64_t>::max();
  for (const PolicyRun& run : policy_runs) v = std::min(v, run.version);
  return policy_runs.empty() ? 0 : v;
}

uint64_t SegmentData::MaxPolicyVersion() const {
  uint64_t v = 0;
  for (const PolicyRun& run : policy_runs) v = std::max(v, run.version);
  return v;
}

size_t SegmentData::ActionTokens() const {
  size_t actions = 0;
  for (Role role : roles) actions += IsAction(role) ? 1 : 0;
  return actions;
}

Status ValidateSegment(const SegmentData& s, const DecodeLimits& limits) {
  return ValidateView(ViewOf(s), limits);
}

std::vector<uint16_t> ExpertsByPosition(const SegmentData& s, std::vector<bool>* has_record) {
  const size_t n = s.tokens.size();
  const size_t per_token = static_cast<size_t>(s.routing.layers) * s.routing.top_k;
  std::vector<uint16_t> out(n * per_token, 0);
  if (has_record != nullptr) has_record->assign(n, false);
  size_t action = 0;
  size_t context = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t* from = nullptr;
    if (IsAction(s.roles[i])) {
      from = s.routing.experts.data() + action++ * per_token;
    } else if (s.routing.coverage == RoutingCoverage::kAll ||
               (s.routing.coverage == RoutingCoverage::kMasked &&
                ((s.routing.mask[i / 8] >> (i % 8)) & 1))) {
      from = s.routing.context_experts.data() + context++ * per_token;
    }
    if (from == nullptr) continue;
    if (has_record != nullptr) (*has_record)[i] = true;
    std::copy(from, from + per_token, out.begin() + i * per_token);
  }
  return out;
}

Result<std::string> EncodeSegment(const SegmentData& s, const DecodeLimits& limits) {
  STRIDER_RETURN_IF_ERROR(ValidateSegment(s, limits));
  size_t payload_estimate = s.tokens.size() * 9 + s.routing.experts.size() * 2 +
                            s.routing.context_experts.size() * 2 + s.routing.mask.size() + 4096;
  for (const Image& image : s.images) payload_estimate += image.pixels.size() + 64;
  capnp::MallocMessageBuilder builder(payload_estimate / sizeof(capnp::word) + 64);
  auto out = builder.initRoot<wire::Message>().initSegment();
  out.setTrajectoryId(AsData(s.trajectory_id.View()));
  out.setSegmentIndex(s.segment_index);
  out.setIsLast(s.is_last);
  out.setTokenBegin(s.token_begin);
  out.setTokens(AsData(s.tokens.data(), s.tokens.size() * 4));
  out.setRoles(AsData(s.roles.data(), s.roles.size()));
  out.setBehaviourLogprobs(AsData(s.behaviour_logprobs.data(), s.behaviour_logprobs.size() * 4));
  auto runs = out.initPolicyRuns(s.policy_runs.size());
  for (size_t i = 0; i < s.policy_runs.size(); ++i) {
    runs[i].setBegin(s.policy_runs[i].begin);
    runs[i].setVersion(s.policy_runs[i].version);
  }
  auto routing = out.initRouting();
  routing.setLayers(s.routing.layers);
  routing.setTopK(s.routing.top_k);
  routing.setExperts(AsData(s.routing.experts.data(), s.routing.experts.size() * 2));
  routing.setCoverage(static_cast<wire::RoutingCoverage>(s.routing.coverage));
  if (!s.routing.context_experts.empty()) {
    routing.setContextExperts(
        AsData(s.routing.context_experts.data(), s.routing.context_experts.size() * 2));
  }
  if (!s.routing.mask.empty()) routing.setMask(AsData(s.routing.mask.data(), s.routing.mask.size()));
  auto steps = out.initSteps(s.steps.size());
  for (size_t i = 0; i < s.steps.size(); ++i) {
    steps[i].setEnd(s.steps[i].end);
    steps[i].setProcessReward(s.steps[i].process_reward);
    steps[i].setLabel(static_cast<wire::StepLabel>(s.steps[i].label));
    steps[i].setHasReward(s.steps[i].has_reward);
    steps[i].setIndex(s.steps[i].index);
    steps[i].setBegin(s.steps[i].begin);
  }
  out.setOutcomeReward(s.outcome_reward);
  auto images = out.initImages(s.images.size());
  for (size_t i = 0; i < s.images.size(); ++i) {
    images[i].setTokenOffset(s.images[i].token_offset);
    images[i].setWidth(s.images[i].width);
    images[i].setHeight(s.images[i].height);
    images[i].setChannels(s.images[i].channels);
    images[i].setPixels(AsData(s.images[i].pixels));
  }
  out.setEnv(AsText(s.env));
  auto metadata = out.initMetadata(s.metadata.size());
  for (size_t i = 0; i < s.metadata.size(); ++i) {
    metadata[i].setKey(AsText(s.metadata[i].first));
    metadata[i].setValue(AsText(s.metadata[i].second));
  }
  out.setStateDigest(AsData(s.state_digest));
  out.setTable(AsText(s.table));
  if (s.group_size > 0) out.setGroupId(AsData(s.group_id.View()));
  out.setGroupIndex(s.group_index);
  out.setGroupSize(s.group_size);
  out.setEndReason(static_cast<wire::EndReason>(s.end_reason));
  out.setTemperature(s.temperature);
  out.setTopP(s.top_p);
  out.setTopK(s.top_k);
  std::string frame = Seal(builder);
  if (frame.size() > limits.max_message_bytes) {
    return Reject(reject::kSize, "segment " + s.key().ToString() + " encodes to " +
                                     std::to_string(frame.size()) + " bytes, over the limit of " +
                                     std::to_string(limits.max_message_bytes));
  }
  return frame;
}

std::string EncodeHello(const Hello& hello) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<wire::Message>().initHello();
  out.setClientId(AsText(hello.client_id));
  out.setRole(hello.role == ClientRole::kLearner ? wire::ClientRole::LEARNER
                                                 : wire::ClientRole::ACTOR);
  return Seal(builder);
}

std::string EncodeAck(const std::vector<SegmentKey>& keys) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<wire::Message>().initAck().initKeys(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) SetKey(out[i], keys[i]);
  return Seal(builder);
}

std::string EncodeCredit(const Credit& credit) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<wire::Message>().initCredit();
  out.setBytes(credit.bytes);
  out.setServerInstance(credit.server_instance);
  out.setMaxFrameBytes(credit.max_frame_bytes);
  return Seal(builder);
}

std::string EncodeSampleRequest(const SampleRequest& request) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<wire::Message>().initSampleRequest();
  out.setTable(AsText(request.table));
  out.setLearnerId(AsText(request.learner_id));
  out.setStep(request.step);
  out.setCount(request.count);
  out.setPolicyVersion(request.policy_version);
  if (request.world_size > 1) {
    out.setRank(request.rank);
    out.setWorldSize(request.world_size);
  }
  if (!request.fetch_trajectory.empty()) out.setFetchTrajectory(AsData(request.fetch_trajectory));
  if (!request.fetch_group.empty()) out.setFetchGroup(AsData(request.fetch_group));
  return Seal(builder);
}

std::string EncodeSampleReply(const SampleReply& reply) {
  size_t bytes = 1024;
  for (const SampledSegment& s : reply.segments) bytes += s.envelope.size() + 64;
  capnp::MallocMessageBuilder builder(bytes / sizeof(capnp::word) + 64);
  auto out = builder.initRoot<wire::Message>().initSampleReply();
  out.setStep(reply.step);
  out.setNotReadyReason(AsText(reply.not_ready_reason));
  out.setReplayed(reply.replayed);
  auto segments = out.initSegments(reply.segments.size());
  for (size_t i = 0; i < reply.segments.size(); ++i) {
    segments[i].setSequence(reply.segments[i].sequence);
    segments[i].setTimesSampled(reply.segments[i].times_sampled);
    segments[i].setSegment(AsData(reply.segments[i].envelope));
  }
  return Seal(builder);
}

std::string EncodePriorityUpdate(const PriorityUpdate& update) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<wire::Message>().initPriorityUpdate();
  out.setTable(AsText(update.table));
  auto sequences = out.initSequences(update.sequences.size());
  for (size_t i = 0; i < update.sequences.size(); ++i) sequences.set(i, update.sequences[i]);
  auto priorities = out.initPriorities(update.priorities.size());
  for (size_t i = 0; i < update.priorities.size(); ++i) priorities.set(i, update.priorities[i]);
  return Seal(builder);
}

std::string EncodeError(const ErrorReply& error) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<wire::Message>().initError();
  out.setReason(AsText(error.reason));
  out.setMessage(AsText(error.message));
  if (error.has_key) SetKey(out.initKey(), error.key);
  return Seal(builder);
}

std::string EncodeStatsRequest() {
  capnp::MallocMessageBuilder builder;
  builder.initRoot<wire::Message>().setStatsRequest();
  return Seal(builder);
}

std::string EncodeStats(const std::string& json) {
  capnp::MallocMessageBuilder builder;
  builder.initRoot<wire::Message>().initStats().setJson(AsText(json));
  return Seal(builder);
}

namespace {

// Header, magic and major version of the envelope at the start of `bytes`.
Status CheckEnvelopeHeader(std::string_view bytes) {
  if (bytes.size() < kEnvelopeHeaderBytes) {
    return Reject(reject::kTruncated, "message of " + std::to_string(bytes.size()) +
                                          " bytes is shorter than the " +
                                          std::to_string(kEnvelopeHeaderBytes) +
                                          "-byte envelope header");
  }
  const char* header = bytes.data();
  if (Get<uint32_t>(header) != kEnvelopeMagic) {
    return Reject(reject::kMagic, "the message does not start with the envelope magic 'STRD'");
  }
  const uint16_t major = Get<uint16_t>(header + 4);
  const uint16_t minor = Get<uint16_t>(header + 6);
  if (major != kSchemaMajor) {
    return Reject(reject::kVersion, "schema version " + std::to_string(major) + "." +
                                        std::to_string(minor) + " is not supported (this reader " +
                                        "knows major version " + std::to_string(kSchemaMajor) +
                                        ")");
  }
  return Status::Ok();
}

}  // namespace

Result<size_t> LeadingEnvelopeBytes(std::string_view bytes) {
  STRIDER_RETURN_IF_ERROR(CheckEnvelopeHeader(bytes));
  const uint64_t payload_bytes = Get<uint64_t>(bytes.data() + 8);
  const uint64_t available = bytes.size() - kEnvelopeHeaderBytes;
  if (payload_bytes > available) {
    return Reject(reject::kTruncated, "the envelope announces " + std::to_string(payload_bytes) +
                                          " payload bytes but " + std::to_string(available) +
                                          " arrived");
  }
  return static_cast<size_t>(kEnvelopeHeaderBytes + payload_bytes);
}

Status CheckFrameSize(std::string_view frame, const DecodeLimits& limits) {
  if (frame.size() > limits.max_message_bytes) {
    return Reject(reject::kSize, "message of " + std::to_string(frame.size()) +
                                     " bytes is over the limit of " +
                                     std::to_string(limits.max_message_bytes));
  }
  return Status::Ok();
}

Status CheckEnvelope(std::string_view frame, const DecodeLimits& limits) {
  STRIDER_RETURN_IF_ERROR(CheckFrameSize(frame, limits));
  STRIDER_RETURN_IF_ERROR(CheckEnvelopeHeader(frame));
  const char* header = frame.data();
  const uint64_t payload_bytes = Get<uint64_t>(header + 8);
  const uint64_t actual = frame.size() - kEnvelopeHeaderBytes;
  if (payload_bytes != actual) {
    return Reject(reject::kTruncated, "the envelope announces " + std::to_string(payload_bytes) +
                                          " payload bytes but " + std::to_string(actual) +
                                          " arrived");
  }
  if (payload_bytes % sizeof(capnp::word) != 0) {
    return Reject(reject::kMalformed, "payload of " + std::to_string(payload_bytes) +
                                          " bytes is not a whole number of 8-byte words");
  }
  const uint32_t expected_crc = Get<uint32_t>(header + 16);
  const uint32_t actual_crc = Crc32c(frame.data() + kEnvelopeHeaderBytes, payload_bytes);
  if (expected_crc != actual_crc) {
    return Reject(reject::kChecksum, "payload CRC32C is " + std::to_string(actual_crc) +
                                         ", the envelope says " + std::to_string(expected_crc));
  }
  return Status::Ok();
}

namespace {

// Runs `read` on the root of type `Root` of a frame whose envelope is already checked, turning
// Cap'n Proto's exceptions for malformed input into a Status.
template <typename Root, typename Fn>
Status ReadRoot(std::string_view frame, Fn&& read) {
  std::string_view payload = frame.substr(kEnvelopeHeaderBytes);
  const size_t words = payload.size() / sizeof(capnp::word);
  // Cap'n Proto reads words in place; ZeroMQ and RocksDB give no alignment guarantee.
  kj::Array<capnp::word> aligned_copy;
  const capnp::word* data = reinterpret_cast<const capnp::word*>(payload.data());
  if (reinterpret_cast<uintptr_t>(payload.data()) % alignof(capnp::word) != 0) {
    aligned_copy = kj::heapArray<capnp::word>(words);
    std::memcpy(aligned_copy.begin(), payload.data(), payload.size());
    data = aligned_copy.begin();
  }
  capnp::ReaderOptions options;
  // Bounds the work a hostile message can cause (pointer amplification) to a few passes over
  // its own size.
  options.traversalLimitInWords = words * 4 + 1024;
  options.nestingLimit = 16;
  try {
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(data, words), options);
    if (reader.getEnd() != data + words) {
      return Reject(reject::kMalformed, "trailing bytes after the Cap'n Proto message");
    }
    return read(reader.getRoot<Root>());
  } catch (const kj::Exception& error) {
    return Reject(reject::kMalformed, std::string(error.getDescription().cStr()));
  } catch (const std::exception& error) {
    return Reject(reject::kMalformed, error.what());
  }
}

}  // namespace

Result<Message> Decode(std::string_view frame, const DecodeLimits& limits,
                       SegmentDecoding segment_decoding) {
  STRIDER_RETURN_IF_ERROR(CheckEnvelope(frame, limits));
  Message message;
  const uint16_t minor = Get<uint16_t>(frame.data() + 6);
  STRIDER_RETURN_IF_ERROR(ReadRoot<wire::Message>(frame, [&](wire::Message::Reader root) {
    return ReadMessage(root, limits, segment_decoding, minor, &message);
  }));
  return message;
}

std::string EncodeTrajectorySummary(const TrajectorySummary& summary) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<wire::TrajectorySummary>();
  out.setTrajectoryId(AsData(summary.trajectory_id.View()));
  out.setEnv(AsText(summary.env));
  out.setTable(AsText(summary.table));
  out.setStatus(summary.abandoned  ? wire::TrajectoryStatus::ABANDONED
                : summary.complete ? wire::TrajectoryStatus::COMPLETE
                                   : wire::TrajectoryStatus::OPEN);
  out.setSegmentsStored(summary.segments_stored);
  out.setTokens(summary.tokens);
  out.setOutcomeReward(summary.outcome_reward);
  out.setProcessRewardSum(summary.process_reward_sum);
  out.setSteps(summary.steps);
  out.setMinPolicyVersion(summary.min_policy_version);
  out.setMaxPolicyVersion(summary.max_policy_version);
  out.setFirstInsertUnixMs(summary.first_insert_unix_ms);
  out.setEndReason(static_cast<wire::EndReason>(summary.end_reason));
  out.setConflicts(summary.conflicts);
  return Seal(builder);
}

Result<TrajectorySummary> DecodeTrajectorySummary(std::string_view frame) {
  STRIDER_RETURN_IF_ERROR(CheckEnvelope(frame));
  TrajectorySummary summary;
  STRIDER_RETURN_IF_ERROR(ReadRoot<wire::TrajectorySummary>(
      frame, [&](wire::TrajectorySummary::Reader in) -> Status {
        if (!in.hasTrajectoryId() || in.getTrajectoryId().size() != 16) {
          return Reject(reject::kMissingField, "trajectory summary without a 16-byte id");
        }
        std::memcpy(summary.trajectory_id.bytes.data(), in.getTrajectoryId().begin(), 16);
        summary.env = in.getEnv();
        summary.table = in.getTable();
        summary.complete = in.getStatus() == wire::TrajectoryStatus::COMPLETE;
        summary.abandoned = in.getStatus() == wire::TrajectoryStatus::ABANDONED;
        summary.segments_stored = in.getSegmentsStored();
        summary.tokens = in.getTokens();
        summary.outcome_reward = in.getOutcomeReward();
        summary.process_reward_sum = in.getProcessRewardSum();
        summary.steps = in.getSteps();
        summary.min_policy_version = in.getMinPolicyVersion();
        summary.max_policy_version = in.getMaxPolicyVersion();
        summary.first_insert_unix_ms = in.getFirstInsertUnixMs();
        const auto end_reason = static_cast<uint8_t>(in.getEndReason());
        summary.end_reason = end_reason < kEndReasonCount ? static_cast<EndReason>(end_reason)
                                                          : EndReason::kNone;
        summary.conflicts = in.getConflicts();
        return Status::Ok();
      }));
  return summary;
}

}  // namespace strider::schema
