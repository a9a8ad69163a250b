// The supervisor behind Launch (launcher.h): one Boost.Asio io_context on the calling thread.
//
// Everything happens in handlers of that one context, so no state here is shared between
// threads: SIGCHLD, SIGINT and SIGTERM arrive through signal_sets, each child's stdout through a
// stream_descriptor on its pipe, readiness timeouts, restart backoff, the stop deadline and the
// progress tick through steady_timers.
//
// Each child leads a process group of its own. A Ctrl-C on the terminal then reaches only the
// launcher, which stops the children in order: were the replay server to get it at the same
// moment as the actors, it would be gone before they delivered their last segments, and they
// would wait out their delivery deadline. SIGKILL goes to a child's whole group, so whatever it
// started (tool sandboxes, environment processes) goes with it. Each child also asks the kernel
// for SIGTERM when the launcher dies (PR_SET_PDEATHSIG), so even a SIGKILLed launcher leaves
// nothing running.
#include "launcher/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

// clang-format off
#include <utility>  // before Boost.Asio: its awaitable.hpp uses std::exchange without including it
// clang-format on

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "common/transport/http_status.h"
#include "launcher/child_commands.h"
#include "launcher/status_page.h"
#include "report/report.h"

namespace strider::launcher {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr double kPlainProgressPeriodS = 10;           // progress lines when stderr is no terminal
constexpr size_t kLogTailLines = 12;                   // quoted in errors
constexpr auto kEvalRetryPause = std::chrono::seconds(30);  // after a failed evaluation
// The status page: how often the browser polls, how long a child's /status may take, and how
// many points each plotted series sends.
constexpr int kPagePollMs = 2000;
constexpr auto kScrapeTimeout = std::chrono::milliseconds(1500);
constexpr size_t kPagePoints = 1000;

enum class Role { kReplay, kLearner, kActor, kEval };

// The last `lines` lines of a log file, for error messages.
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

constexpr std::string_view kStartHeader = "--- launch: starting";

// How many times the launcher started a child with this log (each start writes a header).
size_t CountStarts(const std::string& log_path) {
  std::ifstream in(log_path, std::ios::binary);
  size_t starts = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(kStartHeader, 0) == 0) ++starts;
  }
  return starts;
}

// Lines appended to a JSON-lines file since the last call; a line still being written (no
// newline yet) waits for the next call.
class FileTail {
 public:
  FileTail() = default;
  explicit FileTail(std::string path) : path_(std::move(path)) {}

  std::vector<std::string> NewLines() {
    std::vector<std::string> lines;
    std::ifstream in(path_, std::ios::binary);
    if (!in) return lines;
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    if (size < offset_) offset_ = 0;  // replaced by a shorter file: read it from the start
    if (size == offset_) return lines;
    in.seekg(offset_);
    std::string chunk(static_cast<size_t>(size - offset_), '\0');
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    offset_ += in.gcount();
    partial_.append(chunk.data(), static_cast<size_t>(in.gcount()));
    size_t start = 0;
    for (size_t newline; (newline = partial_.find('\n', start)) != std::string::npos;
         start = newline + 1) {
      if (newline > start) lines.push_back(partial_.substr(start, newline - start));
    }
    partial_.erase(0, start);
    return lines;
  }

 private:
  std::string path_;
  std::streamoff offset_ = 0;
  std::string partial_;
};

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return "signal " + std::to_string(WTERMSIG(status)) +
           (name ? std::string(" (") + name + ")" : "");
  }
  return "status " + std::to_string(status);
}

// Number or null.
json Optional(const std::optional<double>& value) { return value ? json(*value) : json(nullptr); }

struct Child {
  explicit Child(asio::io_context& io) : ready_timer(io), backoff_timer(io) {}

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
  std::unique_ptr<asio::posix::stream_descriptor> out;
  std::array<char, 4096> read_buffer{};
  std::string line_buffer;
  std::string result_line;  // eval: its {"event":"eval",...} line
  std::string http;         // with the fleet's `http`: HOST:PORT of its pages, from its ready line
  Clock::time_point started_at{};
  json last_status;          // its /status as last scraped (null: none yet from this start)
  std::string scrape_error;  // why the last scrape got no answer, or ""
  bool scraping = false;     // a scrape is in flight; the next tick does not start another
  bool final_eval = false;
  std::string eval_weights;  // eval: a weights file to evaluate instead of the learner's endpoint
  std::optional<int64_t> eval_version;  // eval: the version that file holds, when known
  asio::steady_timer ready_timer;
  asio::steady_timer backoff_timer;

  bool running() const { return pid > 0; }
};

class Supervisor {
 public:
  Supervisor(const FleetConfig& fleet, const LaunchOptions& options)
      : fleet_(fleet),
        options_(options),
        run_dir_(fs::absolute(fleet.run_dir).lexically_normal()),
        signals_(io_, SIGINT, SIGTERM),
        child_signals_(io_, SIGCHLD),
        tick_timer_(io_),
        kill_timer_(io_) {}

  ~Supervisor() {
    for (auto& child : children_) {
      if (child->log_fd >= 0) ::close(child->log_fd);
    }
  }

  Result<LaunchSummary> Run();

 private:
  enum class Phase { kRunning, kStopWorkers, kStopReplay, kFinalEval, kDone };

