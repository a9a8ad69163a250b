// The model on a GPU (docs/cuda.md, "Checked on a GPU"): the two-path contract on CUDA in fp32
// for every shipped config that fits the device, CUDA against the CPU on the same weights and
// routing, the latent decode over the engine's pages on CUDA against the CPU kernel, and the
// gated delta rule's decode step (the CUDA kernel in the CUDA LibTorch tree) against the CPU.
//
// Label `gpu`: every case skips with the reason where LibTorch sees no CUDA device (Debian's
// LibTorch has no CUDA at all; the 2.11 tree on a machine without a GPU has no driver), so both
// trees build and run it everywhere and only a GPU machine (scripts/gpu_check.sh) checks it.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/kernels/gated_delta_rule.h"
#include "common/kernels/latent_attention.h"
#include "common/model/config.h"
#include "common/model/incremental_attention.h"
#include "common/model/model.h"
#include "common/model/parameters.h"
#include "common/model/two_path_check.h"
#include "common/tokenizer.h"
#include "tests/cuda/skip_without_cuda.h"
#include "tests/shipped_config.h"

namespace strider {
namespace {

at::Tensor RandomTokens(int64_t batch, int64_t length, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randint(0, token::kByteCount, {batch, length}, generator, at::kLong);
}

double ParameterCount(const ModelConfig& config) {
  double total = 0;
  for (const ParameterSpec& spec : ModelParameterSpecs(config)) {
    double n = 1;
    for (int64_t d : spec.shape) n *= static_cast<double>(d);
    total += n;
  }
  return total;
}

void PrintFigure(const nlohmann::json& line) { std::printf("%s\n", line.dump().c_str()); }

// Every config under configs/model/ with at most this many parameters runs the two-path check:
// its fp32 weights, activations and caches at a few hundred tokens stay within an 80 GB GPU.
// The one left out is the reference model (2.8e12 parameters).
constexpr double kMaxTwoPathParameters = 4e9;

TEST(GpuTwoPaths, EveryShippedConfigThatFitsKeepsTheContractInFp32OnCuda) {
  STRIDER_SKIP_WITHOUT_CUDA();
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  const std::filesystem::path folder =
      std::filesystem::path(source != nullptr ? source : ".") / "configs/model";
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().extension() == ".yaml") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  ASSERT_FALSE(names.empty());
  ConfigureRuntime(4);
  int checked = 0;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    ModelConfig config = testing::ShippedModelConfig(name);
    const double parameters = ParameterCount(config);
    if (parameters > kMaxTwoPathParameters) {
      PrintFigure({{"check", "two_path_cuda_fp32"},
                   {"config", name},
                   {"skipped", "too large"},
                   {"parameters", parameters}});
      continue;
    }
    config.device = "cuda";
    Result<std::unique_ptr<Model>> model = Model::Create(config, 11);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    ASSERT_TRUE((*model)->device().is_cuda());
    // Long enough for several incremental chunks and every chunk form, short enough for the
    // largest config's training pass.
    const int64_t length = parameters > 5e8 ? 256 : 512;
    Result<TwoPathReport> report = CheckTwoPaths(**model, RandomTokens(1, length, 12));
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    PrintFigure({{"check", "two_path_cuda_fp32"},
                 {"config", name},
                 {"parameters", parameters},
                 {"tokens", length},
                 {"max_abs_logprob_diff", report->max_abs_logprob_diff},
                 {"routing_agreement", report->routing_agreement},
                 {"inference_chunks", report->inference_chunks}});
    EXPECT_LE(report->max_abs_logprob_diff, 1e-5);
    ++checked;
  }
  EXPECT_GE(checked, 3) << "tiny, small and gpu_1b at least";
}

// Next-token log-probs of `tokens` from one Forward, on the model's device, as (B, T - 1).
at::Tensor NextTokenLogProbs(const Model& model, const at::Tensor& tokens,
                             const RoutingRecord* replay, RoutingRecord* record) {
  ForwardOptions options;
  options.replay_routing = replay;
  options.record_routing = record != nullptr;
  at::NoGradGuard no_grad;
  Result<ForwardOutput> out = model.Forward({tokens.to(model.device()), {}}, options);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (!out.ok()) return at::Tensor();
  if (record != nullptr) *record = out->routing;
  const int64_t length = tokens.size(1);
  at::Tensor logprobs = at::log_softmax(out->logits.narrow(1, 0, length - 1).to(at::kDouble), -1);
  at::Tensor next = tokens.narrow(1, 1, length - 1).to(model.device()).unsqueeze(-1);
  return logprobs.gather(-1, next).squeeze(-1);
}

