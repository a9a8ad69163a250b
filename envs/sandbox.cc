#include "envs/sandbox.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/landlock.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "common/subprocess.h"

namespace strider::envs {
namespace {

// The syscall numbers are the same on every architecture; older libc headers lack the names.
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

int LandlockAbi() {
  const long abi =
      ::syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return abi < 0 ? 0 : static_cast<int>(abi);
}

// Every right that creates, changes or removes something in the file system.
uint64_t WriteRights(int abi) {
  uint64_t rights = LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR |
                    LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
                    LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
                    LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO |
                    LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM;
#ifdef LANDLOCK_ACCESS_FS_REFER
  if (abi >= 2) rights |= LANDLOCK_ACCESS_FS_REFER;
#endif
#ifdef LANDLOCK_ACCESS_FS_TRUNCATE
  if (abi >= 3) rights |= LANDLOCK_ACCESS_FS_TRUNCATE;
#endif
  return rights;
}

// A ruleset that allows writes beneath `scratch` (and to /dev/null) only; -1 when Landlock is
// unavailable. Built in the parent; the child only calls landlock_restrict_self.
int MakeRuleset(const std::string& scratch) {
  const int abi = LandlockAbi();
  if (abi <= 0) return -1;
  landlock_ruleset_attr attr{};
  attr.handled_access_fs = WriteRights(abi);
  const int ruleset =
      static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, sizeof(attr), 0));
  if (ruleset < 0) return -1;
  auto allow = [&](const char* path, uint64_t rights) {
    const int fd = ::open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) return false;
    landlock_path_beneath_attr beneath{};
    beneath.allowed_access = rights;
    beneath.parent_fd = fd;
    const long rc =
        ::syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &beneath, 0);
    ::close(fd);
    return rc == 0;
  };
  uint64_t file_rights = LANDLOCK_ACCESS_FS_WRITE_FILE;
#ifdef LANDLOCK_ACCESS_FS_TRUNCATE
  if (abi >= 3) file_rights |= LANDLOCK_ACCESS_FS_TRUNCATE;
#endif
  if (!allow(scratch.c_str(), attr.handled_access_fs) || !allow("/dev/null", file_rights)) {
    ::close(ruleset);
    return -1;
  }
  return ruleset;
}

// The directory of this process's pids cgroup where a child cgroup can be made: the cgroup v1
// "pids" hierarchy, or cgroup v2 where the pids controller is enabled for children. Empty when
// neither is mounted or writable (then tools run without a process-count bound).
std::string PidsCgroupBase() {
  static const std::string base = [] {
    std::string v1_mount, v2_mount;
    std::ifstream mountinfo("/proc/self/mountinfo");
    for (std::string line; std::getline(mountinfo, line);) {
      // "id parent major:minor root mount-point options ... - fstype source super-options"
      std::istringstream fields(line);
      std::string id, parent, device, root, mount_point, field;
      fields >> id >> parent >> device >> root >> mount_point;
      while (fields >> field && field != "-") {
      }
      std::string fstype, source, super_options;
      fields >> fstype >> source >> super_options;
      if (fstype == "cgroup" && ("," + super_options + ",").find(",pids,") != std::string::npos) {
        v1_mount = mount_point;
      } else if (fstype == "cgroup2" && v2_mount.empty()) {
        v2_mount = mount_point;
      }
    }
    std::string v1_path, v2_path;
    std::ifstream own("/proc/self/cgroup");
    for (std::string line; std::getline(own, line);) {
      // "hierarchy-id:controllers:path"
      const size_t first = line.find(':'), second = line.find(':', first + 1);
      if (first == std::string::npos || second == std::string::npos) continue;
      const std::string controllers = line.substr(first + 1, second - first - 1);
      const std::string path = line.substr(second + 1);
      if (("," + controllers + ",").find(",pids,") != std::string::npos) v1_path = path;
      if (line.compare(0, first, "0") == 0 && controllers.empty()) v2_path = path;
    }
    auto writable = [](const std::string& dir) { return ::access(dir.c_str(), W_OK) == 0; };
    if (!v1_mount.empty()) {
      const std::string dir = v1_mount + (v1_path == "/" ? "" : v1_path);
      if (writable(dir)) return dir;
    }
    if (!v2_mount.empty()) {
      const std::string dir = v2_mount + (v2_path == "/" ? "" : v2_path);
      std::ifstream subtree(dir + "/cgroup.subtree_control");
      std::string controller;
      while (subtree >> controller) {
        if (controller == "pids" && writable(dir)) return dir;
      }
    }
    return std::string();
  }();
  return base;
}