  Status PrepareRunDir();
  Child& AddChild(const std::string& name, Role role, int index);
  std::vector<std::string> Arguments(const Child& child) const;
  uint64_t ActorSeed(const Child& child) const;
  std::string NewestCheckpoint() const;
  void Spawn(Child& child);
  void ReadOutput(Child& child);
  void OnOutput(Child& child, const char* data, size_t size);
  void OnLine(Child& child, const std::string& line);
  void OnReady(Child& child, const json& ready);
  void Drain(Child& child);
  void WaitSignals();
  void WaitChildSignals();
  void ReapAll();
  void OnExit(Child& child, int status);
  void OnEvalExit(Child& child, int status);
  void Fail(const Child& child, const std::string& why);
  void BeginStop(const std::string& reason);
  void ArmKillTimer();
  void AdvanceStop();
  void SignalRunning(int signal, bool replay_too);
  void StartTick();
  void Tick();
  void ReadMetrics();
  json MergedLine() const;
  void Progress(bool final_line);
  void CheckStopRules();
  void MaybeStartEval();
  void Emit(const json& event) const;
  // With the fleet's `http`: {role: "HOST:PORT"} of the children serving pages now, also
  // written to RUN_DIR/http.json whenever one changes.
  json HttpAddresses() const;
  void WriteHttpAddresses() const;
  void Log(const std::string& message) const;
  // The status page (fleet `http`): each child's /status fetched on this loop, and the page
  // bodies rebuilt for the board whenever what they show changed.
  Status StartStatusPage();
  void Scrape();
  void PublishPage();
  json FleetJson() const;
  std::string LauncherMetrics() const;
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  std::string LogPath(const Child& child) const {
    return (run_dir_ / "logs" / (child.name + ".log")).string();
  }

  const FleetConfig& fleet_;
  const LaunchOptions& options_;
  const fs::path run_dir_;
  std::string binary_;
  asio::io_context io_;
  asio::signal_set signals_;
  asio::signal_set child_signals_;
  asio::steady_timer tick_timer_;
  asio::steady_timer kill_timer_;
  Clock::time_point started_ = Clock::now();

  std::vector<std::unique_ptr<Child>> children_;
  Child* replay_ = nullptr;
  Child* learner_ = nullptr;
  std::vector<Child*> actors_;
  Child* eval_ = nullptr;

  // Endpoints read from the first ready lines, reused by every restart so the others reconnect.
  std::string actor_endpoint_;
  std::string sample_endpoint_;
  std::string weights_endpoint_;
  bool announced_ = false;  // the fleet's ready event is out

  Phase phase_ = Phase::kRunning;
  std::optional<Clock::time_point> first_signal_;
  std::string reason_;
  Status failure_;

  // Merged metrics.
  FileTail learner_metrics_;
  std::vector<FileTail> actor_metrics_;
  std::optional<json> learner_row_;
  std::vector<std::optional<json>> actor_rows_;
  FileTail replay_log_;  // its "replay stats: {...}" lines carry each table's fill
  json replay_fill_;     // {"table": fill}, null until the server's first stats line
  std::map<int64_t, int64_t> sampled_by_step_;  // a resumed learner repeats steps: one entry each
  int64_t samples_ = 0;
  std::optional<double> eval_success_rate_;
  std::ofstream merged_;
  std::ofstream eval_rows_;
  double last_plain_progress_ = -kPlainProgressPeriodS;
  bool progress_on_terminal_ = ::isatty(STDERR_FILENO) == 1;
  mutable bool progress_line_open_ = false;  // a \r line on the terminal awaits its end

  // Evaluation schedule.
  bool evaluation_enabled_ = false;
  bool start_evaluated_ = false;
  int64_t next_eval_version_ = 0;
  Clock::time_point eval_retry_after_{};
  std::string start_weights_;  // the start evaluation's weights file, when it reads one

  // The status page; all null/empty without the fleet's `http`.
  FleetCurves curves_;
  std::shared_ptr<StatusBoard> board_;
  std::unique_ptr<http::StatusServer> page_server_;  // declared last: stops before the rest goes
  std::string page_address_;
};

json Supervisor::HttpAddresses() const {
  json addresses = json::object();
  if (!page_address_.empty()) addresses["launcher"] = page_address_;
  for (const Child* child : {replay_, learner_}) {
    if (child != nullptr && !child->http.empty()) addresses[child->name] = child->http;
  }
  for (const Child* actor : actors_) {
    if (!actor->http.empty()) addresses[actor->name] = actor->http;
  }
  return addresses;
}

void Supervisor::WriteHttpAddresses() const {
  const fs::path path = run_dir_ / "http.json";
  const fs::path temporary = run_dir_ / "http.json.tmp";
  {
    std::ofstream out(temporary);
    out << HttpAddresses().dump() << "\n";
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) Log("cannot write " + path.string() + ": " + error.message());
}

void Supervisor::Emit(const json& event) const {
  if (options_.on_event) options_.on_event(event.dump());
}

void Supervisor::Log(const std::string& message) const {
  // A progress line being rewritten in place would be overwritten half-way: end it first.
  std::fprintf(stderr, "%slaunch: %s\n", progress_line_open_ ? "\n" : "", message.c_str());
  progress_line_open_ = false;
}

Status Supervisor::PrepareRunDir() {
  std::error_code error;
  const fs::path learner_dir = run_dir_ / "learner";
  if (!options_.resume && (fs::exists(learner_dir / "metrics.jsonl", error) ||
                           fs::exists(learner_dir / "checkpoints", error))) {
    return Status::InvalidArgument(run_dir_.string() +
                                   " holds an earlier run: --resume continues it, or choose "
                                   "another run_dir / --run-dir");
  }
  for (const fs::path& dir : {run_dir_, run_dir_ / "logs", learner_dir, run_dir_ / "actors"}) {
    fs::create_directories(dir, error);
    if (error) return Status::IoError("cannot create " + dir.string() + ": " + error.message());
  }
  const fs::path recorded = run_dir_ / "fleet.yaml";
  if (!fs::equivalent(fleet_.origin, recorded, error)) {
    fs::copy_file(fleet_.origin, recorded, fs::copy_options::overwrite_existing, error);
    if (error) return Status::IoError("cannot copy " + fleet_.origin + " to " + recorded.string());
  }
  merged_.open(run_dir_ / "metrics.jsonl", std::ios::app);
  if (!merged_) return Status::IoError("cannot open " + (run_dir_ / "metrics.jsonl").string());
  if (fleet_.evaluation) {
    eval_rows_.open(run_dir_ / "eval.jsonl", std::ios::app);
    if (!eval_rows_) return Status::IoError("cannot open " + (run_dir_ / "eval.jsonl").string());
  }
  return Status::Ok();
}

