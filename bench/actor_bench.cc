// Actor benchmark (docs/design.md#benchmark-protocol): episodes and tokens per second of one actor
// on `calculator` at B = 1, 16, 64 against the rollout engine alone on the same token counts, and
// optionally a long `retrieval` trajectory end to end with its time and peak memory.
//
// The baseline replays the actor's own trajectories through a fresh engine with the same model,
// options and concurrency: every context run is appended as it was, and every model turn
// samples exactly as many tokens as the actor's did (no stop tokens), so the engine does the
// same model work with nothing else around it. The actor's overhead is its time over that:
// environments, tokenizing, tool parsing, segmenting, encoding and streaming to a real replay
// server (in this process, on loopback). Target: at most 10% at B = 64.
//
// On a 2-core machine the replay server in this process competes with the engine's two threads
// for the same cores, so the benchmark also counts CPU seconds per thread group
// (/proc/self/task/*/stat): the engine's threads, the replay server's, the actor's sender and
// transport, and the short-lived environment threads. The CPU overhead with the server's CPU
// set aside is (process CPU - server CPU) / the engine alone's process CPU - 1.
//
//   actor_bench [--quick] [--model NAME|PATH] [--batch B (only this one)] [--interleave]
//               [--long-tokens N] [--long-model NAME|PATH] [--long-keep DIR]
//               [--long-block-tokens N (4096)]
// --interleave runs the actor again after the engine alone and reports the wall overhead
// against the mean of the two actor runs, which cancels load that drifts steadily.
// A model NAME is configs/model/NAME.yaml; the long run defaults to tiny_incremental, whose
// context holds 1,048,576 tokens; tiny_1m is the hybrid tiny with that context. --long-keep
// keeps the long episode's replay store in DIR/db (for `strider replay inspect` and the
// learner's pass over it). The long episode's replay server runs in a child process (this
// program with --replay-server DIR), so the memory figure is the actor's alone.
#include <spdlog/spdlog.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stop_token>
#include <string>
#include <vector>

#include "actors/actor.h"
#include "bench/bench_json.h"
#include "bench/bench_util.h"
#include "bench/ceiling.h"
#include "common/clock.h"
#include "common/model/model.h"
#include "common/model/parameters.h"
#include "common/model/tensor_pool.h"
#include "common/process_memory.h"
#include "common/subprocess.h"
#include "envs/registry.h"
#include "replay/inspect.h"
#include "replay/replay.h"
#include "rollout_engine/engine.h"

namespace strider {
namespace {

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// CPU seconds (user + system) of each live thread of this process.
std::map<int, double> ThreadCpuSeconds() {
  std::map<int, double> cpu;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stod(field);
      if (i == 15) stime = std::stod(field);
    }
    cpu[std::stoi(entry.path().filename().string())] = (utime + stime) / tick;
  }
  return cpu;
}

std::set<int> ThreadIds() {
  std::set<int> ids;
  for (const auto& [tid, seconds] : ThreadCpuSeconds()) ids.insert(tid);
  return ids;
}

double ProcessCpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

std::string ThreadName(int tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

struct Run {
  std::string source = STRIDER_SOURCE_DIR;
  std::string model = "small";
  std::string long_model = "tiny_incremental";
  std::string long_keep;    // where the long episode's store stays; empty: a temporary one
  // The long episode's cache blocks: the prefill kernel reads the past block by block, so at
  // 256 tokens (the actor's default) every tile has half the 512 keys it takes.
  int64_t long_block_tokens = 4096;
  bool interleave = false;  // the actor again after the engine alone
};

// A name is configs/model/NAME.yaml; anything with a slash or ending in .yaml is a path.
Result<std::string> ModelConfigPath(const Run& r, const std::string& model) {
  const bool path = model.find('/') != std::string::npos ||
                    (model.size() > 5 && model.compare(model.size() - 5, 5, ".yaml") == 0);
  const std::string file = path ? model : r.source + "/configs/model/" + model + ".yaml";
  if (!std::filesystem::is_regular_file(file)) {
    return Status::InvalidArgument("actor_bench: model config '" + model + "' not found (looked for " +
                                   file + ")");
  }
  return file;
}

// A trajectory as runs: context tokens, then how many tokens the model sampled, and so on.
struct Script {
  std::vector<std::vector<int64_t>> context;  // context[i] precedes turn i
  std::vector<int64_t> turn_tokens;
};

std::vector<Script> ReadScripts(const std::string& db) {
  std::vector<Script> scripts;
  auto inspector = replay::Inspector::Open(db);
  if (!inspector.ok()) return scripts;
  auto list = (*inspector)->List({});
  if (!list.ok()) return scripts;
  for (const schema::TrajectorySummary& summary : *list) {
    auto segments = (*inspector)->Trajectory(summary.trajectory_id);
    if (!segments.ok()) continue;
    Script script;
    bool in_action = false;
    std::vector<int64_t> pending;
    for (const replay::StoredSegment& stored : *segments) {
      const schema::SegmentData& s = stored.segment;
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        const bool action = schema::IsAction(s.roles[i]);
        if (action) {
          if (!in_action) {
            script.context.push_back(std::move(pending));
            pending.clear();
            script.turn_tokens.push_back(0);
          }
          ++script.turn_tokens.back();
        } else {
          pending.push_back(s.tokens[i]);
        }
        in_action = action;
      }
    }
    if (!script.turn_tokens.empty()) scripts.push_back(std::move(script));
  }
  return scripts;
}

