#include "learner/distributed.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "common/clock.h"
#include "common/model/expert_parallel.h"
#include "common/model/model.h"
#include "common/model/torch_status.h"
#include "common/mutex.h"
#include "learner/learner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_set>

namespace strider {
namespace {

using std::chrono::milliseconds;

// What Gloo's and NCCL's process groups have in common: c10d's ProcessGroup in LibTorch 1.x,
// its Backend since 2.0.
#if TORCH_VERSION_MAJOR >= 2
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// Tensors flattened into buckets of one dtype each, about `bucket_bytes` apiece, in order.
struct Bucket {
  std::vector<size_t> members;  // indices into the tensor list
  at::Tensor flat;
  at::Tensor flags;  // with a flag tail: the end of `flat`, one value per member, in order
};

// Zeroed buckets for tensors like `like`, with each tensor's view into its bucket. With
// `flag_tail` each bucket ends with one more value per member (Bucket::flags).
std::vector<Bucket> AllocateBuckets(const std::vector<at::Tensor>& like, int64_t bucket_bytes,
                                    std::vector<at::Tensor>* views, bool flag_tail = false) {
  std::vector<Bucket> buckets;
  int64_t bytes = 0;
  for (size_t i = 0; i < like.size(); ++i) {
    const int64_t size = like[i].numel() * static_cast<int64_t>(like[i].element_size());
    const bool fits = !buckets.empty() && bytes + size <= bucket_bytes &&
                      like[buckets.back().members.front()].scalar_type() == like[i].scalar_type();
    if (!fits) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().members.push_back(i);
    bytes += size;
  }
  views->assign(like.size(), at::Tensor());
  for (Bucket& bucket : buckets) {
    int64_t elements = 0;
    for (size_t i : bucket.members) elements += like[i].numel();
    const int64_t tail = flag_tail ? static_cast<int64_t>(bucket.members.size()) : 0;
    bucket.flat = at::zeros({elements + tail}, like[bucket.members.front()].options());
    if (flag_tail) bucket.flags = bucket.flat.narrow(0, elements, tail);
    int64_t offset = 0;
    for (size_t i : bucket.members) {
      (*views)[i] = bucket.flat.narrow(0, offset, like[i].numel()).view(like[i].sizes());
      offset += like[i].numel();
    }
  }
  return buckets;
}

// Buckets holding copies of `tensors`.
std::vector<Bucket> MakeBuckets(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes) {
  std::vector<at::Tensor> views;
  std::vector<Bucket> buckets = AllocateBuckets(tensors, bucket_bytes, &views);
  for (size_t i = 0; i < tensors.size(); ++i) views[i].copy_(tensors[i]);
  return buckets;
}

void Unflatten(const Bucket& bucket, const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (size_t i : bucket.members) {
    const int64_t n = tensors[i].numel();
    tensors[i].copy_(bucket.flat.narrow(0, offset, n).view_as(tensors[i]));
    offset += n;
  }
}

// A parameter list's gradient buckets and the reduction that follows backward. The parameters'
// grad accumulators carry a post hook (it runs once a gradient has been added) that marks the
// parameter as having a gradient and, during the backward OverlapNextBackward armed, sends each
// bucket as soon as all of its parameters are final. Buckets are laid out in reverse parameter
// order, roughly the order backward completes them, and are sent strictly in that order, so
// every rank issues the same collectives in the same sequence whatever its data.
// The post hooks run on autograd's threads (the one calling backward for CPU tensors, a
// device's own for others), so what they touch is guarded by `mu`.
struct GradientReduction {
  // The gradient groups, apart from the rest: Gloo for CPU buckets, NCCL (when the group has
  // one) for CUDA buckets.
  c10::intrusive_ptr<Collectives> gloo;
  c10::intrusive_ptr<Collectives> nccl;
  std::vector<at::Tensor> parameters;
  std::vector<Bucket> buckets;
  std::vector<at::Tensor> views;      // per parameter: its gradient's storage in a bucket
  std::vector<size_t> bucket_of;      // per parameter
  std::vector<int64_t> flag_of;       // per parameter: its flag's index in Bucket::flags
  Mutex mu;
  // Per parameter: a gradient arrived since PrepareGradients.
  std::vector<uint8_t> touched GUARDED_BY(mu);
  bool armed GUARDED_BY(mu) = false;              // in the update's last backward
  std::vector<uint8_t> final_seen GUARDED_BY(mu);  // per parameter, in the armed backward
  std::vector<int64_t> waiting GUARDED_BY(mu);     // per bucket: parameters not yet final
  size_t next GUARDED_BY(mu) = 0;                  // the next bucket to send
  int64_t sent_during_backward GUARDED_BY(mu) = 0;
  std::vector<c10::intrusive_ptr<c10d::Work>> works GUARDED_BY(mu);
  std::string failure GUARDED_BY(mu);  // a send that threw inside backward