Child& Supervisor::AddChild(const std::string& name, Role role, int index) {
  children_.push_back(std::make_unique<Child>(io_));
  Child& child = *children_.back();
  child.name = name;
  child.role = role;
  child.index = index;
  return child;
}

// Newest of the learner's checkpoints/latest and checkpoints/final (by its weights file), or "".
// A crash after an orderly stop of an earlier launch leaves both, and the newer one is the one
// to continue from.
std::string Supervisor::NewestCheckpoint() const {
  std::string best;
  fs::file_time_type best_time{};
  for (const char* name : {"latest", "final"}) {
    const fs::path dir = run_dir_ / "learner" / "checkpoints" / name;
    std::error_code error;
    const fs::file_time_type time = fs::last_write_time(dir / "model.safetensors", error);
    if (error) continue;
    if (best.empty() || time > best_time) {
      best = dir.string();
      best_time = time;
    }
  }
  return best;
}

// Actor i's first start plays with base + i; its k-th start in this run directory with
// base + i + k * count, so a restarted actor does not play the problems it played before again
// and no two starts of any actors share a seed.
uint64_t Supervisor::ActorSeed(const Child& child) const {
  return options_.actor_base_seed + static_cast<uint64_t>(child.index) +
         static_cast<uint64_t>(child.starts) * static_cast<uint64_t>(fleet_.actor_count);
}

std::vector<std::string> Supervisor::Arguments(const Child& child) const {
  const std::string any_port = "tcp://127.0.0.1:0";
  const std::string http = fleet_.http ? "127.0.0.1:0" : "";
  const CommandBase base = {binary_,
                            run_dir_.string(),
                            fleet_.replay_config,
                            fleet_.learner_config,
                            fleet_.actor_config,
                            fleet_.weights};
  switch (child.role) {
    case Role::kReplay:
      return ReplayServeCommand(base, actor_endpoint_.empty() ? any_port : actor_endpoint_,
                                sample_endpoint_.empty() ? any_port : sample_endpoint_, http);
    case Role::kLearner: {
      LearnerCommandOptions learner;
      learner.replay = sample_endpoint_;
      learner.publish = weights_endpoint_.empty() ? any_port : weights_endpoint_;
      learner.http = http;
      if (options_.resume || child.restarts > 0) {
        learner.resume = NewestCheckpoint();
      } else {
        // A fresh learner counts from 0, so it can stop exactly at the rule instead of a tick
        // later. A resumed one continues from a checkpoint step the launcher does not know; the
        // tick enforces the rule then.
        learner.max_steps = fleet_.stop.learner_steps;
      }
      return LearnerCommand(base, learner);
    }
    case Role::kActor:
      return ActorCommand(base, child.name, ActorSeed(child), actor_endpoint_, weights_endpoint_,
                          http);
    case Role::kEval: {
      std::vector<std::string> args = {binary_, "eval", "--config", fleet_.evaluation->config};
      if (!child.eval_weights.empty()) {
        args.insert(args.end(), {"--weights", child.eval_weights});
      } else {
        args.insert(args.end(), {"--weights-endpoint", weights_endpoint_});
      }
      args.insert(args.end(),
                  {"--episodes", std::to_string(fleet_.evaluation->episodes), "--json"});
      return args;
    }
  }
  return {};
}

void Supervisor::Spawn(Child& child) {
  if (phase_ != Phase::kRunning && !(child.role == Role::kEval && phase_ == Phase::kFinalEval)) {
    return;
  }
  const std::vector<std::string> args = Arguments(child);
  if (child.log_fd < 0) {
    child.log_fd = ::open(LogPath(child).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (child.log_fd < 0) {
      Fail(child, "cannot open " + LogPath(child));
      return;
    }
  }
  std::string header(kStartHeader);
  for (const std::string& arg : args) header += " " + arg;
  header += "\n";
  (void)!::write(child.log_fd, header.data(), header.size());

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    Fail(child, "cannot create a pipe");
    return;
  }
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
    Fail(child, "cannot fork");
    return;
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
  Emit({{"event", "started"}, {"role", child.name}, {"pid", pid}, {"restarts", child.restarts}});
  PublishPage();
  ReadOutput(child);
  if (child.role != Role::kEval) {
    const uint64_t generation = child.generation;
    child.ready_timer.expires_after(
        std::chrono::milliseconds(static_cast<int64_t>(fleet_.ready_timeout_s * 1000)));
    child.ready_timer.async_wait([this, &child, generation](const boost::system::error_code& ec) {
      if (ec || generation != child.generation || !child.running() || child.ready ||
          phase_ != Phase::kRunning) {
        return;
      }
      if (!child.ever_ready) {
        Fail(child, "printed no ready line within " +
                        std::to_string(static_cast<int64_t>(fleet_.ready_timeout_s)) + " s");
      } else {
        Log(child.name + " printed no ready line after its restart; killing it");
      }
      ::kill(-child.pid, SIGKILL);  // reaped through SIGCHLD; a restarted one is retried
    });
  }
}