struct EngineRun {
  double seconds = 0;
  double cpu_seconds = 0;  // the whole process's, during the run
  int64_t tokens = 0;
  int64_t steps = 0;
};

// The same work through the engine alone, `concurrency` trajectories at a time.
Result<EngineRun> ReplayThroughEngine(const std::vector<Script>& scripts,
                                      std::shared_ptr<const Model> model,
                                      const actors::ActorOptions& options) {
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<rollout::Engine> engine,
                           rollout::Engine::Create(actors::EngineOptionsFor(options), model, 0));
  struct Live {
    size_t script;
    size_t turn;
    rollout::SequenceId id;
  };
  std::map<rollout::SequenceId, Live> live;
  size_t next = 0;
  EngineRun run;
  auto sampling_for = [&](const Script& s, size_t turn) {
    rollout::SamplingParams sampling = options.sampling;
    sampling.stop_tokens.clear();
    sampling.max_new_tokens = s.turn_tokens[turn];
    sampling.seed = turn * 7919 + 1;
    return sampling;
  };
  const double cpu_start = ProcessCpuSeconds();
  const auto start = Clock::now();
  while (next < scripts.size() || !live.empty()) {
    while (next < scripts.size() &&
           static_cast<int64_t>(live.size()) < options.episodes_in_flight) {
      const Script& s = scripts[next];
      STRIDER_ASSIGN_OR_RETURN(rollout::SequenceId id,
                               engine->Submit({s.context[0], sampling_for(s, 0), false}));
      run.tokens += static_cast<int64_t>(s.context[0].size());
      live[id] = {next++, 0, id};
    }
    STRIDER_ASSIGN_OR_RETURN(rollout::StepResult step, engine->Step());
    ++run.steps;
    for (const rollout::SequenceStep& s : step.sequences) {
      if (!s.sampled) continue;
      ++run.tokens;
      if (s.finish == rollout::FinishReason::kNone) continue;
      Live& l = live[s.id];
      const Script& script = scripts[l.script];
      if (++l.turn < script.turn_tokens.size()) {
        STRIDER_RETURN_IF_ERROR(
            engine->Append(s.id, {script.context[l.turn], sampling_for(script, l.turn), false}));
        run.tokens += static_cast<int64_t>(script.context[l.turn].size());
      } else {
        STRIDER_RETURN_IF_ERROR(engine->Cancel(s.id));
        live.erase(s.id);
      }
    }
  }
  run.seconds = Seconds(start);
  run.cpu_seconds = ProcessCpuSeconds() - cpu_start;
  return run;
}

Result<actors::ActorOptions> BaseOptions(const Run& r, const std::string& model,
                                         const std::string& dir) {
  actors::ActorOptions o;
  o.actor_id = "bench";
  STRIDER_ASSIGN_OR_RETURN(o.model_config, ModelConfigPath(r, model));
  o.threads = 2;
  o.max_turns = 2;
  o.max_episode_tokens = 4096;
  o.segment_tokens = 4096;
  o.sampling.max_new_tokens = 32;
  o.cache_budget_bytes = int64_t{512} << 20;
  o.spill_dir = dir + "/spill";
  o.metrics_interval_s = 1000;
  o.progress = false;
  o.env.name = "calculator";
  o.env.options = {{"difficulty", "1"}};
  return o;
}

