// libFuzzer target for the weight stream's frames (common/transport/weight_frames.h): requests
// reach a learner from any actor, and manifests and chunks reach an actor from the network. No
// input may crash, hang or read out of bounds, and the assembler must never hand out bytes that
// differ from what the chunks carried.
//
// The first byte picks a mode:
//   even: raw frames. The whole input is parsed as a request; then 16-bit length-prefixed
//         frames follow, the first read as a manifest and the rest fed to an assembler.
//   odd:  structured. A consistent manifest is built from the input (at most 4 KiB in chunks
//         of 1..512 bytes), then chunk frames, each either correct or damaged in one field in a
//         way the input chooses, arrive in an order the input chooses. What the assembler
//         accepts must equal the source bytes.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/schema/crc32c.h"
#include "common/transport/weight_frames.h"

namespace {

using strider::Result;
using strider::Status;
namespace wf = strider::transport::weight_frames;

void Require(bool condition) {
  if (!condition) std::abort();
}

void RawFrames(FuzzedDataProvider& input) {
  std::vector<std::string> frames;
  while (input.remaining_bytes() > 0) {
    frames.push_back(input.ConsumeBytesAsString(input.ConsumeIntegral<uint16_t>()));
  }
  for (const std::string& frame : frames) (void)wf::ParseRequest(frame);
  if (frames.empty()) return;
  Result<wf::Manifest> manifest = wf::ParseManifest(frames[0], uint64_t{1} << 20);
  if (!manifest.ok() || manifest->version == 0) return;
  wf::ChunkAssembler assembler(*manifest);
  for (size_t i = 1; i < frames.size() && !assembler.complete(); ++i) {
    if (!assembler.Add(frames[i]).ok()) return;
  }
  if (assembler.complete()) (void)assembler.Finish();
}

void Structured(FuzzedDataProvider& input) {
  const uint32_t chunk_bytes = input.ConsumeIntegralInRange<uint32_t>(1, 512);
  const std::string source = input.ConsumeBytesAsString(input.ConsumeIntegralInRange(0, 4096));
  wf::Manifest manifest;
  manifest.version = input.ConsumeIntegralInRange<uint64_t>(1, 1000);
  manifest.total_bytes = source.size();
  manifest.chunk_bytes = chunk_bytes;
  manifest.chunks = static_cast<uint32_t>((source.size() + chunk_bytes - 1) / chunk_bytes);
  manifest.crc32c = strider::schema::Crc32c(source);
  manifest.metadata = input.ConsumeRandomLengthString(64);
  Result<wf::Manifest> parsed = wf::ParseManifest(wf::ManifestFrame(manifest), 4096);
  Require(parsed.ok() && parsed->chunks == manifest.chunks && parsed->crc32c == manifest.crc32c);

  wf::ChunkAssembler assembler(*parsed);
  bool damaged_accepted = false;
  while (!assembler.complete() && input.remaining_bytes() > 0) {
    const uint32_t index = input.ConsumeIntegralInRange<uint32_t>(0, manifest.chunks);
    const size_t begin = size_t{index} * chunk_bytes;
    std::string chunk = begin < source.size() ? source.substr(begin, chunk_bytes) : "";
    std::string frame = wf::ChunkFrame(manifest.version, index, chunk);
    const int damage = input.ConsumeIntegralInRange(0, 5);
    const bool silent = damage == 1 && chunk.empty();  // nothing to flip
    switch (damage) {
      case 1:  // one payload bit: the chunk's CRC32C must catch it
        if (!chunk.empty()) {
          const size_t at = input.ConsumeIntegralInRange<size_t>(0, chunk.size() - 1);
          frame[frame.size() - chunk.size() + at] ^=
              static_cast<char>(1 << input.ConsumeIntegralInRange(0, 7));
        }
        break;
      case 2:  // another version
        frame = wf::ChunkFrame(manifest.version + 1, index, chunk);
        break;
      case 3:  // truncated
        frame.resize(input.ConsumeIntegralInRange<size_t>(0, frame.size() - 1));
        break;
      case 4:  // gone
        frame = wf::GoneFrame(manifest.version);
        break;
      default:
        break;
    }
    const Status added = assembler.Add(frame);
    const bool intact = damage == 0 || damage == 5 || silent;
    if (intact && index < manifest.chunks) {
      Require(added.ok());
    } else if (added.ok()) {
      damaged_accepted = true;
    }
    if (!added.ok()) {
      Require(damage == 4 ? added.code() == strider::StatusCode::kUnavailable : added.IsCorruption());
    }
  }
  Require(!damaged_accepted);
  if (!assembler.complete()) return;
  Result<strider::transport::WeightUpdate> update = assembler.Finish();
  Require(update.ok() && update->bytes == source && update->version == manifest.version &&
          update->metadata == manifest.metadata);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  if (input.ConsumeIntegral<uint8_t>() % 2 == 0) {
    RawFrames(input);
  } else {
    Structured(input);
  }
  return 0;
}