void Supervisor::ReadOutput(Child& child) {
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

void Supervisor::OnOutput(Child& child, const char* data, size_t size) {
  if (child.log_fd >= 0) (void)!::write(child.log_fd, data, size);
  child.line_buffer.append(data, size);
  size_t start = 0;
  for (size_t newline; (newline = child.line_buffer.find('\n', start)) != std::string::npos;
       start = newline + 1) {
    OnLine(child, child.line_buffer.substr(start, newline - start));
  }
  child.line_buffer.erase(0, start);
}

void Supervisor::OnLine(Child& child, const std::string& line) {
  const json event = json::parse(line, nullptr, false);
  if (!event.is_object() || !event.contains("event") || !event["event"].is_string()) return;
  const std::string kind = event["event"];
  if (kind == "ready" && child.role != Role::kEval && !child.ready) {
    OnReady(child, event);
  } else if (kind == "eval" && child.role == Role::kEval) {
    child.result_line = line;
  }
}

void Supervisor::OnReady(Child& child, const json& ready) {
  child.ready = true;
  child.ever_ready = true;
  child.ready_timer.cancel();
  if (fleet_.http) {
    // A restarted child serves its pages on a new port: the file always has the current ones.
    child.http = ready.value("http", "");
    WriteHttpAddresses();
    PublishPage();
  }
  if (child.role == Role::kReplay) {
    if (actor_endpoint_.empty()) {
      actor_endpoint_ = ready.value("actor_endpoint", "");
      sample_endpoint_ = ready.value("learner_endpoint", "");
      if (actor_endpoint_.empty() || sample_endpoint_.empty()) {
        Fail(child, "its ready line names no actor_endpoint and learner_endpoint");
        return;
      }
      Spawn(*learner_);
    }
  } else if (child.role == Role::kLearner) {
    if (weights_endpoint_.empty()) {
      weights_endpoint_ = ready.value("weights", "");
      if (weights_endpoint_.empty()) {
        Fail(child, "its ready line names no weights endpoint (the learner config publishes none)");
        return;
      }
      for (Child* actor : actors_) Spawn(*actor);
    }
  } else if (!announced_ &&
             std::all_of(actors_.begin(), actors_.end(), [](Child* a) { return a->ever_ready; })) {
    announced_ = true;
    json announcement = {{"event", "ready"},
                         {"run_dir", run_dir_.string()},
                         {"replay", actor_endpoint_},
                         {"replay_sample", sample_endpoint_},
                         {"weights", weights_endpoint_},
                         {"actors", actors_.size()}};
    if (fleet_.http) announcement["http"] = HttpAddresses();
    Emit(announcement);
    // A resumed run may be past a stop rule already: the first tick is now, not in tick_s.
    Tick();
    if (phase_ == Phase::kRunning) StartTick();
  }
}

void Supervisor::Drain(Child& child) {
  if (child.out) {
    // The process is gone: what it wrote is in the pipe, and nobody else holds its write end.
    const int fd = child.out->native_handle();
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    char chunk[4096];
    for (ssize_t n; (n = ::read(fd, chunk, sizeof(chunk))) > 0;) {
      OnOutput(child, chunk, static_cast<size_t>(n));
    }
    child.out.reset();
  }
  if (!child.line_buffer.empty()) {
    OnLine(child, child.line_buffer);
    child.line_buffer.clear();
  }
}

void Supervisor::WaitSignals() {
  signals_.async_wait([this](const boost::system::error_code& ec, int signal) {
    if (ec) return;
    if (phase_ == Phase::kRunning) {
      Log(std::string("received ") + (signal == SIGINT ? "SIGINT" : "SIGTERM") +
          ": stopping (again to kill at once)");
      first_signal_ = Clock::now();
      BeginStop("signal");
    } else if (first_signal_ && Clock::now() - *first_signal_ < std::chrono::seconds(1)) {
      // One signal sent twice (`timeout` signals the process and then its group) is no
      // request to hurry.
    } else {
      Log("received another signal: killing every child");
      SignalRunning(SIGKILL, true);
    }
    WaitSignals();
  });
}

void Supervisor::WaitChildSignals() {
  child_signals_.async_wait([this](const boost::system::error_code& ec, int) {
    if (ec) return;
    ReapAll();
    WaitChildSignals();
  });
}

void Supervisor::ReapAll() {
  for (auto& child : children_) {
    if (!child->running()) continue;
    int status = 0;
    if (::waitpid(child->pid, &status, WNOHANG) == child->pid) OnExit(*child, status);
  }
}

void Supervisor::OnExit(Child& child, int status) {
  const pid_t pid = child.pid;
  Drain(child);
  child.pid = -1;
  child.ready_timer.cancel();
  if (fleet_.http && !child.http.empty()) {
    child.http.clear();  // its pages went with it; a restart names new ones
    WriteHttpAddresses();
  }
  child.last_status = nullptr;
  PublishPage();
  Emit({{"event", "exited"},
        {"role", child.name},
        {"pid", pid},
        {"status", DescribeStatus(status)}});
  if (child.role == Role::kEval) {
    OnEvalExit(child, status);
    return;
  }
  if (phase_ != Phase::kRunning) {
    AdvanceStop();
    return;
  }
  if (child.role == Role::kLearner && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    ReadMetrics();
    CheckStopRules();  // it stopped at the learner_steps rule (--max-steps)
    if (phase_ == Phase::kRunning) {
      Log("the learner finished its steps");
      BeginStop("learner_finished");
    }
    return;
  }
  if (!child.ever_ready) {
    Fail(child, "exited before it was ready (" + DescribeStatus(status) + ")");
    return;
  }
  if (child.restarts >= fleet_.restart.max_restarts) {
    Fail(child, "ended (" + DescribeStatus(status) + ") after " + std::to_string(child.restarts) +
                    " restarts, restart.max_restarts is " +
                    std::to_string(fleet_.restart.max_restarts));
    return;
  }
  ++child.restarts;
  const std::vector<int64_t>& backoff = fleet_.restart.backoff_s;
  const int64_t delay =
      backoff[std::min<size_t>(static_cast<size_t>(child.restarts - 1), backoff.size() - 1)];
  Log(child.name + " ended (" + DescribeStatus(status) + "); restart " +
      std::to_string(child.restarts) + " of " + std::to_string(fleet_.restart.max_restarts) +
      " in " + std::to_string(delay) + " s");
  child.backoff_timer.expires_after(std::chrono::seconds(delay));
  child.backoff_timer.async_wait([this, &child](const boost::system::error_code& ec) {
    if (!ec) Spawn(child);
  });
}

void Supervisor::OnEvalExit(Child& child, int status) {
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  json row = json::parse(child.result_line, nullptr, false);
  if (ok && row.is_object()) {
    if (child.eval_version) {
      row["policy_version"] = *child.eval_version;  // a file carries no version
    } else if (child.final_eval) {
      // The final checkpoint holds the learner's last published version.
      row["policy_version"] =
          learner_row_ ? (*learner_row_).value("policy_version", json(nullptr)) : json(nullptr);
    }
    row["learner_step"] = learner_row_ ? (*learner_row_).value("step", json(nullptr)) : json(0);
    row["samples_seen"] = samples_;
    row["elapsed_s"] = Elapsed();
    if (child.final_eval) row["final"] = true;
    eval_rows_ << row.dump() << "\n" << std::flush;
    curves_.AddEvalRow(row);
    Emit(row);
    if (row.contains("success_rate") && row["success_rate"].is_number()) {
      eval_success_rate_ = row["success_rate"].get<double>();
    }
    const int64_t version =
        row.contains("policy_version") && row["policy_version"].is_number_integer()
            ? row["policy_version"].get<int64_t>()
            : next_eval_version_;
    const int64_t every = fleet_.evaluation->every_versions;
    next_eval_version_ = every > 0 ? (version / every + 1) * every : INT64_MAX;
  } else if (phase_ != Phase::kRunning && !child.final_eval) {
    Log("evaluation stopped with the run (" + DescribeStatus(status) + ")");
  } else {
    Log("evaluation failed (" + DescribeStatus(status) + "); last lines of " + LogPath(child) +
        ":\n" + LogTail(LogPath(child), kLogTailLines));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
      // Bad usage or config does not get better by trying again.
      Log("evaluations are off for the rest of this run");
      evaluation_enabled_ = false;
    } else {
      // Again at the next version due, and not before a pause: a failure that lasts (no
      // weights served yet, no memory) would otherwise start an evaluation every tick.
      if (learner_row_ && fleet_.evaluation->every_versions > 0) {
        next_eval_version_ =
            (*learner_row_).value("policy_version", int64_t{0}) + fleet_.evaluation->every_versions;
      }
      eval_retry_after_ = Clock::now() + kEvalRetryPause;
    }
  }
  if (phase_ == Phase::kRunning) {
    CheckStopRules();
    MaybeStartEval();
  } else {
    AdvanceStop();
  }
}