  void Reset() REQUIRES(mu) {
    touched.assign(parameters.size(), 0);
    final_seen.assign(parameters.size(), 0);
    waiting.assign(buckets.size(), 0);
    for (size_t b = 0; b < buckets.size(); ++b) {
      waiting[b] = static_cast<int64_t>(buckets[b].members.size());
    }
    armed = false;
    next = 0;
    works.clear();
    failure.clear();
  }

  // Autograd accumulates into the bucket view in place; a gradient set any other way since
  // PrepareGradients is copied in before its bucket leaves.
  void Gather(const Bucket& bucket) REQUIRES(mu) {
    for (size_t i : bucket.members) {
      const at::Tensor grad = parameters[i].grad();
      if (grad.defined() && !grad.is_same(views[i])) {
        views[i].copy_(grad);
        touched[i] = 1;
      }
    }
  }

  void Send(size_t b) REQUIRES(mu) {
    Gather(buckets[b]);
    // The bucket's parameters are final: their flags are known.
    std::vector<double> own;
    for (size_t i : buckets[b].members) own.push_back(touched[i] != 0 ? 1.0 : 0.0);
    buckets[b].flags.copy_(at::tensor(own, at::kDouble));
    std::vector<at::Tensor> one{buckets[b].flat};
    Collectives& group = buckets[b].flat.is_cuda() && nccl ? *nccl : *gloo;
    works.push_back(group.allreduce(one));
  }

  // The post hook of parameter i's grad accumulator.
  void Arrived(size_t i) EXCLUDES(mu) {
    MutexLock lock(&mu);
    touched[i] = 1;
    if (!armed || final_seen[i] != 0 || !failure.empty()) return;
    final_seen[i] = 1;
    if (--waiting[bucket_of[i]] > 0) return;
    SendReady();
  }

  // Sends the complete buckets at the front of the order.
  void SendReady() REQUIRES(mu) {
    if (!failure.empty()) return;
    std::optional<std::string> thrown = model::ThrownMessage([&] {
      mu.AssertHeld();  // the lambda runs here, under the caller's hold
      at::NoGradGuard no_grad;
      while (next < buckets.size() && waiting[next] == 0) {
        Send(next++);
        ++sent_during_backward;
      }
    });
    if (thrown.has_value()) failure = std::move(*thrown);
  }
};

}  // namespace

// All-to-all of routed rows over the group's NCCL process group for CUDA rows, its Gloo one
// otherwise; a failure names the lost rank like every other collective, thrown because it runs
// inside LibTorch's forward and backward.
class GroupExpertExchange : public model::ExpertExchange {
 public:
  explicit GroupExpertExchange(LearnerGroup::Impl* impl) : impl_(impl) {}
  int rank() const override;
  int world_size() const override;
  at::Tensor AllToAll(const at::Tensor& rows, const std::vector<int64_t>& send_counts,
                      const std::vector<int64_t>& recv_counts) override;

 private:
  LearnerGroup::Impl* impl_;
};

struct LearnerGroup::Impl {
  LearnerGroupOptions options;
  c10::intrusive_ptr<c10d::Store> store;        // the rendezvous (rank 0 hosts it)
  c10::intrusive_ptr<c10d::Store> own_keys;     // this class's keys, apart from Gloo's
  c10::intrusive_ptr<Collectives> group;
  // Gradient buckets go over a group of their own: sent from inside backward, they would
  // otherwise interleave with the expert all-to-alls that backward issues, in an order that
  // could differ between ranks.
  c10::intrusive_ptr<Collectives> gradient_group;
  // With cuda_device set (the CUDA LibTorch build): NCCL groups for CUDA tensors, the data
  // collectives' and the gradients', kept apart for the same reason. Gloo's stay for the
  // control collectives on CPU tensors (counts, flags, round agreement).
  c10::intrusive_ptr<Collectives> nccl;
  c10::intrusive_ptr<Collectives> nccl_gradients;
  int64_t collectives = 0;  // the same count on every rank: names a failed collective
  LearnerGroupStats stats;

