// The supervisor behind Launch (launcher.h): one Boost.Asio io_context on the calling thread.
//
// Everything happens in handlers of that one context, so no state here is shared between
// threads: SIGCHLD, SIGINT and SIGTERM arrive through signal_sets, each child's stdout through a
// stream_descriptor on its pipe, readiness timeouts, restart backoff, the stop deadline and the
// progress tick through steady_timers.
//
// The Supervisor decides what runs when (the start order, restarts, the ordered stop) and wires
// the parts that do the rest, one job each: ChildProcesses starts, reads and reaps the processes
// (child_process.h), FleetMetrics merges the metrics the children write (fleet_metrics.h),
// FleetPage scrapes the children's status pages and serves the launcher's (fleet_page.h), and
// EvaluationSchedule says when an evaluation is due (eval_schedule.h).
#include "launcher/launcher.h"

#include <signal.h>
#include <sys/wait.h>

// clang-format off
#include <utility>  // before Boost.Asio: its awaitable.hpp uses std::exchange without including it
// clang-format on

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/durable_file.h"
#include "launcher/child_commands.h"
#include "launcher/child_process.h"
#include "launcher/eval_schedule.h"
#include "launcher/fleet_metrics.h"
#include "launcher/fleet_page.h"
#include "report/report.h"

namespace strider::launcher {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kLogTailLines = 12;  // quoted in errors

// Number or null.
json Optional(const std::optional<double>& value) { return value ? json(*value) : json(nullptr); }

class Supervisor {
 public:
  Supervisor(const FleetConfig& fleet, const LaunchOptions& options)
      : fleet_(fleet),
        options_(options),
        run_dir_(fs::absolute(fleet.run_dir).lexically_normal()),
        signals_(io_, SIGINT, SIGTERM),
        child_signals_(io_, SIGCHLD),
        tick_timer_(io_),
        kill_timer_(io_),
        processes_(io_, run_dir_ / "logs",
                   {[this](Child& child, const std::string& line) { OnLine(child, line); },
                    [this](Child& child, pid_t pid, int status) { OnExit(child, pid, status); }}) {}

  Result<LaunchSummary> Run();

 private:
  enum class Phase { kRunning, kStopWorkers, kStopReplay, kFinalEval, kDone };

  Status PrepareRunDir();
  Status AddChildren();
  std::vector<std::string> Arguments(const Child& child) const;
  uint64_t ActorSeed(const Child& child) const;
  std::string NewestCheckpoint() const;
  void Spawn(Child& child);
  void ArmReadyTimer(Child& child);
  void OnLine(Child& child, const std::string& line);
  void OnReady(Child& child, const json& ready);
  void Announce();
  void WaitSignals();
  void WaitChildSignals();
  void OnExit(Child& child, pid_t pid, int status);
  void Restart(Child& child, int status);
  void OnEvalExit(Child& child, int status);
  void RecordEvaluation(const Child& child, json row);
  void Fail(const Child& child, const std::string& why);
  void BeginStop(const std::string& reason);
  void ArmKillTimer();
  void AdvanceStop();
  bool StartFinalEval();
  void StartTick();
  void Tick();
  void ReadMetrics();
  json MergedLine() const;
  void CheckStopRules();
  void MaybeStartEval();
  std::optional<int64_t> LearnerVersion() const;
  void Emit(const json& event) const;
  // With the fleet's `http`: {role: "HOST:PORT"} of the children serving pages now, also
  // written to RUN_DIR/http.json whenever one changes.
  json HttpAddresses() const;
  void WriteHttpAddresses();
  void Log(const std::string& message) { progress_.Log(message); }
  Status StartStatusPage();
  FleetState PageState() const;
  void PublishPage();
  LaunchSummary Finish();
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  std::string LogPath(const Child& child) const { return processes_.LogPath(child); }

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

  ChildProcesses processes_;
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