// A replay server of the bench's own: store in `dir`/db, no periodic stats in the log.
replay::ServerOptions ReplayOptions(const std::string& dir) {
  replay::ServerOptions options;
  options.db_path = dir + "/db";
  options.stats_interval_s = 0;
  return options;
}

struct ActorWall {
  double seconds = 0;
  int64_t tokens = 0;
};

// The actor once more, wall time only, with a fresh replay server in `dir`.
Result<ActorWall> ActorAgain(const Run& r, int64_t batch, int64_t episodes, const std::string& dir) {
  std::filesystem::create_directories(dir);
  const replay::ServerOptions server_options = ReplayOptions(dir);
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<replay::ReplayServer> server,
                           replay::ReplayServer::Start(server_options));
  STRIDER_ASSIGN_OR_RETURN(actors::ActorOptions o, BaseOptions(r, r.model, dir));
  o.episodes_in_flight = batch;
  o.episodes = episodes;
  o.replay_endpoint = server->actor_endpoint();
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<actors::Actor> actor, actors::Actor::Create(o));
  const auto start = Clock::now();
  std::stop_source never;
  STRIDER_RETURN_IF_ERROR(actor->Run(never.get_token()));
  ActorWall wall;
  wall.seconds = Seconds(start);
  const actors::ActorMetrics m = actor->metrics();
  wall.tokens = m.generated_tokens + m.context_tokens;
  actor.reset();
  server->Stop();
  return wall;
}

// The process's first engine steps pay one-time costs (thread pools, first kernel runs, the
// allocator growing); without this the actor, measured first, would pay them for both halves.
Status WarmUp(const std::string& model_config) {
  static bool warm = false;
  if (warm) return Status::Ok();
  warm = true;
  STRIDER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_config));
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(config, 0));
  rollout::EngineOptions options;
  options.threads = 2;
  options.cache_budget_bytes = int64_t{64} << 20;
  STRIDER_ASSIGN_OR_RETURN(
      std::unique_ptr<rollout::Engine> engine,
      rollout::Engine::Create(options, std::shared_ptr<const Model>(std::move(model)), 0));
  rollout::SamplingParams sampling;
  sampling.max_new_tokens = 8;
  for (int i = 0; i < 4; ++i) {
    STRIDER_RETURN_IF_ERROR(
        engine->Submit({std::vector<int64_t>(200, 65 + i), sampling, false}).status());
  }
  for (int i = 0; i < 10; ++i) STRIDER_RETURN_IF_ERROR(engine->Step().status());
  return Status::Ok();
}