  // Gradient storage for one parameter list (PrepareGradients): the parameters' gradients are
  // views into these buckets, so backward accumulates straight into what is reduced.
  struct Gradients {
    std::vector<const c10::TensorImpl*> owners;
    // The hooks hold it weakly: once these buckets are dropped, theirs do nothing.
    std::shared_ptr<GradientReduction> reduction;
    // Held so that the hooks stay on the accumulators the graphs use.
    std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  };
  std::unique_ptr<Gradients> gradients;
  GroupExpertExchange exchange{this};

  // The group a collective over `tensor` goes through.
  Collectives& For(const at::Tensor& tensor) {
    return tensor.is_cuda() && nccl ? *nccl : *group;
  }

  bool Owns(const std::vector<at::Tensor>& parameters) const {
    if (gradients == nullptr || gradients->owners.size() != parameters.size()) return false;
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (gradients->owners[i] != parameters[i].unsafeGetTensorImpl()) return false;
    }
    return true;
  }

  milliseconds timeout() const {
    return milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  }

  // Waits for every work item, then names the ranks that stopped answering if one failed.
  Status Wait(std::vector<c10::intrusive_ptr<c10d::Work>>& works, const std::string& what) {
    std::string failure;
    for (auto& work : works) {
      std::optional<std::string> thrown =
          model::ThrownMessage([&] { static_cast<void>(work->wait(timeout())); });
      if (thrown.has_value() && failure.empty()) failure = std::move(*thrown);
    }
    if (failure.empty()) return Status::Ok();
    return Lost(what, failure);
  }

  // After a failed collective the survivors check in at the store under the collective's
  // number; whoever has not checked in within a few seconds is the lost rank. The store lives
  // in rank 0, so when it cannot be reached, rank 0 is the one gone.
  Status Lost(const std::string& what, std::string detail) {
    const size_t newline = detail.find('\n');
    if (newline != std::string::npos) detail.resize(newline);
    const std::string prefix = "after " + what + " (collective " + std::to_string(collectives) +
                               ") failed: " + detail;
    const std::string key = "alive/" + std::to_string(collectives) + "/";
    std::vector<int> missing;
    // Any failure to reach the store means rank 0 is gone, whatever LibTorch says about it.
    STRIDER_RETURN_IF_ERROR(model::GuardedWith(
        [&] {
          own_keys->set(key + std::to_string(options.rank), std::vector<uint8_t>{1});
          const auto deadline =
              Clock::now() + std::min<Clock::duration>(std::chrono::seconds(10), timeout());
          while (true) {
            missing.clear();
            for (int r = 0; r < options.world_size; ++r) {
              if (!own_keys->check({key + std::to_string(r)})) missing.push_back(r);
            }
            if (missing.empty() || Clock::now() >= deadline) break;
            std::this_thread::sleep_for(milliseconds(100));
          }
        },
        [&](std::string_view) {
          return Status::Unavailable("learner rank 0, which hosts the rendezvous at " +
                                     options.host + ":" + std::to_string(options.port) +
                                     ", is gone (this is rank " + std::to_string(options.rank) +
                                     " of " + std::to_string(options.world_size) + ") " + prefix);
        }));
    if (missing.empty()) {
      return Status::Unavailable("learner rank " + std::to_string(options.rank) + ": " + prefix +
                                 " though every rank still answers at the rendezvous");
    }
    return Status::Unavailable(
        std::string(missing.size() == 1 ? "learner rank " : "learner ranks ") + JoinRanks(missing) +
        " of " + std::to_string(options.world_size) + " stopped answering (seen by rank " +
        std::to_string(options.rank) + ") " + prefix);
  }

