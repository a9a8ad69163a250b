// A bounded local directory of encoded segments the replay server has not acknowledged.
//
// When the replay server is unreachable, or grants no credit for too long, the actor's sender
// writes segments here instead of holding them in memory; when the server answers again they
// are sent (oldest first, before anything new) and each file is deleted once its ack arrives.
// An actor that starts finds the files of an earlier run and sends them first, so a crash of
// either side loses nothing that reached this directory.
//
// Files are written atomically (temporary name, fsync, rename, fsync of the directory), so a
// crash leaves whole files only. Names sort in write order: "<sequence>-<trajectory
// hex>-<index>.seg". A file whose envelope fails its checks on reading is renamed to "*.corrupt"
// and reported, never sent and never deleted.
//
// Not thread-safe; the sender thread owns it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/schema/messages.h"
#include "common/status.h"

namespace strider::actors {

struct SpilledSegment {
  std::string path;
  schema::SegmentKey key;
  uint64_t bytes = 0;
};

class SpillDirectory {
 public:
  // Creates `dir` when absent and indexes the segment files already there. `max_bytes` bounds
  // the total size of the files (> 0).
  static Result<SpillDirectory> Open(const std::string& dir, uint64_t max_bytes);

  // Writes one encoded segment. ResourceExhausted when it would cross the bound (nothing is
  // written); IoError when the file system fails.
  Status Put(const schema::SegmentKey& key, std::string_view frame);
  // Spilled segments, oldest first.
  const std::vector<SpilledSegment>& segments() const { return segments_; }
  // The frame of a spilled segment, envelope checked. Corruption (and the file renamed aside)
  // when the bytes fail the checks.
  Result<std::string> Read(const SpilledSegment& segment);
  // Deletes the file of `key` (after the server acknowledged it); OK when there is none.
  Status Remove(const schema::SegmentKey& key);

  uint64_t bytes() const { return bytes_; }
  uint64_t max_bytes() const { return max_bytes_; }
  bool Has(const schema::SegmentKey& key) const;
  const std::string& dir() const { return dir_; }

 private:
  SpillDirectory(std::string dir, uint64_t max_bytes)
      : dir_(std::move(dir)), max_bytes_(max_bytes) {}

  std::string dir_;
  uint64_t max_bytes_ = 0;
  uint64_t bytes_ = 0;
  uint64_t next_sequence_ = 0;
  std::vector<SpilledSegment> segments_;
};

}  // namespace strider::actors