Status Calculator(const Run& r, int64_t batch, int64_t episodes) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("strider-actor-bench-" + std::to_string(batch)))
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const replay::ServerOptions server_options = ReplayOptions(dir);
  // Before the thread census: the engine's thread pool exists from here on.
  STRIDER_ASSIGN_OR_RETURN(std::string model_config, ModelConfigPath(r, r.model));
  STRIDER_RETURN_IF_ERROR(WarmUp(model_config));
  // Which threads are whose: those the server starts, those the actor starts (sender, ZeroMQ);
  // RocksDB's background threads carry their own names.
  const std::set<int> before_server = ThreadIds();
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<replay::ReplayServer> server,
                           replay::ReplayServer::Start(server_options));
  const std::set<int> before_actor = ThreadIds();
  STRIDER_ASSIGN_OR_RETURN(actors::ActorOptions o, BaseOptions(r, r.model, dir));
  o.episodes_in_flight = batch;
  o.episodes = episodes;
  o.replay_endpoint = server->actor_endpoint();
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<actors::Actor> actor, actors::Actor::Create(o));
  const std::set<int> after_actor = ThreadIds();
  const std::map<int, double> cpu_start = ThreadCpuSeconds();
  const double process_cpu_start = ProcessCpuSeconds();
  const auto start = Clock::now();
  std::stop_source never;
  STRIDER_RETURN_IF_ERROR(actor->Run(never.get_token()));
  const double actor_seconds = Seconds(start);
  const double process_cpu = ProcessCpuSeconds() - process_cpu_start;
  const std::map<int, double> cpu_end = ThreadCpuSeconds();
  const actors::ActorMetrics m = actor->metrics();
  // CPU seconds during the run by group; threads that ended during it (environment calls and
  // closes, the sender and its ZeroMQ threads) are the process's total less the live threads'.
  double server_cpu = 0, sender_cpu = 0, engine_cpu = 0, live_cpu = 0;
  int server_threads = 0, sender_threads = 0, engine_threads = 0;
  for (const auto& [tid, end] : cpu_end) {
    auto it = cpu_start.find(tid);
    const double used = end - (it == cpu_start.end() ? 0.0 : it->second);
    live_cpu += used;
    const bool server_thread = (!before_server.count(tid) && before_actor.count(tid)) ||
                               ThreadName(tid).rfind("rocksdb", 0) == 0;
    if (server_thread) {
      server_cpu += used;
      ++server_threads;
    } else if (!before_actor.count(tid) && after_actor.count(tid)) {
      sender_cpu += used;
      ++sender_threads;
    } else {
      engine_cpu += used;  // the loop's own thread and the OpenMP workers it steps
      ++engine_threads;
    }
  }
  const double ended_threads_cpu = std::max(0.0, process_cpu - live_cpu);
  actor.reset();
  server->Stop();
  std::vector<Script> scripts = ReadScripts(server_options.db_path);
  STRIDER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(o.model_config));
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(config, o.model_seed));
  STRIDER_ASSIGN_OR_RETURN(
      EngineRun engine_run,
      ReplayThroughEngine(scripts, std::shared_ptr<const Model>(std::move(model)), o));
  const double baseline_cpu = std::max(1e-9, engine_run.cpu_seconds);
  // Interleaved: the actor, the engine alone, the actor again. Against the mean of the two actor
  // runs (per token), load that drifts steadily over the three cancels.
  std::optional<ActorWall> again;
  if (r.interleave) {
    STRIDER_ASSIGN_OR_RETURN(ActorWall wall, ActorAgain(r, batch, episodes, dir + "/again"));
    again = wall;
  }
  const int64_t actor_tokens = m.generated_tokens + m.context_tokens;
  const std::string b = "B=" + std::to_string(batch);
  bench::PrintResult("actor", "episodes_per_s " + b, m.episodes_finished / actor_seconds, "1/s",
                     static_cast<double>(scripts.size()) / engine_run.seconds);
  bench::PrintResult("actor", "tokens_per_s " + b, actor_tokens / actor_seconds, "tokens/s",
                     engine_run.tokens / engine_run.seconds);
  bench::PrintResult("actor", "token_count_actor_over_engine " + b, actor_tokens, "tokens",
                     engine_run.tokens);
  bench::PrintResult("actor", "overhead " + b, actor_seconds / engine_run.seconds - 1, "fraction",
                     0.10);
  // Where the time went: engine steps the actor made against the baseline's, and the actor's
  // time outside Engine::Step (its own work and waiting) as a share of its run.
  bench::PrintResult("actor", "engine_steps " + b, static_cast<double>(m.engine_steps), "steps",
                     static_cast<double>(engine_run.steps));
  bench::PrintResult("actor", "time_outside_engine_step " + b,
                     (actor_seconds - m.engine_step_seconds) / actor_seconds, "fraction");
  // CPU: the actor run's process total by thread group, against the engine alone's total.
  bench::PrintResult("actor", "cpu_seconds_process " + b, process_cpu, "s", engine_run.cpu_seconds);
  bench::PrintResult("actor", "cpu_seconds_engine_threads " + b, engine_cpu, "s",
                     engine_run.cpu_seconds);
  bench::PrintResult("actor", "cpu_seconds_replay_server " + b, server_cpu, "s");
  // The actor's threads besides the engine's: environment calls, and the sender with its ZeroMQ
  // context, whose threads Run closes at its end (so they count as ended threads).
  bench::PrintResult("actor", "cpu_seconds_actor_other_threads " + b,
                     sender_cpu + ended_threads_cpu, "s");
  bench::PrintResult("actor", "cpu_overhead " + b, process_cpu / baseline_cpu - 1, "fraction", 0.10);
  bench::PrintResult("actor", "cpu_overhead_without_server " + b,
                     (process_cpu - server_cpu) / baseline_cpu - 1, "fraction", 0.10);
  if (again) {
    const double per_token_actor =
        (actor_seconds / std::max<int64_t>(1, actor_tokens) +
         again->seconds / std::max<int64_t>(1, again->tokens)) /
        2;
    const double per_token_engine = engine_run.seconds / std::max<int64_t>(1, engine_run.tokens);
    bench::PrintResult("actor", "overhead_interleaved " + b, per_token_actor / per_token_engine - 1,
                       "fraction", 0.10);
    std::fprintf(stderr, "B=%lld: actor again %.2f s for %lld tokens\n",
                 static_cast<long long>(batch), again->seconds,
                 static_cast<long long>(again->tokens));
  }
  // Cores the process got while running: below 2 means the machine's other load (or the
  // in-process server) took them.
  bench::PrintResult("actor", "cores_used " + b, process_cpu / actor_seconds, "cores",
                     engine_run.cpu_seconds / engine_run.seconds);
  std::fprintf(stderr,
               "B=%lld: actor %.2f s for %lld episodes, %lld tokens (%lld sampled); engine alone "
               "%.2f s for %zu trajectories, %lld tokens\n",
               static_cast<long long>(batch), actor_seconds,
               static_cast<long long>(m.episodes_finished), static_cast<long long>(actor_tokens),
               static_cast<long long>(m.generated_tokens), engine_run.seconds, scripts.size(),
               static_cast<long long>(engine_run.tokens));
  std::fprintf(stderr,
               "B=%lld: CPU %.2f s (engine %.2f s on %d threads, replay server %.2f s on %d, "
               "sender and transport still live %.2f s on %d, ended threads (environment calls, "
               "sender) %.2f s); engine alone %.2f s\n",
               static_cast<long long>(batch), process_cpu, engine_cpu, engine_threads, server_cpu,
               server_threads, sender_cpu, sender_threads, ended_threads_cpu,
               engine_run.cpu_seconds);
  std::filesystem::remove_all(dir);
  return Status::Ok();
}

