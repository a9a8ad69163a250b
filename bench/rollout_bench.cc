// Rollout engine benchmark (docs/design.md#benchmark-protocol): each figure beside its ceiling from
// the same run.
//
//   decode_b{1,8,64}  decode tokens/s of the small config through Engine::Step. Batch 1 against
//                     the memory-bandwidth roofline (active weight bytes per token over a
//                     measured copy bandwidth); batch 64 against the LibTorch matmul peak (model
//                     FLOPs per token = 2 x active parameters). Both ceilings at the better
//                     OpenMP wait policy (bench/ceiling.h).
//   per_token_*       engine decode cost per token at short and long context for an
//                     incremental-only config (1K vs 1M), and the hybrid tiny config against an
//                     equal-size full multi-head-attention baseline at 64K and 256K (baseline:
//                     the hybrid's own non-attention cost at 1K plus, for every layer, full
//                     attention of one query over a K and V cache of the context, timed here).
//                     The hybrid's long contexts are real prefills; per_token_hybrid_synthetic_*
//                     reaches them with synthetic latent rows (the benchmark-only
//                     rollout::FillForBenchmark) as a cross-check; the baseline's caches are
//                     random.
//   products_*        the decode path's in-place products (kernels::MultiplyByTransposed) against
//                     at::mm on the same operands, per shape of the small config's decode at
//                     batch 64 (16 rows: one routed expert's share; 64 rows: a joined input
//                     projection), on one thread and on all, weights cold in cache (a pool
//                     larger than the last-level cache, visited in turn).
//   memory_1m         resident memory of one 1M-token incremental-only sequence against the
//                     formula (state + compressed cache + the constant working set of a chunk).
//
//   rollout_bench [--quick] [--threads N] [--only decode|products|incremental|hybrid]
//                 [--batch B]
//   (--batch B: decode at that batch size only, with as many steps again, for profiling)
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_json.h"
#include "bench/bench_util.h"
#include "bench/ceiling.h"
#include "common/kernels/cpu_features.h"
#include "common/kernels/matmul.h"
#include "common/model/config.h"
#include "common/model/model.h"
#include "common/model/parameters.h"
#include "common/process_memory.h"
#include "rollout_engine/engine.h"
#include "rollout_engine/engine_testing.h"
#include "tests/pseudo_tokens.h"

#ifndef STRIDER_SOURCE_DIR
#define STRIDER_SOURCE_DIR "."
#endif

