// End-to-end fleet benchmark: runs `strider launch` on a fleet file for a fixed time and reports,
// from the run directory the fleet wrote, what a user watching the run would ask first:
//   samples_per_second      trajectories the learner trained on per second of wall time, against
//                           the learner's own rate when it never waits for replay (the same
//                           steps' compute time), so the ratio is the share of its speed the
//                           fleet delivers end to end;
//   learner_busy_fraction   the learner's time not spent waiting for replay (target 0.9);
//   actor_weights_wait      the share of the actors' time spent waiting for new weights (sync
//                           rounds; asynchronous actors never wait, and report 0);
//   learner_tokens_per_second, actor_generated_tokens_per_second.
// No LibTorch: the fleet's processes are real `strider` children, this program only reads what
// they wrote.
//
//   fleet_bench [--fleet FILE] [--seconds N] [--strider PATH] [--quick] [--keep DIR]
//
// With --learner-ranks, the data-parallel RL learner's throughput across group sizes instead
// (docs/fleet.md, "Learner throughput across ranks"): a replay server filled once by a real
// actor, then for each W a group of W learner ranks (one thread each) training on W x
// --per-rank-units groups a step, the group sizes taking turns for --rounds rounds. Per W, the
// group's tokens/s against W x one rank's tokens/s (the scaling efficiency), samples/s and the
// share of step time in gradient all-reduces; a summary line holds the largest group's
// efficiency against the one the machine's cores allow.
//
//   fleet_bench --learner-ranks 1,2,4 [--per-rank-units N] [--steps S] [--rounds R]
//               [--bucket-mb MB] [--expert-parallel] [--model CONFIG] [--strider PATH]
//               [--quick] [--keep DIR]
// --expert-parallel: the groups of 2 and more ranks also shard the routed experts (the
// learner's distributed.expert_parallel); the lines add its rounds and the gathers for
// publishing.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_json.h"
#include "tests/free_port.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<json> ReadLines(const fs::path& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    json value = json::parse(line, nullptr, false);
    if (value.is_object()) lines.push_back(std::move(value));
  }
  return lines;
}

double Number(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_number() ? it->get<double>() : 0.0;
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "fleet_bench: %s\nusage: fleet_bench [--fleet FILE] [--seconds N] [--strider PATH] "
               "[--quick] [--keep DIR]\n"
               "       fleet_bench --learner-ranks 1,2,4 [--per-rank-units N] [--steps S] "
               "[--rounds R] [--bucket-mb MB] [--expert-parallel] [--model CONFIG] [--strider PATH] [--quick] [--keep DIR]\n",
               why);
  return 2;
}

// A `strider` child with stdout and stderr in files; killed and reaped if still running when
// this goes out of scope, so a failed run leaves no process behind.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  bool Start(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err) {
    pid_ = ::fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      // Ranks outnumber cores here: spinning OpenMP workers would take the cores from the rank
      // whose turn it is.
      ::setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
      const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out_fd >= 0) ::dup2(out_fd, STDOUT_FILENO);
      if (err_fd >= 0) ::dup2(err_fd, STDERR_FILENO);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    return true;
  }

  // Exit status (128 + signal when killed); nullopt while still running after `timeout_s`.
  std::optional<int> Wait(double timeout_s) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (pid_ > 0) {
      int status = 0;
      rusage usage{};
      if (::wait4(pid_, &status, WNOHANG, &usage) == pid_) {
        pid_ = -1;
        cpu_seconds_ = Seconds(usage.ru_utime) + Seconds(usage.ru_stime);
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }

  void Signal(int signal) {
    if (pid_ > 0) ::kill(pid_, signal);
  }

  // False once it exited, reaped or not.
  bool Running() const {
    if (pid_ <= 0) return false;
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
  }

  // User and system CPU time so far (/proc while running, the exit's rusage after Wait); -1
  // when not known.
  double CpuSeconds() const {
    if (pid_ <= 0) return cpu_seconds_;
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Fields after the command name, which may hold spaces, in brackets: utime and stime are
    // the 12th and 13th.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) return -1;
    std::istringstream fields(stat.substr(close + 2));
    std::string field;
    double ticks = 0;
    for (int i = 1; i <= 13 && fields >> field; ++i) {
      if (i >= 12) ticks += std::atof(field.c_str());
    }
    return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }

 private:
  static double Seconds(const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; }

  pid_t pid_ = -1;
  double cpu_seconds_ = -1;
};

