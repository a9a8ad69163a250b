#include "learner/pretrain/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/durable_file.h"
#include "common/schema/crc32c.h"

namespace strider::data {
namespace {

void PutU32(uint8_t* at, uint32_t value) { std::memcpy(at, &value, 4); }
void PutU64(uint8_t* at, uint64_t value) { std::memcpy(at, &value, 8); }
uint32_t GetU32(const uint8_t* at) {
  uint32_t value;
  std::memcpy(&value, at, 4);
  return value;
}
uint64_t GetU64(const uint8_t* at) {
  uint64_t value;
  std::memcpy(&value, at, 8);
  return value;
}

std::string Errno(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

}  // namespace

std::string ShardFileName(int64_t index) {
  char name[32];
  std::snprintf(name, sizeof(name), "part-%05lld.shard", static_cast<long long>(index));
  return name;
}

Status ShardWriter::Add(const std::vector<int32_t>& tokens) {
  const int32_t limit = token_bytes_ == 2 ? 65535 : INT32_MAX;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > limit) {
      return Status::InvalidArgument("token " + std::to_string(tokens[i]) + " at position " +
                                     std::to_string(i) + " does not fit a " +
                                     std::to_string(token_bytes_) + "-byte shard");
    }
  }
  offsets_.push_back(tokens_.size());
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  return Status::Ok();
}

Status ShardWriter::Write(const std::string& path) {
  if (token_bytes_ != 2 && token_bytes_ != 4) {
    return Status::InvalidArgument("shard token width must be 2 or 4 bytes");
  }
  const uint64_t documents = offsets_.size();
  const uint64_t count = tokens_.size();
  const size_t table_bytes = 8 * (documents + 1);
  std::vector<uint8_t> bytes(kShardHeaderBytes + table_bytes + count * token_bytes_, 0);
  uint8_t* header = bytes.data();
  std::memcpy(header, kShardMagic, 8);
  PutU32(header + 8, kShardVersion);
  PutU32(header + 12, static_cast<uint32_t>(token_bytes_));
  PutU64(header + 16, documents);
  PutU64(header + 24, count);
  PutU64(header + 36, id_space_);
  uint8_t* table = header + kShardHeaderBytes;
  for (uint64_t i = 0; i < documents; ++i) PutU64(table + 8 * i, offsets_[i]);
  PutU64(table + 8 * documents, count);
  uint8_t* data = table + table_bytes;
  for (uint64_t i = 0; i < count; ++i) {
    if (token_bytes_ == 2) {
      const uint16_t value = static_cast<uint16_t>(tokens_[i]);
      std::memcpy(data + 2 * i, &value, 2);
    } else {
      std::memcpy(data + 4 * i, &tokens_[i], 4);
    }
  }
  PutU32(header + 32, schema::Crc32c(table, bytes.size() - kShardHeaderBytes));
  PutU32(header + 60, schema::Crc32c(header, 60));

  STRIDER_RETURN_IF_ERROR(WriteFileDurably(
      path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  offsets_.clear();
  tokens_.clear();
  return Status::Ok();
}

Result<std::unique_ptr<Shard>> Shard::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return Status::NotFound(Errno("cannot open shard", path));
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    const Status status = Status::IoError(Errno("cannot stat shard", path));
    ::close(fd);
    return status;
  }
  const size_t size = static_cast<size_t>(info.st_size);
  auto corrupt = [&](size_t offset, const std::string& problem) {
    return Status::Corruption("shard " + path + " at byte offset " + std::to_string(offset) +
                              ": " + problem);
  };
  if (size < kShardHeaderBytes) {
    ::close(fd);
    return corrupt(size, "truncated: " + std::to_string(size) + " bytes, shorter than the " +
                             std::to_string(kShardHeaderBytes) + "-byte header");
  }
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file open
  if (mapped == MAP_FAILED) return Status::IoError(Errno("cannot map shard", path));
  std::unique_ptr<Shard> shard(new Shard());
  shard->path_ = path;
  shard->base_ = static_cast<const uint8_t*>(mapped);
  shard->size_ = size;
  const uint8_t* header = shard->base_;

  if (std::memcmp(header, kShardMagic, 8) != 0) return corrupt(0, "bad magic, not a shard");
  if (GetU32(header + 60) != schema::Crc32c(header, 60)) {
    return corrupt(60, "header checksum mismatch");
  }
  const uint32_t version = GetU32(header + 8);
  if (version != kShardVersion) {
    return corrupt(8, "unsupported version " + std::to_string(version) + " (this build reads " +
                          std::to_string(kShardVersion) + ")");
  }
  const uint32_t token_bytes = GetU32(header + 12);
  if (token_bytes != 2 && token_bytes != 4) {
    return corrupt(12, "token width " + std::to_string(token_bytes) + " is not 2 or 4");
  }
  const uint64_t documents = GetU64(header + 16);
  const uint64_t count = GetU64(header + 24);
  // Bound the counts before multiplying so a corrupt header cannot overflow the size check.
  if (documents > size || count > size) return corrupt(16, "counts exceed the file size");
  const uint64_t expected = kShardHeaderBytes + 8 * (documents + 1) + count * token_bytes;
  if (size < expected) {
    return corrupt(size, "truncated: " + std::to_string(size) + " bytes, the header describes " +
                             std::to_string(expected));
  }
  if (size > expected) {
    return corrupt(expected, std::to_string(size - expected) + " trailing bytes after the tokens");
  }
  const uint8_t* table = header + kShardHeaderBytes;
  if (GetU32(header + 32) != schema::Crc32c(table, size - kShardHeaderBytes)) {
    // Find the first offset entry that breaks the table's invariants to point at the damage when
    // possible; otherwise the damage is in the token bytes.
    uint64_t previous = 0;
    for (uint64_t i = 0; i <= documents; ++i) {
      const uint64_t offset = GetU64(table + 8 * i);
      if (offset < previous || offset > count || (i == 0 && offset != 0) ||
          (i == documents && offset != count)) {
        return corrupt(kShardHeaderBytes + 8 * i, "offsets table entry " + std::to_string(i) +
                                                      " is invalid (checksum mismatch)");
      }
      previous = offset;
    }
    return corrupt(kShardHeaderBytes + 8 * (documents + 1),
                   "checksum mismatch in the token data");
  }
  uint64_t previous = 0;
  for (uint64_t i = 0; i <= documents; ++i) {
    const uint64_t offset = GetU64(table + 8 * i);
    if (offset < previous || offset > count || (i == 0 && offset != 0) ||
        (i == documents && offset != count)) {
      return corrupt(kShardHeaderBytes + 8 * i,
                     "offsets table entry " + std::to_string(i) + " is invalid");
    }
    previous = offset;
  }
  shard->token_bytes_ = static_cast<int>(token_bytes);
  shard->documents_ = static_cast<int64_t>(documents);
  shard->tokens_ = static_cast<int64_t>(count);
  shard->id_space_ = GetU64(header + 36);
  shard->offsets_ = table;
  shard->data_ = table + 8 * (documents + 1);
  return shard;
}