void Supervisor::Fail(const Child& child, const std::string& why) {
  if (failure_.ok()) {
    failure_ = Status::Unavailable(child.name + " " + why + "; last lines of " + LogPath(child) +
                                   ":\n" + LogTail(LogPath(child), kLogTailLines));
  }
  BeginStop("failed");
}

void Supervisor::SignalRunning(int signal, bool replay_too) {
  for (auto& child : children_) {
    if (!child->running()) continue;
    if (child->role == Role::kReplay && !replay_too) continue;
    // SIGTERM to the child, which stops what it started; SIGKILL to its whole group.
    ::kill(signal == SIGKILL ? -child->pid : child->pid, signal);
  }
}

void Supervisor::BeginStop(const std::string& reason) {
  if (phase_ != Phase::kRunning) return;
  reason_ = reason;
  phase_ = Phase::kStopWorkers;
  tick_timer_.cancel();
  for (auto& child : children_) child->backoff_timer.cancel();
  SignalRunning(SIGTERM, /*replay_too=*/false);
  ArmKillTimer();
  AdvanceStop();
}

void Supervisor::ArmKillTimer() {
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(fleet_.stop.grace_s * 1000));
  kill_timer_.expires_after(grace);  // cancels the wait of an earlier stage
  kill_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    Log("children still running " + fmt::format("{:g}", fleet_.stop.grace_s) +
        " s after SIGTERM: SIGKILL");
    SignalRunning(SIGKILL, true);
  });
}

void Supervisor::AdvanceStop() {
  const auto any_running = [&](bool replay) {
    return std::any_of(children_.begin(), children_.end(), [&](const auto& c) {
      return c->running() && (c->role == Role::kReplay) == replay;
    });
  };
  if (phase_ == Phase::kStopWorkers) {
    if (any_running(false)) return;
    phase_ = Phase::kStopReplay;
    if (replay_->running()) {
      ::kill(replay_->pid, SIGTERM);
      ArmKillTimer();
    }
  }
  if (phase_ == Phase::kStopReplay) {
    if (any_running(true)) return;
    kill_timer_.cancel();
    phase_ = Phase::kFinalEval;
    const bool wanted = fleet_.evaluation && fleet_.evaluation->final && evaluation_enabled_ &&
                        reason_ != "signal" && reason_ != "failed" && !NewestCheckpoint().empty();
    if (wanted) {
      ReadMetrics();
      eval_->final_eval = true;
      eval_->eval_weights = NewestCheckpoint() + "/model.safetensors";
      eval_->eval_version.reset();
      Log("final evaluation of " + NewestCheckpoint());
      Spawn(*eval_);
      return;
    }
  }
  if (phase_ == Phase::kFinalEval) {
    if (eval_ != nullptr && eval_->running()) return;
    phase_ = Phase::kDone;
    signals_.cancel();
    child_signals_.cancel();
    io_.stop();
  }
}

