// `strider launch` as a real process over real children (replay server, RL learner, actors with
// the tiny model): it announces the fleet once every child is ready, stops at a stop rule with
// merged metrics and a finished event, resumes a run directory, ends everything within seconds
// on SIGINT, leaves nothing running when it is itself SIGKILLed, restarts a killed actor, and
// refuses a broken fleet file before starting anything.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/child_process.h"
#include "tests/integration/tiny_fleet.h"
#include "tests/scratch_dir.h"
#include "tests/transport/http_get.h"

namespace strider {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using strider::testing::ChildProcess;
using strider::testing::HttpGet;
using strider::testing::HttpReply;
using strider::testing::PortOf;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;

// The tiny fleet's child configs on the calculator (tests/integration/tiny_fleet.h).
void WriteChildConfigs(const TempDir& dir) {
  strider::testing::WriteTinyFleetConfigs(
      dir, {.env_yaml = "env:\n  name: calculator\n  options: {difficulty: 1}\n"});
}

// A fleet file over the configs above; `stop` and `extra` are YAML lines.
std::string WriteFleet(const TempDir& dir, const std::string& name, const std::string& stop,
                       int actors = 1, const std::string& extra = "",
                       const std::string& restart = "  max_restarts: 3\n  backoff_s: [1]\n") {
  WriteChildConfigs(dir);
  const std::string path = dir.Sub(name);
  std::ofstream(path) << "run_dir: " << dir.Sub("run") << "\n"
                      << "replay:\n  config: " << dir.Sub("replay.yaml") << "\n"
                      << "learner:\n  config: " << dir.Sub("learner.yaml") << "\n"
                      << "actors:\n  config: " << dir.Sub("actor.yaml") << "\n  count: " << actors
                      << "\n"
                      << "stop:\n"
                      << stop << "restart:\n"
                      << restart << extra;
  return path;
}

// The launcher's stdout events, read as they come; every child pid it reported is kept.
class Launcher {
 public:
  // `strider launch ARGS`, or with `raw` ARGS as the whole command line.
  bool Start(const std::vector<std::string>& args, bool raw = false) {
    std::vector<std::string> argv;
    if (!raw) argv = {StriderBinary(), "launch"};
    argv.insert(argv.end(), args.begin(), args.end());
    return process_.Start(argv);
  }

  // The next event named `event` (null after `timeout_ms` or at end of output).
  nlohmann::json Wait(const std::string& event, int timeout_ms,
                      const std::function<bool(const nlohmann::json&)>& also = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      const auto left =
          std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      const std::string line = process_.ReadLine(left);
      if (line.empty()) break;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object()) continue;
      events_.push_back(j);
      if (j.value("event", "") == "started") pids_[j["role"]].push_back(j["pid"]);
      if (j.value("event", "") == event && (!also || also(j))) return j;
    }
    return nlohmann::json();
  }

  ChildProcess& process() { return process_; }
  const std::map<std::string, std::vector<pid_t>>& pids() const { return pids_; }

 private:
  ChildProcess process_;
  std::vector<nlohmann::json> events_;
  std::map<std::string, std::vector<pid_t>> pids_;
};

// Whether `pid` is a live process (a zombie waiting for a reaper is not).
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

std::vector<std::string> Running(const Launcher& launcher) {
  std::vector<std::string> alive;
  for (const auto& [role, pids] : launcher.pids()) {
    for (pid_t pid : pids) {
      if (Alive(pid)) alive.push_back(role + " " + std::to_string(pid));
    }
  }
  return alive;
}

std::vector<nlohmann::json> ReadLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The learner's newest metrics row, null before its first step.
nlohmann::json LastStep(const std::string& run) {
  const std::vector<nlohmann::json> rows = ReadLines(run + "/learner/metrics.jsonl");
  return rows.empty() ? nlohmann::json() : rows.back();
}

bool WaitForStep(const std::string& run, int64_t step) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (std::chrono::steady_clock::now() < deadline) {
    const nlohmann::json last = LastStep(run);
    if (last.is_object() && last["step"].get<int64_t>() >= step) return true;
    std::this_thread::sleep_for(milliseconds(200));
  }
  return false;
}