struct LongEpisode {
  double seconds = 0;
  actors::ActorMetrics metrics;
  int64_t tokens = 0;      // in the trajectory: context and sampled
  int64_t peak_rss = 0;    // of this process while it played (the high-water mark reset first)
  int64_t server_rss = 0;  // of the replay server's process at the end of the episode
  replay::VerifyReport verify;
};

// The long episode's replay server runs in a process of its own (this program again with
// --replay-server DIR), as in a fleet: its memtables and the segments it is receiving are the
// server's memory, and in this process they would read as growth of the actor's (a million-token
// episode fills 64 MB of memtable before the first flush).
int ServeReplay(const std::string& dir) {
  // Blocked before the server's threads start, so they inherit it and only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  spdlog::set_level(spdlog::level::warn);
  replay::ServerOptions options = ReplayOptions(dir);
  // One part of a million-token document can take longer than the server's default silence
  // before it closes a trajectory as abandoned (1800 s); the actor is alive throughout.
  options.abandon_after_s = 0;
  Result<std::unique_ptr<replay::ReplayServer>> server = replay::ReplayServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "actor_bench: replay server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("endpoint %s\n", (*server)->actor_endpoint().c_str());
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop, &signal_number);
  (*server)->Stop();
  return 0;
}

struct ServerChild {
  pid_t pid = -1;
  std::string endpoint;
  FILE* output = nullptr;  // its stdout, open while it runs (its log lines go there too)

  // Stops the server (SIGTERM; it flushes and closes the store) and waits for it.
  Status Stop() {
    if (pid <= 0) return Status::Ok();
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    if (output != nullptr) std::fclose(output);
    output = nullptr;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return Status::Internal("the replay server's process ended with status " +
                              std::to_string(status));
    }
    return Status::Ok();
  }
  // The run calls Stop and reports its error; here, after an error elsewhere, only the process
  // matters.
  ~ServerChild() { (void)Stop(); }
};

Status StartServerChild(const std::string& dir, ServerChild* child) {
  const std::string self = bench::SelfPath();
  if (self.empty()) return Status::IoError("actor_bench: cannot find its own executable");
  int out[2];
  if (pipe(out) != 0) return Status::IoError("actor_bench: pipe for the replay server");
  const char* argv[] = {self.c_str(), "--replay-server", dir.c_str(), nullptr};
  child->pid = ForkWithLifeline([&] {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    execv(argv[0], const_cast<char* const*>(argv));
    _exit(127);
  });
  close(out[1]);
  if (child->pid < 0) {
    close(out[0]);
    return Status::IoError("actor_bench: cannot fork the replay server");
  }
  child->output = fdopen(out[0], "r");
  char line[1024] = "";
  std::string text;
  while (child->output != nullptr && std::fgets(line, sizeof(line), child->output) != nullptr) {
    text = line;
    if (text.rfind("endpoint ", 0) == 0) break;
    std::fputs(line, stderr);  // a log line before it
  }
  if (text.rfind("endpoint ", 0) != 0) {
    (void)child->Stop();  // the failed start is the error to report
    return Status::Internal("actor_bench: the replay server did not start (see its errors)");
  }
  child->endpoint = text.substr(9, text.find_last_not_of("\r\n") - 8);
  return Status::Ok();
}