void Supervisor::StartTick() {
  tick_timer_.expires_after(
      std::chrono::milliseconds(static_cast<int64_t>(options_.tick_s * 1000)));
  tick_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || phase_ != Phase::kRunning) return;
    Tick();
    if (phase_ == Phase::kRunning) StartTick();
  });
}

void Supervisor::Tick() {
  ReapAll();  // a SIGCHLD that raced a handler's start is never lost for longer than a tick
  if (phase_ != Phase::kRunning) return;
  ReadMetrics();
  const json line = MergedLine();
  merged_ << line.dump() << "\n" << std::flush;
  if (board_) {
    // The page plots the replay server's own fill when it answered its last scrape: it is
    // current, where its log's stats line comes every server.stats_interval_s, if at all.
    json tick = line;
    if (replay_->last_status.is_object() && replay_->last_status.contains("metrics") &&
        replay_->last_status["metrics"].value("tables", json()).is_array()) {
      json fill = json::object();
      for (const json& table : replay_->last_status["metrics"]["tables"]) {
        if (table.contains("name") && table.contains("fill")) fill[table["name"]] = table["fill"];
      }
      tick["replay_fill"] = std::move(fill);
    }
    curves_.AddTick(tick);
    Scrape();
    PublishPage();
  }
  Progress(false);
  CheckStopRules();
  MaybeStartEval();
}

void Supervisor::ReadMetrics() {
  for (const std::string& line : learner_metrics_.NewLines()) {
    json row = json::parse(line, nullptr, false);
    if (!row.is_object() || !row.contains("step")) continue;
    const int64_t step = row.value("step", int64_t{0});
    sampled_by_step_[step] = row.value("trajectories", int64_t{0});
    curves_.AddLearnerRow(row);
    learner_row_ = std::move(row);
  }
  samples_ = 0;
  for (const auto& [step, count] : sampled_by_step_) samples_ += count;
  // The server logs its stats every server.stats_interval_s; a client of its own in the
  // launcher would cost more than reading what it already writes.
  constexpr std::string_view kStats = "replay stats: ";
  for (const std::string& line : replay_log_.NewLines()) {
    const size_t at = line.find(kStats);
    if (at == std::string::npos) continue;
    const json stats = json::parse(line.substr(at + kStats.size()), nullptr, false);
    if (!stats.is_object() || !stats.contains("tables") || !stats["tables"].is_array()) continue;
    json fill = json::object();
    for (const json& table : stats["tables"]) {
      if (table.contains("name") && table.contains("fill")) fill[table["name"]] = table["fill"];
    }
    replay_fill_ = std::move(fill);
  }
  for (size_t i = 0; i < actor_metrics_.size(); ++i) {
    for (const std::string& line : actor_metrics_[i].NewLines()) {
      json row = json::parse(line, nullptr, false);
      if (row.is_object()) actor_rows_[i] = std::move(row);
    }
  }
}

json Supervisor::MergedLine() const {
  const auto learner = [&](const char* key) -> json {
    if (!learner_row_ || !learner_row_->contains(key)) return nullptr;
    return (*learner_row_)[key];
  };
  std::optional<double> actor_tokens;
  for (const auto& row : actor_rows_) {
    if (row && row->contains("generated_tokens_per_s") &&
        (*row)["generated_tokens_per_s"].is_number()) {
      actor_tokens = actor_tokens.value_or(0) + (*row)["generated_tokens_per_s"].get<double>();
    }
  }
  json restarts = json::object();
  for (const auto& child : children_) {
    if (child->role != Role::kEval) restarts[child->name] = child->restarts;
  }
  return {{"elapsed_s", Elapsed()},
          {"learner_step", learner_row_ ? learner("step") : json(0)},
          {"policy_version", learner("policy_version")},
          {"reward_mean", learner("reward_mean")},
          {"success_rate", learner("success_rate")},
          {"eval_success_rate", Optional(eval_success_rate_)},
          {"samples", samples_},
          {"learner_tokens_per_s", learner("tokens_per_second")},
          {"actor_tokens_per_s", Optional(actor_tokens)},
          {"staleness_mean", learner("staleness_mean")},
          {"replay_fill", replay_fill_},
          {"restarts", restarts}};
}

void Supervisor::Progress(bool final_line) {
  const double elapsed = Elapsed();
  if (!progress_on_terminal_ && !final_line &&
      elapsed - last_plain_progress_ < kPlainProgressPeriodS) {
    return;
  }
  last_plain_progress_ = elapsed;
  const json m = MergedLine();
  const auto number = [](const json& value, const char* format) {
    if (!value.is_number()) return std::string("-");
    char text[32];
    std::snprintf(text, sizeof(text), format, value.get<double>());
    return std::string(text);
  };
  int64_t restarts = 0;
  for (const auto& [name, count] : m["restarts"].items()) restarts += count.get<int64_t>();
  char line[512];
  std::snprintf(line, sizeof(line),
                "%6.0fs step %s v%s | reward %s | success train %s eval %s | tok/s learner %s "
                "actors %s | staleness %s | restarts %lld",
                elapsed, number(m["learner_step"], "%.0f").c_str(),
                number(m["policy_version"], "%.0f").c_str(),
                number(m["reward_mean"], "%.3f").c_str(), number(m["success_rate"], "%.2f").c_str(),
                number(m["eval_success_rate"], "%.2f").c_str(),
                number(m["learner_tokens_per_s"], "%.0f").c_str(),
                number(m["actor_tokens_per_s"], "%.0f").c_str(),
                number(m["staleness_mean"], "%.1f").c_str(), static_cast<long long>(restarts));
  if (progress_on_terminal_) {
    std::fprintf(stderr, "\r%s\x1b[K%s", line, final_line ? "\n" : "");
    progress_line_open_ = !final_line;
  } else {
    std::fprintf(stderr, "launch: %s\n", line);
  }
  std::fflush(stderr);
}

