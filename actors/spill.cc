#include "actors/spill.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/durable_file.h"

namespace strider::actors {
namespace {

namespace fs = std::filesystem;

Status Errno(const std::string& what) {
  return Status::IoError(what + ": " + std::strerror(errno));
}

Status WriteFileAtomically(const std::string& dir, const std::string& name,
                           std::string_view bytes) {
  // Its temporary is a hidden "*.tmp" file, which Open deletes if a crash left one.
  return WriteFileDurably(fs::path(dir) / name, bytes).WithContext("spill");
}

// "<sequence>-<hex>-<index>.seg" -> sequence and key.
bool ParseName(const std::string& name, uint64_t* sequence, schema::SegmentKey* key) {
  if (name.size() < 4 || name.substr(name.size() - 4) != ".seg") return false;
  const std::string stem = name.substr(0, name.size() - 4);
  const size_t first = stem.find('-');
  const size_t second = stem.rfind('-');
  if (first == std::string::npos || second == first) return false;
  try {
    *sequence = std::stoull(stem.substr(0, first));
    key->index = static_cast<uint32_t>(std::stoul(stem.substr(second + 1)));
  } catch (...) {
    return false;
  }
  Result<schema::TrajectoryId> id =
      schema::TrajectoryId::FromHex(stem.substr(first + 1, second - first - 1));
  if (!id.ok()) return false;
  key->trajectory = *id;
  return true;
}

}  // namespace

Result<SpillDirectory> SpillDirectory::Open(const std::string& dir, uint64_t max_bytes) {
  if (dir.empty()) return Status::InvalidArgument("spill: the directory path is empty");
  if (max_bytes == 0) return Status::InvalidArgument("spill: max_bytes must be > 0");
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return Status::IoError("spill: cannot create " + dir + ": " + error.message());
  SpillDirectory spill(dir, max_bytes);
  std::vector<std::pair<uint64_t, SpilledSegment>> found;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (!name.empty() && name[0] == '.' && name.size() > 4 &&
        name.substr(name.size() - 4) == ".tmp") {
      fs::remove(entry.path(), error);  // a write that never completed
      continue;
    }
    uint64_t sequence = 0;
    SpilledSegment segment;
    if (!entry.is_regular_file() || !ParseName(name, &sequence, &segment.key)) continue;
    segment.path = entry.path().string();
    segment.bytes = entry.file_size();
    found.emplace_back(sequence, segment);
  }
  if (error) return Status::IoError("spill: cannot list " + dir + ": " + error.message());
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [sequence, segment] : found) {
    spill.next_sequence_ = std::max(spill.next_sequence_, sequence + 1);
    spill.bytes_ += segment.bytes;
    spill.segments_.push_back(std::move(segment));
  }
  return spill;
}

bool SpillDirectory::Has(const schema::SegmentKey& key) const {
  return std::any_of(segments_.begin(), segments_.end(),
                     [&](const SpilledSegment& s) { return s.key == key; });
}

Status SpillDirectory::Put(const schema::SegmentKey& key, std::string_view frame) {
  if (Has(key)) return Status::Ok();  // the same segment, already safe on disk
  if (bytes_ + frame.size() > max_bytes_) {
    return Status::ResourceExhausted("spill: " + dir_ + " holds " + std::to_string(bytes_) +
                                     " bytes; " + std::to_string(frame.size()) +
                                     " more would cross its bound of " +
                                     std::to_string(max_bytes_));
  }
  char sequence[24];
  std::snprintf(sequence, sizeof(sequence), "%012llu",
                static_cast<unsigned long long>(next_sequence_));
  const std::string name =
      std::string(sequence) + "-" + key.trajectory.Hex() + "-" + std::to_string(key.index) + ".seg";
  STRIDER_RETURN_IF_ERROR(WriteFileAtomically(dir_, name, frame));
  ++next_sequence_;
  bytes_ += frame.size();
  segments_.push_back({dir_ + "/" + name, key, frame.size()});
  return Status::Ok();
}

Result<std::string> SpillDirectory::Read(const SpilledSegment& segment) {
  std::ifstream in(segment.path, std::ios::binary);
  if (!in) return Status::IoError("spill: cannot open " + segment.path);
  std::string frame((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Status check = schema::CheckEnvelope(frame);
  if (!check.ok()) {
    // Keep the bytes for a person to look at, out of the way of the sender.
    const Status moved = RenameDurably(segment.path, segment.path + ".corrupt");
    bytes_ -= std::min(bytes_, segment.bytes);
    const std::string path = segment.path;
    segments_.erase(std::remove_if(segments_.begin(), segments_.end(),
                                   [&](const SpilledSegment& s) { return s.path == path; }),
                    segments_.end());
    return Status::Corruption("spill: " + path + " fails its envelope checks (" + check.message() +
                              (moved.ok() ? "); renamed to .corrupt"
                                          : "); renaming it to .corrupt failed: " + moved.ToString()));
  }
  return frame;
}

Status SpillDirectory::Remove(const schema::SegmentKey& key) {
  auto it = std::find_if(segments_.begin(), segments_.end(),
                         [&](const SpilledSegment& s) { return s.key == key; });
  if (it == segments_.end()) return Status::Ok();
  if (::unlink(it->path.c_str()) != 0 && errno != ENOENT) {
    return Errno("spill: cannot delete " + it->path);
  }
  bytes_ -= std::min(bytes_, it->bytes);
  segments_.erase(it);
  return Status::Ok();
}

}  // namespace strider::actors