// The value after `flag` in each "--- launch: starting ..." line of a child's log.
std::vector<std::string> StartFlags(const std::string& log_path, const std::string& flag) {
  std::vector<std::string> values;
  std::ifstream in(log_path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("--- launch: starting", 0) != 0) continue;
    std::istringstream words(line);
    std::string word, value;
    while (words >> word) {
      if (word == flag && (words >> value)) break;
    }
    values.push_back(value);
  }
  return values;
}

TEST(Launch, RunsTheFleetToAStopRuleAndResumesIt) {
  TempDir dir;
  const std::string fleet = WriteFleet(dir, "fleet.yaml", "  learner_steps: 2\n");
  const std::string run = dir.Sub("run");
  Launcher launcher;
  ASSERT_TRUE(launcher.Start({fleet}));
  const nlohmann::json ready = launcher.Wait("ready", 120000);
  ASSERT_TRUE(ready.is_object()) << ReadFile(run + "/logs/learner.log");
  EXPECT_EQ(ready["actors"], 1);
  EXPECT_EQ(ready["run_dir"], run);
  EXPECT_NE(ready["replay"].get<std::string>().find("tcp://127.0.0.1:"), std::string::npos);
  EXPECT_NE(ready["weights"].get<std::string>().find("tcp://127.0.0.1:"), std::string::npos);
  const nlohmann::json finished = launcher.Wait("finished", 120000);
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(finished["reason"], "learner_steps");
  EXPECT_GE(finished["learner_step"].get<int64_t>(), 2);
  // The run's report is written at the end, with the learner's steps plotted.
  ASSERT_TRUE(finished.contains("report")) << finished.dump();
  std::ifstream report(finished["report"].get<std::string>());
  const std::string page((std::istreambuf_iterator<char>(report)), std::istreambuf_iterator<char>());
  EXPECT_NE(page.find("<polyline"), std::string::npos) << "no plotted line in the report";
  EXPECT_EQ(launcher.process().Wait(), 0);
  EXPECT_EQ(Running(launcher), std::vector<std::string>{});
  for (const char* role : {"replay", "learner", "actor-0"}) {
    EXPECT_EQ(launcher.pids().at(role).size(), 1u) << role << " was started more than once";
  }

  const std::vector<nlohmann::json> rows = ReadLines(run + "/metrics.jsonl");
  ASSERT_GE(rows.size(), 2u) << "a row per tick and one at exit";
  for (const char* key : {"elapsed_s", "learner_step", "policy_version", "reward_mean",
                          "success_rate", "eval_success_rate", "samples", "learner_tokens_per_s",
                          "actor_tokens_per_s", "staleness_mean", "replay_fill", "restarts"}) {
    EXPECT_TRUE(rows.back().contains(key)) << key;
  }
  EXPECT_GE(rows.back()["learner_step"].get<int64_t>(), 2);
  EXPECT_GE(rows.back()["samples"].get<int64_t>(), 8) << "two steps of one group of four";
  EXPECT_TRUE(rows.back()["eval_success_rate"].is_null()) << "no evaluation configured";
  ASSERT_TRUE(rows.back()["replay_fill"].is_object()) << rows.back().dump();
  EXPECT_TRUE(rows.back()["replay_fill"]["groups"].is_number()) << rows.back().dump();
  EXPECT_EQ(rows.back()["restarts"],
            nlohmann::json({{"replay", 0}, {"learner", 0}, {"actor-0", 0}}));
  EXPECT_EQ(ReadFile(run + "/fleet.yaml"), ReadFile(fleet));
  EXPECT_NE(ReadFile(run + "/logs/learner.log").find("learner step"), std::string::npos);
  EXPECT_NE(ReadFile(run + "/logs/actor-0.log").find("\"event\":\"ready\""), std::string::npos)
      << "stdout goes to the log too";
  EXPECT_TRUE(fs::exists(run + "/learner/checkpoints/final/model.safetensors"));

  EXPECT_EQ(ReadLines(run + "/learner/metrics.jsonl").size(), 2u)
      << "a fresh learner stops exactly at the learner_steps rule";

  // A fresh launch into the same run directory is refused, and so is a resumed one already past
  // its stop rule (nothing started).
  strider::testing::RunResult again = strider::testing::RunCommand(
      {"/bin/sh", "-c", StriderBinary() + " launch " + fleet + " 2>&1"});
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find("--resume"), std::string::npos) << again.output;
  Launcher done;
  ASSERT_TRUE(done.Start({"--resume", "--run-dir", run}));
  const nlohmann::json done_finished = done.Wait("finished", 30000);
  ASSERT_TRUE(done_finished.is_object());
  EXPECT_EQ(done_finished["reason"], "learner_steps");
  EXPECT_EQ(done.process().Wait(), 0);
  EXPECT_TRUE(done.pids().empty());

  // --resume continues from the fleet file recorded in the run directory (raised here), the
  // learner from its final checkpoint.
  std::string recorded = ReadFile(run + "/fleet.yaml");
  recorded.replace(recorded.find("learner_steps: 2"), 16, "learner_steps: 4");
  std::ofstream(run + "/fleet.yaml") << recorded;
  Launcher resumed;
  ASSERT_TRUE(resumed.Start({"--resume", "--run-dir", run}));
  const nlohmann::json resumed_finished = resumed.Wait("finished", 120000);
  ASSERT_TRUE(resumed_finished.is_object());
  EXPECT_EQ(resumed_finished["reason"], "learner_steps");
  EXPECT_GE(resumed_finished["learner_step"].get<int64_t>(), 4);
  EXPECT_EQ(resumed.process().Wait(), 0);
  EXPECT_EQ(Running(resumed), std::vector<std::string>{});
  const std::string learner_log = ReadFile(run + "/logs/learner.log");
  EXPECT_EQ(Count(learner_log, "--- launch: starting"), 2u);
  EXPECT_NE(learner_log.find("--resume " + run + "/learner/checkpoints/final"), std::string::npos)
      << learner_log;
  const std::vector<nlohmann::json> steps = ReadLines(run + "/learner/metrics.jsonl");
  ASSERT_GE(steps.size(), 4u);
  EXPECT_EQ(steps[2]["step"], 3) << "the resumed learner continues after its checkpoint";
}

