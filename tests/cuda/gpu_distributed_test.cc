// The learner group (learner/distributed.h) with its tensors on one GPU (docs/cuda.md, "NCCL in
// the learner group"):
//   - NCCL at world size 1: the gradient all-reduce, a broadcast and an all-gather of CUDA
//     tensors go through ProcessGroupNCCL on cuda:0 and leave a lone rank's values as they are;
//   - two ranks sharing the GPU over Gloo with CUDA tensors (NCCL refuses two ranks on one
//     device), the second a real process: three steps end on the same parameters on both,
//     equal to the sum of the two ranks' gradients applied by hand;
//   - the second rank killed mid-step, inside its gradient all-reduce: the survivor stops
//     within the collective timeout with an error naming rank 1, and a group started again
//     from rank 0's parameters (what `--resume` does) continues in lockstep.
// The second rank is this test binary again, running its disabled SecondRank case.
// Label `gpu`: every case skips with the reason where LibTorch sees no CUDA device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "learner/distributed.h"
#include "tests/cuda/skip_without_cuda.h"
#include "tests/free_port.h"
#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::ChildProcess;
using strider::testing::TempDir;
using strider::testing::WaitEvent;

constexpr double kTimeoutS = 20;
constexpr double kLearningRate = 0.1;
// Set only in the second rank's process: the rendezvous port, the step to start from, the
// steps to run, and the step at which it announces itself mid-step (and is killed).
constexpr char kPortVariable[] = "STRIDER_GPU_RANK_PORT";
constexpr char kFirstStepVariable[] = "STRIDER_GPU_RANK_FIRST_STEP";
constexpr char kStepsVariable[] = "STRIDER_GPU_RANK_STEPS";
constexpr char kAnnounceVariable[] = "STRIDER_GPU_RANK_ANNOUNCE";

Result<std::unique_ptr<LearnerGroup>> JoinLoopback(int rank, int world, uint16_t port,
                                                   int cuda_device) {
  LearnerGroupOptions options;
  options.rank = rank;
  options.world_size = world;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout_s = kTimeoutS;
  options.bucket_bytes = 4096;  // several buckets, most sent while backward runs
  options.cuda_device = cuda_device;
  return LearnerGroup::Join(options);
}

// Two parameters on cuda:0, the same on every rank unless `fresh` (a restarted rank's own
// values, which the broadcast from rank 0 must replace).
std::vector<at::Tensor> Parameters(bool fresh) {
  const auto o = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0);
  const double shift = fresh ? 3.0 : 0.0;
  return {(at::linspace(-1, 1, 64 * 32, o) + shift).reshape({64, 32}).requires_grad_(true),
          (at::linspace(2, -2, 300, o) - shift).requires_grad_(true)};
}

// Rank `rank`'s gradient of parameter `i` at `step`: different on every rank and step.
at::Tensor RankGradient(const at::Tensor& parameter, size_t i, int rank, int step) {
  const auto o = parameter.options().requires_grad(false);
  const at::Tensor index = at::arange(parameter.numel(), o).reshape(parameter.sizes());
  return at::cos(index * (0.01 * (rank + 1)) + (step + 0.5 * static_cast<double>(i)));
}

double Checksum(const std::vector<at::Tensor>& parameters) {
  double sum = 0;
  for (const at::Tensor& p : parameters) sum += p.detach().to(at::kDouble).sum().item<double>();
  return sum;
}

// One step as the learner takes it: gradient buckets prepared, the loss's backward overlapping
// the all-reduce, the sum awaited, then plain SGD. `before_reduce` runs after backward, with
// this rank's buckets already sent.
Status Step(LearnerGroup& group, std::vector<at::Tensor>& parameters, int step,
            const std::function<void()>& before_reduce = {}) {
  STRIDER_RETURN_IF_ERROR(group.PrepareGradients(parameters));
  at::Tensor loss = at::zeros({}, parameters[0].options().requires_grad(false));
  for (size_t i = 0; i < parameters.size(); ++i) {
    loss = loss + (parameters[i] * RankGradient(parameters[i], i, group.rank(), step)).sum();
  }
  group.OverlapNextBackward(loss);
  loss.backward();
  if (before_reduce) before_reduce();
  STRIDER_RETURN_IF_ERROR(group.AllReduceGradients(parameters));
  at::NoGradGuard no_grad;
  for (at::Tensor& p : parameters) p.sub_(p.grad() * kLearningRate);
  return Status::Ok();
}