  FleetMetrics metrics_;
  ProgressLine progress_;
  std::optional<EvaluationSchedule> evaluations_;  // with the fleet's `evaluation`
  // The status page, with the fleet's `http`; declared last: its server stops before the rest
  // goes.
  FleetPage page_;
};

json Supervisor::HttpAddresses() const {
  json addresses = json::object();
  if (!page_.address().empty()) addresses["launcher"] = page_.address();
  for (const Child* child : {replay_, learner_}) {
    if (child != nullptr && !child->http.empty()) addresses[child->name] = child->http;
  }
  for (const Child* actor : actors_) {
    if (!actor->http.empty()) addresses[actor->name] = actor->http;
  }
  return addresses;
}

void Supervisor::WriteHttpAddresses() {
  const fs::path path = run_dir_ / "http.json";
  Status written = WriteFileDurably(path, HttpAddresses().dump() + "\n");
  if (!written.ok()) Log("cannot write " + path.string() + ": " + written.message());
}

void Supervisor::Emit(const json& event) const {
  if (options_.on_event) options_.on_event(event.dump());
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
  // The run record `--resume` reads back: whole, or the earlier copy.
  const fs::path recorded = run_dir_ / "fleet.yaml";
  if (!fs::equivalent(fleet_.origin, recorded, error)) {
    std::ifstream in(fleet_.origin, std::ios::binary);
    if (!in) return Status::IoError("cannot read " + fleet_.origin);
    const std::string contents{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (in.bad()) return Status::IoError("cannot read " + fleet_.origin);
    Status copied = WriteFileDurably(recorded, contents);
    if (!copied.ok()) {
      return Status::IoError("cannot copy " + fleet_.origin + " to " + recorded.string() + ": " +
                             copied.message());
    }
  }
  return Status::Ok();
}

Status Supervisor::AddChildren() {
  replay_ = &processes_.Add("replay", Role::kReplay, 0);
  learner_ = &processes_.Add("learner", Role::kLearner, 0);
  std::vector<std::string> names;
  for (int64_t i = 0; i < fleet_.actor_count; ++i) {
    names.push_back("actor-" + std::to_string(i));
    actors_.push_back(&processes_.Add(names.back(), Role::kActor, static_cast<int>(i)));
    std::error_code error;
    fs::create_directories(run_dir_ / "actors" / names.back(), error);
  }
  STRIDER_RETURN_IF_ERROR(metrics_.Open(run_dir_, names, fleet_.evaluation.has_value()));
  if (!fleet_.evaluation) return Status::Ok();
  eval_ = &processes_.Add("eval", Role::kEval, 0);
  std::string start_weights;
  if (!options_.resume) {
    if (!fleet_.weights.empty()) {
      start_weights = fleet_.weights;
    } else if (options_.write_initial_weights) {
      const std::string path = (run_dir_ / "initial.safetensors").string();
      STRIDER_RETURN_IF_ERROR(options_.write_initial_weights(path));
      start_weights = path;
    }
  }
  evaluations_.emplace(fleet_.evaluation->every_versions, options_.resume, start_weights);
  return Status::Ok();
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
                            fleet_.weights,
                            fleet_.gpu_budget ? fleet_.gpu_budget->actor_cache_mb : 0};
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
  Status started = processes_.Start(child, Arguments(child));
  if (!started.ok()) {
    Fail(child, started.message());
    return;
  }
  Emit({{"event", "started"},
        {"role", child.name},
        {"pid", child.pid},
        {"restarts", child.restarts}});
  PublishPage();
  if (child.role != Role::kEval) ArmReadyTimer(child);
}

void Supervisor::ArmReadyTimer(Child& child) {
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
    Announce();
  }
}

void Supervisor::Announce() {
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
      processes_.SignalRunning(SIGKILL, true);
    }
    WaitSignals();
  });
}

void Supervisor::WaitChildSignals() {
  child_signals_.async_wait([this](const boost::system::error_code& ec, int) {
    if (ec) return;
    processes_.ReapAll();
    WaitChildSignals();
  });
}

void Supervisor::OnExit(Child& child, pid_t pid, int status) {
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
  Restart(child, status);
}