// `weights:` reaches both sides: weights from another seed than the configs' init_seed and
// model_seed, and the learner's mismatch check still keeps every trajectory.
TEST(Launch, FleetWeightsStartTheLearnerAndTheActorsFromTheSameFile) {
  TempDir dir;
  const std::string weights = dir.Sub("start.safetensors");
  const strider::testing::RunResult init = strider::testing::RunCommand(
      {StriderBinary(), "model", "init", "--config", SourceDir() + "/configs/model/tiny.yaml",
       "--out", weights, "--seed", "5"});
  ASSERT_EQ(init.exit_code, 0);
  const std::string fleet = WriteFleet(dir, "fleet.yaml", "  learner_steps: 1\n");
  std::ofstream(fleet, std::ios::app) << "weights: " << weights << "\n";
  const std::string run = dir.Sub("run");
  Launcher launcher;
  ASSERT_TRUE(launcher.Start({fleet}));
  const nlohmann::json finished = launcher.Wait("finished", 150000);
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(finished["reason"], "learner_steps");
  EXPECT_EQ(launcher.process().Wait(), 0);
  EXPECT_EQ(StartFlags(run + "/logs/learner.log", "--init"), std::vector<std::string>{weights});
  EXPECT_EQ(StartFlags(run + "/logs/actor-0.log", "--weights"), std::vector<std::string>{weights});
  const nlohmann::json step = LastStep(run);
  ASSERT_TRUE(step.is_object());
  EXPECT_EQ(step["mismatch_excluded"], 0) << step.dump();
  EXPECT_EQ(step["trained_trajectories"], 4) << step.dump();
}

