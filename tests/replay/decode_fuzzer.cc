// libFuzzer target for the replay message decoder: no input may crash it, hang it or make it
// read out of bounds; whatever it accepts must be a valid message that re-encodes.
//
// Random bytes rarely get past the envelope's checksum, so inputs starting with 0x01 are
// applied as an XOR patch to a valid segment frame and then resealed with a correct checksum:
// that drives the fuzzer into the Cap'n Proto structure and the field validation.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "common/schema/crc32c.h"
#include "common/schema/messages.h"

namespace {

std::string ValidFrame() {
  strider::schema::SegmentData s;
  for (size_t i = 0; i < 16; ++i) s.trajectory_id.bytes[i] = static_cast<uint8_t>(i);
  s.segment_index = 2;
  s.env = "math";
  for (int i = 0; i < 24; ++i) {
    s.tokens.push_back(97 + i);
    s.roles.push_back(i < 8 ? strider::schema::Role::kUser : strider::schema::Role::kModel);
    s.behaviour_logprobs.push_back(i < 8 ? 0.0f : -0.5f);
  }
  s.policy_runs = {{0, 3}, {12, 4}};
  s.routing.layers = 1;
  s.routing.top_k = 1;
  s.routing.experts.assign(16, 5);
  // Schema 1.2's fields too, so mutations reach their checks: consecutive step indices with
  // their first positions, a group, typed sampling settings.
  s.steps = {{20, 0.5f}, {24, 1.0f}};
  s.steps[0].index = 0;
  s.steps[0].begin = 8;
  s.steps[0].label = strider::schema::StepLabel::kCorrect;
  s.steps[1].index = 1;
  s.steps[1].begin = 20;
  s.steps[1].has_reward = false;
  s.steps[1].process_reward = 0;
  for (size_t i = 0; i < 16; ++i) s.group_id.bytes[i] = static_cast<uint8_t>(100 + i);
  s.group_index = 1;
  s.group_size = 4;
  s.temperature = 0.7f;
  s.top_p = 0.9f;
  s.top_k = 40;
  s.images.push_back({4, 2, 2, 1, std::string(4, 'x')});
  s.metadata.push_back({"k", "v"});
  return *strider::schema::EncodeSegment(s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string valid = ValidFrame();
  std::string frame;
  if (size > 0 && data[0] == 0x01) {
    frame = valid;
    for (size_t i = 1; i < size && i - 1 < frame.size() - strider::schema::kEnvelopeHeaderBytes;
         ++i) {
      frame[strider::schema::kEnvelopeHeaderBytes + i - 1] ^= static_cast<char>(data[i]);
    }
    const uint32_t crc =
        strider::schema::Crc32c(frame.data() + strider::schema::kEnvelopeHeaderBytes,
                                frame.size() - strider::schema::kEnvelopeHeaderBytes);
    std::memcpy(frame.data() + 16, &crc, 4);
  } else {
    frame.assign(reinterpret_cast<const char*>(data), size);
  }
  strider::Result<strider::schema::Message> message = strider::schema::Decode(frame);
  if (message.ok() && message->kind == strider::schema::MessageKind::kSegment) {
    // Accepted segments satisfy the validator and survive a round trip.
    if (!strider::schema::EncodeSegment(message->segment).ok()) __builtin_trap();
  }
  // A frame may hold several envelopes back to back: finding them never leaves the input.
  std::string_view rest(frame);
  while (!rest.empty()) {
    strider::Result<size_t> envelope = strider::schema::LeadingEnvelopeBytes(rest);
    if (!envelope.ok()) break;
    if (*envelope < strider::schema::kEnvelopeHeaderBytes || *envelope > rest.size()) {
      __builtin_trap();
    }
    (void)strider::schema::Decode(rest.substr(0, *envelope));
    rest.remove_prefix(*envelope);
  }
  return 0;
}