// One retrieval episode of `tokens` document tokens (revealed in parts of at most 262,144)
// through an actor and a replay server storing in `dir`/db, which stays for inspection.
Result<LongEpisode> PlayLongEpisode(const Run& r, int64_t tokens, const std::string& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ServerChild server;
  STRIDER_RETURN_IF_ERROR(StartServerChild(dir, &server));
  STRIDER_ASSIGN_OR_RETURN(actors::ActorOptions o, BaseOptions(r, r.long_model, dir));
  const int64_t parts = std::max<int64_t>(1, (tokens + 262143) / 262144);
  o.env.name = "retrieval";
  o.env.options = {{"total_tokens", std::to_string(tokens)}, {"parts", std::to_string(parts)}};
  o.env.step_timeout_ms = 3600000;
  o.episodes_in_flight = 1;
  o.episodes = 1;
  o.max_turns = parts + 2;
  o.sampling.max_new_tokens = 16;
  o.max_episode_tokens = tokens + 8192;
  o.segment_tokens = 65536;
  o.cache_budget_bytes = int64_t{8} << 30;
  o.block_tokens = r.long_block_tokens;
  o.prefill_chunk_tokens = 8192;
  o.replay_endpoint = server.endpoint;
  ResetPeakResident();
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<actors::Actor> actor, actors::Actor::Create(o));
  const auto start = Clock::now();
  std::stop_source never;
  STRIDER_RETURN_IF_ERROR(actor->Run(never.get_token()));
  LongEpisode episode;
  episode.seconds = Seconds(start);
  episode.metrics = actor->metrics();
  episode.peak_rss = PeakResidentBytes();
  episode.tokens = episode.metrics.generated_tokens + episode.metrics.context_tokens;
  actor.reset();
  episode.server_rss = ResidentBytesOf(server.pid);
  STRIDER_RETURN_IF_ERROR(server.Stop());
  if (episode.metrics.segments == 0) {
    std::string errors;
    for (const auto& [kind, n] : episode.metrics.errors) {
      errors += " " + kind + "=" + std::to_string(n);
    }
    return Status::FailedPrecondition("the long retrieval episode produced nothing; endings:" +
                                      errors + " (the model's context must hold the trajectory)");
  }
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<replay::Inspector> inspector,
                           replay::Inspector::Open(dir + "/db"));
  STRIDER_ASSIGN_OR_RETURN(episode.verify, inspector->Verify());
  return episode;
}