void Supervisor::CheckStopRules() {
  if (phase_ != Phase::kRunning) return;
  const StopRules& stop = fleet_.stop;
  const int64_t step = learner_row_ ? learner_row_->value("step", int64_t{0}) : 0;
  if (stop.learner_steps > 0 && step >= stop.learner_steps) {
    BeginStop("learner_steps");
  } else if (stop.samples > 0 && samples_ >= stop.samples) {
    BeginStop("samples");
  } else if (stop.wall_time_s > 0 && Elapsed() >= stop.wall_time_s) {
    BeginStop("wall_time");
  } else if (stop.success_rate > 0 && eval_success_rate_ &&
             *eval_success_rate_ >= stop.success_rate) {
    BeginStop("success_rate");
  }
}

void Supervisor::MaybeStartEval() {
  if (!evaluation_enabled_ || phase_ != Phase::kRunning || !announced_ || eval_->running()) return;
  const int64_t version =
      learner_row_ ? learner_row_->value("policy_version", int64_t{0}) : int64_t{0};
  eval_->final_eval = false;
  eval_->eval_weights.clear();
  eval_->eval_version.reset();
  if (!start_evaluated_) {
    if (!start_weights_.empty()) {
      eval_->eval_weights = start_weights_;
      eval_->eval_version = 0;
    } else if (!options_.resume && !learner_row_) {
      return;  // nothing published before the learner's first step: wait for it
    }
  } else if (version < next_eval_version_ || Clock::now() < eval_retry_after_) {
    return;
  }
  start_evaluated_ = true;
  Spawn(*eval_);
}

Status Supervisor::StartStatusPage() {
  // A resumed run's earlier evaluations belong on its curve; its learner rows come with
  // ReadMetrics, which reads the learner's file from the start.
  std::ifstream earlier(run_dir_ / "eval.jsonl");
  for (std::string line; std::getline(earlier, line);) {
    curves_.AddEvalRow(json::parse(line, nullptr, false));
  }
  board_ = std::make_shared<StatusBoard>();
  PublishPage();
  Result<std::unique_ptr<http::StatusServer>> server =
      http::StatusServer::Start(fleet_.status_page, StatusBoard::Pages(board_, kPagePollMs));
  if (!server.ok()) {
    return Status(server.status().code(), "status_page: " + server.status().message());
  }
  page_server_ = std::move(server).value();
  page_address_ = page_server_->address();
  Log("status page on http://" + page_address_ + "/");
  WriteHttpAddresses();
  return Status::Ok();
}

void Supervisor::Scrape() {
  for (auto& owned : children_) {
    Child& child = *owned;
    if (child.http.empty() || child.scraping || !child.running()) continue;
    child.scraping = true;
    const uint64_t generation = child.generation;
    http::AsyncGet(io_, child.http, "/status", kScrapeTimeout,
                   [this, &child, generation](Result<std::string> body) {
                     child.scraping = false;
                     if (generation != child.generation) return;  // an earlier start's pages
                     if (!body.ok()) {
                       child.scrape_error = body.status().message();
                     } else if (json status = json::parse(*body, nullptr, false);
                                status.is_object()) {
                       child.last_status = std::move(status);
                       child.scrape_error.clear();
                     } else {
                       child.scrape_error = "its /status is not a JSON object";
                     }
                     PublishPage();
                   });
  }
}

json Supervisor::FleetJson() const {
  json children = json::array();
  for (const auto& owned : children_) {
    const Child& child = *owned;
    const char* role = child.role == Role::kReplay    ? "replay"
                       : child.role == Role::kLearner ? "learner"
                       : child.role == Role::kActor   ? "actor"
                                                      : "eval";
    // An evaluation prints no ready line: it is up while it runs.
    const bool up = child.running() && (child.ready || child.role == Role::kEval);
    children.push_back(
        {{"name", child.name},
         {"role", role},
         {"running", child.running()},
         {"up", up},
         {"pid", child.running() ? json(child.pid) : json(nullptr)},
         {"restarts", child.restarts},
         {"uptime_s",
          child.running()
              ? json(std::chrono::duration<double>(Clock::now() - child.started_at).count())
              : json(nullptr)},
         {"http", child.http.empty() ? json(nullptr) : json(child.http)},
         {"status", child.last_status},
         {"scrape_error", child.scrape_error.empty() ? json(nullptr) : json(child.scrape_error)}});
  }
  const char* phase = "done";
  switch (phase_) {
    case Phase::kRunning:
      phase = announced_ ? "running" : "starting";
      break;
    case Phase::kStopWorkers:
    case Phase::kStopReplay:
      phase = "stopping";
      break;
    case Phase::kFinalEval:
      phase = "final evaluation";
      break;
    case Phase::kDone:
      break;
  }
  return {{"run_dir", run_dir_.string()},
          {"phase", phase},
          {"reason", reason_.empty() ? json(nullptr) : json(reason_)},
          {"elapsed_s", Elapsed()},
          {"http", HttpAddresses()},
          {"latest", MergedLine()},
          {"children", std::move(children)},
          {"curves", curves_.ToJson(kPagePoints)}};
}

