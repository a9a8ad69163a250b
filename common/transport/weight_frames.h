// The weight stream's frames (wire format in weight_stream.h), encoded and decoded without any
// socket, so the checks on bytes from a peer live in one place that tests and the fuzzer reach
// directly. Internal to strider_weight_stream.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/transport/weight_stream.h"

namespace strider::transport::weight_frames {

enum class Kind : uint8_t { kQuery = 1, kChunkRequest = 2, kManifest = 3, kChunk = 4, kGone = 5 };

struct Manifest {
  uint64_t version = 0;  // 0: nothing newer than the subscriber has
  uint64_t total_bytes = 0;
  uint32_t chunk_bytes = 0;
  uint32_t chunks = 0;
  uint32_t crc32c = 0;  // of the whole
  std::string metadata;
};

std::string QueryFrame(uint64_t have_version);
std::string ChunkRequestFrame(uint64_t version, uint32_t index);
std::string ManifestFrame(const Manifest& manifest);
std::string ChunkFrame(uint64_t version, uint32_t index, std::string_view chunk);
std::string GoneFrame(uint64_t version);

// A subscriber's request as the publisher reads it: a query (version = the subscriber's) or a
// chunk request. nullopt for anything else, which the publisher ignores.
struct Request {
  Kind kind = Kind::kQuery;
  uint64_t version = 0;
  uint32_t index = 0;
};
std::optional<Request> ParseRequest(std::string_view frame);

// A manifest as the subscriber reads it. Corruption for a malformed frame and, unless it says
// "nothing newer", for sizes that do not agree with each other or exceed `max_total_bytes`.
Result<Manifest> ParseManifest(std::string_view frame, uint64_t max_total_bytes);

// Puts a version together from chunk replies in any order, checking each chunk's CRC32C and
// length on arrival and the whole's CRC32C at the end. Duplicates are ignored.
class ChunkAssembler {
 public:
  // `manifest` must have come from ParseManifest with a nonzero version.
  explicit ChunkAssembler(Manifest manifest);

  // One reply frame. Unavailable when the publisher no longer holds the version; Corruption for
  // a malformed reply, another version, an index out of range, or a failed checksum or length.
  Status Add(std::string_view frame);
  bool complete() const { return received_ == manifest_.chunks; }
  // The assembled version; Corruption when the whole fails its CRC32C. Call once, when complete.
  Result<WeightUpdate> Finish();

 private:
  Manifest manifest_;
  std::string bytes_;
  std::vector<bool> have_;
  uint32_t received_ = 0;
  uint32_t running_crc_ = 0;  // over the chunks while they arrive in order
  bool in_order_ = true;
};

}  // namespace strider::transport::weight_frames
