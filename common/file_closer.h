// An owned file descriptor for the POSIX file code in common/ (durable writes, weights reads).
#pragma once

#include <unistd.h>

namespace strider {

// Closes a descriptor on every return path. Close() closes early and reports the result, for
// writers where close can be where a failed write shows.
class FileCloser {
 public:
  explicit FileCloser(int fd) : fd_(fd) {}
  FileCloser(const FileCloser&) = delete;
  FileCloser& operator=(const FileCloser&) = delete;
  ~FileCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  int Close() {
    const int result = ::close(fd_);
    fd_ = -1;
    return result;
  }

 private:
  int fd_;
};

}  // namespace strider