  // Every rank's `tensor` in rank order; sizes may differ along `dim` only. Two collectives:
  // the sizes, then the tensors padded to the largest.
  Result<std::vector<at::Tensor>> GatherParts(const at::Tensor& tensor, int64_t dim) {
    const int world = options.world_size;
    std::vector<std::vector<at::Tensor>> lengths(1);
    std::vector<at::Tensor> own_length;
    STRIDER_RETURN_IF_ERROR(model::Guarded("all-gather", [&] {
      own_length.push_back(at::full({1}, tensor.size(dim), at::kLong));
      for (int r = 0; r < world; ++r) lengths[0].push_back(at::zeros({1}, at::kLong));
    }));
    STRIDER_RETURN_IF_ERROR(Run("length all-gather", [&](auto& works) {
      works.push_back(group->allgather(lengths, own_length));
    }));
    std::vector<int64_t> sizes;
    int64_t longest = 0;
    for (const at::Tensor& l : lengths[0]) {
      sizes.push_back(l.item<int64_t>());
      longest = std::max(longest, sizes.back());
    }
    std::vector<std::vector<at::Tensor>> gathered(1);
    std::vector<at::Tensor> own;
    STRIDER_RETURN_IF_ERROR(model::Guarded("all-gather", [&] {
      std::vector<int64_t> shape = tensor.sizes().vec();
      shape[dim] = longest;
      at::Tensor padded = at::zeros(shape, tensor.options());
      padded.narrow(dim, 0, tensor.size(dim)).copy_(tensor);
      own.push_back(padded);
      for (int r = 0; r < world; ++r) gathered[0].push_back(at::empty_like(padded));
    }));
    STRIDER_RETURN_IF_ERROR(Run("all-gather", [&](auto& works) {
      works.push_back(For(own[0]).allgather(gathered, own));
    }));
    std::vector<at::Tensor> parts;
    for (int r = 0; r < world; ++r) parts.push_back(gathered[0][r].narrow(dim, 0, sizes[r]));
    return parts;
  }

  template <typename Body>
  Status Run(const std::string& what, Body body) {
    ++collectives;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    STRIDER_RETURN_IF_ERROR(model::GuardedWith(
        [&] { body(works); },
        [&](std::string_view message) { return Lost(what, std::string(message)); }));
    return Wait(works, what);
  }
};

int GroupExpertExchange::rank() const { return impl_->options.rank; }
int GroupExpertExchange::world_size() const { return impl_->options.world_size; }

at::Tensor GroupExpertExchange::AllToAll(const at::Tensor& rows,
                                        const std::vector<int64_t>& send_counts,
                                        const std::vector<int64_t>& recv_counts) {
  int64_t total = 0;
  for (int64_t n : recv_counts) total += n;
  std::vector<int64_t> shape = rows.sizes().vec();
  shape[0] = total;
  at::Tensor input = rows.contiguous();
  at::Tensor output = at::empty(shape, rows.options());
  std::vector<int64_t> out_counts = recv_counts;
  std::vector<int64_t> in_counts = send_counts;
  const Status status = impl_->Run("expert all-to-all", [&](auto& works) {
    works.push_back(impl_->For(input).alltoall_base(output, input, out_counts, in_counts));
  });
  TORCH_CHECK(status.ok(), status.message());
  return output;
}

// A round's kind is 2 x (the model's index) + (1 when the call records a graph); a rank out of
// calls asks for kIdle. The group agrees on the smallest kind asked for: the ranks that asked
// for it make their calls, the others serve theirs, and everyone asks again. Each rank's calls
// run in its own order, so every round makes progress and the phase ends when all ask kIdle.
class GroupRounds : public ChunkRounds {
 public:
  GroupRounds(LearnerGroup::Impl* impl, std::vector<const Model*> models)
      : impl_(impl), models_(std::move(models)) {}

  model::ExpertExchange& exchange() override { return impl_->exchange; }

  Status Enter(const Model& model, bool record) override {
    int64_t kind = -1;
    for (size_t i = 0; i < models_.size(); ++i) {
      if (models_[i] == &model) kind = 2 * static_cast<int64_t>(i) + (record ? 1 : 0);
    }
    if (kind < 0) {
      return Status::InvalidArgument("expert rounds: a model call of a model not in the rounds");
    }
    while (true) {
      STRIDER_ASSIGN_OR_RETURN(const int64_t agreed, Agree(kind));
      if (agreed == kind) return Status::Ok();
      STRIDER_RETURN_IF_ERROR(Serve(agreed));
    }
  }

  Status Drain() override {
    while (true) {
      STRIDER_ASSIGN_OR_RETURN(const int64_t agreed, Agree(kIdle));
      if (agreed == kIdle) return Status::Ok();
      STRIDER_RETURN_IF_ERROR(Serve(agreed));
    }
  }

 private:
  static constexpr int64_t kIdle = std::numeric_limits<int64_t>::max();

  Result<int64_t> Agree(int64_t kind) {
    at::Tensor value = at::full({1}, kind, at::kLong);
    STRIDER_RETURN_IF_ERROR(impl_->Run("expert round", [&](auto& works) {
      std::vector<at::Tensor> one{value};
      c10d::AllreduceOptions options;
      options.reduceOp = c10d::ReduceOp::MIN;
      works.push_back(impl_->group->allreduce(one, options));
    }));
    const int64_t agreed = value.item<int64_t>();
    if (agreed != kIdle && (agreed < 0 || agreed / 2 >= static_cast<int64_t>(models_.size()))) {
      return Status::Internal("expert rounds: the group agreed on round kind " +
                              std::to_string(agreed) + ", not one of this rank's " +
                              std::to_string(models_.size()) + " models");
    }
    ++impl_->stats.rounds;
    return agreed;
  }