Shard::~Shard() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

int64_t Shard::DocumentLength(int64_t document) const {
  return static_cast<int64_t>(GetU64(offsets_ + 8 * (document + 1)) -
                              GetU64(offsets_ + 8 * document));
}

void Shard::CopyTokens(int64_t document, int64_t begin, int64_t end, int32_t* out) const {
  assert(document >= 0 && document < documents_ && begin >= 0 && begin <= end &&
         end <= DocumentLength(document));
  const uint64_t first = GetU64(offsets_ + 8 * document) + static_cast<uint64_t>(begin);
  const int64_t n = end - begin;
  if (token_bytes_ == 2) {
    const uint8_t* at = data_ + 2 * first;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t value;
      std::memcpy(&value, at + 2 * i, 2);
      out[i] = value;
    }
  } else {
    std::memcpy(out, data_ + 4 * first, static_cast<size_t>(n) * 4);
  }
}

std::vector<int32_t> Shard::Document(int64_t document) const {
  std::vector<int32_t> tokens(DocumentLength(document));
  CopyTokens(document, 0, static_cast<int64_t>(tokens.size()), tokens.data());
  return tokens;
}

Result<std::vector<std::unique_ptr<Shard>>> OpenShardDirectory(const std::string& directory) {
  std::error_code error;
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    if (entry.path().extension() == ".shard") paths.push_back(entry.path().string());
  }
  if (error) {
    return Status::NotFound("cannot list shard directory " + directory + ": " + error.message());
  }
  if (paths.empty()) return Status::NotFound("no *.shard files in " + directory);
  std::sort(paths.begin(), paths.end());
  std::vector<std::unique_ptr<Shard>> shards;
  for (const std::string& path : paths) {
    STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Shard> shard, Shard::Open(path));
    shards.push_back(std::move(shard));
  }
  return shards;
}

}  // namespace strider::data
