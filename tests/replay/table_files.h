// The store's table files, for tests that damage one on disk.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

namespace strider::testing {

// The largest table file (.sst) in `db`, empty when it has none: the one most likely to hold
// data blocks a start does not otherwise open.
inline std::filesystem::path LargestTableFile(const std::string& db) {
  std::filesystem::path largest;
  for (const auto& entry : std::filesystem::directory_iterator(db)) {
    if (entry.path().extension() == ".sst" &&
        (largest.empty() || entry.file_size() > std::filesystem::file_size(largest))) {
      largest = entry.path();
    }
  }
  return largest;
}

// XORs the byte at `at` of `path` with `mask`, in place.
inline void FlipByte(const std::filesystem::path& path, std::streamoff at, char mask) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(at);
  const char byte = static_cast<char>(file.peek());
  file.seekp(at);
  file.put(static_cast<char>(byte ^ mask));
}

}  // namespace strider::testing