  Status Serve(int64_t kind) {
    ++impl_->stats.rounds_served;
    return model::Guarded(StatusCode::kUnavailable, "serving an expert round", [&] {
      models_[static_cast<size_t>(kind / 2)]->ServeExperts(impl_->exchange, kind % 2 == 1);
    });
  }

  LearnerGroup::Impl* impl_;
  std::vector<const Model*> models_;
};

std::unique_ptr<ChunkRounds> LearnerGroup::ExpertRounds(std::vector<const Model*> models) {
  return std::make_unique<GroupRounds>(impl_.get(), std::move(models));
}

LearnerGroup::LearnerGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
model::ExpertExchange& LearnerGroup::experts() { return impl_->exchange; }
LearnerGroup::~LearnerGroup() = default;

int LearnerGroup::rank() const { return impl_->options.rank; }
int LearnerGroup::world_size() const { return impl_->options.world_size; }
const LearnerGroupStats& LearnerGroup::stats() const { return impl_->stats; }

std::vector<std::pair<std::string, std::string>> NcclEnvironment() {
  return {{"TORCH_NCCL_BLOCKING_WAIT", "1"},
          {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"},
          {"TORCH_NCCL_ENABLE_MONITORING", "0"},
          {"TORCH_NCCL_DUMP_ON_TIMEOUT", "0"}};
}

std::vector<std::string> ApplyNcclEnvironment() {
  std::vector<std::string> set;
  for (const auto& [name, value] : NcclEnvironment()) {
    if (std::getenv(name.c_str()) != nullptr) continue;
    setenv(name.c_str(), value.c_str(), /*overwrite=*/0);
    set.push_back(name);
  }
  return set;
}

#ifdef USE_C10D_NCCL
Result<c10::intrusive_ptr<c10d::ProcessGroupNCCL::Options>> NcclOptions(
    const LearnerGroupOptions& options, const std::string& name) {
  if (options.cuda_device < 0) {
    return Status::InvalidArgument("NCCL options for '" + name + "': no CUDA device (cuda_device " +
                                   std::to_string(options.cuda_device) + ")");
  }
  if (!(options.timeout_s > 0)) {
    return Status::InvalidArgument("NCCL options for '" + name + "': timeout_s " +
                                   std::to_string(options.timeout_s) + " is not positive");
  }
  auto nccl = c10d::ProcessGroupNCCL::Options::create(/*is_high_priority_stream=*/false);
  nccl->timeout = milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  nccl->group_name = "strider/" + name;
  nccl->group_desc = "learner " + name;
  for (int r = 0; r < options.world_size; ++r) {
    nccl->global_ranks_in_group.push_back(static_cast<uint64_t>(r));
  }
  return nccl;
}
#endif

Result<std::unique_ptr<LearnerGroup>> LearnerGroup::Join(const LearnerGroupOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return Status::InvalidArgument("learner group: rank " + std::to_string(options.rank) +
                                   " is not in [0, " + std::to_string(options.world_size) + ")");
  }
  const std::string who =
      "learner rank " + std::to_string(options.rank) + " of " + std::to_string(options.world_size);
  if (options.cuda_device >= 0) {
#ifdef USE_C10D_NCCL
    // Before the rendezvous, so a rank on a missing device fails alone and at once.
    const int devices = c10::cuda::device_count();
    if (options.cuda_device >= devices) {
      return Status::InvalidArgument(who + ": device cuda:" + std::to_string(options.cuda_device) +
                                     " asked for, but this machine has " +
                                     std::to_string(devices) + " CUDA devices");
    }
    // The NCCL communicators bind to the current device when they are created.
    STRIDER_RETURN_IF_ERROR(model::Guarded("setting the CUDA device", [&] {
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(options.cuda_device));
    }));
#else
    return Status::InvalidArgument(
        who + ": device cuda:" + std::to_string(options.cuda_device) +
        " asked for, but this build's LibTorch has no CUDA or NCCL (build with "
        "STRIDER_TORCH=cuda scripts/setup.sh, docs/cuda.md)");
#endif
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const std::string where = options.host + ":" + std::to_string(options.port);
  // LibTorch's messages run on for lines of context; the first says what failed.
  auto first_line = [](std::string_view message) { return message.substr(0, message.find('\n')); };
  STRIDER_RETURN_IF_ERROR(model::GuardedWith(
      [&] {
        c10d::TCPStoreOptions store_options;
        store_options.port = options.port;
        store_options.isServer = options.rank == 0;
        store_options.numWorkers = static_cast<size_t>(options.world_size);
        store_options.waitWorkers = true;
        store_options.timeout = impl->timeout();
        impl->store = c10::make_intrusive<c10d::TCPStore>(options.host, store_options);
        impl->own_keys = c10::make_intrusive<c10d::PrefixStore>("strider", impl->store);
      },
      [&](std::string_view message) {
        return Status::Unavailable("learner rank " + std::to_string(options.rank) + " of " +
                                   std::to_string(options.world_size) + ": rendezvous at " + where +
                                   (options.rank == 0 ? " (this rank hosts it)" : "") +
                                   " failed within " + std::to_string(options.timeout_s) +
                                   " s: " + std::string(first_line(message)));
      }));
  STRIDER_RETURN_IF_ERROR(model::GuardedWith(
      [&] {
        auto gloo = c10d::ProcessGroupGloo::Options::create(impl->timeout());
        // Gloo listens on the address it is given; the peers connect to what it publishes.
        if (!options.interface.empty()) {
          gloo->devices.push_back(
              c10d::ProcessGroupGloo::createDeviceForInterface(options.interface));
        } else if (IsLoopback(options.host)) {
          gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        } else {
          gloo->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
        }
        gloo->threads = 2;
        impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, options.rank,
                                                                  options.world_size, gloo);
        impl->gradient_group = c10::make_intrusive<c10d::ProcessGroupGloo>(
            c10::make_intrusive<c10d::PrefixStore>("gradients", impl->store), options.rank,
            options.world_size, gloo);
      },
      [&](std::string_view message) {
        return Status::Unavailable("learner rank " + std::to_string(options.rank) + " of " +
                                   std::to_string(options.world_size) +
                                   ": Gloo connections (rendezvous " + where +
                                   ") failed: " + std::string(first_line(message)));
      }));
