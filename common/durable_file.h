// Files that survive a crash whole or not at all.
//
// Every file Strider writes for a later run to read (weights, checkpoints, spilled segments,
// shards, keys, reports, run records) goes through here, so one sequence is right once: write a
// temporary beside the target, fsync it, rename it over the target, fsync the directory. A
// reader, or a run after a power loss, then sees either the previous contents or the new ones,
// never a prefix, and once the call returns OK the new contents are on disk. This is the only
// place in the tree that renames files.
//
// Temporaries are named ".<target name>.<pid>.<n>.tmp" in the target's directory: hidden from
// listings that look for the target's pattern, unique per process and call so concurrent writers
// of one path do not share one, and removed on every failure this process sees, an exception
// thrown by a streamed write's callback included. A crash can leave one behind; a component that
// lists its own directory may delete hidden "*.tmp" files it finds. The temporary's name is
// longer than the target's (by a leading dot and ".<pid>.<n>.tmp", nine bytes at least), so a
// target whose name is that close to the filesystem's limit (NAME_MAX, 255 bytes on most) cannot
// be written: creating the temporary fails with "File name too long".
//
// Thread-safe: calls share no state but an atomic counter. Writers of the same path race like
// renames do: the last rename wins, and each reader sees one writer's whole file.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string_view>

#include "common/status.h"

namespace strider {

// Replaces `path` with `contents` atomically and durably. The Status names `path` on failure, and
// no temporary is left. On every failure but the last step's, `path` keeps what it held (or stays
// absent). The last step, the fsync of the directory, comes after the rename: when it fails,
// `path` already holds the new contents, but the rename may not survive a power loss, after which
// `path` may again hold what it held before. Retrying the write is safe; a caller that reports the
// failure must not claim the old contents are still there.
//
// The new file gets 0644 less the umask, as open(2) gives, or exactly `exact_mode` when set: that
// mode is applied before any byte is written, so a secret is never readable by others.
Status WriteFileDurably(const std::filesystem::path& path, std::string_view contents,
                        std::optional<mode_t> exact_mode = std::nullopt);

// Appends bytes to the temporary file being written; fails with a Status naming that file.
using FileAppender = std::function<Status(std::string_view bytes)>;

// WriteFileDurably for contents produced piece by piece, when holding them in one buffer would
// cost too much memory (a weights file is its tensors' bytes). `write` is called once with an
// appender; an error it returns aborts the write as a failed append would. An exception it throws
// removes the temporary and passes on to the caller; `path` keeps what it held.
Status WriteFileDurablyStreamed(const std::filesystem::path& path,
                                const std::function<Status(const FileAppender& append)>& write,
                                std::optional<mode_t> exact_mode = std::nullopt);

// Renames `from` (a file or a directory whose contents the caller has already synced) to `to`
// durably: fsyncs `from`, renames, then fsyncs the directories whose entries changed. As
// rename(2), replaces a file `to` or an empty directory `to`.
Status RenameDurably(const std::filesystem::path& from, const std::filesystem::path& to);

// Flushes a directory's entries (creations, renames, removals within it) to disk.
Status FsyncDirectory(const std::filesystem::path& directory);

// Flushes a file's or a directory's contents to disk, for writers that fill a directory and then
// rename the whole of it.
Status FsyncPath(const std::filesystem::path& path);

}  // namespace strider