bool WriteFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// One tool run's pids cgroup: at most `max_processes` tasks (processes and threads) at once, so
// a fork bomb stops at the cap instead of filling the machine's process table, and every task
// in it, wherever it moved in the session or process-group tree, is killed at the end.
class ProcessCap {
 public:
  static std::unique_ptr<ProcessCap> Create(int64_t max_processes) {
    const std::string& base = PidsCgroupBase();
    if (base.empty() || max_processes <= 0) return nullptr;
    static std::atomic<uint64_t> counter{0};
    auto cap = std::unique_ptr<ProcessCap>(new ProcessCap);
    cap->dir_ = fmt::format("{}/strider-sandbox-{}-{}", base, ::getpid(), counter++);
    if (::mkdir(cap->dir_.c_str(), 0755) != 0) return nullptr;
    if (!WriteFile(cap->dir_ + "/pids.max", std::to_string(max_processes))) return nullptr;
    cap->procs_fd_ = ::open((cap->dir_ + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
    if (cap->procs_fd_ < 0) return nullptr;
    return cap;
  }
  // Kills every task still in the cgroup, then removes it.
  ~ProcessCap() {
    if (procs_fd_ >= 0) ::close(procs_fd_);
    KillAll();
    // Tasks leave the cgroup as they are reaped; the last ones may take a moment.
    for (int attempt = 0; attempt < 200 && ::rmdir(dir_.c_str()) != 0 && errno == EBUSY;
         ++attempt) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // The child writes "0" here before exec: that moves it into the cgroup (v1 and v2 alike).
  int procs_fd() const { return procs_fd_; }

  // Whether a fork or clone was refused at the cap (the "max" count of pids.events).
  bool LimitHit() const {
    std::ifstream events(dir_ + "/pids.events");
    std::string key;
    int64_t count = 0;
    while (events >> key >> count) {
      if (key == "max") return count > 0;
    }
    return false;
  }

  // SIGKILL to every task until none is left (new ones can appear between reading the list
  // and the kills, at most the cap each round). cgroup v2 does it in one write where offered.
  void KillAll() {
    if (WriteFile(dir_ + "/cgroup.kill", "1")) return;
    for (int round = 0; round < 1000; ++round) {
      std::ifstream procs(dir_ + "/cgroup.procs");
      bool any = false;
      for (pid_t pid; procs >> pid;) {
        ::kill(pid, SIGKILL);
        any = true;
      }
      if (!any) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  ProcessCap() = default;
  std::string dir_;
  int procs_fd_ = -1;
};

void SetLimit(int resource, rlim_t soft, rlim_t hard) {
  rlimit limit{soft, hard};
  ::setrlimit(resource, &limit);
}

// Runs in the forked child: only async-signal-safe calls until exec.
[[noreturn]] void ExecChild(const SandboxLimits& limits, const char* scratch, int out_fd,
                            int err_fd, int ruleset, int cap_fd, int parent_max_fd,
                            char* const* argv) {
  // Into the run's pids cgroup first, before anything else can fork; a cap that cannot be
  // joined is a failed start, not a run without it.
  if (cap_fd >= 0 && ::write(cap_fd, "0", 1) != 1) ::_exit(126);
  ::setpgid(0, 0);
  const int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
  ::dup2(out_fd, STDOUT_FILENO);
  ::dup2(err_fd, STDERR_FILENO);
  if (::chdir(scratch) != 0) ::_exit(126);
  const rlim_t cpu = static_cast<rlim_t>(std::ceil(std::max(limits.cpu_seconds, 0.001)));
  SetLimit(RLIMIT_CPU, cpu, cpu + 1);
  SetLimit(RLIMIT_AS, limits.memory_bytes, limits.memory_bytes);
  SetLimit(RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes);
  SetLimit(RLIMIT_NOFILE, limits.open_files, limits.open_files);
  SetLimit(RLIMIT_CORE, 0, 0);
  ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  if (ruleset >= 0 && ::syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) ::_exit(126);
  // Descriptors above stderr (the parent's sockets, the ruleset) must not leak into tool code.
  // close_range (Linux 5.9+) closes them all; the loop is the fallback, bounded by the parent's
  // descriptor limit taken before RLIMIT_NOFILE was lowered here.
  if (::syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
    for (int fd = 3; fd < parent_max_fd; ++fd) ::close(fd);
  }
  ::execvp(argv[0], argv);
  ::_exit(127);
}

class Pipe {
 public:
  ~Pipe() {
    if (fds_[0] >= 0) ::close(fds_[0]);
    if (fds_[1] >= 0) ::close(fds_[1]);
  }
  bool Open() { return ::pipe2(fds_, O_CLOEXEC) == 0; }
  int read_end() const { return fds_[0]; }
  int write_end() const { return fds_[1]; }
  void CloseWrite() {
    ::close(fds_[1]);
    fds_[1] = -1;
  }
  void CloseRead() {
    ::close(fds_[0]);
    fds_[0] = -1;
  }

 private:
  int fds_[2] = {-1, -1};
};

// Reads what is available; false at end of stream.
bool Drain(int fd, std::string* out, int64_t keep, bool* truncated) {
  char buffer[8192];
  const ssize_t n = ::read(fd, buffer, sizeof(buffer));
  if (n == 0) return false;
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  const size_t room = out->size() < static_cast<size_t>(keep) ? keep - out->size() : 0;
  out->append(buffer, std::min<size_t>(room, n));
  if (static_cast<size_t>(n) > room) *truncated = true;
  return true;
}

}  // namespace

bool SandboxCanContainWrites() { return LandlockAbi() > 0; }

std::string SandboxResult::Summary(const SandboxLimits& limits) const {
  std::string text;
  if (timed_out) {
    text = fmt::format("killed: wall-clock limit of {} ms", limits.wall_ms);
  } else if (cpu_limit) {
    text = fmt::format("killed: CPU limit of {} s", limits.cpu_seconds);
  } else if (signal != 0) {
    text = fmt::format("killed by signal {} ({})", signal, ::strsignal(signal));
  } else {
    text = fmt::format("exit {}", exit_code);
  }
  if (process_limit_hit) text += fmt::format("; process limit of {} reached", limits.processes);
  return text;
}

Result<SandboxResult> RunSandboxed(const SandboxRequest& request) {
  if (request.argv.empty()) return Status::InvalidArgument("sandbox: empty command");
  namespace fs = std::filesystem;
  std::string scratch = request.scratch_dir;
  const bool own_scratch = scratch.empty();
  if (own_scratch) {
    std::string parent = request.scratch_parent;
    if (parent.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      parent = tmp && *tmp ? tmp : "/tmp";
    }
    std::string pattern = parent + "/strider-sandbox-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return Status::IoError("sandbox: cannot create a scratch directory in " + parent + ": " +
                             std::strerror(errno));
    }
    scratch = pattern;
  } else if (!fs::is_directory(scratch)) {
    return Status::NotFound("sandbox: scratch directory " + scratch + " does not exist");
  }
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ignored;
      if (!dir.empty()) fs::remove_all(dir, ignored);
    }
  } cleanup{own_scratch ? scratch : ""};

