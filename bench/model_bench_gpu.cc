// model_bench's GPU sections; see model_bench_gpu.h and docs/cuda.md, "Baseline figures".
//
// Every line carries the device, its driver and the commit (EveryLineFields), and each figure
// names its ceiling from this run:
//   ceilings  device-to-device copy of 1 GiB (bytes read plus written per second) and the
//             8192-cube matrix product in bf16 and in fp32 (TF32 off), on random data;
//   decode    tokens/s of the rollout engine at batch 1, 64 and 256 and contexts 4K, 128K and
//             1M where the latent cache of the batch fits the device, the context reached with
//             synthetic latent rows (rollout::FillForBenchmark) and shared by forks, against
//             the HBM roofline: the bytes one step must read (weights the batch touches, every
//             row's cache, the recurrent states read and written) at the copy rate;
//   prefill   tokens/s of one 128K-token prompt through the engine;
//   train     tokens/s of a training step (forward, next-token loss, backward) of the large
//             config in fp32, and its model FLOP rate (6 x active parameters per token) against
//             the bf16 and fp32 matrix peaks; with LibTorch 2.x the profile's top CUDA kernels;
//   publish   the large model's weights to bytes (what the learner publishes), back onto the
//             device, and the engine's swap.
#include "bench/model_bench_gpu.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

#include "bench/bench_json.h"
#include "bench/bench_util.h"
#include "common/model/config.h"
#include "common/model/model.h"
#include "common/model/parameters.h"
#include "rollout_engine/engine.h"
#include "rollout_engine/engine_testing.h"
#include "tests/pseudo_tokens.h"

#ifndef STRIDER_SOURCE_DIR
#define STRIDER_SOURCE_DIR "."
#endif