TEST(GpuAgainstCpu, SameWeightsAndRoutingGiveTheSameLogProbsWithin1e4) {
  STRIDER_SKIP_WITHOUT_CUDA();
  ConfigureRuntime(4);
  for (const char* name : {"tiny", "small"}) {
    SCOPED_TRACE(name);
    ModelConfig config = testing::ShippedModelConfig(name);
    config.device = "cpu";
    Result<std::unique_ptr<Model>> cpu = Model::Create(config, 21);
    ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
    config.device = "cuda";
    Result<std::unique_ptr<Model>> gpu = Model::Create(config, 21);
    ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
    // One seed, the same weights wherever they are placed (Model::Create).
    for (const auto& [name_in_cpu, tensor] : (*cpu)->tensors()) {
      const std::string tensor_name = name_in_cpu;  // a lambda may not capture a binding
      const auto found =
          std::find_if((*gpu)->tensors().begin(), (*gpu)->tensors().end(),
                       [&](const auto& entry) { return entry.first == tensor_name; });
      ASSERT_NE(found, (*gpu)->tensors().end()) << tensor_name;
      const at::Tensor& other = found->second;
      ASSERT_TRUE(at::equal(tensor, other.cpu())) << tensor_name;
    }
    const at::Tensor tokens = RandomTokens(2, 384, 22);
    RoutingRecord routing;
    const at::Tensor on_cpu = NextTokenLogProbs(**cpu, tokens, nullptr, &routing);
    for (RoutingRecord::Layer& layer : routing.layers) {
      layer.experts = layer.experts.to((*gpu)->device());
      if (layer.scores.defined()) layer.scores = layer.scores.to((*gpu)->device());
    }
    const at::Tensor on_gpu = NextTokenLogProbs(**gpu, tokens, &routing, nullptr);
    ASSERT_TRUE(on_cpu.defined() && on_gpu.defined());
    const double worst = (on_gpu.cpu() - on_cpu).abs().max().item<double>();
    PrintFigure({{"check", "cuda_vs_cpu_fp32"}, {"config", name}, {"max_abs_logprob_diff", worst}});
    EXPECT_LE(worst, 1e-4);
  }
}

// Pages as the rollout engine holds them (rollout_engine/paged_cache.h): blocks of one pool, each
// (block_tokens, Dc + Dr), a sequence's blocks scattered through it, the latent and rope parts
// views of the same rows.
struct PagedPast {
  at::Tensor pool;  // (blocks, block_tokens, W)
  kernels::LatentAttentionPages pages;
};

PagedPast MakePages(const std::vector<int64_t>& lengths, int64_t block_tokens, int64_t dc,
                    int64_t dr, const at::Tensor& pool) {
  PagedPast past;
  past.pool = pool;
  int64_t next = pool.size(0) - 1;  // handed out from the end, so neighbours are not adjacent
  for (int64_t length : lengths) {
    std::vector<kernels::LatentAttentionPage> row;
    for (int64_t at_row = 0; at_row < length; at_row += block_tokens) {
      const int64_t n = std::min(block_tokens, length - at_row);
      at::Tensor block = pool[next--].narrow(0, 0, n);
      row.push_back({block.narrow(-1, 0, dc), block.narrow(-1, dc, dr)});
    }
    past.pages.push_back(std::move(row));
  }
  return past;
}

