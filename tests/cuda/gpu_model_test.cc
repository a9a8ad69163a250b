// The model on a GPU (docs/cuda.md, "Checked on a GPU"): the two-path contract on CUDA in fp32
// for every shipped config that fits the device, CUDA against the CPU on the same weights and
// routing, and the latent decode over the engine's pages on CUDA against the CPU kernel.
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

#include "common/kernels/latent_attention.h"
#include "common/model/config.h"
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

}  // namespace
}  // namespace strider
