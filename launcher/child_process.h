// The launcher's children as processes: each started as the leader of its own process group
// with its stdout on a pipe the launcher reads line by line and its stderr appended to
// RUN_DIR/logs/<name>.log, and reaped when it exits. What a child is for (its role, restarts,
// readiness) is the Supervisor's (launcher.cc); everything here runs on its io_context.
#pragma once

// clang-format off
#include <utility>  // before Boost.Asio: its awaitable.hpp uses std::exchange without including it
// clang-format on

#include <sys/types.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace strider::launcher {

enum class Role { kReplay, kLearner, kActor, kEval };

// "replay", "learner", "actor" or "eval", as the status page names roles.
const char* RoleName(Role role);

struct Child {
  explicit Child(boost::asio::io_context& io) : ready_timer(io), backoff_timer(io) {}

  std::string name;  // role in logs, events and the restart counters: replay, learner, actor-i
  Role role = Role::kActor;
  int index = 0;
  pid_t pid = -1;
  bool ready = false;       // this start printed its ready line
  bool ever_ready = false;  // some start did
  int64_t restarts = 0;
  int64_t starts = 0;       // in this run directory, earlier launches included (from its log)
  uint64_t generation = 0;  // bumped per start; handlers of an earlier start see a stale one
  int log_fd = -1;
  std::unique_ptr<boost::asio::posix::stream_descriptor> out;
  std::array<char, 4096> read_buffer{};
  std::string line_buffer;
  std::string result_line;  // eval: its {"event":"eval",...} line
  std::string http;         // with the fleet's `http`: HOST:PORT of its pages, from its ready line
  Clock::time_point started_at{};
  nlohmann::json last_status;  // its /status as last scraped (null: none yet from this start)
  std::string scrape_error;    // why the last scrape got no answer, or ""
  bool scraping = false;       // a scrape is in flight; the next tick does not start another
  bool final_eval = false;
  std::string eval_weights;  // eval: a weights file to evaluate instead of the learner's endpoint
  std::optional<int64_t> eval_version;  // eval: the version that file holds, when known
  boost::asio::steady_timer ready_timer;
  boost::asio::steady_timer backoff_timer;

  bool running() const { return pid > 0; }
};

// How a child ended, from waitpid's status: "exit code 1", "signal 9 (Killed)".
std::string DescribeStatus(int status);

// The last `lines` lines of a log file, for error messages.
std::string LogTail(const std::string& path, size_t lines);

class ChildProcesses {
 public:
  struct Handlers {
    // Each line a child printed on stdout (without its newline), in order.
    std::function<void(Child& child, const std::string& line)> on_line;
    // A child exited with waitpid's `status`; its output has been read to the end and its pid
    // is -1 again (`pid` is the one it had).
    std::function<void(Child& child, pid_t pid, int status)> on_exit;
  };

  ChildProcesses(boost::asio::io_context& io, std::filesystem::path log_dir, Handlers handlers);
  ~ChildProcesses();  // closes the logs; the children are the caller's to have reaped
  ChildProcesses(const ChildProcesses&) = delete;
  ChildProcesses& operator=(const ChildProcesses&) = delete;

  // A child that is not started yet. An actor's `starts` counts the starts its log records, so
  // that a later launch in the same run directory continues the count.
  Child& Add(const std::string& name, Role role, int index);
  const std::vector<std::unique_ptr<Child>>& all() const { return children_; }
  std::string LogPath(const Child& child) const;

  // Starts `child` running `args` (args[0] the binary) and reads its stdout from now on. The
  // child leads its own process group, gets SIGTERM when the launcher dies, and runs with
  // OMP_WAIT_POLICY=PASSIVE unless the environment chose a policy. IoError naming what could
  // not be created (its log, a pipe, the process).
  Status Start(Child& child, const std::vector<std::string>& args);
  // Reaps every child that exited (handlers.on_exit for each).
  void ReapAll();
  // `signal` to every running child (SIGKILL to its whole group), the replay server only with
  // `replay_too`.
  void SignalRunning(int signal, bool replay_too) const;

 private:
  void ReadOutput(Child& child);
  void OnOutput(Child& child, const char* data, size_t size);
  // The process is gone: what it wrote is still in the pipe, and a last line may lack its
  // newline.
  void Drain(Child& child);

  boost::asio::io_context& io_;
  const std::filesystem::path log_dir_;
  const Handlers handlers_;
  std::vector<std::unique_ptr<Child>> children_;
};

}  // namespace strider::launcher
