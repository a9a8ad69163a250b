// Each child leads a process group of its own. A Ctrl-C on the terminal then reaches only the
// launcher, which stops the children in order: were the replay server to get it at the same
// moment as the actors, it would be gone before they delivered their last segments, and they
// would wait out their delivery deadline. SIGKILL goes to a child's whole group, so whatever it
// started (tool sandboxes, environment processes) goes with it. Each child also asks the kernel
// for SIGTERM when the launcher dies (PR_SET_PDEATHSIG), so even a SIGKILLed launcher leaves
// nothing running.
#include "launcher/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <fstream>
#include <string_view>

namespace strider::launcher {
namespace {

namespace asio = boost::asio;

constexpr std::string_view kStartHeader = "--- launch: starting";

// How many times the launcher started a child with this log (each start writes a header).
int64_t CountStarts(const std::string& log_path) {
  std::ifstream in(log_path, std::ios::binary);
  int64_t starts = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(kStartHeader, 0) == 0) ++starts;
  }
  return starts;
}

// A log line lost to a full disk is not worth stopping the fleet for; the child's own
// output goes on regardless.
void AppendToLog(int fd, const char* data, size_t size) {
  if (::write(fd, data, size) < 0) return;
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kReplay:
      return "replay";
    case Role::kLearner:
      return "learner";
    case Role::kActor:
      return "actor";
    case Role::kEval:
      break;
  }
  return "eval";
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return "signal " + std::to_string(WTERMSIG(status)) +
           (name ? std::string(" (") + name + ")" : "");
  }
  return "status " + std::to_string(status);
}

std::string LogTail(const std::string& path, size_t lines) {
  std::ifstream in(path, std::ios::binary);
  std::deque<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  std::string out;
  for (const std::string& line : tail) out += "  | " + line + "\n";
  return out.empty() ? "  | (empty)\n" : out;
}

ChildProcesses::ChildProcesses(asio::io_context& io, std::filesystem::path log_dir,
                               Handlers handlers)
    : io_(io), log_dir_(std::move(log_dir)), handlers_(std::move(handlers)) {}

ChildProcesses::~ChildProcesses() {
  for (auto& child : children_) {
    if (child->log_fd >= 0) ::close(child->log_fd);
  }
}

Child& ChildProcesses::Add(const std::string& name, Role role, int index) {
  children_.push_back(std::make_unique<Child>(io_));
  Child& child = *children_.back();
  child.name = name;
  child.role = role;
  child.index = index;
  // Only an actor's seed depends on its starts (ActorSeed); the other logs can be long.
  if (role == Role::kActor) child.starts = CountStarts(LogPath(child));
  return child;
}

std::string ChildProcesses::LogPath(const Child& child) const {
  return (log_dir_ / (child.name + ".log")).string();
}

Status ChildProcesses::Start(Child& child, const std::vector<std::string>& args) {
  if (child.log_fd < 0) {
    child.log_fd = ::open(LogPath(child).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (child.log_fd < 0) return Status::IoError("cannot open " + LogPath(child));
  }
  std::string header(kStartHeader);
  for (const std::string& arg : args) header += " " + arg;
  header += "\n";
  AppendToLog(child.log_fd, header.data(), header.size());

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::IoError("cannot create a pipe");
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Built before fork: the child only calls async-signal-safe functions.
  std::vector<char*> argv;
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  // Several LibTorch processes share the cores: OpenMP threads that spin while they wait burn
  // a core another child needs (evaluations ran 5 to 10 times slower beside actors), so they
  // wait passively unless the caller chose otherwise.
  std::vector<std::string> environment;
  bool wait_policy_set = false;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    environment.emplace_back(*entry);
    if (environment.back().rfind("OMP_WAIT_POLICY=", 0) == 0) wait_policy_set = true;
  }
  if (!wait_policy_set) environment.emplace_back("OMP_WAIT_POLICY=PASSIVE");
  std::vector<char*> envp;
  for (std::string& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(child.log_fd, STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  if (null_fd >= 0) ::close(null_fd);
  if (pid < 0) {
    ::close(fds[0]);
    return Status::IoError("cannot fork");
  }
  ::setpgid(pid, pid);  // also here, so a signal to the group cannot precede the child's own call
  ++child.starts;
  child.pid = pid;
  child.started_at = Clock::now();
  child.last_status = nullptr;
  child.scrape_error.clear();
  child.ready = false;
  child.result_line.clear();
  child.line_buffer.clear();
  ++child.generation;
  child.out = std::make_unique<asio::posix::stream_descriptor>(io_, fds[0]);
  ReadOutput(child);
  return Status::Ok();
}

void ChildProcesses::ReadOutput(Child& child) {
  const uint64_t generation = child.generation;
  child.out->async_read_some(
      asio::buffer(child.read_buffer),
      [this, &child, generation](const boost::system::error_code& ec, size_t size) {
        if (generation != child.generation || !child.out) return;
        if (size > 0) OnOutput(child, child.read_buffer.data(), size);
        if (ec) {
          child.out.reset();  // end of file: the child closed stdout (or died)
          return;
        }
        ReadOutput(child);
      });
}

void ChildProcesses::OnOutput(Child& child, const char* data, size_t size) {
  if (child.log_fd >= 0) AppendToLog(child.log_fd, data, size);
  child.line_buffer.append(data, size);
  size_t start = 0;
  for (size_t newline; (newline = child.line_buffer.find('\n', start)) != std::string::npos;
       start = newline + 1) {
    handlers_.on_line(child, child.line_buffer.substr(start, newline - start));
  }
  child.line_buffer.erase(0, start);
}

void ChildProcesses::Drain(Child& child) {
  if (child.out) {
    // Nobody else holds the pipe's write end now.
    const int fd = child.out->native_handle();
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    char chunk[4096];
    for (ssize_t n; (n = ::read(fd, chunk, sizeof(chunk))) > 0;) {
      OnOutput(child, chunk, static_cast<size_t>(n));
    }
    child.out.reset();
  }
  if (!child.line_buffer.empty()) {
    handlers_.on_line(child, child.line_buffer);
    child.line_buffer.clear();
  }
}

void ChildProcesses::ReapAll() {
  for (auto& owned : children_) {
    Child& child = *owned;
    if (!child.running()) continue;
    int status = 0;
    if (::waitpid(child.pid, &status, WNOHANG) != child.pid) continue;
    const pid_t pid = child.pid;
    Drain(child);
    child.pid = -1;
    handlers_.on_exit(child, pid, status);
  }
}

void ChildProcesses::SignalRunning(int signal, bool replay_too) const {
  for (const auto& child : children_) {
    if (!child->running()) continue;
    if (child->role == Role::kReplay && !replay_too) continue;
    // SIGTERM to the child, which stops what it started; SIGKILL to its whole group.
    ::kill(signal == SIGKILL ? -child->pid : child->pid, signal);
  }
}

}  // namespace strider::launcher