// The long episode end to end: wall time against the bound its latent attention sets, the time
// split, and memory against `strider model info`'s formula plus a constant measured by a short
// episode of the same kind first.
//
// The bound is the episode's latent-attention FLOPs (every causal query-key pair of every latent
// layer, 2W + 2Dc per pair and head, as model_bench counts them) at the matmul rate of the
// prefill kernel's own tile products, measured here before the episodes. The episode does more
// than that attention (the incremental layers, the experts, decoding, the environment), so a
// ratio near 1 says the attention runs at its tiles' rate and the rest is small beside it.
Status LongRetrieval(const Run& r, int64_t tokens) {
  const bool keep = !r.long_keep.empty();
  const std::string dir =
      keep ? r.long_keep
           : (std::filesystem::temp_directory_path() / "strider-actor-bench-long").string();
  STRIDER_ASSIGN_OR_RETURN(std::string model_path, ModelConfigPath(r, r.long_model));
  STRIDER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_path));
  if (tokens + 8192 > config.context) {
    return Status::InvalidArgument(
        "actor_bench: --long-tokens " + std::to_string(tokens) + " (plus 8192 for the prompt " +
        "and turns) exceeds the context of model '" + config.name + "' (" +
        std::to_string(config.context) + "); use --long-model tiny_incremental or tiny_1m");
  }
  const LatentAttentionConfig& g = config.latent;
  const int64_t latent_layers = config.CountLayers('G');
  const int64_t width = g.kv_rank + g.rope_dim;
  // The tile rate is read before, between and after the episodes and the best reading is the
  // bound's: on these machines one reading of the same shapes comes out at 59-70 or 131-143
  // GFLOP/s from run to run (a core shared for a while), and the bound is the machine's rate.
  std::vector<double> tile_readings;
  auto read_tile_rate = [&] {
    if (latent_layers > 0) tile_readings.push_back(bench::LatentPrefillTileRate(width, g.kv_rank));
  };
  read_tile_rate();
  const int64_t rss_before = ResidentBytes();

  // Long enough for a full-size segment, so the segments in flight weigh what they will.
  constexpr int64_t kShortTokens = 65536;
  STRIDER_ASSIGN_OR_RETURN(LongEpisode brief, PlayLongEpisode(r, kShortTokens, dir + "/short"));
  std::filesystem::remove_all(dir + "/short");
  read_tile_rate();
  STRIDER_ASSIGN_OR_RETURN(LongEpisode e, PlayLongEpisode(r, tokens, dir));
  read_tile_rate();
  const double tile_rate =
      tile_readings.empty() ? 0 : *std::max_element(tile_readings.begin(), tile_readings.end());
  std::string readings_text = "[";
  for (double reading : tile_readings) {
    readings_text += (readings_text.size() > 1 ? "," : "") + bench::JsonNumber(reading);
  }
  readings_text += "]";
  const actors::ActorMetrics& m = e.metrics;
  const std::string at = " tokens=" + std::to_string(e.tokens);
  const bench::JsonFields model_field = {{"model", bench::JsonString(config.name)}};

  // Time: the episode against its attention bound, then where it went.
  const double n = static_cast<double>(e.tokens);
  const double attention_flops =
      latent_layers * 0.5 * n * (n + 1) * g.heads * (2.0 * width + 2.0 * g.kv_rank);
  std::optional<double> bound;
  if (tile_rate > 0) bound = attention_flops / (tile_rate * 1e9);
  bench::PrintResult("actor", "retrieval_trajectory_seconds" + at, e.seconds, "s", bound,
                     {{"model", bench::JsonString(config.name)},
                      {"block_tokens", std::to_string(r.long_block_tokens)},
                      {"baseline_is", bench::JsonString("latent-attention FLOPs at the prefill "
                                                        "tiles' matmul rate, the best of three "
                                                        "readings in this run")},
                      {"attention_gflop", bench::JsonNumber(attention_flops / 1e9)},
                      {"tile_matmul_gflops", bench::JsonNumber(tile_rate)},
                      {"tile_matmul_gflops_readings", readings_text}});
  const double env = m.env_call_seconds;
  const double other = std::max(0.0, e.seconds - m.engine_step_seconds - env);
  const int64_t decode_steps = m.engine_steps - m.prefill_steps;
  for (const auto& [part, seconds] : {std::pair{"prefill", m.prefill_step_seconds},
                                      std::pair{"decode", m.decode_step_seconds},
                                      std::pair{"environment", env}, std::pair{"other", other}}) {
    bench::PrintResult("actor", std::string("retrieval_split_") + part + "_seconds" + at,
                       seconds, "s", e.seconds, model_field);
  }
  bench::PrintResult("actor", "retrieval_prefill_tokens_per_second" + at,
                     m.prefill_tokens / std::max(1e-9, m.prefill_step_seconds), "tokens/s",
                     std::nullopt, model_field);
  if (decode_steps > 0) {
    // One sequence, so a decode-only step is one token at the context it has reached: these
    // come after each part of the document, the last ones near the full length.
    bench::PrintResult("actor", "retrieval_decode_ms_per_token" + at,
                       1e3 * m.decode_step_seconds / decode_steps, "ms", std::nullopt,
                       {{"model", bench::JsonString(config.name)},
                        {"decode_steps", std::to_string(decode_steps)}});
  }

  // Memory: growth over the process before both episodes, against the formula at this length
  // plus the constant the short episode showed (its growth less its own formula).
  // The rollout engine's formula per token (blocks of 1: the rows written, not the block
  // rounding, which at 4,096-token blocks is at most 393 KB here).
  const CacheAccounting caches = AccountCaches(config);
  auto formula = [&](int64_t length) { return rollout::SequenceBytesFormula(config, length, 1); };
  const double constant =
      static_cast<double>(brief.peak_rss - rss_before) - formula(brief.tokens);
  const double growth = static_cast<double>(e.peak_rss - rss_before);
  const TensorPoolStats pool = GetTensorPoolStats();  // both episodes' tensors (tensor_pool.h)
  bench::PrintResult("actor", "retrieval_peak_rss_growth_bytes" + at, growth, "bytes",
                     formula(e.tokens) + constant,
                     {{"model", bench::JsonString(config.name)},
                      {"baseline_is", bench::JsonString("formula + constant")},
                      {"formula_bytes", bench::JsonNumber(formula(e.tokens))},
                      {"kv_cache_bytes_per_token",
                       std::to_string(caches.kv_cache_bytes_per_token)},
                      {"state_bytes_per_sequence",
                       std::to_string(caches.state_bytes_per_sequence)},
                      {"constant_bytes", bench::JsonNumber(constant)},
                      {"constant_from_tokens", std::to_string(brief.tokens)},
                      {"rss_before_bytes", std::to_string(rss_before)},
                      {"replay_server_process_rss_bytes", std::to_string(e.server_rss)},
                      {"tensor_pool_peak_mapped_bytes", std::to_string(pool.peak_mapped_bytes)},
                      {"tensor_pool_hits", std::to_string(pool.hits)},
                      {"tensor_pool_misses", std::to_string(pool.misses)},
                      {"tensor_pool_unmapped_bytes", std::to_string(pool.unmapped_bytes)}});

  // Delivery: every segment acknowledged and the store consistent.
  bench::PrintResult("actor", "retrieval_segments_acknowledged" + at,
                     static_cast<double>(m.acked_segments), "segments",
                     static_cast<double>(m.segments),
                     {{"model", bench::JsonString(config.name)},
                      {"verify_ok", e.verify.ok() ? "true" : "false"},
                      {"verify_segments", std::to_string(e.verify.segments)},
                      {"verify_problems", std::to_string(e.verify.problems.size())}});
  for (const std::string& problem : e.verify.problems) {
    std::fprintf(stderr, "verify: %s\n", problem.c_str());
  }
  std::fprintf(stderr, "long retrieval (%s): %lld tokens in %.1f s, %lld segments, %s\n",
               config.name.c_str(), static_cast<long long>(e.tokens), e.seconds,
               static_cast<long long>(m.segments), m.ToJson().c_str());
  if (keep) {
    std::fprintf(stderr, "the store stays in %s/db (strider replay inspect %s/db verify)\n",
                 dir.c_str(), dir.c_str());
  } else {
    std::filesystem::remove_all(dir);
  }
  return Status::Ok();
}

}  // namespace
}  // namespace strider

