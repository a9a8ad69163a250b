#include "common/transport/weight_frames.h"

#include <algorithm>
#include <cstring>

#include "common/schema/crc32c.h"

namespace strider::transport::weight_frames {
namespace {

constexpr uint32_t kMagic = 0x57525453;  // "STRW" little-endian
constexpr uint16_t kProtocol = 1;

class Writer {
 public:
  explicit Writer(Kind kind) {
    Put(kMagic);
    Put(kProtocol);
    Put(static_cast<uint8_t>(kind));
  }
  template <typename T>
  Writer& Put(T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out_.append(bytes, sizeof(T));
    return *this;
  }
  Writer& PutBytes(std::string_view bytes) {
    Put(static_cast<uint32_t>(bytes.size()));
    out_.append(bytes);
    return *this;
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Every read checks the bytes left first, so a short frame fails instead of reading past it.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool Get(T* value) {
    if (bytes_.size() - offset_ < sizeof(T)) return false;
    std::memcpy(value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }
  bool GetBytes(std::string_view* out) {
    uint32_t length = 0;
    if (!Get(&length) || bytes_.size() - offset_ < length) return false;
    *out = bytes_.substr(offset_, length);
    offset_ += length;
    return true;
  }
  // Checks magic and protocol and returns the kind byte, or 0.
  uint8_t Header() {
    uint32_t magic = 0;
    uint16_t protocol = 0;
    uint8_t kind = 0;
    if (!Get(&magic) || !Get(&protocol) || !Get(&kind)) return 0;
    if (magic != kMagic || protocol != kProtocol) return 0;
    return kind;
  }

 private:
  std::string_view bytes_;
  size_t offset_ = 0;
};

constexpr uint8_t Code(Kind kind) { return static_cast<uint8_t>(kind); }

}  // namespace

std::string QueryFrame(uint64_t have_version) {
  return Writer(Kind::kQuery).Put(have_version).Take();
}

std::string ChunkRequestFrame(uint64_t version, uint32_t index) {
  return Writer(Kind::kChunkRequest).Put(version).Put(index).Take();
}

std::string ManifestFrame(const Manifest& manifest) {
  return Writer(Kind::kManifest)
      .Put(manifest.version)
      .Put(manifest.total_bytes)
      .Put(manifest.chunk_bytes)
      .Put(manifest.chunks)
      .Put(manifest.crc32c)
      .PutBytes(manifest.metadata)
      .Take();
}

std::string ChunkFrame(uint64_t version, uint32_t index, std::string_view chunk) {
  return Writer(Kind::kChunk)
      .Put(version)
      .Put(index)
      .Put(schema::Crc32c(chunk))
      .PutBytes(chunk)
      .Take();
}

std::string GoneFrame(uint64_t version) { return Writer(Kind::kGone).Put(version).Take(); }

std::optional<Request> ParseRequest(std::string_view frame) {
  Reader reader(frame);
  const uint8_t kind = reader.Header();
  Request request;
  if (kind == Code(Kind::kQuery)) {
    if (!reader.Get(&request.version)) return std::nullopt;
    request.kind = Kind::kQuery;
    return request;
  }
  if (kind == Code(Kind::kChunkRequest)) {
    if (!reader.Get(&request.version) || !reader.Get(&request.index)) return std::nullopt;
    request.kind = Kind::kChunkRequest;
    return request;
  }
  return std::nullopt;
}

Result<Manifest> ParseManifest(std::string_view frame, uint64_t max_total_bytes) {
  Reader reader(frame);
  Manifest manifest;
  std::string_view metadata;
  if (reader.Header() != Code(Kind::kManifest) || !reader.Get(&manifest.version) ||
      !reader.Get(&manifest.total_bytes) || !reader.Get(&manifest.chunk_bytes) ||
      !reader.Get(&manifest.chunks) || !reader.Get(&manifest.crc32c) ||
      !reader.GetBytes(&metadata)) {
    return Status::Corruption("weight stream: malformed manifest");
  }
  manifest.metadata = std::string(metadata);
  if (manifest.version == 0) return manifest;
  if (manifest.total_bytes > max_total_bytes || manifest.chunk_bytes == 0 ||
      uint64_t{manifest.chunks} !=
          (manifest.total_bytes + manifest.chunk_bytes - 1) / manifest.chunk_bytes) {
    return Status::Corruption(
        "weight stream: manifest of version " + std::to_string(manifest.version) +
        " is inconsistent (" + std::to_string(manifest.total_bytes) + " bytes, " +
        std::to_string(manifest.chunks) + " chunks of " + std::to_string(manifest.chunk_bytes) +
        (manifest.total_bytes > max_total_bytes
             ? ", over the limit of " + std::to_string(max_total_bytes) + " bytes)"
             : ")"));
  }
  return manifest;
}

ChunkAssembler::ChunkAssembler(Manifest manifest)
    : manifest_(std::move(manifest)),
      bytes_(manifest_.total_bytes, '\0'),
      have_(manifest_.chunks, false) {}

Status ChunkAssembler::Add(std::string_view frame) {
  Reader reader(frame);
  const uint8_t kind = reader.Header();
  if (kind == Code(Kind::kGone)) {
    return Status::Unavailable("weight stream: version " + std::to_string(manifest_.version) +
                               " was replaced while it was being fetched");
  }
  uint64_t version = 0;
  uint32_t index = 0, crc = 0;
  std::string_view bytes;
  if (kind != Code(Kind::kChunk) || !reader.Get(&version) || !reader.Get(&index) ||
      !reader.Get(&crc) || !reader.GetBytes(&bytes) || version != manifest_.version ||
      index >= manifest_.chunks) {
    return Status::Corruption("weight stream: malformed chunk reply for version " +
                              std::to_string(manifest_.version));
  }
  const uint64_t begin = uint64_t{index} * manifest_.chunk_bytes;
  const uint64_t expected = std::min<uint64_t>(manifest_.chunk_bytes, manifest_.total_bytes - begin);
  if (bytes.size() != expected || schema::Crc32c(bytes) != crc) {
    return Status::Corruption("weight stream: chunk " + std::to_string(index) + " of version " +
                              std::to_string(manifest_.version) + " fails its checksum or length");
  }
  if (have_[index]) return Status::Ok();
  std::memcpy(bytes_.data() + begin, bytes.data(), bytes.size());
  have_[index] = true;
  ++received_;
  // Replies usually come in request order on one socket: the whole's CRC then runs along with
  // them, and is computed over the assembled bytes only when they came otherwise.
  if (in_order_ && index == received_ - 1) {
    running_crc_ = schema::Crc32c(bytes.data(), bytes.size(), running_crc_);
  } else {
    in_order_ = false;
  }
  return Status::Ok();
}

Result<WeightUpdate> ChunkAssembler::Finish() {
  if (!complete()) {
    return Status::FailedPrecondition("weight stream: version " +
                                      std::to_string(manifest_.version) + " is incomplete");
  }
  const uint32_t whole = in_order_ ? running_crc_ : schema::Crc32c(bytes_.data(), bytes_.size());
  if (whole != manifest_.crc32c) {
    return Status::Corruption("weight stream: version " + std::to_string(manifest_.version) +
                              " fails the checksum of the whole");
  }
  WeightUpdate update;
  update.version = manifest_.version;
  update.bytes = std::move(bytes_);
  update.metadata = std::move(manifest_.metadata);
  return update;
}

}  // namespace strider::transport::weight_frames