TEST(GpuPagedDecode, EnginePagesOnCudaMatchTheCpuKernel) {
  STRIDER_SKIP_WITHOUT_CUDA();
  const int64_t dc = 512, dr = 64, heads = 16, block_tokens = 256;
  const std::vector<int64_t> lengths = {0, 1, 300, 5000};
  at::Generator generator = at::detail::createCPUGenerator(31);
  const at::Tensor pool = at::randn({40, block_tokens, dc + dr}, generator, at::kFloat);
  const PagedPast cpu_past = MakePages(lengths, block_tokens, dc, dr, pool);
  const PagedPast gpu_past = MakePages(lengths, block_tokens, dc, dr, pool.cuda());
  for (int64_t tokens : {int64_t{1}, int64_t{3}}) {
    SCOPED_TRACE("new tokens per row: " + std::to_string(tokens));
    const int64_t batch = static_cast<int64_t>(lengths.size());
    const double scale = 1.0 / std::sqrt(192.0);
    const at::Tensor query =
        at::randn({batch, tokens, heads, dc + dr}, generator, at::kFloat) * scale;
    const at::Tensor latent = at::randn({batch, tokens, dc}, generator, at::kFloat);
    const at::Tensor rope = at::randn({batch, tokens, dr}, generator, at::kFloat);
    const at::Tensor want = kernels::LatentAttentionDecode(query, cpu_past.pages, latent, rope);
    const at::Tensor got =
        kernels::LatentAttentionDecode(query.cuda(), gpu_past.pages, latent.cuda(), rope.cuda());
    ASSERT_TRUE(got.is_cuda());
    const double worst = (got.cpu() - want).abs().max().item<double>();
    PrintFigure(
        {{"check", "paged_decode_cuda_vs_cpu"}, {"tokens", tokens}, {"max_abs_diff", worst}});
    EXPECT_LE(worst, 1e-5);
  }
}

double MaxAbsDiff(const at::Tensor& gpu, const at::Tensor& cpu) {
  return (gpu.cpu().to(at::kDouble) - cpu.to(at::kDouble)).abs().max().item<double>();
}

// Inputs of one decode position as the incremental layer makes them (incremental_attention.cc):
// q, k, v, g transposes of (B, 1, H, D) projections, k of unit norm, q scaled by Dk^-1/2.
struct DeltaRuleStep {
  at::Tensor q, k, v, g, beta;  // (B, H, 1, Dk) x 2, (B, H, 1, Dv), (B, H, 1, Dk), (B, H, 1)
};

DeltaRuleStep RandomDeltaRuleStep(int64_t batch, int64_t heads, int64_t dk, int64_t dv,
                                  at::Generator& generator) {
  auto strided = [&](int64_t width) {
    return at::randn({batch, 1, heads, width}, generator, at::kFloat).transpose(1, 2);
  };
  DeltaRuleStep step;
  step.q = strided(dk);
  step.q = step.q / at::sqrt(step.q.pow(2).sum(-1, true)) / std::sqrt(static_cast<double>(dk));
  step.k = strided(dk);
  step.k = step.k / at::sqrt(step.k.pow(2).sum(-1, true));
  step.v = strided(dv);
  step.g = -5.0 * at::rand({batch, 1, heads, dk}, generator, at::kFloat).transpose(1, 2);
  step.beta = at::rand({batch, 1, heads}, generator, at::kFloat).transpose(1, 2);
  return step;
}

// The shapes of the shipped configs (32, 64 and 128 wide heads), widths the kernel's thread
// layout does not divide evenly, and the smallest; four chained steps from a nonzero state.
TEST(GpuDeltaRuleDecode, RecurrentStepOnCudaMatchesTheCpuKernel) {
  STRIDER_SKIP_WITHOUT_CUDA();
  at::NoGradGuard no_grad;
  at::Generator generator = at::detail::createCPUGenerator(41);
  struct Shape {
    int64_t batch, heads, dk, dv;
  };
  for (const Shape& shape : {Shape{2, 2, 32, 32}, Shape{3, 8, 64, 64}, Shape{2, 12, 128, 128},
                             Shape{3, 2, 96, 100}, Shape{2, 1, 1, 7}}) {
    SCOPED_TRACE("B, H, Dk, Dv = " + std::to_string(shape.batch) + ", " +
                 std::to_string(shape.heads) + ", " + std::to_string(shape.dk) + ", " +
                 std::to_string(shape.dv));
    at::Tensor cpu_state =
        at::randn({shape.batch, shape.heads, shape.dk, shape.dv}, generator, at::kFloat);
    at::Tensor gpu_state = cpu_state.cuda();
    double worst = 0;
    for (int step = 0; step < 4; ++step) {
      const DeltaRuleStep in =
          RandomDeltaRuleStep(shape.batch, shape.heads, shape.dk, shape.dv, generator);
      const kernels::GatedDeltaRuleOutput want =
          kernels::GatedDeltaRuleRecurrent(in.q, in.k, in.v, in.g, in.beta, cpu_state);
      const at::Tensor gpu_before = gpu_state.clone();
      const kernels::GatedDeltaRuleOutput got = kernels::GatedDeltaRuleRecurrent(
          in.q.cuda(), in.k.cuda(), in.v.cuda(), in.g.cuda(), in.beta.cuda(), gpu_state);
      ASSERT_TRUE(got.output.is_cuda() && got.final_state.is_cuda());
      ASSERT_EQ(got.output.sizes(), want.output.sizes());
      ASSERT_EQ(got.final_state.sizes(), want.final_state.sizes());
      // The step is functional: the state passed in is not written.
      EXPECT_TRUE(at::equal(gpu_state, gpu_before));
      worst = std::max({worst, MaxAbsDiff(got.output, want.output),
                        MaxAbsDiff(got.final_state, want.final_state)});
      cpu_state = want.final_state;
      gpu_state = got.final_state;
    }
    PrintFigure({{"check", "delta_rule_step_cuda_vs_cpu"},
                 {"heads", shape.heads},
                 {"key_dim", shape.dk},
                 {"value_dim", shape.dv},
                 {"max_abs_diff", worst}});
    EXPECT_LE(worst, 1e-5);
  }
}

