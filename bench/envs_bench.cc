// Environment and tool costs against their raw floor, measured side by side
// (docs/design.md#benchmark-protocol):
//   - a sandboxed tool call (fork, limits, Landlock, pipes, scratch directory) against a plain
//     fork/exec/wait of the same python3 command;
//   - one step of an out-of-process environment (the Python example over the JSON protocol)
//     against a raw ZeroMQ round trip to a Python echo process on the same kind of socket pair;
//   - generating the retrieval environment's documents (a 1M-token episode read part by part)
//     against copying the same number of bytes.
// Usage: envs_bench [--quick]. Needs /usr/bin/python3 with python3-zmq for the first two.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "bench/bench_json.h"
#include "bench/bench_util.h"
#include "common/clock.h"
#include "envs/environment.h"
#include "envs/episode.h"
#include "envs/sandbox.h"
#include "envs/tools.h"

extern char** environ;

namespace strider::bench {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double PlainRun(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  const auto start = Clock::now();
  pid_t pid = 0;
  posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  int status = 0;
  waitpid(pid, &status, 0);
  posix_spawn_file_actions_destroy(&actions);
  return Seconds(start);
}

void SandboxBench(int runs) {
  const std::vector<std::string> argv = {kPython, "-I", "-c", "print(1)"};
  std::vector<double> ours, plain;
  for (int i = 0; i < runs; ++i) {  // interleaved, so load changes hit both alike
    envs::SandboxRequest request;
    request.argv = argv;
    const auto start = Clock::now();
    Result<envs::SandboxResult> run = envs::RunSandboxed(request);
    ours.push_back(Seconds(start));
    if (!run.ok() || run->stdout_text != "1\n") {
      std::fprintf(stderr, "sandbox run failed\n");
      return;
    }
    plain.push_back(PlainRun(argv));
  }
  PrintResult("envs", "sandboxed_python_call_ms", 1e3 * Median(ours), "ms", 1e3 * Median(plain));
}

// A Python REP process that echoes each message: the floor of one protocol round trip.
void ExternalBench(int steps) {
  envs::EnvironmentConfig config;
  config.command =
      std::string(kPython) + " " + STRIDER_SOURCE_DIR + "/envs/external/example_env.py";
  Result<std::unique_ptr<envs::Environment>> env = envs::MakeEnvironment(config);
  if (!env.ok()) {
    std::fprintf(stderr, "%s\n", env.status().ToString().c_str());
    return;
  }
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.bind("tcp://127.0.0.1:*");
  const std::string endpoint = dealer.get(zmq::sockopt::last_endpoint);
  const std::string echo = std::string(kPython) +
                           " -c \"import zmq,sys; s=zmq.Context().socket(zmq.REP); "
                           "s.connect(sys.argv[1]);\n"
                           "while True:\n m=s.recv()\n s.send(m)\n if m==b'stop': break\" " +
                           endpoint + " &";
  if (std::system(echo.c_str()) != 0) return;

  const envs::Action action = envs::MakeAction(envs::FormatToolCall("guess", "50"));
  std::vector<double> ours, raw;
  Check((*env)->Reset(0, {}).status(), "resetting the external environment");
  int in_episode = 0;
  for (int i = 0; i < steps; ++i) {
    if (++in_episode == 15) {
      Check((*env)->Reset(i, {}).status(), "resetting the external environment");
      in_episode = 0;
    }
    auto start = Clock::now();
    Result<envs::StepResult> step = (*env)->Step(action);
    ours.push_back(Seconds(start));
    if (!step.ok()) {
      std::fprintf(stderr, "%s\n", step.status().ToString().c_str());
      return;
    }
    // The same request size through the raw socket pair.
    const std::string payload(200, 'x');
    std::array<zmq::const_buffer, 2> frames = {zmq::const_buffer(nullptr, 0), zmq::buffer(payload)};
    start = Clock::now();
    (void)zmq::send_multipart(dealer, frames);
    std::vector<zmq::message_t> parts;
    (void)zmq::recv_multipart(dealer, std::back_inserter(parts));
    raw.push_back(Seconds(start));
  }
  std::array<zmq::const_buffer, 2> stop = {zmq::const_buffer(nullptr, 0), zmq::str_buffer("stop")};
  (void)zmq::send_multipart(dealer, stop);
  std::vector<zmq::message_t> parts;
  (void)zmq::recv_multipart(dealer, std::back_inserter(parts));
  (*env)->Close();
  PrintResult("envs", "external_step_us", 1e6 * Median(ours), "us", 1e6 * Median(raw));
}

// Asks for the next part every turn, so an episode reads the whole document.
class NextPartPolicy : public envs::ScriptedPolicy {
 public:
  Result<std::string> NextTurn(const std::vector<envs::Observation>&) override {
    return std::string("next");
  }
};

void RetrievalBench(int episodes) {
  Result<std::unique_ptr<envs::Environment>> env = envs::MakeEnvironment(
      {.name = "retrieval", .options = {{"total_tokens", "1048576"}, {"parts", "16"}}});
  if (!env.ok()) return;
  NextPartPolicy next_part;
  double ours = 0, copy = 0;
  size_t bytes = 0;
  std::vector<char> source(1 << 20, 'x'), target(1 << 20);
  for (int e = 0; e < episodes; ++e) {
    // The first part comes with Reset, the other 15 with one step each.
    const envs::EpisodeReport episode = envs::PlayEpisode(**env, next_part, e, 15);
    if (episode.error) {
      std::fprintf(stderr, "retrieval episode failed: %s\n", episode.end.c_str());
      return;
    }
    ours += episode.seconds;
    const size_t episode_bytes = episode.observation_bytes;
    bytes += episode_bytes;
    // The same number of bytes through memcpy, 1 MiB at a time.
    const auto start = Clock::now();
    for (size_t done = 0; done < episode_bytes; done += source.size()) {
      std::memcpy(target.data(), source.data(), source.size());
      source[done % source.size()] = target[(done + 1) % target.size()];
    }
    copy += Seconds(start);
  }
  const double per_second = static_cast<double>(bytes) / ours;
  const double copy_per_second = static_cast<double>(bytes) / copy;
  PrintResult("envs", "retrieval_document_tokens_per_s", per_second, "tokens/s", copy_per_second);
}

}  // namespace
}  // namespace strider::bench

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  strider::bench::RetrievalBench(quick ? 2 : 10);
  if (::access(strider::bench::kPython, X_OK) != 0) {
    std::fprintf(stderr, "no %s: skipping the sandbox and external benches\n",
                 strider::bench::kPython);
    return 0;
  }
  strider::bench::SandboxBench(quick ? 5 : 30);
  strider::bench::ExternalBench(quick ? 100 : 2000);
  return 0;
}
