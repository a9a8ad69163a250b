// Data-parallel learner ranks on PyTorch's c10d: a TCPStore rendezvous hosted by rank 0 and a
// Gloo process group over TCP. With the learner's tensors on a GPU (cuda_device, in the CUDA
// LibTorch build), the gradient all-reduce and the expert all-to-all go over NCCL instead, and
// Gloo keeps the control collectives on CPU tensors. A group of `world_size` learner processes
// with one config trains as one learner with the whole batch: each rank computes gradients on
// its share of the step's units, the gradients are summed across ranks (AllReduceGradients),
// and every rank applies the same optimiser step to the same weights.
//
// A collective that fails (a rank's process died, its host went away) or waits longer than the
// timeout (a rank hung) returns an error naming the ranks that no longer answer: the survivors
// meet once more at the store and whoever does not show up is named. The group is unusable
// after an error; the learner stops and `--resume` starts the ranks again together.
//
// docs/fleet.md, "Data-parallel learners", has the protocol and the measured costs.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

// USE_C10D_NCCL: LibTorch with c10d's NCCL process group (the CUDA build; Debian's has none).
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace strider {

namespace model {
class ExpertExchange;
}
class ChunkRounds;
class Model;

struct LearnerGroupOptions {
  int rank = 0;
  int world_size = 1;
  std::string host;    // rendezvous: rank 0 listens on port, the others connect to host
  uint16_t port = 0;
  std::string interface;  // Gloo's network interface; empty: see ResolveDevice in the .cc
  double timeout_s = 120;
  int64_t bucket_bytes = int64_t{25} << 20;
  // The GPU this rank's tensors live on, or -1 for CPU tensors. One rank per GPU: NCCL refuses
  // two ranks on one device, so a node runs at most as many learner ranks as it has GPUs, rank
  // r on its node taking device r (docs/cuda.md).
  int cuda_device = -1;
};

// The environment LibTorch's NCCL process group reads when it is created, as this group wants
// it: a collective that fails or outlasts the timeout throws in the rank that waits for it,
// so that it names the lost rank like a Gloo failure, instead of the process being killed.
//   TORCH_NCCL_BLOCKING_WAIT=1         wait() blocks, and throws on a timeout or an NCCL error
//   TORCH_NCCL_ASYNC_ERROR_HANDLING=2  the watchdog aborts a failed communicator (CleanUpOnly)
//                                      but does not kill the process (LibTorch 2.x's default
//                                      3, SkipCleanUp, does)
//   TORCH_NCCL_ENABLE_MONITORING=0     no heartbeat monitor that aborts the process when the
//                                      watchdog is stuck in a call to a hung peer
//   TORCH_NCCL_DUMP_ON_TIMEOUT=0       no flight-recorder dumps on a timeout
// A variable already set in the environment is left as the operator set it.
std::vector<std::pair<std::string, std::string>> NcclEnvironment();
// Sets NcclEnvironment()'s variables that are not set yet; returns the names it set.
std::vector<std::string> ApplyNcclEnvironment();

#ifdef USE_C10D_NCCL
// Options of one of the group's NCCL process groups (`name`: "gradients" or "experts"): every
// collective's timeout is options.timeout_s, as for Gloo; normal-priority streams, so that the
// communication does not preempt the backward kernels it overlaps. InvalidArgument for a
// negative device or a timeout that is not positive.
Result<c10::intrusive_ptr<c10d::ProcessGroupNCCL::Options>> NcclOptions(
    const LearnerGroupOptions& options, const std::string& name);
#endif

struct LearnerGroupStats {
  int64_t allreduces = 0;         // gradient all-reduces (one per optimiser update)
  int64_t bytes = 0;              // gradient bytes this rank contributed
  int64_t buckets = 0;            // gradient buckets reduced
  int64_t buckets_during_backward = 0;  // of them, sent before backward ended
  // Wall time in AllReduceGradients: with the reduction overlapping backward, only what is
  // left of it when backward ends.
  double allreduce_seconds = 0;
  int64_t rounds = 0;         // expert-parallel rounds agreed (ExpertRounds)
  int64_t rounds_served = 0;  // of them, rounds this rank served without a call of its own
};

class GroupExpertExchange;
class GroupRounds;

class LearnerGroup {
 public:
  // Blocks until all world_size ranks have joined (or timeout_s passed: an error naming the
  // rendezvous and how many ranks came). With cuda_device set, makes that device current
  // before the NCCL groups exist (their communicators bind to it); InvalidArgument, naming the
  // device, when this LibTorch has no NCCL or the device is not there.
  static Result<std::unique_ptr<LearnerGroup>> Join(const LearnerGroupOptions& options);
  ~LearnerGroup();

  int rank() const;
  int world_size() const;

  // Before an update's backward passes: gives each parameter a zeroed gradient that is a view
  // into flat buckets of about bucket_bytes (allocated once per parameter list), so backward
  // accumulates straight into the buffers AllReduceGradients sends, with no copy either way.
  Status PrepareGradients(const std::vector<at::Tensor>& parameters);
  // Called just before an update's last backward pass, with the loss it backpropagates
  // (ChunkedPassOptions::before_last_backward): during it, each bucket is sent as soon as its
  // parameters' gradients are final and every bucket before it has gone, so the all-reduce
  // overlaps the rest of backward. Buckets are laid out in reverse parameter order, the order
  // backward fills them; parameters the loss's graph does not reach count as final at once.
  void OverlapNextBackward(const at::Tensor& loss);
  // Sums the gradients of `parameters` across ranks in place, bucket by bucket: sends the
  // buckets backward has not sent, then waits for all. A parameter without a gradient on this
  // rank takes part as zeros; one without a gradient on every rank is left without one, as a
  // lone learner would leave it. FailedPrecondition unless PrepareGradients was called for
  // these parameters.
  Status AllReduceGradients(const std::vector<at::Tensor>& parameters);
  // Element-wise sums across ranks, in place (a step's counts and flags).
  Status AllReduceSum(std::vector<double>& values);
  // In place: every rank ends with root's values (weights at the start of a run).
  Status Broadcast(const std::vector<at::Tensor>& tensors, int root);
  // Every rank's `values`, in rank order (lengths may differ).
  Result<std::vector<std::vector<int64_t>>> AllGather(const std::vector<int64_t>& values);
  // Every rank's `tensor` joined along `dim` in rank order; the tensors' sizes may differ only
  // along `dim` (routing records of different lengths).
  Result<at::Tensor> AllGatherAlong(const at::Tensor& tensor, int64_t dim);
  // Every rank's `tensor`, all of one shape, joined along dim 0 in rank order on `root` only
  // (an expert-parallel rank's experts, whole on the rank that publishes them); the other
  // ranks get an undefined tensor.
  Result<at::Tensor> GatherTo(const at::Tensor& tensor, int root);

  // The ranks as an expert-parallel group (common/model/expert_parallel.h): the model's sparse
  // layers exchange routed tokens over it with c10d all-to-all. Lives as long as this group.
  model::ExpertExchange& experts();
  // Lockstep rounds of model calls over experts() (learner.h, ChunkRounds) for these models,
  // each sharded over the group and given in the same order on every rank. Lives no longer
  // than this group.
  std::unique_ptr<ChunkRounds> ExpertRounds(std::vector<const Model*> models);

  const LearnerGroupStats& stats() const;

 private:
  friend class GroupExpertExchange;
  friend class GroupRounds;
  struct Impl;
  explicit LearnerGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strider
