// Scratch directories for a test program: <system temp>/<name>_<pid>, emptied when made and
// removed when the program exits, so a suite run repeated all day leaves nothing behind (the
// pretraining tests' runs are tens of megabytes each). STRIDER_KEEP_TEST_FILES=1 keeps them, to
// read what a failed test wrote. Header-only, like free_port.h.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace strider::testing {

class ScratchDirs {
 public:
  static ScratchDirs& Get() {
    static ScratchDirs dirs;
    return dirs;
  }

  std::string Make(const std::string& name) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
    std::error_code ignored;
    fs::remove_all(dir, ignored);
    fs::create_directories(dir);
    std::lock_guard<std::mutex> lock(mutex_);
    made_.push_back(dir.string());
    return dir.string();
  }

  ~ScratchDirs() {
    // A forked child that returns through exit() must not remove its parent's directories.
    if (::getpid() != owner_) return;
    const char* keep = std::getenv("STRIDER_KEEP_TEST_FILES");
    if (keep != nullptr && std::string(keep) == "1") return;
    std::error_code ignored;
    for (const std::string& dir : made_) std::filesystem::remove_all(dir, ignored);
  }

 private:
  ScratchDirs() : owner_(::getpid()) {}

  const pid_t owner_;
  std::mutex mutex_;
  std::vector<std::string> made_;
};

inline std::string ScratchDir(const std::string& name) { return ScratchDirs::Get().Make(name); }

}  // namespace strider::testing
