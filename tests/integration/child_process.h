// Child processes for integration tests: the built `strider` binary, started with a pipe on its
// stdout, killed (SIGKILL on destruction at the latest) and reaped.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace strider::testing {

inline std::string StriderBinary() {
  const char* dir = std::getenv("STRIDER_BINARY_DIR");
  return std::string(dir ? dir : ".") + "/cli/strider";
}

inline std::string SourceDir() {
  const char* dir = std::getenv("STRIDER_SOURCE_DIR");
  return dir ? dir : ".";
}

// An integer from the environment (a test's length or seed), or `fallback` when unset.
inline int64_t EnvInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoll(value) : fallback;
}

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
  }

  // Starts argv[0] with the given arguments; stdout is readable with ReadLine, stderr inherited
  // or, given `stderr_path`, written to that file.
  bool Start(const std::vector<std::string>& argv, const std::string& stderr_path = "") {
    int fds[2];
    if (::pipe(fds) != 0) return false;
    pid_ = ::fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      if (!stderr_path.empty()) {
        const int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (err >= 0) ::dup2(err, STDERR_FILENO);
      }
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    stdout_fd_ = fds[0];
    return true;
  }

  // The next line of the child's stdout (without the newline), or "" after `timeout`.
  std::string ReadLine(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const size_t newline = buffer_.find('\n');
      if (newline != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "";
      pollfd item{stdout_fd_, POLLIN, 0};
      if (::poll(&item, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(stdout_fd_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  // Everything the child writes to stdout until it closes it (or `timeout`).
  std::string ReadAll(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string out;
    out.swap(buffer_);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd item{stdout_fd_, POLLIN, 0};
      if (::poll(&item, 1, 100) <= 0) continue;
      char chunk[65536];
      const ssize_t n = ::read(stdout_fd_, chunk, sizeof(chunk));
      if (n <= 0) break;
      out.append(chunk, static_cast<size_t>(n));
    }
    return out;
  }

  void Signal(int signal) {
    if (pid_ > 0) ::kill(pid_, signal);
  }

  // Exit status (or 128 + signal); -1 when not started.
  int Wait() {
    if (pid_ <= 0) return -1;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
  }

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
};

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout
};

// Runs a command to completion and returns its exit code and stdout.
inline RunResult RunCommand(const std::vector<std::string>& argv) {
  ChildProcess child;
  RunResult result;
  if (!child.Start(argv)) return result;
  result.output = child.ReadAll(std::chrono::milliseconds(60000));
  result.exit_code = child.Wait();
  return result;
}

// Reads JSON lines from `child` until one has "event" == `event`; null after `timeout_ms`.
inline nlohmann::json WaitEvent(ChildProcess& child, const std::string& event, int timeout_ms) {
  using std::chrono::milliseconds;
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string line = child.ReadLine(milliseconds(timeout_ms));
    if (line.empty()) break;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == event) return j;
  }
  return nlohmann::json();
}

// `strider replay serve` on free ports with the tables of `config_yaml` (written to
// `config_path`), once it has printed its ready line. Empty endpoints when it did not start
// (the calling test has failed then).
struct ReplayEndpoints {
  std::string actor;
  std::string learner;
};

inline ReplayEndpoints StartReplayServer(ChildProcess& server, const std::string& db,
                                         const std::string& config_path,
                                         const std::string& config_yaml) {
  std::ofstream(config_path) << config_yaml;
  EXPECT_TRUE(server.Start({StriderBinary(), "replay", "serve", "--db", db, "--config",
                            config_path, "--bind", "tcp://127.0.0.1:0", "--sample-bind",
                            "tcp://127.0.0.1:0"}));
  const nlohmann::json ready = WaitEvent(server, "ready", 30000);
  EXPECT_TRUE(ready.is_object()) << "no ready line from the replay server";
  if (!ready.is_object()) return {};
  return {ready["actor_endpoint"].get<std::string>(), ready["learner_endpoint"].get<std::string>()};
}

}  // namespace strider::testing