  for (const auto& [name, content] : request.files) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      return Status::InvalidArgument("sandbox: file name '" + name + "' must be a plain name");
    }
    std::ofstream file(scratch + "/" + name, std::ios::binary);
    file << content;
    if (!file) return Status::IoError("sandbox: cannot write " + scratch + "/" + name);
  }

  std::vector<std::string> argv_storage = request.argv;
  std::vector<char*> argv;
  for (std::string& arg : argv_storage) argv.push_back(arg.data());
  argv.push_back(nullptr);

  Pipe out, err;
  if (!out.Open() || !err.Open())
    return Status::IoError("sandbox: pipe: " + std::string(std::strerror(errno)));
  const int ruleset = MakeRuleset(scratch);
  const std::unique_ptr<ProcessCap> cap = ProcessCap::Create(request.limits.processes);
  const int parent_max_fd = static_cast<int>(std::min<long>(::sysconf(_SC_OPEN_MAX), 1 << 20));
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ForkWithLifeline([&] {
    ExecChild(request.limits, scratch.c_str(), out.write_end(), err.write_end(), ruleset,
              cap ? cap->procs_fd() : -1, parent_max_fd, argv.data());
  });
  if (pid < 0) {
    if (ruleset >= 0) ::close(ruleset);
    return Status::IoError("sandbox: fork: " + std::string(std::strerror(errno)));
  }
  ::setpgid(pid, pid);  // also in the parent, so a kill right away reaches the group
  if (ruleset >= 0) ::close(ruleset);
  out.CloseWrite();
  err.CloseWrite();

  SandboxResult result;
  result.contained = ruleset >= 0;
  result.process_cap = cap != nullptr;
  const auto deadline = start + std::chrono::milliseconds(request.limits.wall_ms);
  bool out_open = true, err_open = true, exited = false;
  int wait_status = 0;
  rusage usage{};
  std::chrono::steady_clock::time_point exit_time;
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    if (!exited && now >= deadline) {
      ::kill(-pid, SIGKILL);
      result.timed_out = true;
    }
    if (!exited) {
      const pid_t done = ::wait4(pid, &wait_status, result.timed_out ? 0 : WNOHANG, &usage);
      if (done == pid) {
        exited = true;
        exit_time = std::chrono::steady_clock::now();
      }
    }
    // After the child exits, give stray holders of the pipes (its own children) a moment.
    if (exited && ((!out_open && !err_open) ||
                   std::chrono::steady_clock::now() - exit_time > std::chrono::milliseconds(100))) {
      break;
    }
    pollfd fds[2];
    int count = 0;
    if (out_open) fds[count++] = {out.read_end(), POLLIN, 0};
    if (err_open) fds[count++] = {err.read_end(), POLLIN, 0};
    if (count == 0) {
      ::usleep(2000);
      continue;
    }
    ::poll(fds, count, 10);
    for (int i = 0; i < count; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      if (fds[i].fd == out.read_end()) {
        out_open = Drain(fds[i].fd, &result.stdout_text, request.limits.output_bytes,
                         &result.output_truncated);
      } else {
        err_open = Drain(fds[i].fd, &result.stderr_text, request.limits.output_bytes,
                         &result.output_truncated);
      }
    }
  }
  ::kill(-pid, SIGKILL);  // whatever the tool left running in its group
  // The cap's destructor, on the way out, kills what left the group (setsid, setpgid).
  if (cap) result.process_limit_hit = cap->LimitHit();
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(wait_status)) {
    result.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    result.signal = WTERMSIG(wait_status);
    const double cpu = usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
                       1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
    result.cpu_limit =
        !result.timed_out &&
        (result.signal == SIGXCPU ||
         (result.signal == SIGKILL && cpu >= std::floor(request.limits.cpu_seconds)));
  }
  return result;
}

}  // namespace strider::envs