// The first line of `path` whose "event" is `event`, once a child has written it; null after
// `timeout_s`.
json WaitForEvent(const fs::path& path, const std::string& event, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    for (const json& line : ReadLines(path)) {
      if (line.value("event", "") == event) return line;
    }
    if (std::chrono::steady_clock::now() >= deadline) return json();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

double LoadAverage() {
  double load[1] = {-1};
  return ::getloadavg(load, 1) == 1 ? load[0] : -1;
}

struct RanksOptions {
  std::vector<int> worlds;    // ascending, always with 1: the baseline
  int per_rank_units = 4;     // groups each rank trains on per step
  int steps = 8;              // per group run; the first is warm-up and not counted
  int rounds = 2;             // runs of every group size, interleaved
  double bucket_mb = 0;       // gradient bucket size; 0: the learner's default
  bool expert_parallel = false;  // groups of 2+ ranks shard the routed experts
  fs::path model;
  fs::path strider;
  std::string keep;
};

// One group size's sums over the counted steps of all its runs.
struct RanksResult {
  int world = 0;
  int steps = 0;
  double tokens = 0, trajectories = 0, step_seconds = 0;  // the group's, on rank 0's clock
  double update_seconds = 0, score_seconds = 0, sample_seconds = 0;  // rank 0's
  double allreduce_shares = 0;  // per rank and run: all-reduce time / step time
  double buckets = 0, buckets_during_backward = 0;  // rank 0's gradient buckets
  double rounds = 0, rounds_served = 0;   // rank 0's expert-parallel rounds
  double gather_seconds = 0, publish_seconds = 0;  // rank 0's
  double cpu_seconds = 0;       // all ranks' CPU time after warm-up; negative when not known
  int rank_runs = 0;
  double load_sum = 0;  // the machine's 1-minute load average as each run started
  int runs = 0;
  std::vector<double> run_tokens_per_second;  // each run's own, in the order they ran

  void Add(const RanksResult& other) {
    world = other.world;
    steps += other.steps;
    tokens += other.tokens;
    trajectories += other.trajectories;
    step_seconds += other.step_seconds;
    update_seconds += other.update_seconds;
    score_seconds += other.score_seconds;
    sample_seconds += other.sample_seconds;
    allreduce_shares += other.allreduce_shares;
    buckets += other.buckets;
    buckets_during_backward += other.buckets_during_backward;
    rounds += other.rounds;
    rounds_served += other.rounds_served;
    gather_seconds += other.gather_seconds;
    publish_seconds += other.publish_seconds;
    cpu_seconds = cpu_seconds >= 0 && other.cpu_seconds >= 0 ? cpu_seconds + other.cpu_seconds : -1;
    rank_runs += other.rank_runs;
    load_sum += other.load_sum;
    runs += other.runs;
    run_tokens_per_second.push_back(other.TokensPerSecond());
  }
  double TokensPerSecond() const { return step_seconds > 0 ? tokens / step_seconds : 0; }
  double Share(double seconds) const { return step_seconds > 0 ? seconds / step_seconds : 0; }
  std::optional<double> TokensPerCpuSecond() const {
    if (cpu_seconds <= 0) return std::nullopt;
    return tokens / cpu_seconds;
  }
};

constexpr int kGroupSize = 4;

// Every learner id reads every group once, in order (fifo per id, no sampling limit): each
// group size reads the same episodes from the start under its own id.
constexpr char kReplayConfig[] =
    "server: {stats_interval_s: 0}\n"
    "tables:\n  - name: groups\n    unit: group\n    sampler: fifo\n"
    "    capacity: 100000\n    rate_limiter: {min_fill: 1, max_times_sampled: 0}\n";

// The episode settings of configs/actor/calculator_tiny.yaml, so the learner sees the
// trajectory lengths a calculator run trains on; both cores play, nothing else runs yet.
void WriteActorConfig(const fs::path& path, const fs::path& model, int episodes) {
  std::ofstream(path) << "actor:\n  model: " << model.string() << "\n"
                      << "  model_seed: 0\n  threads: 2\n  episodes: " << episodes << "\n"
                      << "  episodes_in_flight: 16\n  group_size: " << kGroupSize << "\n"
                      << "  max_turns: 3\n  max_episode_tokens: 2048\n  seed: 1\n"
                      << "  segment_tokens: 256\n"
                      << "  sampling: {temperature: 1.0, max_new_tokens: 48}\n"
                      << "  engine: {cache_budget_mb: 128, max_batch: 64}\n"
                      << "  replay: {endpoint: tcp://127.0.0.1:1}\n"
                      << "  metrics: {interval_s: 5, progress: false}\n"
                      << "env:\n  name: calculator\n  options: {difficulty: 1}\n";
}

// The training settings of configs/rl/calculator_tiny.yaml (one epoch, one mini-batch,
// balance, scoring against the initial reference), one thread per rank, and no periodic
// checkpoints, whose writes are no part of a step's throughput.
void WriteLearnerConfig(const fs::path& path, const fs::path& model, const std::string& id,
                        int units_per_step, int steps, double bucket_mb, bool expert_parallel) {
  std::ofstream out(path);
  out << "distributed: {expert_parallel: " << (expert_parallel ? "true" : "false");
  if (bucket_mb > 0) out << ", bucket_mb: " << bucket_mb;
  out << "}\n";
  out << "mode: rl\nmodel_config: " << model.string() << "\n"
      << "init_seed: 0\nseed: 1\nthreads: 1\n"
      << "replay: {table: groups, learner_id: ranks-" << id
      << ", units_per_step: " << units_per_step << ", sample_timeout_s: 120}\n"
      << "publish: {every_steps: 1}\n"
      << "optimizer: {learning_rate: 0.0003, weight_decay: 0.0, clip_norm: 1.0}\n"
      << "balance: {enabled: true, router_learning_rate_scale: 0.1}\n"
      << "train: {steps: " << steps << ", ppo_epochs: 1, minibatches: 1, chunk_tokens: 512,"
      << " backprop: truncated, sync: false}\n"
      << "scoring: {replay_routing: true, mismatch_threshold: 0.0001, reference: initial}\n"
      << "objective:\n  advantages: {estimator: outcome_group, divide_by_std: true}\n"
      << "  aggregation: token_mean\n  policy: {eps_low: 0.2, eps_high: 0.28}\n"
      << "  value: {coef: 0.0}\n"
      << "reward: {step_weight: 0.1, outcome_weight: 1.0}\n"
      << "checkpoint: {every_steps: 0}\n";
}

// Runs one group of `world` ranks to the end and adds its metrics to `result`; false (with the
// reason on stderr) when a rank failed or a step is missing.
bool RunGroup(const RanksOptions& options, const fs::path& base,
              const std::string& replay_endpoint, int world, int round, RanksResult& result) {
  // An id per run: each reads the same groups from the first.
  const std::string name = std::to_string(world) + "-r" + std::to_string(round);
  const fs::path config = base / ("learner-" + name + ".yaml");
  WriteLearnerConfig(config, options.model, name, world * options.per_rank_units, options.steps,
                     options.bucket_mb, options.expert_parallel);
  const fs::path run_dir = base / ("ranks-" + name);
  result.world = world;
  result.load_sum += LoadAverage();
  ++result.runs;
  const std::string rendezvous = "127.0.0.1:" + std::to_string(strider::testing::FreeLoopbackPort());
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = {options.strider.string(), "learner", "--config",
                                     config.string(), "--run-dir", run_dir.string(),
                                     "--replay", replay_endpoint,
                                     "--publish", "tcp://127.0.0.1:0"};
    // One rank alone is the plain learner, without a process group: the baseline a user
    // would otherwise run.
    if (world > 1) {
      argv.insert(argv.end(), {"--rank", std::to_string(r), "--world-size",
                               std::to_string(world), "--rendezvous", rendezvous});
    }
    const std::string log = "learner-" + name + "-rank" + std::to_string(r);
    ranks.push_back(std::make_unique<Child>());
    if (!ranks.back()->Start(argv, base / (log + ".out"), base / (log + ".err"))) {
      std::fprintf(stderr, "fleet_bench: fork failed\n");
      return false;
    }
  }
  // A generous bound: 4 one-thread ranks on 2 cores take some seconds a step.
  const double timeout_s = 120 + 60.0 * options.steps;
  auto metrics_path = [&](int r) {
    return (r == 0 ? run_dir : run_dir / ("rank-" + std::to_string(r))) / "metrics.jsonl";
  };
  // Each rank's CPU time as its warm-up step ends, so the counted CPU time, like the counted
  // steps, starts after it (it ends at exit, with the final checkpoint's write).
  std::vector<double> warm_cpu(world, -1);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int waiting = world; waiting > 0 && std::chrono::steady_clock::now() < deadline;) {
    waiting = 0;
    for (int r = 0; r < world; ++r) {
      if (warm_cpu[r] >= 0) continue;
      if (!ReadLines(metrics_path(r)).empty()) {
        warm_cpu[r] = ranks[r]->CpuSeconds();
      } else {
        ++waiting;
      }
    }
    // A rank that stopped before its first step fails the run below.
    if (std::any_of(ranks.begin(), ranks.end(), [](const auto& c) { return !c->Running(); })) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int r = 0; r < world; ++r) {
    const std::optional<int> code = ranks[r]->Wait(timeout_s);
    if (code != 0) {
      std::fprintf(stderr, "fleet_bench: learner rank %d of %d %s; see %s\n", r, world,
                   code ? ("exited with " + std::to_string(*code)).c_str() : "did not finish",
                   (base / ("learner-" + name + "-rank" + std::to_string(r) + ".err")).c_str());
      return false;
    }
  }

  double cpu_seconds = 0;
  for (int r = 0; r < world; ++r) {
    const double end = ranks[r]->CpuSeconds();
    cpu_seconds = warm_cpu[r] >= 0 && end >= 0 && cpu_seconds >= 0
                      ? cpu_seconds + end - warm_cpu[r] : -1;
  }
  result.cpu_seconds = cpu_seconds;
  for (int r = 0; r < world; ++r) {
    const fs::path metrics = metrics_path(r);
    std::vector<json> steps;
    for (json& line : ReadLines(metrics)) {
      if (line.contains("step")) steps.push_back(std::move(line));
    }
    if (static_cast<int>(steps.size()) != options.steps) {
      std::fprintf(stderr, "fleet_bench: %s has %zu steps, not %d\n", metrics.c_str(),
                   steps.size(), options.steps);
      return false;
    }
    double allreduce = 0, step_seconds = 0;
    // The first step pays for first touches (allocator, Gloo's buffers, the reference's
    // scoring pass warming up): warm-up, not throughput.
    for (size_t i = 1; i < steps.size(); ++i) {
      const json& step = steps[i];
      allreduce += Number(step, "allreduce_seconds");
      step_seconds += Number(step, "step_seconds");
      if (r != 0) continue;
      if (world > 1) {
        result.buckets += Number(step, "allreduce_buckets");
        result.buckets_during_backward += Number(step, "allreduce_buckets_during_backward");
        if (options.expert_parallel) {
          result.rounds += Number(step, "expert_rounds");
          result.rounds_served += Number(step, "expert_rounds_served");
          result.gather_seconds += Number(step, "expert_gather_seconds");
        }
      }
      result.publish_seconds += Number(step, "publish_seconds");
      result.tokens += Number(step, "tokens");
      result.trajectories += Number(step, "trajectories");
      result.update_seconds += Number(step, "update_seconds");
      result.score_seconds += Number(step, "score_seconds");
      result.sample_seconds += Number(step, "sample_seconds");
      ++result.steps;
    }
    if (r == 0) result.step_seconds += step_seconds;
    result.allreduce_shares += step_seconds > 0 ? allreduce / step_seconds : 0;
    ++result.rank_runs;
  }
  return true;
}

