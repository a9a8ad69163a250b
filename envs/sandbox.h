// Running untrusted tool code in a child process with limits.
//
// RunSandboxed forks and execs argv in a new process group, inside a scratch directory, with:
//   - RLIMIT_CPU (CPU seconds), RLIMIT_AS (address space), RLIMIT_FSIZE (largest file written),
//     RLIMIT_NOFILE (open descriptors), RLIMIT_CORE = 0;
//   - a wall-clock limit: past it the whole process group gets SIGKILL;
//   - stdout and stderr captured through pipes, each kept up to `output_bytes` (the rest is
//     read and dropped so the child never blocks on a full pipe);
//   - stdin from /dev/null;
//   - where the kernel offers Landlock (Linux 5.13+), no file or directory may be created,
//     written, renamed or removed outside the scratch directory (reads stay allowed). This holds
//     even for root, which setrlimit and file permissions do not stop. `contained` in the result
//     says whether the restriction was in force;
//   - where a pids cgroup can be made (the cgroup v1 pids hierarchy, or cgroup v2 with the pids
//     controller, writable: as root in most containers), at most `processes` tasks at once, and
//     every task in that cgroup is killed when the run ends, even ones that left the process
//     group. `process_cap` in the result says whether the cap was in force.
// The scratch directory is created fresh under `scratch_parent` and removed afterwards unless
// the caller passes its own `scratch_dir` (kept, so a tool can keep files across calls).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace strider::envs {

struct SandboxLimits {
  double cpu_seconds = 2.0;            // RLIMIT_CPU, rounded up to whole seconds
  int64_t memory_bytes = 512LL << 20;  // RLIMIT_AS
  int64_t file_bytes = 1LL << 20;      // RLIMIT_FSIZE
  int64_t open_files = 64;             // RLIMIT_NOFILE
  int64_t wall_ms = 5000;              // SIGKILL of the process group after this
  int64_t output_bytes = 64 * 1024;    // kept of stdout and of stderr, each
  int64_t processes = 64;              // pids cgroup cap (processes and threads); 0: none
};

struct SandboxRequest {
  std::vector<std::string> argv;  // argv[0] is a path or a name looked up in PATH
  // Files written into the scratch directory before the start (name -> content); names are
  // plain file names, no '/'.
  std::vector<std::pair<std::string, std::string>> files;
  std::string scratch_dir;     // use this directory (kept); empty: a fresh one
  std::string scratch_parent;  // where fresh ones go; empty: $TMPDIR or /tmp
  SandboxLimits limits;
};

struct SandboxResult {
  int exit_code = -1;      // when the child exited normally; -1 otherwise
  int signal = 0;          // the signal that killed it, 0 if it exited
  bool timed_out = false;  // killed by the wall-clock limit
  bool cpu_limit = false;  // killed by RLIMIT_CPU (SIGXCPU or SIGKILL after it)
  bool contained = false;  // writes outside the scratch directory were refused (Landlock)
  bool process_cap = false;        // the run was in a pids cgroup capped at limits.processes
  bool process_limit_hit = false;  // a fork or thread was refused at that cap
  bool output_truncated = false;
  std::string stdout_text;
  std::string stderr_text;
  double wall_seconds = 0;

  bool ok() const { return exit_code == 0; }
  // One line for a tool result: "exit 0", "killed by the 2 s CPU limit", "timed out after 5 s".
  std::string Summary(const SandboxLimits& limits) const;
};

// Errors are about the sandbox itself (no scratch directory, fork failed); whatever the child
// does, including crashing or hitting a limit, is a SandboxResult.
Result<SandboxResult> RunSandboxed(const SandboxRequest& request);

// Whether Landlock write containment is available on this kernel.
bool SandboxCanContainWrites();

}  // namespace strider::envs
