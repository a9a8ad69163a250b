#include "common/durable_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "common/file_closer.h"

namespace strider {
namespace {

namespace fs = std::filesystem;

std::string ErrnoText(int error) { return std::strerror(error); }

// The directory holding `path`'s entry: "." for a bare file name.
fs::path DirectoryOf(const fs::path& path) {
  return path.has_parent_path() ? path.parent_path() : fs::path(".");
}

Status FsyncOpened(const fs::path& path, int flags, std::string_view what) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) {
    return Status::IoError(
        fmt::format("{}: cannot open {} to sync it: {}", path.string(), what, ErrnoText(errno)));
  }
  FileCloser closer(fd);
  if (::fsync(fd) != 0) {
    return Status::IoError(
        fmt::format("{}: fsync of {} failed: {}", path.string(), what, ErrnoText(errno)));
  }
  return Status::Ok();
}

Status WriteAll(int fd, std::string_view bytes, const fs::path& file) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(fmt::format("{}: write failed: {}", file.string(), ErrnoText(errno)));
    }
    bytes.remove_prefix(static_cast<size_t>(written));
  }
  return Status::Ok();
}

}  // namespace

Status FsyncDirectory(const fs::path& directory) {
  return FsyncOpened(directory, O_RDONLY | O_DIRECTORY, "directory");
}

Status FsyncPath(const fs::path& path) { return FsyncOpened(path, O_RDONLY, "file"); }

Status WriteFileDurablyStreamed(const fs::path& path,
                                const std::function<Status(const FileAppender& append)>& write,
                                std::optional<mode_t> exact_mode) {
  const std::string target = path.string();
  if (!path.has_filename()) {
    return Status::InvalidArgument(fmt::format("{}: not a file path", target));
  }
  // Beside the target, so the rename stays on one filesystem and is atomic.
  static std::atomic<uint64_t> counter{0};
  const fs::path temporary =
      DirectoryOf(path) / fmt::format(".{}.{}.{}.tmp", path.filename().string(),
                                      static_cast<long>(::getpid()), counter.fetch_add(1));
  // With an exact mode, created owner-only (the umask can only narrow that) and then set.
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                        exact_mode.has_value() ? 0600 : 0644);
  if (fd < 0) {
    return Status::IoError(fmt::format("{}: cannot create temporary file {}: {}", target,
                                       temporary.string(), ErrnoText(errno)));
  }
  FileCloser closer(fd);
  auto fail = [&](const Status& status) {
    closer.Close();
    ::unlink(temporary.c_str());
    return status.WithContext(target);
  };
  if (exact_mode.has_value() && ::fchmod(fd, *exact_mode) != 0) {
    return fail(Status::IoError(fmt::format("{}: cannot set mode {:o}: {}", temporary.string(),
                                            *exact_mode, ErrnoText(errno))));
  }
  const FileAppender append = [&](std::string_view bytes) {
    return WriteAll(fd, bytes, temporary);
  };
  Status written;
  try {
    written = write(append);
  } catch (...) {
    // The writer's exception is its caller's to handle; the temporary is ours to remove.
    closer.Close();
    ::unlink(temporary.c_str());
    throw;
  }
  if (!written.ok()) return fail(written);
  if (::fsync(fd) != 0) {
    return fail(Status::IoError(
        fmt::format("{}: fsync failed: {}", temporary.string(), ErrnoText(errno))));
  }
  if (closer.Close() != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    return Status::IoError(
        fmt::format("{}: close of {} failed: {}", target, temporary.string(), ErrnoText(error)));
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    return Status::IoError(fmt::format("{}: cannot rename {} over it: {}", target,
                                       temporary.string(), ErrnoText(error)));
  }
  // The rename is durable only once the directory entry is.
  return FsyncDirectory(DirectoryOf(path)).WithContext(target);
}

Status WriteFileDurably(const fs::path& path, std::string_view contents,
                        std::optional<mode_t> exact_mode) {
  return WriteFileDurablyStreamed(
      path, [contents](const FileAppender& append) { return append(contents); }, exact_mode);
}

Status RenameDurably(const fs::path& from, const fs::path& to) {
  // Syncing the source first means the new name can never point at data still only in cache.
  STRIDER_RETURN_IF_ERROR(FsyncPath(from));
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return Status::IoError(fmt::format("{}: cannot rename {} to it: {}", to.string(),
                                       from.string(), ErrnoText(errno)));
  }
  const fs::path to_directory = DirectoryOf(to);
  STRIDER_RETURN_IF_ERROR(FsyncDirectory(to_directory).WithContext(to.string()));
  const fs::path from_directory = DirectoryOf(from);
  std::error_code error;
  if (!fs::equivalent(from_directory, to_directory, error)) {
    STRIDER_RETURN_IF_ERROR(FsyncDirectory(from_directory).WithContext(from.string()));
  }
  return Status::Ok();
}

}  // namespace strider