TEST(Launch, SigintEndsEveryChildWithinTenSeconds) {
  TempDir dir;
  const std::string fleet = WriteFleet(dir, "fleet.yaml", "  wall_time_s: 600\n", 1, "http: true\n");
  Launcher launcher;
  // Without OMP_WAIT_POLICY in its environment (ctest sets it), to see the launcher add it.
  ASSERT_TRUE(launcher.Start(
      {"/bin/sh", "-c", "exec env -u OMP_WAIT_POLICY " + StriderBinary() + " launch " + fleet},
      /*raw=*/true));
  const nlohmann::json ready = launcher.Wait("ready", 120000);
  ASSERT_TRUE(ready.is_object());
  // `http: true`: every service's pages, named in the ready line and in RUN_DIR/http.json.
  ASSERT_TRUE(ready.contains("http")) << ready.dump();
  EXPECT_EQ(nlohmann::json::parse(ReadFile(dir.Sub("run/http.json"))), ready["http"]);
  for (const std::string role : {"replay", "learner", "actor-0"}) {
    ASSERT_TRUE(ready["http"].contains(role)) << ready.dump();
    const HttpReply metrics = HttpGet(PortOf(ready["http"][role].get<std::string>()), "/metrics");
    EXPECT_EQ(metrics.status, 200) << role;
    EXPECT_NE(metrics.body.find("strider_up{"), std::string::npos) << role << ": " << metrics.body;
  }
  std::string environment =
      ReadFile("/proc/" + std::to_string(launcher.pids().at("actor-0").at(0)) + "/environ");
  std::replace(environment.begin(), environment.end(), '\0', '\n');
  EXPECT_NE(environment.find("\nOMP_WAIT_POLICY=PASSIVE\n"), std::string::npos) << environment;
  std::this_thread::sleep_for(milliseconds(2000));  // children busy: episodes and a step
  const auto signalled = std::chrono::steady_clock::now();
  launcher.process().Signal(SIGINT);
  const nlohmann::json finished = launcher.Wait("finished", 15000);
  const int exit_code = launcher.process().Wait();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(finished["reason"], "signal");
  EXPECT_EQ(exit_code, 0);
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(Running(launcher), std::vector<std::string>{});
  EXPECT_EQ(launcher.pids().size(), 3u) << "replay, learner, actor-0";
}

TEST(Launch, ASigkilledLauncherLeavesNothingRunning) {
  TempDir dir;
  const std::string fleet = WriteFleet(dir, "fleet.yaml", "  wall_time_s: 600\n");
  Launcher launcher;
  ASSERT_TRUE(launcher.Start({fleet}));
  ASSERT_TRUE(launcher.Wait("ready", 120000).is_object());
  launcher.process().Signal(SIGKILL);
  EXPECT_EQ(launcher.process().Wait(), 128 + SIGKILL);
  // The children get SIGTERM from the kernel (PR_SET_PDEATHSIG) and stop themselves.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!Running(launcher).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_EQ(Running(launcher), std::vector<std::string>{});
}

TEST(Launch, AKilledActorIsRestartedAndTheRunFinishes) {
  TempDir dir;
  const std::string fleet = WriteFleet(dir, "fleet.yaml", "  learner_steps: 3\n");
  const std::string run = dir.Sub("run");
  Launcher launcher;
  ASSERT_TRUE(launcher.Start({fleet}));
  ASSERT_TRUE(launcher.Wait("ready", 120000).is_object());
  const pid_t first = launcher.pids().at("actor-0").at(0);
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  const nlohmann::json restarted = launcher.Wait(
      "started", 30000, [](const nlohmann::json& e) { return e["role"] == "actor-0"; });
  ASSERT_TRUE(restarted.is_object()) << "actor-0 was not restarted";
  EXPECT_EQ(restarted["restarts"], 1);
  EXPECT_NE(restarted["pid"].get<pid_t>(), first);
  const nlohmann::json finished = launcher.Wait("finished", 150000);
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(finished["reason"], "learner_steps");
  EXPECT_EQ(launcher.process().Wait(), 0);
  EXPECT_EQ(Running(launcher), std::vector<std::string>{});
  const std::vector<nlohmann::json> rows = ReadLines(run + "/metrics.jsonl");
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows.back()["restarts"]["actor-0"], 1);
  EXPECT_EQ(rows.back()["restarts"]["learner"], 0);
  // Both starts on the one spill directory, so segments the first left there are delivered.
  const std::string log = ReadFile(run + "/logs/actor-0.log");
  EXPECT_EQ(Count(log, "--spill-dir " + run + "/actors/actor-0/spill"), 2u) << log;
  // The config's seed (3), then the next one: the restarted actor plays new problems.
  EXPECT_EQ(StartFlags(run + "/logs/actor-0.log", "--seed"), (std::vector<std::string>{"3", "4"}));
}

