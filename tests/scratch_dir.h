// Directories for tests, of two lifetimes: ScratchDir(name) for a test program,
// <system temp>/<name>_<pid>, emptied when made and removed when the program exits; TempDir for
// one scope, a fresh <system temp>/strider-test-XXXXXX removed with the object. A suite run
// repeated all day leaves nothing behind (the pretraining tests' runs are tens of megabytes each).
// STRIDER_KEEP_TEST_FILES=1 keeps both, to read what a failed test wrote. Header-only, like
// free_port.h.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace strider::testing {

inline bool KeepTestFiles() {
  const char* keep = std::getenv("STRIDER_KEEP_TEST_FILES");
  return keep != nullptr && std::string(keep) == "1";
}

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
    if (KeepTestFiles()) return;
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

// A directory of its own for one test or fixture, removed with everything in it when the object
// goes away.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "strider-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror(pattern.c_str());
      std::abort();  // no test that asked for it can run
    }
    path_ = pattern;
  }
  ~TempDir() {
    if (KeepTestFiles()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace strider::testing
