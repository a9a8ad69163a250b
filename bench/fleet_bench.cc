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
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_json.h"

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
               "[--quick] [--keep DIR]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path source = STRIDER_SOURCE_DIR;
  fs::path fleet = source / "configs/fleet/calculator_tiny.yaml";
  fs::path strider = fs::path(argv[0]).parent_path() / "../cli/strider";
  double seconds = 120;
  std::string keep;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--quick") {
      seconds = 30;
    } else if (arg == "--fleet" || arg == "--seconds" || arg == "--strider" || arg == "--keep") {
      const char* v = value();
      if (!v) return Usage(("missing value for " + arg).c_str());
      if (arg == "--fleet") fleet = v;
      if (arg == "--seconds") seconds = std::atof(v);
      if (arg == "--strider") strider = v;
      if (arg == "--keep") keep = v;
    } else {
      return Usage(("unknown argument " + arg).c_str());
    }
  }
  if (!(seconds > 0)) return Usage("--seconds must be positive");
  if (!fs::is_regular_file(fleet)) return Usage(("no fleet file " + fleet.string()).c_str());
  if (!fs::is_regular_file(strider)) return Usage(("no strider binary " + strider.string()).c_str());

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