#ifdef USE_C10D_NCCL
  if (options.cuda_device >= 0) {
    const std::vector<std::string> set = ApplyNcclEnvironment();
    for (const std::string& name : set) {
      spdlog::info("learner rank {}: {}={} for NCCL", options.rank, name, std::getenv(name.c_str()));
    }
    STRIDER_ASSIGN_OR_RETURN(auto experts, NcclOptions(options, "experts"));
    STRIDER_ASSIGN_OR_RETURN(auto gradients, NcclOptions(options, "gradients"));
    // The communicators themselves are made at each group's first collective, over the store.
    STRIDER_RETURN_IF_ERROR(model::GuardedWith(
        [&] {
          impl->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
              c10::make_intrusive<c10d::PrefixStore>("nccl/experts", impl->store), options.rank,
              options.world_size, experts);
          impl->nccl_gradients = c10::make_intrusive<c10d::ProcessGroupNCCL>(
              c10::make_intrusive<c10d::PrefixStore>("nccl/gradients", impl->store),
              options.rank, options.world_size, gradients);
        },
        [&](std::string_view message) {
          return Status::Unavailable(who + ": NCCL process groups on cuda:" +
                                     std::to_string(options.cuda_device) +
                                     " failed: " + std::string(first_line(message)));
        }));
  }
#endif
  spdlog::info("learner rank {} of {}: joined at {}{}", options.rank, options.world_size, where,
               options.cuda_device >= 0
                   ? " (NCCL on cuda:" + std::to_string(options.cuda_device) + ")"
                   : std::string());
  return std::unique_ptr<LearnerGroup>(new LearnerGroup(std::move(impl)));
}

