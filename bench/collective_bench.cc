// Collectives of data-parallel learner ranks against raw c10d (docs/design.md#benchmark-protocol):
//   allreduce_gradients   LearnerGroup::AllReduceGradients over a model's trainable parameters
//                         (their gradients in the group's buckets, as PrepareGradients leaves
//                         them for backward; 25 MB buckets all in flight) against one raw
//                         ProcessGroupGloo::allreduce of a flat tensor of the same bytes, on the
//                         same ranks in the same run; both as bytes per second of wall time
//                         (the gradient bytes over the time to sum them across ranks).
// The ranks are this program's own children on loopback: the parent spawns --world copies of
// itself, rank 0 prints the lines.
//
//   expert_alltoall       one expert-parallel sparse layer's exchanges (LearnerGroup::experts())
//                         against raw c10d all-to-all of the same latent rows
//
//   collective_bench [--world N] [--model CONFIG] [--iterations N] [--tokens N] [--quick]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_json.h"
#include "common/clock.h"
#include "common/model/expert_parallel.h"
#include "common/model/model.h"
#include "learner/distributed.h"
#include "tests/free_port.h"

namespace {

using strider::Clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

struct Args {
  int world = 2;
  int rank = -1;  // -1: the parent
  uint16_t port = 0;
  uint16_t raw_port = 0;
  std::string model = std::string(STRIDER_SOURCE_DIR) + "/configs/model/calc.yaml";
  int iterations = 30;
  int64_t tokens = 4096;  // per rank, for the expert all-to-all
};

int Rank(const Args& args) {
  at::set_num_threads(1);
  strider::LearnerGroupOptions options;
  options.rank = args.rank;
  options.world_size = args.world;
  options.host = "127.0.0.1";
  options.port = args.port;
  options.timeout_s = 120;
  auto group = strider::LearnerGroup::Join(options);
  if (!group.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", args.rank, group.status().ToString().c_str());
    return 1;
  }
  // The raw baseline: its own store and process group, the same transport.
  c10d::TCPStoreOptions store_options;
  store_options.port = args.raw_port;
  store_options.isServer = args.rank == 0;
  store_options.numWorkers = static_cast<size_t>(args.world);
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_options);
  auto gloo = c10d::ProcessGroupGloo::Options::create();
  gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  gloo->threads = 2;
  auto raw = c10::make_intrusive<c10d::ProcessGroupGloo>(store, args.rank, args.world, gloo);