namespace strider {
namespace {

using bench::Check;
using bench::Unwrap;
using rollout::Engine;
using rollout::EngineOptions;
using rollout::Request;
using rollout::SamplingParams;
using testing::PseudoRandomTokens;

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

ModelConfig LoadConfig(const char* name) {
  return Unwrap(LoadModelConfig(std::string(STRIDER_SOURCE_DIR) + "/configs/model/" + name),
                "loading config");
}

std::unique_ptr<Engine> MakeEngine(const ModelConfig& config, EngineOptions options,
                                   int64_t threads) {
  std::shared_ptr<const Model> model(Unwrap(Model::Create(config, 1), "creating model"));
  options.threads = threads;
  options.record_routing = false;
  return Unwrap(Engine::Create(options, model, 0), "creating engine");
}

// Copy bandwidth (GB read + written per second), best of a few 256 MiB copies, and the fp32
// matmul peak (GFLOP/s) of 2048^2 products; both at the better wait policy (bench/ceiling.h).
bench::Ceiling RolloutCeiling(bench::CeilingKind kind, int64_t threads) {
  bench::CeilingSpec spec;
  spec.kind = kind;
  spec.size = kind == bench::CeilingKind::kCopy ? int64_t{64} << 20 : 2048;
  spec.repeats = 5;
  spec.threads = threads;
  return Unwrap(bench::MeasureCeiling(spec), "ceiling");
}

// Median seconds per Step with every one of `batch` sequences generating.
double DecodeStepSeconds(Engine* engine, int64_t batch, int64_t prompt, int steps) {
  for (int64_t i = 0; i < batch; ++i) {
    Request request;
    request.tokens = PseudoRandomTokens(prompt, i);
    SamplingParams sampling;
    sampling.max_new_tokens = steps + 8;
    sampling.seed = i;
    request.sampling = sampling;
    request.release_on_finish = true;
    Unwrap(engine->Submit(request), "submit");
  }
  Unwrap(engine->Step(), "step");  // prefill and the first token
  Unwrap(engine->Step(), "step");
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    const double start = Seconds();
    rollout::StepResult result = Unwrap(engine->Step(), "step");
    times.push_back(Seconds() - start);
    if (result.decode_tokens != batch) {
      std::fprintf(stderr, "expected %lld decode tokens, got %lld\n",
                   static_cast<long long>(batch), static_cast<long long>(result.decode_tokens));
    }
  }
  while (engine->Stats().live_sequences > 0) Unwrap(engine->Step(), "step");
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void DecodeThroughput(bool quick, int64_t threads, int64_t only_batch) {
  const ModelConfig config = LoadConfig("small.yaml");
  const ParameterCounts counts = CountParameters(config);
  // Weights read per token: the active parameters, less the embedding table (one row read).
  const double embedding = static_cast<double>(config.vocabulary * config.width);
  const double active = counts.active - embedding + config.width;
  const bench::Ceiling copy = RolloutCeiling(bench::CeilingKind::kCopy, threads);
  const bench::Ceiling matmul = RolloutCeiling(bench::CeilingKind::kMatmul, threads);
  const double bandwidth = copy.value * 1e9;
  const double peak = matmul.value * 1e9;
  bench::PrintResult("rollout", "copy_bandwidth", bandwidth / 1e9, "GB/s", std::nullopt,
                     bench::CeilingFields(copy));
  bench::PrintResult("rollout", "matmul_peak_fp32", peak / 1e9, "GFLOP/s", std::nullopt,
                     bench::CeilingFields(matmul));
  std::unique_ptr<Engine> engine = MakeEngine(config, EngineOptions{}, threads);
  const std::vector<int64_t> batches =
      only_batch > 0 ? std::vector<int64_t>{only_batch} : std::vector<int64_t>{1, 8, 64};
  for (int64_t batch : batches) {
    const int steps = (quick ? 4 : 12) * (only_batch > 0 ? 2 : 1);
    const double seconds = DecodeStepSeconds(engine.get(), batch, 32, steps);
    const double tokens_per_second = batch / seconds;
    const std::string metric = "decode_b" + std::to_string(batch) + "_small";
    if (batch == 1) {
      // Roofline: every active weight byte read once per token at the copy bandwidth's read
      // half (a copy moves each byte twice; reading alone is about as fast as copying).
      const double roofline = bandwidth / 2.0 / (4.0 * active);
      bench::PrintResult("rollout", metric, tokens_per_second, "tokens/s", roofline,
                         bench::CeilingFields(copy));
    } else {
      const double flops = 2.0 * active * tokens_per_second;
      bench::PrintResult("rollout", metric + "_flops", flops / 1e9, "GFLOP/s", peak / 1e9,
                         bench::CeilingFields(matmul));
      bench::PrintResult("rollout", metric, tokens_per_second, "tokens/s");
    }
  }
}

// GFLOP/s of y = x W^T by `product` over a pool of weight matrices visited in turn (about 160 MB
// in all, so each one comes from memory as in a decode step; 16 MB with --quick); best of three
// passes.
template <typename Product>
double ColdProductGflops(bool quick, int64_t rows, int64_t columns, int64_t inner,
                         Product product) {
  const int64_t pool_bytes = quick ? int64_t{16} << 20 : int64_t{160} << 20;
  const int64_t pool = std::max<int64_t>(8, pool_bytes / (4 * columns * inner));
  std::vector<at::Tensor> weights;
  for (int64_t i = 0; i < pool; ++i) weights.push_back(at::randn({columns, inner}));
  const at::Tensor x = at::randn({rows, inner});
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const double start = Seconds();
    for (const at::Tensor& weight : weights) product(x, weight);
    const double seconds = (Seconds() - start) / static_cast<double>(pool);
    best = std::max(best, 2.0 * rows * columns * inner / seconds / 1e9);
  }
  return best;
}

void DecodeProducts(bool quick, int64_t threads) {
  if (!kernels::CpuHasAvx2WithFma()) {
    std::fprintf(stderr, "rollout_bench: no AVX2 with FMA here; decode products use at::mm\n");
    return;
  }
  struct Shape {
    const char* name;
    int64_t rows, columns, inner;
  };
  // The small config at batch 64: an expert's gate (16 rows, 384 x 256), the sparse layer's
  // joined router/latent/shared input projection (64 rows, 2320 x 512).
  const Shape shapes[] = {{"expert_16x384x256", 16, 384, 256},
                          {"joined_64x2320x512", 64, 2320, 512}};
  for (int64_t thread_count : {int64_t{1}, threads}) {
    at::set_num_threads(static_cast<int>(thread_count));
    for (const Shape& shape : shapes) {
      const double library = ColdProductGflops(
          quick, shape.rows, shape.columns, shape.inner,
          [](const at::Tensor& x, const at::Tensor& w) { return at::mm(x, w.t()); });
      const double ours = ColdProductGflops(quick, shape.rows, shape.columns, shape.inner,
                                            [](const at::Tensor& x, const at::Tensor& w) {
                                              return kernels::MultiplyByTransposed(x, w);
                                            });
      bench::PrintResult("rollout",
                         std::string("products_") + shape.name + "_threads" +
                             std::to_string(thread_count),
                         ours, "GFLOP/s", library);
    }
    if (threads == 1) break;
  }
  at::set_num_threads(static_cast<int>(threads));
}

ModelConfig IncrementalConfig() {
  ModelConfig config;
  config.name = "incremental-32";
  config.width = 32;
  config.layers = 2;
  config.layer_pattern = "I";
  config.residual_block = 1;
  config.context = 1 << 20;
  config.incremental.heads = 2;
  config.incremental.key_dim = 16;
  config.incremental.value_dim = 16;
  config.incremental.decay_rank = 8;
  config.feed_forward.dense_hidden = 64;
  config.feed_forward.latent_width = 16;
  config.feed_forward.expert_hidden = 16;
  config.feed_forward.shared_hidden = 32;
  config.vision.enabled = false;
  Check(ValidateModelConfig(config, "incremental-32"), "config");
  return config;
}

// Grows one sequence to each context in turn and times single-token steps there (median).

// Generates a 16-token turn on an idle sequence and returns the median seconds of its steps.
double MedianDecodeStepSeconds(Engine* engine, rollout::SequenceId id) {
  Request turn;
  SamplingParams sampling;
  sampling.max_new_tokens = 16;
  turn.sampling = sampling;
  Check(engine->Append(id, turn), "turn");
  std::vector<double> times;
  for (int i = 0; i < 16; ++i) {
    const double start = Seconds();
    Unwrap(engine->Step(), "decode");
    times.push_back(Seconds() - start);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Also reports resident memory around the growth.
struct GrowthPoint {
  int64_t context;
  double step_seconds;
  int64_t resident;
};

std::vector<GrowthPoint> GrowAndTime(const ModelConfig& config, std::vector<int64_t> contexts,
                                     int64_t threads, double* resident_before,
                                     double* resident_after_first_chunk) {
  constexpr int64_t kChunk = 65536;
  EngineOptions options;
  options.prefill_chunk_tokens = 65536;
  options.block_tokens = 1024;
  std::unique_ptr<Engine> engine = MakeEngine(config, options, threads);
  *resident_before = ResidentBytes();
  std::vector<GrowthPoint> points;
  rollout::SequenceId id = 0;
  int64_t length = 0;
  for (int64_t context : contexts) {
    while (length < context - 16) {
      Request request;
      const int64_t chunk = std::min<int64_t>(kChunk, context - 16 - length);
      request.tokens = PseudoRandomTokens(chunk, length);
      if (id == 0) {
        id = Unwrap(engine->Submit(request), "submit");
      } else {
        Check(engine->Append(id, request), "append");
      }
      Unwrap(engine->Step(), "prefill");
      length = Unwrap(engine->Info(id), "info").length;
      // The working set of a call grows with its chunk: the constant of the memory formula is
      // read after the first full-size chunk.
      if (chunk == kChunk && *resident_after_first_chunk == 0) {
        *resident_after_first_chunk = ResidentBytes();
      }
    }
    const double step_seconds = MedianDecodeStepSeconds(engine.get(), id);
    length = Unwrap(engine->Info(id), "info").length;
    points.push_back({context, step_seconds, ResidentBytes()});
    std::fprintf(stderr, "%s: context %lld, %.3f ms per token\n", config.name.c_str(),
                 static_cast<long long>(context), 1e3 * points.back().step_seconds);
  }
  return points;
}

// Decode cost per token of one sequence at each context: a real prompt up to the first context,
// then synthetic latent rows (rollout::FillForBenchmark) up to the next ones.
std::vector<GrowthPoint> FillAndTime(const ModelConfig& config, std::vector<int64_t> contexts,
                                     int64_t threads) {
  EngineOptions options;
  options.block_tokens = 1024;
  std::unique_ptr<Engine> engine = MakeEngine(config, options, threads);
  Request prompt;
  prompt.tokens = PseudoRandomTokens(contexts.front() - 16, 0);
  const rollout::SequenceId id = Unwrap(engine->Submit(prompt), "submit");
  Unwrap(engine->Step(), "prefill");
  std::vector<GrowthPoint> points;
  for (int64_t context : contexts) {
    const int64_t length = Unwrap(engine->Info(id), "info").length;
    if (length < context - 16) {
      Check(rollout::FillForBenchmark(engine.get(), id, context - 16 - length, context), "fill");
    }
    const double step_seconds = MedianDecodeStepSeconds(engine.get(), id);
    points.push_back({context, step_seconds, ResidentBytes()});
    std::fprintf(stderr, "%s: context %lld, %.3f ms per token\n", config.name.c_str(),
                 static_cast<long long>(context), 1e3 * points.back().step_seconds);
  }
  return points;
}

// One decode token of full multi-head attention over a cache of `context` tokens in every
// layer: q (H, 1, D) against K, V (H, S, D), with D the latent config's value width.
double FullAttentionSeconds(const ModelConfig& config, int64_t context) {
  const int64_t heads = config.latent.heads;
  const int64_t dim = config.latent.value_dim;
  at::Tensor keys = at::randn({heads, context, dim});
  at::Tensor values = at::randn({heads, context, dim});
  at::Tensor query = at::randn({heads, 1, dim});
  std::vector<double> times;
  for (int i = 0; i < 9; ++i) {
    const double start = Seconds();
    for (int64_t layer = 0; layer < config.layers; ++layer) {
      at::Tensor scores = at::matmul(query, keys.transpose(1, 2)) / std::sqrt(double(dim));
      at::Tensor out = at::matmul(at::softmax(scores, -1), values);
    }
    times.push_back(Seconds() - start);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void IncrementalLongContext(bool quick, int64_t threads) {
  // Incremental-only: cost per token at 1K and 1M (quick: 128K).
  const ModelConfig incremental = IncrementalConfig();
  const int64_t far = quick ? 131072 : (int64_t{1} << 20);
  const std::string far_name = quick ? "128k" : "1m";
  double before = 0, first_chunk = 0;
  std::vector<GrowthPoint> points =
      GrowAndTime(incremental, {1024, far}, threads, &before, &first_chunk);
  bench::PrintResult("rollout", "per_token_incremental_1k", 1e3 * points[0].step_seconds, "ms");
  bench::PrintResult("rollout", "per_token_incremental_" + far_name,
                     1e3 * points[1].step_seconds, "ms", 1e3 * points[0].step_seconds);
  // Memory: what the sequence added to the process against state + cache + the constant
  // working set of a call (measured after the first full-size chunk).
  const double used = points[1].resident - before;
  const double formula = rollout::SequenceBytesFormula(incremental, points[1].context, 1024) +
                         (first_chunk - before);
  bench::PrintResult("rollout", "memory_" + far_name + "_incremental", used / (1 << 20), "MiB",
                     formula / (1 << 20));
}

void HybridLongContext(int64_t threads) {
  // Hybrid tiny against the multi-head baseline, after a real prefill of the prompt up to each
  // context (the latent-attention prefill kernel makes 256K a couple of minutes). The baseline's
  // K and V caches are random: its cost does not depend on the values. As a cross-check the
  // same contexts reached through the engine's benchmark-only fill (synthetic latent rows).
  ModelConfig hybrid = LoadConfig("tiny.yaml");
  hybrid.vision.enabled = false;
  std::vector<int64_t> contexts = {1024, 65536, 262144};
  double before = 0, first_chunk = 0;
  std::vector<GrowthPoint> hybrid_points = GrowAndTime(hybrid, contexts, threads, &before,
                                                       &first_chunk);
  std::vector<GrowthPoint> synthetic_points = FillAndTime(hybrid, contexts, threads);
  const double latent_share = static_cast<double>(hybrid.CountLayers('G')) / hybrid.layers;
  const double rest = std::max(
      0.0, hybrid_points[0].step_seconds - FullAttentionSeconds(hybrid, 1024) * latent_share);
  bench::PrintResult("rollout", "per_token_hybrid_1k", 1e3 * hybrid_points[0].step_seconds, "ms");
  for (size_t i = 1; i < hybrid_points.size(); ++i) {
    const int64_t context = hybrid_points[i].context;
    const std::string k = std::to_string(context / 1024) + "k";
    const double baseline = rest + FullAttentionSeconds(hybrid, context);
    bench::PrintResult("rollout", "per_token_hybrid_speedup_" + k,
                       baseline / hybrid_points[i].step_seconds, "x", std::nullopt,
                       {{"context_is", bench::JsonString("real prefill")}});
    bench::PrintResult("rollout", "per_token_hybrid_" + k, 1e3 * hybrid_points[i].step_seconds,
                       "ms", 1e3 * baseline, {{"context_is", bench::JsonString("real prefill")}});
    bench::PrintResult("rollout", "per_token_hybrid_synthetic_" + k,
                       1e3 * synthetic_points[i].step_seconds, "ms",
                       1e3 * hybrid_points[i].step_seconds,
                       {{"baseline_is", bench::JsonString("the same context by real prefill")}});
  }
  std::fprintf(stderr,
               "hybrid contexts are real prefills; the synthetic lines reach them through "
               "rollout::FillForBenchmark; the baseline's K/V caches are random\n");
}

}  // namespace
}  // namespace strider

int main(int argc, char** argv) {
  if (std::optional<int> child = strider::bench::RunCeilingChild(argc, argv)) return *child;
  bool quick = false;
  int64_t threads = 2;
  std::string only;
  int64_t only_batch = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
      only_batch = std::atoll(argv[++i]);
      if (only_batch <= 0) {
        std::fprintf(stderr, "--batch takes a positive number, not '%s'\n", argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: rollout_bench [--quick] [--threads N] "
                   "[--only decode|products|incremental|hybrid] [--batch B]\n");
      return 2;
    }
  }
  if (!only.empty() && only != "decode" && only != "products" && only != "incremental" &&
      only != "hybrid") {
    std::fprintf(stderr, "--only takes decode, products, incremental or hybrid, not '%s'\n",
                 only.c_str());
    return 2;
  }
  if (only_batch > 0) {
    if (!only.empty() && only != "decode") {
      std::fprintf(stderr, "--batch measures decode only; it cannot go with --only %s\n",
                   only.c_str());
      return 2;
    }
    only = "decode";
  }
  strider::ConfigureRuntime(threads);
  strider::bench::EveryLineFields() = strider::bench::RunPolicyFields();
  at::NoGradGuard no_grad;
  // The memory figure first: later parts would leave a large free heap behind that the 1M run
  // reuses, and the growth against the formula would then measure that heap's history.
  if (only.empty() || only == "incremental") strider::IncrementalLongContext(quick, threads);
  if (only.empty() || only == "decode") strider::DecodeThroughput(quick, threads, only_batch);
  if (only.empty() || only == "products") strider::DecodeProducts(quick, threads);
  if (only.empty() || only == "hybrid") strider::HybridLongContext(threads);
  return 0;
}