Status LearnerGroup::PrepareGradients(const std::vector<at::Tensor>& parameters) {
  return model::Guarded("gradient buckets", [&]() -> Status {
    at::NoGradGuard no_grad;
    if (!impl_->Owns(parameters)) {
      impl_->gradients.reset();
      auto g = std::make_unique<Impl::Gradients>();
      auto r = std::make_shared<GradientReduction>();
      r->gloo = impl_->gradient_group;
      r->nccl = impl_->nccl_gradients;
      r->parameters = parameters;
      const size_t n = parameters.size();
      const std::vector<at::Tensor> reversed(parameters.rbegin(), parameters.rend());
      std::vector<at::Tensor> reversed_views;
      // Each bucket ends with a flag per parameter in it: summed with the gradients, they
      // say which parameters some rank gave a gradient, at no extra collective.
      r->buckets = AllocateBuckets(reversed, impl_->options.bucket_bytes, &reversed_views,
                                   /*flag_tail=*/true);
      r->views.resize(n);
      r->bucket_of.resize(n);
      r->flag_of.resize(n);
      for (size_t b = 0; b < r->buckets.size(); ++b) {
        std::vector<size_t>& members = r->buckets[b].members;
        for (size_t k = 0; k < members.size(); ++k) {
          const size_t i = n - 1 - members[k];  // back to the parameters' own order
          members[k] = i;
          r->views[i] = reversed_views[n - 1 - i];
          r->bucket_of[i] = b;
          r->flag_of[i] = static_cast<int64_t>(k);
        }
      }
      for (size_t i = 0; i < n; ++i) {
        g->owners.push_back(parameters[i].unsafeGetTensorImpl());
        std::shared_ptr<torch::autograd::Node> accumulator =
            torch::autograd::impl::grad_accumulator(parameters[i]);
        if (accumulator == nullptr) {
          return Status::InvalidArgument("gradient buckets: parameter " + std::to_string(i) +
                                         " does not require a gradient");
        }
        std::weak_ptr<GradientReduction> weak = r;
        accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [weak, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list&) {
              if (auto reduction = weak.lock()) reduction->Arrived(i);
              return outputs;
            }));
        g->accumulators.push_back(std::move(accumulator));
      }
      g->reduction = std::move(r);
      impl_->gradients = std::move(g);
    }
    GradientReduction& r = *impl_->gradients->reduction;
    for (Bucket& bucket : r.buckets) bucket.flat.zero_();
    MutexLock lock(&r.mu);
    r.Reset();
    for (size_t i = 0; i < parameters.size(); ++i) {
      at::Tensor parameter = parameters[i];
      parameter.mutable_grad() = r.views[i];
    }
    return Status::Ok();
  });
}

void LearnerGroup::OverlapNextBackward(const at::Tensor& loss) {
  if (impl_->gradients == nullptr) return;
  Impl::Gradients& g = *impl_->gradients;
  GradientReduction& r = *g.reduction;
  // The grad accumulators this backward will run: the others' parameters get nothing more, so
  // they must not hold their buckets back (the value head without a value loss, vision
  // weights without images, an expert no token chose).
  std::unordered_set<const torch::autograd::Node*> reached;
  std::vector<torch::autograd::Node*> stack;
  if (loss.defined() && loss.grad_fn() != nullptr) stack.push_back(loss.grad_fn().get());
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!reached.insert(node).second) continue;
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      if (edge.function != nullptr) stack.push_back(edge.function.get());
    }
  }
  MutexLock lock(&r.mu);
  r.armed = true;
  for (size_t i = 0; i < g.accumulators.size(); ++i) {
    if (reached.count(g.accumulators[i].get()) == 0 && r.final_seen[i] == 0) {
      r.final_seen[i] = 1;
      --r.waiting[r.bucket_of[i]];
    }
  }
  r.SendReady();
}

Status LearnerGroup::AllReduceGradients(const std::vector<at::Tensor>& parameters) {
  const auto started = Clock::now();
  if (!impl_->Owns(parameters)) {
    return Status::FailedPrecondition(
        "gradient all-reduce: PrepareGradients was not called for these parameters before "
        "their backward passes");
  }
  GradientReduction& r = *impl_->gradients->reduction;
  MutexLock lock(&r.mu);
  r.armed = false;
  ++impl_->collectives;
  if (!r.failure.empty()) return impl_->Lost("gradient all-reduce", r.failure);
  STRIDER_RETURN_IF_ERROR(model::GuardedWith(
      [&] {
        r.mu.AssertHeld();  // the lambda runs here, under `lock`
        at::NoGradGuard no_grad;
        for (size_t b = r.next; b < r.buckets.size(); ++b) r.Send(b);
        r.next = r.buckets.size();
      },
      [&](std::string_view message) {
        return impl_->Lost("gradient all-reduce", std::string(message));
      }));
  STRIDER_RETURN_IF_ERROR(impl_->Wait(r.works, "gradient all-reduce"));
  r.works.clear();
  STRIDER_RETURN_IF_ERROR(model::Guarded("gradient all-reduce", [&] {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> present;
    for (const Bucket& bucket : r.buckets) {
      // To the host: a device-to-host copy of one value per parameter, once per update.
      present.push_back(bucket.flags.to(at::kCPU, at::kFloat).contiguous());
    }
    for (size_t i = 0; i < parameters.size(); ++i) {
      at::Tensor parameter = parameters[i];
      // A parameter no rank gave a gradient keeps none, as a lone learner would leave it.
      const float flag = present[r.bucket_of[i]].data_ptr<float>()[r.flag_of[i]];
      parameter.mutable_grad() = flag > 0 ? r.views[i] : at::Tensor();
      impl_->stats.bytes += r.views[i].numel() * static_cast<int64_t>(r.views[i].element_size());
    }
  }));
  impl_->stats.allreduces += 1;
  impl_->stats.buckets += static_cast<int64_t>(r.buckets.size());
  impl_->stats.buckets_during_backward += r.sent_during_backward;
  r.sent_during_backward = 0;
  impl_->stats.allreduce_seconds +=
      std::chrono::duration<double>(Clock::now() - started).count();
  return Status::Ok();
}