// The parameters after `steps` more steps of a `world`-rank group from `start`, by hand.
std::vector<at::Tensor> Expected(std::vector<at::Tensor> start, int world, int first_step,
                                 int steps) {
  at::NoGradGuard no_grad;
  for (at::Tensor& p : start) p = p.detach().to(at::kDouble);
  for (int s = first_step; s < first_step + steps; ++s) {
    for (size_t i = 0; i < start.size(); ++i) {
      at::Tensor sum = at::zeros_like(start[i]);
      for (int r = 0; r < world; ++r) sum += RankGradient(start[i], i, r, s);
      start[i] -= sum * kLearningRate;
    }
  }
  return start;
}

double MaxDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, (a[i].detach().to(at::kDouble) - b[i].detach().to(at::kDouble))
                                .abs().max().item<double>());
  }
  return worst;
}

void Announce(const nlohmann::json& event) {
  std::printf("%s\n", event.dump().c_str());
  std::fflush(stdout);
}

// Rank 1 of two as a process of its own: this binary running SecondRank, which joins the group
// at `port` on Gloo with CUDA tensors and takes `steps` steps from `first_step`, printing a
// "step" line with its parameters' checksum after each. A restarted rank (first_step > 0)
// starts from fresh values and takes rank 0's by broadcast. `announce`: the step at which it
// prints "in_step" between backward and the end of its all-reduce.
bool StartSecondRank(ChildProcess& child, const TempDir& dir, uint16_t port, int first_step,
                     int steps, int announce) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  return child.Start(
      {"/usr/bin/env", std::string(kPortVariable) + "=" + std::to_string(port),
       std::string(kFirstStepVariable) + "=" + std::to_string(first_step),
       std::string(kStepsVariable) + "=" + std::to_string(steps),
       std::string(kAnnounceVariable) + "=" + std::to_string(announce), self,
       "--gtest_also_run_disabled_tests", "--gtest_filter=GpuDistributedRank.DISABLED_SecondRank"},
      dir.Sub("rank1-from" + std::to_string(first_step) + ".err"));
}

TEST(GpuDistributedRank, DISABLED_SecondRank) {
  STRIDER_SKIP_WITHOUT_CUDA();
  const int64_t port = strider::testing::EnvInt(kPortVariable, 0);
  ASSERT_GT(port, 0) << "runs only as rank 1 of GpuDistributed's groups";
  const int first_step = static_cast<int>(strider::testing::EnvInt(kFirstStepVariable, 0));
  const int steps = static_cast<int>(strider::testing::EnvInt(kStepsVariable, 0));
  const int announce = static_cast<int>(strider::testing::EnvInt(kAnnounceVariable, -1));
  auto group = JoinLoopback(1, 2, static_cast<uint16_t>(port), -1);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  std::vector<at::Tensor> parameters = Parameters(/*fresh=*/first_step > 0);
  if (first_step > 0) {
    const Status broadcast = (*group)->Broadcast(parameters, 0);
    ASSERT_TRUE(broadcast.ok()) << broadcast.ToString();
  }
  for (int s = first_step; s < first_step + steps; ++s) {
    const Status step = Step(**group, parameters, s, [&] {
      if (s == announce) Announce({{"event", "in_step"}, {"step", s}});
    });
    ASSERT_TRUE(step.ok()) << step.ToString();
    Announce({{"event", "step"}, {"step", s}, {"checksum", Checksum(parameters)}});
  }
}

TEST(GpuDistributed, NcclAtWorldSizeOne) {
  STRIDER_SKIP_WITHOUT_CUDA();
#ifndef USE_C10D_NCCL
  GTEST_SKIP() << "this LibTorch has CUDA but no NCCL process group";
#else
  auto group = JoinLoopback(0, 1, strider::testing::FreeLoopbackPort(), 0);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  std::vector<at::Tensor> parameters = Parameters(false);
  const std::vector<at::Tensor> start = Parameters(false);
  for (int s = 0; s < 2; ++s) {
    const Status step = Step(**group, parameters, s);
    ASSERT_TRUE(step.ok()) << step.ToString();
    // A sum over one rank is its own gradient, left on the device.
    for (size_t i = 0; i < parameters.size(); ++i) {
      ASSERT_TRUE(parameters[i].grad().is_cuda());
      EXPECT_TRUE(at::equal(parameters[i].grad(), RankGradient(parameters[i], i, 0, s)));
    }
  }
  EXPECT_LT(MaxDifference(parameters, Expected(start, 1, 0, 2)), 1e-5);
  const LearnerGroupStats& stats = (*group)->stats();
  EXPECT_EQ(stats.allreduces, 2);
  EXPECT_GT(stats.buckets, 2) << "4096-byte buckets over 9.4 KB of gradients";
  EXPECT_GT(stats.buckets_during_backward, 0);

  const std::vector<at::Tensor> before = {parameters[0].detach().clone(),
                                          parameters[1].detach().clone()};
  const Status broadcast = (*group)->Broadcast(parameters, 0);
  ASSERT_TRUE(broadcast.ok()) << broadcast.ToString();
  EXPECT_EQ(MaxDifference(parameters, before), 0);
  auto gathered = (*group)->AllGatherAlong(parameters[1].detach(), 0);
  ASSERT_TRUE(gathered.ok()) << gathered.status().ToString();
  EXPECT_TRUE(gathered->is_cuda());
  EXPECT_TRUE(at::equal(*gathered, parameters[1].detach()));
#endif
}