std::string Supervisor::LauncherMetrics() const {
  http::MetricsText metrics;
  const http::MetricsText::Labels labels = {{"role", "launcher"}, {"id", run_dir_.string()}};
  metrics.Add("strider_up", "gauge", "1 while the service serves", 1.0, labels);
  metrics.Add("strider_uptime_seconds", "gauge", "seconds since the service started", Elapsed(),
              labels);
  int64_t up = 0;
  for (const auto& child : children_) {
    if (child->role != Role::kEval && child->running() && child->ready) ++up;
  }
  metrics.Add("strider_launcher_children_up", "gauge",
              "replay server, learner and actors running and ready", static_cast<double>(up),
              labels);
  for (const auto& child : children_) {
    if (child->role == Role::kEval) continue;
    http::MetricsText::Labels with_child = labels;
    with_child.emplace_back("child", child->name);
    metrics.Add("strider_launcher_child_up", "gauge", "1 while the child runs and is ready",
                child->running() && child->ready ? 1.0 : 0.0, with_child);
    metrics.Add("strider_launcher_child_restarts", "counter",
                "restarts of the child's role in this launch", static_cast<double>(child->restarts),
                with_child);
  }
  json merged = MergedLine();
  merged.erase("restarts");  // per child above, with the label
  (void)metrics.AddJson("strider_launcher", merged.dump(), labels);  // an object: cannot fail
  return metrics.Text();
}

void Supervisor::PublishPage() {
  if (board_) board_->Publish(FleetJson().dump() + "\n", LauncherMetrics());
}

Result<LaunchSummary> Supervisor::Run() {
  std::error_code error;
  binary_ = fs::read_symlink(options_.binary, error).string();
  if (error || binary_.empty()) binary_ = options_.binary;
  STRIDER_RETURN_IF_ERROR(PrepareRunDir());

  replay_ = &AddChild("replay", Role::kReplay, 0);
  learner_ = &AddChild("learner", Role::kLearner, 0);
  for (int64_t i = 0; i < fleet_.actor_count; ++i) {
    const std::string name = "actor-" + std::to_string(i);
    actors_.push_back(&AddChild(name, Role::kActor, static_cast<int>(i)));
    fs::create_directories(run_dir_ / "actors" / name, error);
    actor_metrics_.emplace_back((run_dir_ / "actors" / name / "metrics.jsonl").string());
    actors_.back()->starts = static_cast<int64_t>(CountStarts(LogPath(*actors_.back())));
    // Rows of an earlier launch describe processes that are gone.
    (void)actor_metrics_.back().NewLines();
  }
  actor_rows_.resize(actors_.size());
  learner_metrics_ = FileTail((run_dir_ / "learner" / "metrics.jsonl").string());
  replay_log_ = FileTail((run_dir_ / "logs" / "replay.log").string());
  (void)replay_log_.NewLines();  // an earlier launch's stats describe another server
  if (fleet_.evaluation) {
    eval_ = &AddChild("eval", Role::kEval, 0);
    evaluation_enabled_ = true;
    if (!options_.resume) {
      if (!fleet_.weights.empty()) {
        start_weights_ = fleet_.weights;
      } else if (options_.write_initial_weights) {
        const std::string path = (run_dir_ / "initial.safetensors").string();
        STRIDER_RETURN_IF_ERROR(options_.write_initial_weights(path));
        start_weights_ = path;
      }
    }
  }

  if (fleet_.http) STRIDER_RETURN_IF_ERROR(StartStatusPage());

  WaitSignals();
  WaitChildSignals();
  // A resumed run already past a stop rule has nothing to start.
  ReadMetrics();
  CheckStopRules();
  if (phase_ == Phase::kRunning) {
    Spawn(*replay_);
  } else {
    Log("the run in " + run_dir_.string() + " already met its stop rule (" + reason_ + ")");
  }
  io_.run();

  ReadMetrics();
  merged_ << MergedLine().dump() << "\n" << std::flush;
  PublishPage();  // "done": the page answers until the launcher returns
  if (announced_) Progress(true);
  LaunchSummary summary;
  summary.reason = reason_;
  summary.learner_step = learner_row_ ? learner_row_->value("step", int64_t{0}) : 0;
  summary.eval_success_rate = eval_success_rate_;
  summary.elapsed_s = Elapsed();
  json finished = {{"event", "finished"},
                   {"reason", summary.reason},
                   {"learner_step", summary.learner_step},
                   {"eval_success_rate", Optional(summary.eval_success_rate)},
                   {"samples", samples_},
                   {"elapsed_s", summary.elapsed_s}};
  if (!failure_.ok()) finished["error"] = failure_.message();
  // The run's report.html, as `strider report RUN_DIR` writes it; a run whose files cannot be
  // reported (nothing written yet) still ends as it would have.
  const std::string report_path = (run_dir_ / "report.html").string();
  Result<std::string> report = WriteRlReport({run_dir_.string()}, report_path);
  if (report.ok()) {
    finished["report"] = *report;
  } else {
    Log("no report: " + report.status().ToString());
  }
  Emit(finished);
  if (!failure_.ok()) return failure_;
  return summary;
}

}  // namespace

Result<LaunchSummary> Launch(const FleetConfig& fleet, const LaunchOptions& options) {
  if (fleet.hosts) {
    return Status::InvalidArgument(
        fleet.origin +
        ": names hosts, and the launcher starts its children on this machine only; "
        "`strider launch " + fleet.origin +
        " --print-commands` prints the commands to run on each host (docs/fleet.md)");
  }
  Supervisor supervisor(fleet, options);
  return supervisor.Run();
}

}  // namespace strider::launcher