Status LearnerGroup::AllReduceSum(std::vector<double>& values) {
  at::Tensor sums;
  STRIDER_RETURN_IF_ERROR(model::Guarded("all-reduce", [&] {
    sums = at::tensor(values, at::kDouble);
  }));
  STRIDER_RETURN_IF_ERROR(impl_->Run("all-reduce", [&](auto& works) {
    std::vector<at::Tensor> one{sums};
    works.push_back(impl_->group->allreduce(one));
  }));
  const double* data = sums.data_ptr<double>();
  values.assign(data, data + values.size());
  return Status::Ok();
}

Status LearnerGroup::Broadcast(const std::vector<at::Tensor>& tensors, int root) {
  std::vector<at::Tensor> views;
  std::vector<Bucket> buckets;
  STRIDER_RETURN_IF_ERROR(model::Guarded("broadcast", [&] {
    at::NoGradGuard no_grad;
    for (const at::Tensor& t : tensors) views.push_back(t.detach());
    buckets = MakeBuckets(views, impl_->options.bucket_bytes);
  }));
  STRIDER_RETURN_IF_ERROR(impl_->Run("weight broadcast", [&](auto& works) {
    c10d::BroadcastOptions options;
    options.rootRank = root;
    for (Bucket& bucket : buckets) {
      std::vector<at::Tensor> one{bucket.flat};
      works.push_back(impl_->For(bucket.flat).broadcast(one, options));
    }
  }));
  return model::Guarded("broadcast", [&] {
    at::NoGradGuard no_grad;
    for (const Bucket& bucket : buckets) Unflatten(bucket, views);
  });
}

Result<at::Tensor> LearnerGroup::AllGatherAlong(const at::Tensor& tensor, int64_t dim) {
  STRIDER_ASSIGN_OR_RETURN(std::vector<at::Tensor> parts, impl_->GatherParts(tensor, dim));
  return model::Guarded("all-gather", [&] { return at::cat(parts, dim); });
}

Result<at::Tensor> LearnerGroup::GatherTo(const at::Tensor& tensor, int root) {
  const bool here = impl_->options.rank == root;
  std::vector<std::vector<at::Tensor>> parts(here ? 1 : 0);
  std::vector<at::Tensor> own;
  STRIDER_RETURN_IF_ERROR(model::Guarded("gather", [&] {
    own.push_back(tensor.detach().contiguous());
    for (int r = 0; here && r < impl_->options.world_size; ++r) {
      parts[0].push_back(at::empty_like(own[0]));
    }
  }));
  STRIDER_RETURN_IF_ERROR(impl_->Run("gather", [&](auto& works) {
    c10d::GatherOptions options;
    options.rootRank = root;
    works.push_back(impl_->For(own[0]).gather(parts, own, options));
  }));
  if (!here) return at::Tensor();
  return model::Guarded("gather", [&] { return at::cat(parts[0], 0); });
}

Result<std::vector<std::vector<int64_t>>> LearnerGroup::AllGather(
    const std::vector<int64_t>& values) {
  at::Tensor own;
  STRIDER_RETURN_IF_ERROR(model::Guarded("all-gather", [&] {
    own = at::tensor(values, at::kLong);
  }));
  STRIDER_ASSIGN_OR_RETURN(std::vector<at::Tensor> parts, impl_->GatherParts(own, 0));
  std::vector<std::vector<int64_t>> out;
  for (const at::Tensor& part : parts) {
    const at::Tensor c = part.contiguous();
    out.emplace_back(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  }
  return out;
}

}  // namespace strider
