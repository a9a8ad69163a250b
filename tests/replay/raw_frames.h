// Frames built by hand with Cap'n Proto, bypassing the encoder's validation, as a careless or
// hostile sender would.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstring>
#include <string>

#include "common/schema/crc32c.h"
#include "common/schema/messages.h"
#include "common/schema/replay.capnp.h"
#include "tests/replay/test_segments.h"

namespace strider::testing {

// Puts a correct envelope (magic, version, length, checksum) around a Cap'n Proto message.
inline std::string SealRaw(capnp::MessageBuilder& builder) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  std::string frame(schema::kEnvelopeHeaderBytes, '\0');
  frame.append(reinterpret_cast<const char*>(words.asBytes().begin()), words.asBytes().size());
  const uint32_t magic = schema::kEnvelopeMagic;
  const uint16_t major = schema::kSchemaMajor;
  const uint64_t size = frame.size() - schema::kEnvelopeHeaderBytes;
  const uint32_t crc = schema::Crc32c(frame.data() + schema::kEnvelopeHeaderBytes, size);
  std::memcpy(frame.data(), &magic, 4);
  std::memcpy(frame.data() + 4, &major, 2);
  std::memcpy(frame.data() + 8, &size, 8);
  std::memcpy(frame.data() + 16, &crc, 4);
  return frame;
}

// A segment with 4 tokens but 3 roles.
inline std::string MismatchedRolesFrame() {
  capnp::MallocMessageBuilder builder;
  auto segment = builder.initRoot<schema::wire::Message>().initSegment();
  const schema::TrajectoryId id = MakeTrajectoryId(3);
  segment.setTrajectoryId(capnp::Data::Reader(id.bytes.data(), 16));
  const int32_t tokens[4] = {1, 2, 3, 4};
  const uint8_t roles[3] = {1, 2, 2};
  const float logprobs[4] = {0, -1, -1, -1};
  segment.setTokens(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(tokens), 16));
  segment.setRoles(capnp::Data::Reader(roles, 3));
  segment.setBehaviourLogprobs(
      capnp::Data::Reader(reinterpret_cast<const kj::byte*>(logprobs), 16));
  segment.initPolicyRuns(1)[0].setVersion(1);
  segment.setEnv("math");
  return SealRaw(builder);
}

}  // namespace strider::testing