TEST(Launch, TheReplayServerAndTheLearnerAreRestartedWhereTheOthersFindThem) {
  TempDir dir;
  const std::string fleet = WriteFleet(dir, "fleet.yaml", "  learner_steps: 5\n");
  const std::string run = dir.Sub("run");
  Launcher launcher;
  ASSERT_TRUE(launcher.Start({fleet}));
  ASSERT_TRUE(launcher.Wait("ready", 120000).is_object());
  ASSERT_TRUE(WaitForStep(run, 1));
  ASSERT_EQ(::kill(launcher.pids().at("replay").at(0), SIGKILL), 0);
  const auto restarted = [&](const std::string& role) {
    return launcher.Wait("started", 30000,
                         [&](const nlohmann::json& e) { return e["role"] == role; });
  };
  ASSERT_TRUE(restarted("replay").is_object()) << "the replay server was not restarted";
  ASSERT_TRUE(WaitForStep(run, 2)) << "no step after the replay server's restart";
  ASSERT_EQ(::kill(launcher.pids().at("learner").at(0), SIGKILL), 0);
  ASSERT_TRUE(restarted("learner").is_object()) << "the learner was not restarted";
  const nlohmann::json finished = launcher.Wait("finished", 150000);
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(finished["reason"], "learner_steps");
  EXPECT_GE(finished["learner_step"].get<int64_t>(), 5);
  EXPECT_EQ(launcher.process().Wait(), 0);
  EXPECT_EQ(Running(launcher), std::vector<std::string>{});
  const nlohmann::json restarts = ReadLines(run + "/metrics.jsonl").back()["restarts"];
  EXPECT_EQ(restarts, nlohmann::json({{"replay", 1}, {"learner", 1}, {"actor-0", 0}}));

  // Same ports for the restarted server, same publish port and a checkpoint for the learner.
  const std::vector<std::string> binds = StartFlags(run + "/logs/replay.log", "--bind");
  ASSERT_EQ(binds.size(), 2u);
  EXPECT_EQ(binds[0], "tcp://127.0.0.1:0");
  EXPECT_NE(binds[1], "tcp://127.0.0.1:0");
  EXPECT_EQ(StartFlags(run + "/logs/replay.log", "--sample-bind")[1],
            StartFlags(run + "/logs/learner.log", "--replay")[0]);
  const std::vector<std::string> publish = StartFlags(run + "/logs/learner.log", "--publish");
  ASSERT_EQ(publish.size(), 2u);
  EXPECT_EQ(publish[1], StartFlags(run + "/logs/actor-0.log", "--weights-endpoint")[0]);
  const std::vector<std::string> resume = StartFlags(run + "/logs/learner.log", "--resume");
  EXPECT_EQ(resume[0], "");
  EXPECT_EQ(resume[1], run + "/learner/checkpoints/latest");
}