  auto config = strider::LoadModelConfig(args.model);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 1;
  }
  auto model = strider::Model::Create(*config, 0);
  if (!model.ok()) return 1;
  (*model)->SetRequiresGrad(true);
  std::vector<at::Tensor> parameters = (*model)->TrainableParameters();
  std::vector<at::Tensor> sources;
  int64_t elements = 0;
  for (const at::Tensor& p : parameters) {
    sources.push_back(at::randn_like(p));
    elements += p.numel();
  }
  const int64_t bytes = elements * 4;
  // What an update's backward passes leave: gradients in the group's buckets (untimed).
  auto reset = [&] {
    const strider::Status prepared = (*group)->PrepareGradients(parameters);
    if (!prepared.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", args.rank, prepared.ToString().c_str());
      std::exit(1);
    }
    for (size_t i = 0; i < parameters.size(); ++i) parameters[i].grad().copy_(sources[i]);
  };

  // Alternate the two so drift in the machine's load hits both alike.
  double ours = 0, theirs = 0;
  at::Tensor flat = at::randn({elements});
  for (int i = -3; i < args.iterations; ++i) {
    reset();
    auto started = Clock::now();
    strider::Status status = (*group)->AllReduceGradients(parameters);
    const double ours_seconds = Seconds(started);
    if (!status.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", args.rank, status.ToString().c_str());
      return 1;
    }
    std::vector<at::Tensor> one{flat};
    started = Clock::now();
    raw->allreduce(one)->wait();
    const double raw_seconds = Seconds(started);
    if (i >= 0) {
      ours += ours_seconds;
      theirs += raw_seconds;
    }
  }
  // Expert all-to-all: the four exchanges of one expert-parallel sparse layer's forward as
  // RoutedExpertsParallel issues them (row counts, expert ids, latent rows there, outputs back)
  // against two raw alltoall_base calls moving the same rows there and back.
  const int64_t tokens = args.tokens;
  const int64_t k = config->feed_forward.experts_per_token;
  const int64_t latent = config->feed_forward.latent_width;
  const int64_t pairs = tokens * k;
  std::vector<int64_t> send(static_cast<size_t>(args.world), 0);
  at::manual_seed(1000 + args.rank);
  // Uniform routing: each pair's expert lives on any rank alike.
  const at::Tensor owners =
      at::randint(args.world, {pairs}, at::TensorOptions().dtype(at::kLong)).contiguous();
  for (int64_t i = 0; i < pairs; ++i) ++send[owners.data_ptr<int64_t>()[i]];
  const std::vector<int64_t> ones(static_cast<size_t>(args.world), 1);
  strider::model::ExpertExchange& exchange = (*group)->experts();
  const std::vector<int64_t> recv = [&] {
    at::Tensor c = exchange.AllToAll(at::tensor(send, at::kLong).reshape({args.world, 1}), ones,
                                     ones);
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  }();
  int64_t received = 0;
  for (int64_t n : recv) received += n;
  const at::Tensor rows = at::randn({pairs, latent});
  const at::Tensor ids = at::randint(1 << 20, {pairs, 1}, at::TensorOptions().dtype(at::kLong));
  double ours_exchange = 0, raw_exchange = 0;
  for (int i = -3; i < args.iterations; ++i) {
    auto started = Clock::now();
    exchange.AllToAll(at::tensor(send, at::kLong).reshape({args.world, 1}), ones, ones);
    exchange.AllToAll(ids, send, recv);
    at::Tensor there = exchange.AllToAll(rows, send, recv);
    exchange.AllToAll(there, recv, send);
    const double ours_seconds = Seconds(started);
    started = Clock::now();
    at::Tensor out = at::empty({received, latent});
    at::Tensor in = rows;
    // c10d moves the count vectors into its work item: fresh copies per call.
    std::vector<int64_t> out_counts = recv, in_counts = send;
    raw->alltoall_base(out, in, out_counts, in_counts)->wait();
    at::Tensor back = at::empty({pairs, latent});
    out_counts = send;
    in_counts = recv;
    raw->alltoall_base(back, out, out_counts, in_counts)->wait();
    const double raw_seconds = Seconds(started);
    if (i >= 0) {
      ours_exchange += ours_seconds;
      raw_exchange += raw_seconds;
    }
  }

  if (args.rank == 0) {
    const double n = static_cast<double>(args.iterations);
    const double ours_rate = static_cast<double>(bytes) * n / ours;
    const double raw_rate = static_cast<double>(bytes) * n / theirs;
    strider::bench::PrintResult(
        "collective_bench", "allreduce_gradients_bytes_per_second", ours_rate, "B/s", raw_rate,
        {{"world_size", strider::bench::JsonNumber(args.world)},
         {"model", strider::bench::JsonString(config->name)},
         {"gradient_bytes", strider::bench::JsonNumber(static_cast<double>(bytes))},
         {"tensors", strider::bench::JsonNumber(static_cast<double>(parameters.size()))},
         {"ours_ms", strider::bench::JsonNumber(ours / n * 1e3)},
         {"raw_ms", strider::bench::JsonNumber(theirs / n * 1e3)},
         {"baseline_is", strider::bench::JsonString(
                             "one raw ProcessGroupGloo allreduce of a flat tensor of the same "
                             "bytes, same ranks, same run")},
         {"cores", strider::bench::JsonNumber(std::thread::hardware_concurrency())}});
    const double row_bytes = static_cast<double>((pairs + received) * latent * 4);
    strider::bench::PrintResult(
        "collective_bench", "expert_alltoall_bytes_per_second", row_bytes * n / ours_exchange,
        "B/s", row_bytes * n / raw_exchange,
        {{"world_size", strider::bench::JsonNumber(args.world)},
         {"model", strider::bench::JsonString(config->name)},
         {"tokens_per_rank", strider::bench::JsonNumber(static_cast<double>(tokens))},
         {"experts_per_token", strider::bench::JsonNumber(static_cast<double>(k))},
         {"latent_width", strider::bench::JsonNumber(static_cast<double>(latent))},
         {"row_bytes_rank0", strider::bench::JsonNumber(row_bytes)},
         {"ours_ms", strider::bench::JsonNumber(ours_exchange / n * 1e3)},
         {"raw_ms", strider::bench::JsonNumber(raw_exchange / n * 1e3)},
         {"baseline_is", strider::bench::JsonString(
                             "two raw ProcessGroupGloo alltoall_base calls moving the same latent "
                             "rows there and back; ours adds the row counts and expert ids")},
         {"cores", strider::bench::JsonNumber(std::thread::hardware_concurrency())}});
  }
  return 0;
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "collective_bench: %s\nusage: collective_bench [--world N] [--model CONFIG] "
               "[--iterations N] [--tokens N] [--quick]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--quick") {
      args.iterations = 5;
    } else if (arg == "--world" || arg == "--rank" || arg == "--port" || arg == "--raw-port" ||
               arg == "--model" || arg == "--iterations" || arg == "--tokens") {
      const char* v = value();
      if (v == nullptr) return Usage(("missing value for " + arg).c_str());
      if (arg == "--world") args.world = std::atoi(v);
      if (arg == "--rank") args.rank = std::atoi(v);
      if (arg == "--port") args.port = static_cast<uint16_t>(std::atoi(v));
      if (arg == "--raw-port") args.raw_port = static_cast<uint16_t>(std::atoi(v));
      if (arg == "--model") args.model = v;
      if (arg == "--iterations") args.iterations = std::atoi(v);
      if (arg == "--tokens") args.tokens = std::atoll(v);
    } else {
      return Usage(("unknown argument " + arg).c_str());
    }
  }
  if (args.world < 2) return Usage("--world must be at least 2");
  if (args.iterations < 1) return Usage("--iterations must be positive");
  if (args.rank >= 0) return Rank(args);

  args.port = strider::testing::FreeLoopbackPort();
  args.raw_port = strider::testing::FreeLoopbackPort();
  while (args.raw_port == args.port) args.raw_port = strider::testing::FreeLoopbackPort();
  std::vector<pid_t> children;
  for (int r = 0; r < args.world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::vector<std::string> words = {argv[0], "--world", std::to_string(args.world),
                                        "--rank", std::to_string(r), "--port",
                                        std::to_string(args.port), "--raw-port",
                                        std::to_string(args.raw_port), "--model", args.model,
                                        "--iterations", std::to_string(args.iterations),
                                        "--tokens", std::to_string(args.tokens)};
      std::vector<char*> exec_args;
      for (std::string& w : words) exec_args.push_back(w.data());
      exec_args.push_back(nullptr);
      ::execv("/proc/self/exe", exec_args.data());
      std::_Exit(127);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed == 0 ? 0 : 1;
}