namespace strider::bench {
namespace {

using rollout::Engine;
using rollout::EngineOptions;
using rollout::Request;
using rollout::SamplingParams;
using testing::PseudoRandomTokens;

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Synchronize() { torch::cuda::synchronize(); }

// First line of a shell command's output, or empty.
std::string CommandLine(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  char buffer[512] = {0};
  std::string line = std::fgets(buffer, sizeof(buffer), pipe) != nullptr ? buffer : "";
  pclose(pipe);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}

// "name, driver, memory MiB" of the GPU LibTorch uses first (CUDA_VISIBLE_DEVICES applies).
void AddDeviceFields() {
  const std::string query = CommandLine(
      "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader,nounits "
      "2>/dev/null");
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= query.size()) {
    size_t comma = query.find(',', begin);
    if (comma == std::string::npos) comma = query.size();
    std::string part = query.substr(begin, comma - begin);
    while (!part.empty() && part.front() == ' ') part.erase(part.begin());
    parts.push_back(part);
    begin = comma + 1;
  }
  const char* commit = std::getenv("STRIDER_COMMIT");
  std::string revision = commit != nullptr ? commit
                                           : CommandLine("git -C '" STRIDER_SOURCE_DIR
                                                         "' rev-parse --short=12 HEAD 2>/dev/null");
  JsonFields& fields = EveryLineFields();
  fields.push_back({"device", JsonString(parts.size() > 0 ? parts[0] : "unknown")});
  fields.push_back({"driver", JsonString(parts.size() > 1 ? parts[1] : "unknown")});
  fields.push_back({"commit", JsonString(revision.empty() ? "unknown" : revision)});
  fields.push_back({"torch", JsonString(TORCH_VERSION)});
}

double DeviceMemoryBytes() {
  const std::string total =
      CommandLine("nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null");
  return total.empty() ? 0.0 : std::atof(total.c_str()) * 1024 * 1024;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Ceilings {
  double copy_bytes_per_s = 0;  // read plus written
  double bf16_flops = 0;
  double fp32_flops = 0;
};

// Median of `repeats` timed runs of `fn` after two untimed ones, synchronised around each.
template <typename Fn>
double TimeMedian(int repeats, Fn fn) {
  fn();
  fn();
  Synchronize();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const double start = Seconds();
    fn();
    Synchronize();
    times.push_back(Seconds() - start);
  }
  return Median(times);
}

Ceilings MeasureCeilings(const at::Device& device) {
  Ceilings c;
  const auto options = at::TensorOptions().device(device);
  {
    const int64_t n = int64_t{1} << 28;  // 1 GiB of fp32
    at::Tensor source = at::rand({n}, options);
    at::Tensor target = at::empty({n}, options);
    const double seconds = TimeMedian(10, [&] { target.copy_(source); });
    c.copy_bytes_per_s = 2.0 * 4.0 * static_cast<double>(n) / seconds;
    PrintResult("gpu", "copy_1gib", c.copy_bytes_per_s / 1e9, "GB/s", std::nullopt,
                {{"note", JsonString("bytes read plus written")}});
  }
  const int64_t n = 8192;
  for (at::ScalarType type : {at::kBFloat16, at::kFloat}) {
    at::Tensor a = at::randn({n, n}, options.dtype(type));
    at::Tensor b = at::randn({n, n}, options.dtype(type));
    at::Tensor out = at::empty({n, n}, options.dtype(type));
    const double seconds = TimeMedian(10, [&] { at::mm_out(out, a, b); });
    const double flops = 2.0 * n * n * n / seconds;
    (type == at::kFloat ? c.fp32_flops : c.bf16_flops) = flops;
    PrintResult(
        "gpu", type == at::kFloat ? "matmul_fp32_8192" : "matmul_bf16_8192", flops / 1e12,
        "TFLOP/s", std::nullopt,
        {{"note", JsonString(type == at::kFloat ? "TF32 off, random data" : "random data")}});
  }
  return c;
}

ModelConfig LoadConfig(const std::string& name, const std::string& device) {
  ModelConfig config =
      Unwrap(LoadModelConfig(std::string(STRIDER_SOURCE_DIR) + "/configs/model/" + name + ".yaml"),
             "loading config " + name);
  config.device = device;
  return config;
}

struct Sizes {
  double total_params = 0;
  double routed_params = 0;  // routed experts, all layers
  double active_params = 0;
  double cache_bytes_per_token = 0;  // latent rows of every latent layer
  double state_bytes_per_sequence = 0;
};

Sizes SizesOf(const ModelConfig& config) {
  Sizes s;
  for (const ParameterSpec& spec : ModelParameterSpecs(config)) {
    double n = 1;
    for (int64_t d : spec.shape) n *= static_cast<double>(d);
    s.total_params += n;
    if (spec.component == "routed_experts") s.routed_params += n;
  }
  const ParameterCounts counts = CountParameters(config);
  s.active_params = counts.active;
  const CacheAccounting caches = AccountCaches(config);
  s.cache_bytes_per_token = static_cast<double>(caches.kv_cache_bytes_per_token);
  s.state_bytes_per_sequence = static_cast<double>(caches.state_bytes_per_sequence);
  return s;
}

std::string ContextName(int64_t context) {
  return context >= (int64_t{1} << 20) ? std::to_string(context >> 20) + "m"
                                       : std::to_string(context >> 10) + "k";
}

// Decode: one base sequence grown to each context with synthetic rows, forked into the batch.
void Decode(const std::string& name, const std::string& device, const Ceilings& ceilings,
            bool quick) {
  const ModelConfig config = LoadConfig(name, device);
  const Sizes sizes = SizesOf(config);
  const double memory = DeviceMemoryBytes();
  const double weights = 4.0 * sizes.total_params;
  const std::vector<int64_t> batches = {1, 64, 256};
  std::vector<int64_t> contexts = {4096, 131072, int64_t{1} << 20};
  if (quick) contexts.resize(1);
  contexts.erase(std::remove_if(contexts.begin(), contexts.end(),
                                [&](int64_t c) { return c > config.context; }),
                 contexts.end());
  std::shared_ptr<const Model> model(Unwrap(Model::Create(config, 1), "creating " + name));
  EngineOptions options;
  options.block_tokens = 256;
  options.max_batch = 256;
  options.record_routing = false;
  options.prefill_chunk_tokens = 8192;
  // The base sequence's cache at the longest context plus each fork's own last blocks.
  const double longest = static_cast<double>(contexts.back()) + 4096;
  options.cache_budget_bytes = static_cast<int64_t>(
      sizes.cache_bytes_per_token * (longest + 256.0 * 2 * options.block_tokens) + (64 << 20));
  std::unique_ptr<Engine> engine = Unwrap(Engine::Create(options, model, 0), "engine");
  Request prompt;
  prompt.tokens = PseudoRandomTokens(64, 0);
  const rollout::SequenceId base = Unwrap(engine->Submit(prompt), "submit");
  while (Unwrap(engine->Info(base), "info").pending_tokens > 0) Unwrap(engine->Step(), "prefill");
  const int steps = quick ? 4 : 8;
  for (int64_t context : contexts) {
    const int64_t length = Unwrap(engine->Info(base), "info").length;
    if (length < context - 32) {
      Check(rollout::FillForBenchmark(engine.get(), base, context - 32 - length, context), "fill");
    }
    for (int64_t batch : batches) {
      // As if every row held its own cache: skip what would not fit beside the weights.
      const double cache =
          static_cast<double>(batch) * static_cast<double>(context) * sizes.cache_bytes_per_token;
      const std::string metric =
          "decode_" + name + "_b" + std::to_string(batch) + "_" + ContextName(context);
      if (memory > 0 && weights + cache + (4.0 * (1 << 30)) > memory) {
        std::fprintf(stderr, "%s: cache of %.1f GiB does not fit, skipped\n", metric.c_str(),
                     cache / (1 << 30));
        continue;
      }
      SamplingParams sampling;
      sampling.max_new_tokens = steps + 4;
      sampling.seed = 3;
      std::vector<rollout::SequenceId> rows = Unwrap(engine->Fork(base, batch, sampling), "fork");
      Unwrap(engine->Step(), "decode");  // warm-up
      std::vector<double> times;
      for (int i = 0; i < steps; ++i) {
        const double start = Seconds();
        const rollout::StepResult result = Unwrap(engine->Step(), "decode");
        times.push_back(Seconds() - start);
        if (result.decode_tokens != batch) {
          std::fprintf(stderr, "%s: %lld decode tokens, %lld expected\n", metric.c_str(),
                       static_cast<long long>(result.decode_tokens), static_cast<long long>(batch));
        }
      }
      for (rollout::SequenceId id : rows) Check(engine->Cancel(id), "cancel");
      for (rollout::SequenceId id : rows) (void)engine->Release(id);
      const double step = Median(times);
      // Bytes one step must read: the dense weights once, the routed experts the batch touches
      // (expected distinct experts of B x k draws from n), every row's cache, and the recurrent
      // states read and written.
      const double n = static_cast<double>(config.feed_forward.routed_experts);
      const double k = static_cast<double>(config.feed_forward.experts_per_token);
      const double touched = n > 0 ? 1.0 - std::pow(1.0 - k / n, static_cast<double>(batch)) : 0;
      const double bytes = 4.0 * (sizes.total_params - sizes.routed_params) +
                           4.0 * sizes.routed_params * touched + cache +
                           2.0 * static_cast<double>(batch) * sizes.state_bytes_per_sequence;
      const double roofline_tokens_per_s =
          static_cast<double>(batch) * ceilings.copy_bytes_per_s / bytes;
      PrintResult("gpu", metric, static_cast<double>(batch) / step, "tokens/s",
                  roofline_tokens_per_s,
                  {{"step_ms", JsonNumber(1e3 * step)},
                   {"bytes_per_step", JsonNumber(bytes)},
                   {"cache", JsonString("synthetic rows, forks share the base sequence's blocks")},
                   {"baseline_is", JsonString("HBM roofline: bytes per step at the copy rate")}});
    }
  }
}

void Prefill(const std::string& name, const std::string& device, bool quick) {
  const ModelConfig config = LoadConfig(name, device);
  const int64_t tokens = std::min<int64_t>(quick ? 16384 : 131072, config.context);
  std::shared_ptr<const Model> model(Unwrap(Model::Create(config, 1), "creating " + name));
  EngineOptions options;
  options.record_routing = true;
  options.prefill_chunk_tokens = 8192;
  options.cache_budget_bytes =
      static_cast<int64_t>(SizesOf(config).cache_bytes_per_token * (tokens + 4096)) + (64 << 20);
  std::unique_ptr<Engine> engine = Unwrap(Engine::Create(options, model, 0), "engine");
  // Warm-up: a short prompt through the same kernels.
  Request warm;
  warm.tokens = PseudoRandomTokens(8192, 1);
  warm.release_on_finish = true;
  const rollout::SequenceId warm_id = Unwrap(engine->Submit(warm), "submit");
  while (Unwrap(engine->Info(warm_id), "info").pending_tokens > 0) Unwrap(engine->Step(), "warm");
  Check(engine->Release(warm_id), "release");
  Request prompt;
  prompt.tokens = PseudoRandomTokens(tokens, 2);
  const double start = Seconds();
  const rollout::SequenceId id = Unwrap(engine->Submit(prompt), "submit");
  while (Unwrap(engine->Info(id), "info").pending_tokens > 0) Unwrap(engine->Step(), "prefill");
  Synchronize();
  const double seconds = Seconds() - start;
  PrintResult("gpu", "prefill_" + name + "_" + ContextName(tokens), tokens / seconds, "tokens/s",
              std::nullopt,
              {{"seconds", JsonNumber(seconds)},
               {"chunk_tokens", JsonNumber(static_cast<double>(options.prefill_chunk_tokens))},
               {"routing_recorded", "true"}});
}

// Top CUDA kernels of one training step by device time (LibTorch 2.x's Kineto profiler).
void ProfileTopKernels(const std::function<void()>& step) {
#if TORCH_VERSION_MAJOR >= 2
  using torch::autograd::profiler::ProfilerConfig;
  using torch::autograd::profiler::ProfilerState;
  const ProfilerConfig config(ProfilerState::KINETO);
  const std::set<torch::profiler::impl::ActivityType> activities = {
      torch::profiler::impl::ActivityType::CPU, torch::profiler::impl::ActivityType::CUDA};
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  step();
  Synchronize();
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
      torch::autograd::profiler::disableProfiler();
  std::map<std::string, std::pair<double, int64_t>> by_name;  // device seconds, launches
  double total = 0;
  for (const auto& event : result->events()) {
    if (event.deviceType() != c10::DeviceType::CUDA) continue;
    auto& entry = by_name[event.name()];
    entry.first += 1e-9 * static_cast<double>(event.durationNs());
    entry.second += 1;
    total += 1e-9 * static_cast<double>(event.durationNs());
  }
  std::vector<std::pair<double, std::string>> ranked;
  for (const auto& [name, entry] : by_name) ranked.push_back({entry.first, name});
  std::sort(ranked.rbegin(), ranked.rend());
  for (size_t i = 0; i < std::min<size_t>(ranked.size(), 8); ++i) {
    PrintResult("gpu", "train_profile_kernel_" + std::to_string(i + 1), 1e3 * ranked[i].first, "ms",
                1e3 * total,
                {{"kernel", JsonString(ranked[i].second.substr(0, 160))},
                 {"launches", JsonNumber(static_cast<double>(by_name[ranked[i].second].second))},
                 {"baseline_is", JsonString("device time of all kernels in the step")}});
  }
#else
  (void)step;
  std::fprintf(stderr, "train profile: needs LibTorch 2.x's Kineto profiler\n");
#endif
}

void Train(const std::string& name, const std::string& device, const Ceilings& ceilings,
           bool quick) {
  ModelConfig config = LoadConfig(name, device);
  std::unique_ptr<Model> model = Unwrap(Model::Create(config, 1), "creating " + name);
  for (const auto& [tensor_name, tensor] : model->tensors()) {
    if (tensor.is_floating_point()) tensor.requires_grad_(true);
  }
  const Sizes sizes = SizesOf(config);
  const int64_t batch = 2, length = quick ? 1024 : 4096;
  std::vector<int64_t> ids = PseudoRandomTokens(batch * length, 5);
  const at::Tensor tokens = at::tensor(ids, at::kLong).view({batch, length}).to(model->device());
  auto step = [&] {
    Result<ForwardOutput> out = model->Forward({tokens, {}});
    Check(out.status(), "forward");
    at::Tensor logits = out->logits.narrow(1, 0, length - 1);
    at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                             tokens.narrow(1, 1, length - 1).reshape({-1}));
    loss.backward();
    for (const auto& [tensor_name, tensor] : model->tensors()) {
      if (tensor.grad().defined()) tensor.mutable_grad().reset();
    }
  };
  const double seconds = TimeMedian(quick ? 2 : 4, step);
  const double tokens_per_s = static_cast<double>(batch * length) / seconds;
  const double model_flops = 6.0 * sizes.active_params * tokens_per_s;
  const JsonFields fields = {{"batch", JsonNumber(static_cast<double>(batch))},
                             {"tokens_per_sequence", JsonNumber(static_cast<double>(length))},
                             {"precision", JsonString("float32, TF32 off")},
                             {"step", JsonString("forward, next-token loss, backward")}};
  PrintResult("gpu", "train_" + name + "_tokens_per_s", tokens_per_s, "tokens/s", std::nullopt,
              fields);
  PrintResult("gpu", "train_" + name + "_mfu_bf16_peak", model_flops / 1e12, "TFLOP/s",
              ceilings.bf16_flops / 1e12, fields);
  PrintResult("gpu", "train_" + name + "_mfu_fp32_peak", model_flops / 1e12, "TFLOP/s",
              ceilings.fp32_flops / 1e12, fields);
  ProfileTopKernels(step);
}