TEST(Launch, ARoleOverItsRestartsFailsTheRunQuotingItsLog) {
  TempDir dir;
  const std::string fleet =
      WriteFleet(dir, "fleet.yaml", "  wall_time_s: 600\n", 1, "", "  max_restarts: 0\n");
  Launcher launcher;
  ASSERT_TRUE(launcher.Start(
      {"/bin/sh", "-c",
       "exec " + StriderBinary() + " launch " + fleet + " 2>" + dir.Sub("stderr.txt")},
      /*raw=*/true));
  ASSERT_TRUE(launcher.Wait("ready", 120000).is_object());
  ASSERT_EQ(::kill(launcher.pids().at("actor-0").at(0), SIGKILL), 0);
  const nlohmann::json finished = launcher.Wait("finished", 30000);
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(finished["reason"], "failed");
  EXPECT_EQ(launcher.process().Wait(), 1);
  EXPECT_EQ(Running(launcher), std::vector<std::string>{});
  const std::string stderr_text = ReadFile(dir.Sub("stderr.txt"));
  EXPECT_NE(stderr_text.find("actor-0 ended (signal 9"), std::string::npos) << stderr_text;
  EXPECT_NE(stderr_text.find("restart.max_restarts is 0"), std::string::npos) << stderr_text;
  EXPECT_NE(stderr_text.find("  | {\"event\":\"ready\""), std::string::npos)
      << "the end of the actor's log is quoted: " << stderr_text;
}

size_t SpilledFiles(const std::string& dir) {
  size_t n = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (entry.path().extension() == ".seg") ++n;
  }
  return n;
}

// What a restart on the same spill directory relies on: an actor killed while its server was
// away left segments there, and the next actor started on that directory delivers them.
TEST(Launch, AnActorStartedOnASpillDirectoryDeliversWhatAnEarlierOneLeftThere) {
  TempDir dir;
  WriteChildConfigs(dir);
  std::string config = ReadFile(dir.Sub("actor.yaml"));
  const std::string replay_line = "  replay: {endpoint: tcp://127.0.0.1:1}";
  config.replace(config.find(replay_line), replay_line.size(),
                 "  replay: {endpoint: tcp://127.0.0.1:1, spill_after_ms: 300}");
  std::ofstream(dir.Sub("spilling.yaml")) << config;
  const std::string spill = dir.Sub("spill");
  {
    // Nothing listens on port 1: every segment ends in the spill directory.
    ChildProcess first;
    ASSERT_TRUE(first.Start({StriderBinary(), "actor", "--config", dir.Sub("spilling.yaml"),
                             "--spill-dir", spill, "--episodes", "0"}));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (SpilledFiles(spill) < 4 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(200));
    }
    first.Signal(SIGKILL);
    first.Wait();
  }
  const size_t left = SpilledFiles(spill);
  ASSERT_GE(left, 4u);

  ChildProcess server;
  const strider::testing::ReplayEndpoints endpoints = strider::testing::StartReplayServer(
      server, dir.Sub("db"), dir.Sub("replay.yaml"), ReadFile(dir.Sub("replay.yaml")));
  ASSERT_FALSE(endpoints.actor.empty());
  ChildProcess second;
  ASSERT_TRUE(second.Start({StriderBinary(), "actor", "--config", dir.Sub("spilling.yaml"),
                            "--spill-dir", spill, "--episodes", "4", "--replay", endpoints.actor}));
  const nlohmann::json finished = strider::testing::WaitEvent(second, "finished", 120000);
  ASSERT_EQ(second.Wait(), 0);
  ASSERT_TRUE(finished.is_object());
  server.Signal(SIGTERM);
  ASSERT_EQ(server.Wait(), 0);
  EXPECT_EQ(SpilledFiles(spill), 0u);
  const strider::testing::RunResult stats = strider::testing::RunCommand(
      {StriderBinary(), "replay", "inspect", dir.Sub("db"), "stats", "--json"});
  ASSERT_EQ(stats.exit_code, 0);
  const nlohmann::json store = nlohmann::json::parse(stats.output);
  EXPECT_EQ(store["segments"].get<int64_t>(),
            finished["metrics"]["segments"].get<int64_t>() + static_cast<int64_t>(left))
      << "the store holds the second actor's segments and every one the first left";
}

