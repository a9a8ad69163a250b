// A small file system for disk-full tests: a tmpfs of a given size, mounted under a temporary
// directory, filled with a ballast file whose removal gives the space back. Mounting needs
// CAP_SYS_ADMIN; without it, tests skip with a message.
#pragma once

#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace strider::testing {

class SmallDisk {
 public:
  // Mounts `bytes` of tmpfs at `path` (created); error() says why not.
  SmallDisk(const std::string& path, uint64_t bytes) : path_(path) {
    std::error_code ignored;
    std::filesystem::create_directories(path_, ignored);
    const std::string options = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", path_.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      error_ = "cannot mount a tmpfs (needs CAP_SYS_ADMIN): " + std::string(std::strerror(errno));
    } else {
      mounted_ = true;
    }
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  // Fills what is free with a file of zeros, so the next write finds no space.
  void Fill(const std::string& name) {
    const std::string file = path_ + "/" + name;
    FILE* f = std::fopen(file.c_str(), "wb");
    if (f == nullptr) return;
    static char block[1 << 16] = {};
    while (std::fwrite(block, 1, sizeof(block), f) == sizeof(block)) {
    }
    std::fclose(f);
  }

 private:
  std::string path_;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace strider::testing