// The model's incremental layer decoding on CUDA (a prefill chunk, then one token at a time: the
// recurrent form at T = 1) against the same layer and weights on the CPU.
TEST(GpuDeltaRuleDecode, IncrementalAttentionDecodeOnCudaMatchesTheCpuWithin1e5) {
  STRIDER_SKIP_WITHOUT_CUDA();
  ConfigureRuntime(4);
  at::NoGradGuard no_grad;
  for (const char* name : {"tiny", "small"}) {
    SCOPED_TRACE(name);
    ModelConfig config = testing::ShippedModelConfig(name);
    config.device = "cpu";
    Result<std::unique_ptr<Model>> model = Model::Create(config, 51);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model::TensorMap cpu_tensors, gpu_tensors;
    for (const auto& [tensor_name, tensor] : (*model)->tensors()) {
      cpu_tensors[tensor_name] = tensor;
      gpu_tensors[tensor_name] = tensor.cuda();
    }
    const std::vector<char> kinds = config.LayerKinds();
    const auto first = std::find(kinds.begin(), kinds.end(), 'I');
    ASSERT_NE(first, kinds.end());
    const std::string prefix =
        "layers." + std::to_string(first - kinds.begin()) + ".incremental.";
    const model::IncrementalAttentionWeights cpu_weights =
        model::IncrementalAttentionWeights::Bind(cpu_tensors, prefix);
    const model::IncrementalAttentionWeights gpu_weights =
        model::IncrementalAttentionWeights::Bind(gpu_tensors, prefix);
    const IncrementalAttentionConfig& layer = config.incremental;

    const int64_t batch = 3, prefill = 40, steps = 8;
    at::Generator generator = at::detail::createCPUGenerator(52);
    const at::Tensor x = at::randn({batch, prefill + steps, config.width}, generator, at::kFloat);
    model::IncrementalAttentionState cpu_state =
        model::IncrementalAttentionState::Zeros(layer, batch, x.options());
    model::IncrementalAttentionState gpu_state =
        model::IncrementalAttentionState::Zeros(layer, batch, x.options().device(at::kCUDA));
    double worst_output = 0;
    auto append = [&](int64_t from, int64_t length) {
      const at::Tensor chunk = x.narrow(1, from, length);
      const at::Tensor want = model::IncrementalAttentionForward(
          cpu_weights, layer, chunk, &cpu_state, config.norm_epsilon);
      const at::Tensor got = model::IncrementalAttentionForward(
          gpu_weights, layer, chunk.cuda(), &gpu_state, config.norm_epsilon);
      worst_output = std::max(worst_output, MaxAbsDiff(got, want));
    };
    append(0, prefill);  // a nonzero state for the decode steps
    for (int64_t t = prefill; t < prefill + steps; ++t) append(t, 1);
    ASSERT_TRUE(gpu_state.recurrent.is_cuda());
    const double worst_state = MaxAbsDiff(gpu_state.recurrent, cpu_state.recurrent);
    PrintFigure({{"check", "incremental_decode_cuda_vs_cpu"},
                 {"config", name},
                 {"steps", steps},
                 {"max_abs_output_diff", worst_output},
                 {"max_abs_state_diff", worst_state}});
    EXPECT_LE(worst_output, 1e-5);
    EXPECT_LE(worst_state, 1e-5);
  }
}

}  // namespace
}  // namespace strider