void Publish(const std::string& name, const std::string& device, bool quick) {
  const ModelConfig config = LoadConfig(name, device);
  std::shared_ptr<const Model> model(Unwrap(Model::Create(config, 1), "creating " + name));
  EngineOptions options;
  options.cache_budget_bytes = int64_t{256} << 20;
  std::unique_ptr<Engine> engine = Unwrap(Engine::Create(options, model, 0), "engine");
  std::vector<double> save, load, swap;
  double bytes = 0;
  for (int i = 0; i < (quick ? 1 : 3); ++i) {
    Synchronize();
    double start = Seconds();
    const std::string published = Unwrap(model->SaveToBytes(), "save to bytes");
    save.push_back(Seconds() - start);
    bytes = static_cast<double>(published.size());
    start = Seconds();
    std::shared_ptr<const Model> received(
        Unwrap(Model::LoadFromBytes(config, published), "load from bytes"));
    Synchronize();
    load.push_back(Seconds() - start);
    start = Seconds();
    Check(engine->SwapWeights(received, static_cast<uint64_t>(i + 1)), "swap");
    swap.push_back(Seconds() - start);
  }
  const JsonFields fields = {{"bytes", JsonNumber(bytes)}};
  PrintResult("gpu", "publish_" + name + "_to_bytes", Median(save), "s", std::nullopt, fields);
  PrintResult("gpu", "publish_" + name + "_onto_device", Median(load), "s", std::nullopt, fields);
  PrintResult("gpu", "publish_" + name + "_engine_swap", Median(swap), "s", std::nullopt, fields);
}

bool Has(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

}  // namespace

int RunGpuSections(const GpuBenchOptions& options) {
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "model_bench: no CUDA device (torch::cuda::is_available() is false)\n");
    return 2;
  }
  AddDeviceFields();
  ConfigureRuntime(0);
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  const at::Device device = Unwrap(ResolveDevice(options.device), "device");
  const Ceilings ceilings = MeasureCeilings(device);
  for (const std::string& name : options.configs) {
    if (Has(options.sections, "decode")) Decode(name, options.device, ceilings, options.quick);
    if (Has(options.sections, "prefill")) Prefill(name, options.device, options.quick);
  }
  const std::string& large = options.configs.front();
  if (Has(options.sections, "train")) Train(large, options.device, ceilings, options.quick);
  if (Has(options.sections, "publish")) Publish(large, options.device, options.quick);
  return 0;
}

}  // namespace strider::bench