TEST(GpuDistributed, TwoRanksShareOneGpuOverGlooWithCudaTensors) {
  STRIDER_SKIP_WITHOUT_CUDA();
  TempDir dir;
  const uint16_t port = strider::testing::FreeLoopbackPort();
  ChildProcess second;
  ASSERT_TRUE(StartSecondRank(second, dir, port, 0, 3, -1));
  auto group = JoinLoopback(0, 2, port, -1);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  std::vector<at::Tensor> parameters = Parameters(false);
  for (int s = 0; s < 3; ++s) {
    const Status step = Step(**group, parameters, s);
    ASSERT_TRUE(step.ok()) << step.ToString();
    ASSERT_TRUE(parameters[0].grad().is_cuda());
    const nlohmann::json theirs = WaitEvent(second, "step", 60000);
    ASSERT_TRUE(theirs.is_object()) << "rank 1 stopped before step " << s;
    // Both ranks apply the one sum Gloo gave them to the same values.
    EXPECT_EQ(theirs["checksum"].get<double>(), Checksum(parameters)) << "step " << s;
  }
  EXPECT_EQ(second.Wait(), 0);
  EXPECT_LT(MaxDifference(parameters, Expected(Parameters(false), 2, 0, 3)), 1e-5);
  EXPECT_EQ((*group)->stats().allreduces, 3);
}

TEST(GpuDistributed, ARankKilledMidStepStopsTheOtherNamingItAndTheGroupResumes) {
  STRIDER_SKIP_WITHOUT_CUDA();
  TempDir dir;
  std::vector<at::Tensor> parameters = Parameters(false);
  {
    const uint16_t port = strider::testing::FreeLoopbackPort();
    ChildProcess second;
    ASSERT_TRUE(StartSecondRank(second, dir, port, 0, 10, /*announce=*/2));
    auto group = JoinLoopback(0, 2, port, -1);
    ASSERT_TRUE(group.ok()) << group.status().ToString();
    for (int s = 0; s < 2; ++s) {
      const Status step = Step(**group, parameters, s);
      ASSERT_TRUE(step.ok()) << step.ToString();
      ASSERT_TRUE(WaitEvent(second, "step", 60000).is_object());
    }
    // Rank 1 has sent its step-2 buckets and waits for rank 0's: it dies there.
    ASSERT_TRUE(WaitEvent(second, "in_step", 60000).is_object());
    second.Signal(SIGKILL);
    EXPECT_EQ(second.Wait(), 128 + SIGKILL);
    const auto killed = std::chrono::steady_clock::now();
    std::vector<at::Tensor> saved = {parameters[0].detach().clone(),
                                     parameters[1].detach().clone()};
    const Status step = Step(**group, parameters, 2);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
    ASSERT_FALSE(step.ok());
    EXPECT_NE(step.ToString().find("learner rank 1 of 2 stopped answering"), std::string::npos)
        << step.ToString();
    EXPECT_LT(seconds, kTimeoutS + 15) << "rank 0 must stop within the collective timeout";
    // As a checkpoint of step 2 would hold them: the failed step's update is never applied.
    parameters = {saved[0].requires_grad_(true), saved[1].requires_grad_(true)};
  }
  // Started again together from rank 0's parameters, as `--resume` starts the ranks.
  const uint16_t port = strider::testing::FreeLoopbackPort();
  ChildProcess second;
  ASSERT_TRUE(StartSecondRank(second, dir, port, 2, 2, -1));
  auto group = JoinLoopback(0, 2, port, -1);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  const Status broadcast = (*group)->Broadcast(parameters, 0);
  ASSERT_TRUE(broadcast.ok()) << broadcast.ToString();
  for (int s = 2; s < 4; ++s) {
    const Status step = Step(**group, parameters, s);
    ASSERT_TRUE(step.ok()) << step.ToString();
    const nlohmann::json theirs = WaitEvent(second, "step", 60000);
    ASSERT_TRUE(theirs.is_object()) << "the restarted rank 1 stopped before step " << s;
    EXPECT_EQ(theirs["checksum"].get<double>(), Checksum(parameters)) << "step " << s;
  }
  EXPECT_EQ(second.Wait(), 0);
  // Four steps in all, as if rank 1 had never died.
  EXPECT_LT(MaxDifference(parameters, Expected(Parameters(false), 2, 0, 4)), 1e-5);
}

}  // namespace
}  // namespace strider