void Supervisor::Restart(Child& child, int status) {
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
    RecordEvaluation(child, std::move(row));
  } else if (phase_ != Phase::kRunning && !child.final_eval) {
    Log("evaluation stopped with the run (" + DescribeStatus(status) + ")");
  } else {
    Log("evaluation failed (" + DescribeStatus(status) + "); last lines of " + LogPath(child) +
        ":\n" + LogTail(LogPath(child), kLogTailLines));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
      // Bad usage or config does not get better by trying again.
      Log("evaluations are off for the rest of this run");
      evaluations_->Disable();
    } else {
      evaluations_->Failed(LearnerVersion(), Clock::now());
    }
  }
  if (phase_ == Phase::kRunning) {
    CheckStopRules();
    MaybeStartEval();
  } else {
    AdvanceStop();
  }
}

// An evaluation's result line, with what the launcher knows of the run, to eval.jsonl, the
// page and the events.
void Supervisor::RecordEvaluation(const Child& child, json row) {
  const std::optional<json>& learner = metrics_.learner_row();
  if (child.eval_version) {
    row["policy_version"] = *child.eval_version;  // a file carries no version
  } else if (child.final_eval) {
    // The final checkpoint holds the learner's last published version.
    row["policy_version"] = learner ? learner->value("policy_version", json(nullptr)) : json(nullptr);
  }
  row["learner_step"] = learner ? learner->value("step", json(nullptr)) : json(0);
  row["samples_seen"] = metrics_.samples();
  row["elapsed_s"] = Elapsed();
  if (child.final_eval) row["final"] = true;
  metrics_.AppendEval(row);
  page_.AddEvalRow(row);
  Emit(row);
  std::optional<int64_t> version;
  if (row.contains("policy_version") && row["policy_version"].is_number_integer()) {
    version = row["policy_version"].get<int64_t>();
  }
  evaluations_->Done(version);
}

void Supervisor::Fail(const Child& child, const std::string& why) {
  if (failure_.ok()) {
    failure_ = Status::Unavailable(child.name + " " + why + "; last lines of " + LogPath(child) +
                                   ":\n" + LogTail(LogPath(child), kLogTailLines));
  }
  BeginStop("failed");
}

void Supervisor::BeginStop(const std::string& reason) {
  if (phase_ != Phase::kRunning) return;
  reason_ = reason;
  phase_ = Phase::kStopWorkers;
  tick_timer_.cancel();
  for (const auto& child : processes_.all()) child->backoff_timer.cancel();
  processes_.SignalRunning(SIGTERM, /*replay_too=*/false);
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
    processes_.SignalRunning(SIGKILL, true);
  });
}