TEST(Launch, ABrokenFleetFileIsRefusedBeforeAnythingStarts) {
  TempDir dir;
  const auto run = [&](const std::string& fleet) {
    return strider::testing::RunCommand(
        {"/bin/sh", "-c", StriderBinary() + " launch " + fleet + " 2>&1"});
  };
  // A misspelt key: file, line and key, with the key it resembles.
  std::string fleet = WriteFleet(dir, "typo.yaml", "  learner_steps: 2\n");
  std::string text = ReadFile(fleet);
  text.replace(text.find("  count:"), 8, "  cout:");
  std::ofstream(fleet) << text;
  strider::testing::RunResult result = run(fleet);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("typo.yaml:8"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("actors.cout"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("did you mean count"), std::string::npos) << result.output;

  // A config file that is not there.
  fleet = WriteFleet(dir, "missing.yaml", "  learner_steps: 2\n");
  text = ReadFile(fleet);
  text.replace(text.find(dir.Sub("learner.yaml")), dir.Sub("learner.yaml").size(),
               dir.Sub("nosuch.yaml"));
  std::ofstream(fleet) << text;
  result = run(fleet);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("missing.yaml:5"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("learner.config"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("nosuch.yaml"), std::string::npos) << result.output;

  // No stop rule at all.
  fleet = WriteFleet(dir, "nostop.yaml", "  samples: 0\n");
  result = run(fleet);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("stop"), std::string::npos) << result.output;

  // A child's own config broken: named through the fleet key that points at it.
  fleet = WriteFleet(dir, "child.yaml", "  learner_steps: 2\n");
  std::ofstream(dir.Sub("learner.yaml"), std::ios::app) << "scoring: {mismatch_treshold: 0.1}\n";
  result = run(fleet);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("learner.config"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("scoring.mismatch_treshold"), std::string::npos) << result.output;

  EXPECT_FALSE(fs::exists(dir.Sub("run"))) << "a refused fleet started something";
}

TEST(Launch, EvaluatesTheStartEveryNthVersionAndTheEnd) {
  // An unknown subcommand given --help prints the top-level help and exits 0: ask for eval's
  // own flags instead.
  if (strider::testing::RunCommand(
          {"/bin/sh", "-c", StriderBinary() + " eval --help 2>&1 | grep -q -- --weights-endpoint"})
          .exit_code != 0) {
    GTEST_SKIP() << "`strider eval` is not in this build yet";
  }
  TempDir dir;
  const std::string fleet = WriteFleet(dir, "fleet.yaml", "  learner_steps: 4\n", 1,
                                       "evaluation:\n  config: " + dir.Sub("actor.yaml") +
                                           "\n  episodes: 4\n  every_versions: 2\n  final: true\n");
  const std::string run = dir.Sub("run");
  Launcher launcher;
  ASSERT_TRUE(launcher.Start({fleet}));
  const nlohmann::json finished = launcher.Wait("finished", 240000);
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(launcher.process().Wait(), 0);
  EXPECT_EQ(finished["reason"], "learner_steps");
  EXPECT_TRUE(finished["eval_success_rate"].is_number());
  const std::vector<nlohmann::json> rows = ReadLines(run + "/eval.jsonl");
  ASSERT_GE(rows.size(), 2u) << "the start and the end at least";
  for (const nlohmann::json& row : rows) {
    EXPECT_EQ(row["event"], "eval");
    for (const char* key : {"success_rate", "ci_low", "ci_high", "episodes", "policy_version",
                            "learner_step", "samples_seen", "elapsed_s"}) {
      EXPECT_TRUE(row.contains(key)) << key;
    }
    EXPECT_EQ(row["episodes"], 4);
  }
  EXPECT_TRUE(rows.back().value("final", false));
  // The start: version 0, which a fresh learner never publishes, from the file written for it.
  EXPECT_EQ(rows.front()["policy_version"], 0);
  EXPECT_EQ(rows.front()["weights"], run + "/initial.safetensors");
  EXPECT_TRUE(fs::exists(run + "/initial.safetensors"));
  EXPECT_EQ(Running(launcher), std::vector<std::string>{});
}

}  // namespace
}  // namespace strider