std::string WorldsText(const std::vector<int>& worlds) {
  std::string text;
  for (int w : worlds) text += (text.empty() ? "" : ",") + std::to_string(w);
  return text;
}

int RunLearnerRanks(const RanksOptions& options) {
  const fs::path source = STRIDER_SOURCE_DIR;
  char pattern[] = "/tmp/strider-ranks-bench-XXXXXX";
  const fs::path base = options.keep.empty() ? fs::path(::mkdtemp(pattern)) : fs::path(options.keep);
  fs::create_directories(base);
  const unsigned cores = std::thread::hardware_concurrency();
  const double load_before = LoadAverage();

  Child server;
  std::ofstream(base / "replay.yaml") << kReplayConfig;
  if (!server.Start({options.strider.string(), "replay", "serve", "--db", (base / "db").string(),
                     "--config", (base / "replay.yaml").string(), "--bind", "tcp://127.0.0.1:0",
                     "--sample-bind", "tcp://127.0.0.1:0"},
                    base / "replay.out", base / "replay.err")) {
    return Usage("fork failed");
  }
  const json ready = WaitForEvent(base / "replay.out", "ready", 60);
  if (!ready.is_object()) {
    std::fprintf(stderr, "fleet_bench: no ready line from the replay server; see %s\n",
                 (base / "replay.err").c_str());
    return 1;
  }
  const std::string actor_endpoint = ready.value("actor_endpoint", "");
  const std::string learner_endpoint = ready.value("learner_endpoint", "");

  // Enough groups for the largest group's steps, read by every group size.
  const int groups = options.worlds.back() * options.per_rank_units * options.steps;
  const int episodes = groups * kGroupSize;
  const auto fill_started = std::chrono::steady_clock::now();
  {
    WriteActorConfig(base / "actor.yaml", options.model, episodes);
    Child actor;
    if (!actor.Start({options.strider.string(), "actor", "--config",
                      (base / "actor.yaml").string(), "--replay", actor_endpoint, "--spill-dir",
                      (base / "spill").string()},
                     base / "actor.out", base / "actor.err")) {
      return Usage("fork failed");
    }
    const std::optional<int> code = actor.Wait(60 + 2.0 * episodes);
    const json finished = WaitForEvent(base / "actor.out", "finished", 0);
    if (code != 0 || !finished.is_object() ||
        finished.value("metrics", json::object()).value("episodes", 0) != episodes) {
      std::fprintf(stderr, "fleet_bench: the actor did not play %d episodes; see %s\n", episodes,
                   (base / "actor.err").c_str());
      return 1;
    }
  }
  const double fill_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - fill_started).count();
  std::fprintf(stderr, "fleet_bench: %d episodes in %d groups played in %.0f s\n", episodes,
               groups, fill_seconds);

  // Rounds interleave the group sizes, so load others put on a shared machine for a while
  // falls on each size alike rather than on whichever ran then.
  std::vector<RanksResult> results(options.worlds.size());
  for (int round = 0; round < options.rounds; ++round) {
    for (size_t i = 0; i < options.worlds.size(); ++i) {
      const int world = options.worlds[i];
      RanksResult run;
      if (!RunGroup(options, base, learner_endpoint, world, round, run)) return 1;
      std::fprintf(stderr, "fleet_bench: round %d, %d rank(s): %.0f tokens/s over %d steps\n",
                   round + 1, world, run.TokensPerSecond(), run.steps);
      results[i].Add(run);
    }
  }
  server.Signal(SIGTERM);
  server.Wait(60);
  const double load_after = LoadAverage();

  using strider::bench::JsonNumber;
  using strider::bench::JsonString;
  using strider::bench::PrintResult;
  strider::bench::EveryLineFields() = {{"policy", JsonString("PASSIVE")}};
  const std::string model = fs::relative(options.model, source).string();
  const double one = results.front().TokensPerSecond();
  // With fewer cores than ranks, W ranks can at best do min(W, cores) ranks' work.
  auto core_bound = [&](int world) {
    return cores > 0 ? std::min<double>(world, cores) / world : 1.0;
  };
  // Work per CPU second against one rank's: what splitting the batch costs in extra work, apart
  // from how many cores others left free.
  auto cpu_efficiency = [&](const RanksResult& r) -> std::optional<double> {
    const std::optional<double> mine = r.TokensPerCpuSecond();
    const std::optional<double> lone = results.front().TokensPerCpuSecond();
    if (!mine || !lone) return std::nullopt;
    return *mine / *lone;
  };
  std::string efficiencies = "{", cpu_efficiencies = "{";
  for (const RanksResult& r : results) {
    const double efficiency = one > 0 ? r.TokensPerSecond() / (r.world * one) : 0;
    if (efficiencies.size() > 1) efficiencies += ",";
    efficiencies += JsonString(std::to_string(r.world)) + ":" + JsonNumber(efficiency);
    if (cpu_efficiencies.size() > 1) cpu_efficiencies += ",";
    cpu_efficiencies += JsonString(std::to_string(r.world)) + ":" + JsonNumber(cpu_efficiency(r));
    std::string rates = "[";
    for (double rate : r.run_tokens_per_second) {
      rates += (rates.size() > 1 ? "," : "") + JsonNumber(rate);
    }
    rates += "]";
    const strider::bench::JsonFields fields = {
        {"world_size", JsonNumber(r.world)},
        {"baseline_is", JsonString("world_size x one rank's tokens_per_second")},
        {"samples_per_second",
         JsonNumber(r.step_seconds > 0 ? r.trajectories / r.step_seconds : 0)},
        {"step_seconds_mean", JsonNumber(r.step_seconds / std::max(r.steps, 1))},
        {"allreduce_share",
         JsonNumber(r.rank_runs > 0 ? r.allreduce_shares / r.rank_runs : 0)},
        {"gradient_buckets_per_step", JsonNumber(r.buckets / std::max(r.steps, 1))},
        {"buckets_sent_during_backward",
         JsonNumber(r.buckets > 0 ? r.buckets_during_backward / r.buckets : 0)},
        {"bucket_mb", JsonNumber(options.bucket_mb > 0 ? options.bucket_mb : 25)},
        {"expert_parallel", options.expert_parallel && r.world > 1 ? "true" : "false"},
        {"expert_rounds_per_step", JsonNumber(r.rounds / std::max(r.steps, 1))},
        {"expert_rounds_served_share",
         JsonNumber(r.rounds > 0 ? r.rounds_served / r.rounds : 0)},
        {"expert_gather_seconds_mean", JsonNumber(r.gather_seconds / std::max(r.steps, 1))},
        {"publish_seconds_mean", JsonNumber(r.publish_seconds / std::max(r.steps, 1))},
        {"update_share", JsonNumber(r.Share(r.update_seconds))},
        {"score_share", JsonNumber(r.Share(r.score_seconds))},
        {"sample_share", JsonNumber(r.Share(r.sample_seconds))},
        {"core_bound_efficiency", JsonNumber(core_bound(r.world))},
        {"tokens_per_second_by_round", rates},
        {"tokens_per_cpu_second", JsonNumber(r.TokensPerCpuSecond())},
        {"cpu_efficiency", JsonNumber(cpu_efficiency(r))},
        {"per_rank_units", JsonNumber(options.per_rank_units)},
        {"trajectories_per_step", JsonNumber(r.trajectories / std::max(r.steps, 1))},
        {"tokens_per_step", JsonNumber(r.tokens / std::max(r.steps, 1))},
        {"steps_counted", JsonNumber(r.steps)},
        {"rounds", JsonNumber(options.rounds)},
        {"model", JsonString(model)},
        {"threads_per_rank", JsonNumber(1)},
        {"cores", JsonNumber(cores)},
        {"load_mean_at_start", JsonNumber(r.runs > 0 ? r.load_sum / r.runs : 0)}};
    PrintResult("learner_ranks", "group_tokens_per_second ranks=" + std::to_string(r.world),
                r.TokensPerSecond(), "tokens/s", r.world * one, fields);
  }
  efficiencies += "}";
  cpu_efficiencies += "}";
  const RanksResult& largest = results.back();
  const double efficiency = one > 0 ? largest.TokensPerSecond() / (largest.world * one) : 0;
  PrintResult("learner_ranks", "scaling_efficiency ranks=" + WorldsText(options.worlds),
              efficiency, "fraction", core_bound(largest.world),
              {{"world_size", JsonNumber(largest.world)},
               {"baseline_is", JsonString("min(world_size, cores) / world_size")},
               {"efficiency_by_world_size", efficiencies},
               {"cpu_efficiency_by_world_size", cpu_efficiencies},
               {"per_rank_units", JsonNumber(options.per_rank_units)},
               {"steps_counted", JsonNumber(largest.steps)},
               {"rounds", JsonNumber(options.rounds)},
               {"model", JsonString(model)},
               {"cores", JsonNumber(cores)},
               {"fill_seconds", JsonNumber(fill_seconds)},
               {"load_before", JsonNumber(load_before)},
               {"load_after", JsonNumber(load_after)}});
  if (options.keep.empty()) fs::remove_all(base);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path source = STRIDER_SOURCE_DIR;
  fs::path fleet = source / "configs/fleet/calculator_tiny.yaml";
  fs::path strider = fs::path(argv[0]).parent_path() / "../cli/strider";
  double seconds = 120;
  std::string keep;
  bool quick = false;
  std::string ranks_list;
  std::optional<int> per_rank_units, rank_steps, rounds;
  double bucket_mb = 0;
  bool expert_parallel = false;
  fs::path model = source / "configs/model/tiny.yaml";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--expert-parallel") {
      expert_parallel = true;
    } else if (arg == "--quick") {
      seconds = 30;
      quick = true;
    } else if (arg == "--fleet" || arg == "--seconds" || arg == "--strider" || arg == "--keep" ||
               arg == "--learner-ranks" || arg == "--per-rank-units" || arg == "--steps" ||
               arg == "--rounds" || arg == "--model" || arg == "--bucket-mb") {
      const char* v = value();
      if (!v) return Usage(("missing value for " + arg).c_str());
      if (arg == "--fleet") fleet = v;
      if (arg == "--seconds") seconds = std::atof(v);
      if (arg == "--strider") strider = v;
      if (arg == "--keep") keep = v;
      if (arg == "--learner-ranks") ranks_list = v;
      if (arg == "--per-rank-units") per_rank_units = std::atoi(v);
      if (arg == "--steps") rank_steps = std::atoi(v);
      if (arg == "--rounds") rounds = std::atoi(v);
      if (arg == "--model") model = v;
      if (arg == "--bucket-mb") bucket_mb = std::atof(v);
    } else {
      return Usage(("unknown argument " + arg).c_str());
    }
  }
  if (!fs::is_regular_file(strider)) return Usage(("no strider binary " + strider.string()).c_str());

  if (!ranks_list.empty()) {
    RanksOptions options;
    std::stringstream items(ranks_list);
    for (std::string item; std::getline(items, item, ',');) {
      const int world = std::atoi(item.c_str());
      if (world < 1 || world > 64) return Usage(("bad rank count " + item).c_str());
      options.worlds.push_back(world);
    }
    // Efficiency is against one rank, so one rank always runs.
    options.worlds.push_back(1);
    std::sort(options.worlds.begin(), options.worlds.end());
    options.worlds.erase(std::unique(options.worlds.begin(), options.worlds.end()),
                         options.worlds.end());
    // Quick: a smoke run of the whole path, its figures too short to quote.
    options.per_rank_units = per_rank_units.value_or(quick ? 1 : options.per_rank_units);
    options.steps = rank_steps.value_or(quick ? 3 : options.steps);
    options.rounds = rounds.value_or(quick ? 1 : options.rounds);
    if (options.per_rank_units < 1) return Usage("--per-rank-units must be at least 1");
    if (options.steps < 2) return Usage("--steps must be at least 2 (the first is warm-up)");
    if (options.rounds < 1) return Usage("--rounds must be at least 1");
    if (bucket_mb < 0) return Usage("--bucket-mb must be positive");
    options.bucket_mb = bucket_mb;
    options.expert_parallel = expert_parallel;
    if (!fs::is_regular_file(model)) return Usage(("no model config " + model.string()).c_str());
    options.model = fs::absolute(model);
    options.strider = fs::absolute(strider);
    options.keep = keep;
    return RunLearnerRanks(options);
  }

  if (!(seconds > 0)) return Usage("--seconds must be positive");
  if (!fs::is_regular_file(fleet)) return Usage(("no fleet file " + fleet.string()).c_str());

  char pattern[] = "/tmp/strider-fleet-bench-XXXXXX";
  const fs::path base = keep.empty() ? fs::path(::mkdtemp(pattern)) : fs::path(keep);
  const fs::path run_dir = base / "run";
  fs::create_directories(base);
  // Absolute before the child changes directory: config paths inside fleet files are
  // relative to the repository root, the child's working directory.
  const std::string binary = fs::absolute(strider).string();
  const std::string fleet_path = fs::absolute(fleet).string();
  const std::string run = run_dir.string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(source.c_str()) != 0) ::_exit(127);
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    const std::string out = (base / "launch.log").string();
    std::FILE* log = std::fopen(out.c_str(), "w");
    if (log) {
      ::dup2(::fileno(log), STDOUT_FILENO);
      ::dup2(::fileno(log), STDERR_FILENO);
    }
    ::execl(binary.c_str(), binary.c_str(), "launch", fleet_path.c_str(), "--run-dir", run.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (pid < 0) return Usage("fork failed");
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  bool exited = false;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
         seconds) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!exited) {
    ::kill(pid, SIGTERM);  // the launcher's ordered stop: actors, learner, then replay
    ::waitpid(pid, &status, 0);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "fleet_bench: strider launch failed (status %d); see %s\n", status,
                 (base / "launch.log").c_str());
    return 1;
  }

  // The learner's steps: trained samples, compute time (the step less its wait for replay).
  const std::vector<json> steps = ReadLines(run_dir / "learner/metrics.jsonl");
  double samples = 0, compute_s = 0, busy = 0, tokens_per_s = 0;
  int counted = 0;
  for (const json& step : steps) {
    if (!step.contains("step")) continue;
    samples += Number(step, "trajectories");
    compute_s += Number(step, "step_seconds") - Number(step, "sample_seconds");
    busy += Number(step, "busy_fraction");
    tokens_per_s += Number(step, "tokens_per_second");
    ++counted;
  }
  const std::vector<json> merged = ReadLines(run_dir / "metrics.jsonl");
  const double elapsed = merged.empty() ? wall : Number(merged.back(), "elapsed_s");
  if (counted == 0 || elapsed <= 0) {
    std::fprintf(stderr, "fleet_bench: the learner finished no step in %.0f s; see %s\n", wall,
                 run_dir.c_str());
    return 1;
  }
  double actor_tokens_per_s = 0, weights_wait = 0, actor_time = 0;
  for (const fs::directory_entry& actor : fs::directory_iterator(run_dir / "actors")) {
    const std::vector<json> lines = ReadLines(actor.path() / "metrics.jsonl");
    if (lines.empty()) continue;
    actor_tokens_per_s += Number(lines.back(), "generated_tokens_per_s");
    weights_wait += Number(lines.back(), "weights_wait_s");
    actor_time += Number(lines.back(), "elapsed_s");
  }

  using strider::bench::JsonNumber;
  using strider::bench::JsonString;
  using strider::bench::PrintResult;
  const strider::bench::JsonFields fields = {
      {"fleet", JsonString(fs::relative(fleet, source).string())},
      {"elapsed_s", JsonNumber(elapsed)},
      {"learner_steps", JsonNumber(counted)},
      {"samples", JsonNumber(samples)}};
  strider::bench::EveryLineFields() = {{"policy", JsonString("PASSIVE")}};
  strider::bench::JsonFields against_compute = fields;
  against_compute.emplace_back("baseline_is",
                               JsonString("learner_compute_bound_samples_per_second"));
  strider::bench::JsonFields against_target = fields;
  against_target.emplace_back("baseline_is", JsonString("target"));
  PrintResult("fleet", "samples_per_second", samples / elapsed, "samples/s",
              compute_s > 0 ? std::optional<double>(samples / compute_s) : std::nullopt,
              against_compute);
  PrintResult("fleet", "learner_busy_fraction", busy / counted, "fraction", 0.9, against_target);
  PrintResult("fleet", "learner_tokens_per_second", tokens_per_s / counted, "tokens/s",
              std::nullopt, fields);
  PrintResult("fleet", "actor_generated_tokens_per_second", actor_tokens_per_s, "tokens/s",
              std::nullopt, fields);
  PrintResult("fleet", "actor_weights_wait_fraction",
              actor_time > 0 ? weights_wait / actor_time : 0.0, "fraction", std::nullopt, fields);
  if (keep.empty()) fs::remove_all(base);
  return 0;
}