void Supervisor::AdvanceStop() {
  const auto any_running = [&](bool replay) {
    return std::any_of(processes_.all().begin(), processes_.all().end(), [&](const auto& c) {
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
    if (StartFinalEval()) return;
  }
  if (phase_ == Phase::kFinalEval) {
    if (eval_ != nullptr && eval_->running()) return;
    phase_ = Phase::kDone;
    signals_.cancel();
    child_signals_.cancel();
    io_.stop();
  }
}

// The final checkpoint's evaluation, when the fleet wants one and the run ended by a rule.
bool Supervisor::StartFinalEval() {
  const bool wanted = fleet_.evaluation && fleet_.evaluation->final && evaluations_->enabled() &&
                      reason_ != "signal" && reason_ != "failed" && !NewestCheckpoint().empty();
  if (!wanted) return false;
  ReadMetrics();
  eval_->final_eval = true;
  eval_->eval_weights = NewestCheckpoint() + "/model.safetensors";
  eval_->eval_version.reset();
  Log("final evaluation of " + NewestCheckpoint());
  Spawn(*eval_);
  return true;
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
  processes_.ReapAll();  // a SIGCHLD that raced a handler's start is never lost for longer
  if (phase_ != Phase::kRunning) return;
  ReadMetrics();
  const json line = MergedLine();
  metrics_.AppendMerged(line);
  if (page_.serving()) {
    page_.AddTick(line, *replay_);
    page_.Scrape(io_, processes_.all(), [this] { PublishPage(); });
    PublishPage();
  }
  progress_.Show(MergedLine(), Elapsed(), false);
  CheckStopRules();
  MaybeStartEval();
}

void Supervisor::ReadMetrics() {
  for (const json& row : metrics_.Read()) page_.AddLearnerRow(row);
}

json Supervisor::MergedLine() const {
  json restarts = json::object();
  for (const auto& child : processes_.all()) {
    if (child->role != Role::kEval) restarts[child->name] = child->restarts;
  }
  return metrics_.MergedLine(Elapsed(), std::move(restarts));
}

std::optional<int64_t> Supervisor::LearnerVersion() const {
  if (!metrics_.learner_row()) return std::nullopt;
  return metrics_.LearnerValue("policy_version", 0);
}

void Supervisor::CheckStopRules() {
  if (phase_ != Phase::kRunning) return;
  const StopRules& stop = fleet_.stop;
  const int64_t step = metrics_.LearnerValue("step", 0);
  const std::optional<double> eval_success_rate = metrics_.eval_success_rate();
  if (stop.learner_steps > 0 && step >= stop.learner_steps) {
    BeginStop("learner_steps");
  } else if (stop.samples > 0 && metrics_.samples() >= stop.samples) {
    BeginStop("samples");
  } else if (stop.wall_time_s > 0 && Elapsed() >= stop.wall_time_s) {
    BeginStop("wall_time");
  } else if (stop.success_rate > 0 && eval_success_rate &&
             *eval_success_rate >= stop.success_rate) {
    BeginStop("success_rate");
  }
}

void Supervisor::MaybeStartEval() {
  if (!evaluations_ || !evaluations_->enabled() || phase_ != Phase::kRunning || !announced_ ||
      eval_->running()) {
    return;
  }
  eval_->final_eval = false;
  eval_->eval_weights.clear();
  eval_->eval_version.reset();
  std::optional<EvaluationSchedule::Run> due = evaluations_->Due(LearnerVersion(), Clock::now());
  if (!due) return;
  eval_->eval_weights = due->weights;
  eval_->eval_version = due->version;
  Spawn(*eval_);
}

Status Supervisor::StartStatusPage() {
  STRIDER_RETURN_IF_ERROR(page_.Start(fleet_.status_page, run_dir_, PageState(), processes_.all()));
  Log("status page on http://" + page_.address() + "/");
  WriteHttpAddresses();
  return Status::Ok();
}

FleetState Supervisor::PageState() const {
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
  return {run_dir_.string(), phase, reason_, Elapsed(), HttpAddresses(), MergedLine()};
}

void Supervisor::PublishPage() {
  if (page_.serving()) page_.Publish(PageState(), processes_.all());
}

Result<LaunchSummary> Supervisor::Run() {
  std::error_code error;
  binary_ = fs::read_symlink(options_.binary, error).string();
  if (error || binary_.empty()) binary_ = options_.binary;
  STRIDER_RETURN_IF_ERROR(PrepareRunDir());
  STRIDER_RETURN_IF_ERROR(AddChildren());
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
  LaunchSummary summary = Finish();
  if (!failure_.ok()) return failure_;
  return summary;
}

// The run's last merged line, its report and the finished event, once every child is gone.
LaunchSummary Supervisor::Finish() {
  ReadMetrics();
  metrics_.AppendMerged(MergedLine());
  PublishPage();  // "done": the page answers until the launcher returns
  if (announced_) progress_.Show(MergedLine(), Elapsed(), true);
  LaunchSummary summary;
  summary.reason = reason_;
  summary.learner_step = metrics_.LearnerValue("step", 0);
  summary.eval_success_rate = metrics_.eval_success_rate();
  summary.elapsed_s = Elapsed();
  json finished = {{"event", "finished"},
                   {"reason", summary.reason},
                   {"learner_step", summary.learner_step},
                   {"eval_success_rate", Optional(summary.eval_success_rate)},
                   {"samples", metrics_.samples()},
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