int main(int argc, char** argv) {
  if (argc == 3 && !std::strcmp(argv[1], "--replay-server")) return strider::ServeReplay(argv[2]);
  strider::Run run;
  bool quick = false;
  int64_t long_tokens = 0;
  int64_t only_batch = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--model") && i + 1 < argc) {
      run.model = argv[++i];
    } else if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) {
      only_batch = std::stoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--interleave")) {
      run.interleave = true;
    } else if (!std::strcmp(argv[i], "--long-model") && i + 1 < argc) {
      run.long_model = argv[++i];
    } else if (!std::strcmp(argv[i], "--long-tokens") && i + 1 < argc) {
      long_tokens = std::stoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--long-keep") && i + 1 < argc) {
      run.long_keep = argv[++i];
    } else if (!std::strcmp(argv[i], "--long-block-tokens") && i + 1 < argc) {
      run.long_block_tokens = std::stoll(argv[++i]);
    } else {
      std::fprintf(
          stderr,
          "usage: actor_bench [--quick] [--model NAME|PATH] [--batch B] [--interleave] "
          "[--long-tokens N] "
          "[--long-model NAME|PATH] [--long-keep DIR] [--long-block-tokens N]\n");
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  strider::ConfigureRuntime(2);
  std::vector<std::pair<int64_t, int64_t>> plan =
      quick ? std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {16, 16}}
            : std::vector<std::pair<int64_t, int64_t>>{{1, 4}, {16, 32}, {64, 64}};
  for (const auto& [batch, episodes] : plan) {
    if (only_batch > 0 && batch != only_batch) continue;
    strider::Status status = strider::Calculator(run, batch, episodes);
    if (!status.ok()) {
      std::fprintf(stderr, "actor_bench: %s\n", status.ToString().c_str());
      return 1;
    }
  }
  if (long_tokens > 0) {
    strider::Status status = strider::LongRetrieval(run, long_tokens);
    if (!status.ok()) {
      std::fprintf(stderr, "actor_bench: %s\n", status.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
