// Token shards: the on-disk form of pretraining data, written by `strider data build` and read
// by the pretraining data pipeline through a memory map.
//
// Format, version 1 (all integers little-endian):
//
//   offset  size  field
//   0       8     magic "STRDSHRD"
//   8       4     version (1)
//   12      4     token dtype: 2 = uint16, 4 = int32 (bytes per token)
//   16      8     document count D
//   24      8     token count N
//   32      4     CRC32C of bytes [64, end of tokens): the offsets table and the tokens
//   36      8     id space: 0 for the byte format, else the fingerprint of the tokenizer whose
//                  ids these are (data::IdSpace, builder.h), so a model's corpus cannot mix them
//   44      16    reserved, zero
//   60      4     CRC32C of bytes [0, 60): the header itself
//   64      8(D+1) offsets table: offsets[i] is document i's first token; offsets[0] = 0,
//                  offsets[D] = N, non-decreasing
//   ...     N*w   tokens, documents back to back
//
// Nothing follows the tokens, so a file's size is exactly 64 + 8 (D + 1) + N w: a truncated
// file is detected before any token is read, and every error names the file and the byte offset
// at fault. uint16 is used whenever every id fits (the byte-level vocabulary has 288 ids), which
// halves the bytes read per token.
//
// No LibTorch here: data tools and tests link this without the model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace strider::data {

inline constexpr char kShardMagic[8] = {'S', 'T', 'R', 'D', 'S', 'H', 'R', 'D'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;

// Collects documents in memory and writes one shard atomically (temporary file, fsync, rename).
class ShardWriter {
 public:
  // `token_bytes` is 2 or 4; 2 requires every id to be in [0, 65535]. `id_space`: see the
  // header's field (0: the byte format).
  explicit ShardWriter(int token_bytes = 2, uint64_t id_space = 0)
      : token_bytes_(token_bytes), id_space_(id_space) {}

  // Appends one document. Fails (and adds nothing) when an id does not fit the dtype.
  Status Add(const std::vector<int32_t>& tokens);
  int64_t documents() const { return static_cast<int64_t>(offsets_.size()); }
  int64_t tokens() const { return static_cast<int64_t>(tokens_.size()); }

  // Writes everything added so far to `path` and clears the writer.
  Status Write(const std::string& path);

 private:
  int token_bytes_;
  uint64_t id_space_;
  std::vector<uint64_t> offsets_;  // start of each document
  std::vector<int32_t> tokens_;
};

// A validated, memory-mapped shard. Open checks the size, header, offsets table and checksum
// before returning, so later reads cannot fail. Thread-compatible: const methods may be called
// concurrently.
class Shard {
 public:
  static Result<std::unique_ptr<Shard>> Open(const std::string& path);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& path() const { return path_; }
  int64_t documents() const { return documents_; }
  int64_t tokens() const { return tokens_; }
  uint64_t id_space() const { return id_space_; }
  int64_t DocumentLength(int64_t document) const;
  // Copies tokens [begin, end) of `document` to `out` (end - begin values). Bounds are the
  // caller's contract (checked with an abort in debug builds only).
  void CopyTokens(int64_t document, int64_t begin, int64_t end, int32_t* out) const;
  std::vector<int32_t> Document(int64_t document) const;

 private:
  Shard() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  int token_bytes_ = 2;
  int64_t documents_ = 0;
  int64_t tokens_ = 0;
  uint64_t id_space_ = 0;
  const uint8_t* offsets_ = nullptr;  // (D + 1) uint64, possibly unaligned
  const uint8_t* data_ = nullptr;
};

// Every "*.shard" file of a directory, in name order, opened and validated.
Result<std::vector<std::unique_ptr<Shard>>> OpenShardDirectory(const std::string& directory);

// Name of the i-th shard file in a directory written by the data builder: "part-00007.shard".
std::string ShardFileName(int64_t index);

}  // namespace strider::data
