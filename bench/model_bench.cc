// Model benchmarks (docs/design.md#benchmark-protocol): every figure is printed next to its ceiling
// measured in the same run, because the machines are shared and absolute speeds drift.
//
//   train   Training throughput of the small config (forward plus backward) and the ratio of its
//           model FLOP rate to the LibTorch fp32 matmul peak (at the better OpenMP wait policy,
//           bench/ceiling.h).
//   decode  Decode cost per token against context length for an incremental-only config (to
//           1M), the hybrid IIIG config (to 256K) and an equal-size full multi-head attention
//           baseline written here (to where its KV cache fits the memory budget).
//   cache   Cache bytes per token of latent attention against the multi-head baseline.
//   attention  Latent attention's long prefill and its blockwise training kernel (forward and
//           backward) as FLOP rates against the matmul peak, small and tiny configs, at 16K,
//           64K and a 4K chunk after a 256K past.
//
// Output: one JSON object per line on stdout, {"bench","metric","value","unit","baseline",
// "ratio"} plus descriptive extra keys; progress goes to stderr.
//
//   model_bench [--quick] [--only train|decode|cache|attention] [--config PATH] [--threads N]
//               [--mha-budget-gib G] [--max-context N] [--hybrid-max-context N]
//
// With --device cuda[:N], the GPU sections instead (bench/model_bench_gpu.h, docs/cuda.md):
// device ceilings, then decode, prefill, a training step and the weight publish on the GPU.
//   model_bench --device cuda [--quick] [--gpu-sections decode,prefill,train,publish]
//               [--gpu-configs gpu_1b,small]
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/bench_json.h"
#include "bench/bench_util.h"
#include "bench/ceiling.h"
#include "bench/model_bench_gpu.h"
#include "common/kernels/latent_attention.h"
#include "common/model/config.h"
#include "common/model/model.h"
#include "common/model/ops.h"
#include "common/model/parameters.h"

#ifndef STRIDER_SOURCE_DIR
#define STRIDER_SOURCE_DIR "."
#endif

namespace strider {
namespace {

using bench::Check;
using bench::Unwrap;

constexpr int64_t kKi = 1024;

struct Options {
  bool quick = false;
  std::string only;  // empty: every section
  std::string config_path = std::string(STRIDER_SOURCE_DIR) + "/configs/model/small.yaml";
  int64_t threads = 2;
  // Memory the multi-head baseline's KV cache may take: the machine is shared (24 GiB) and
  // other builds run beside the benchmark.
  double mha_budget_gib = 6.0;
  // Caps on the decode contexts (0: the defaults, 1M incremental and 256K hybrid): prefill time
  // grows linearly (incremental) or quadratically (hybrid) with them.
  int64_t max_context = 0;
  int64_t hybrid_max_context = 0;
  std::string device;  // cuda[:N]: the GPU sections (model_bench_gpu.h) instead of the above
  bench::GpuBenchOptions gpu;
};

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double Min(const std::vector<double>& values) {
  return *std::min_element(values.begin(), values.end());
}

void Progress(const std::string& message) { std::cerr << "[model_bench] " << message << "\n"; }

std::string ContextLabel(int64_t tokens) {
  if (tokens % (kKi * kKi) == 0) return std::to_string(tokens / (kKi * kKi)) + "M";
  if (tokens % kKi == 0) return std::to_string(tokens / kKi) + "K";
  return std::to_string(tokens);
}

// A JSON value written as text with the shared bench helpers: numbers (NaN and infinities become
// null), strings, booleans.
class JsonValue {
 public:
  JsonValue() : text_("null") {}
  JsonValue(double number) : text_(bench::JsonNumber(number)) {}       // NOLINT: implicit for
  JsonValue(int64_t number) : text_(std::to_string(number)) {}         // NOLINT: brevity at call
  JsonValue(int number) : text_(std::to_string(number)) {}             // NOLINT: sites
  JsonValue(bool flag) : text_(flag ? "true" : "false") {}             // NOLINT
  JsonValue(const char* text) : text_(bench::JsonString(text)) {}      // NOLINT
  JsonValue(const std::string& text) : text_(bench::JsonString(text)) {}  // NOLINT
  static JsonValue Null() { return JsonValue(); }
  // Text that is JSON already (bench::JsonFields values).
  static JsonValue Raw(std::string json) {
    JsonValue value;
    value.text_ = std::move(json);
    return value;
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

using Extras = std::vector<std::pair<std::string, JsonValue>>;

// `extras` followed by the keys that say under which policy `ceiling` was measured.
Extras WithCeiling(Extras extras, const bench::Ceiling& ceiling) {
  for (auto& [key, json] : bench::CeilingFields(ceiling)) {
    extras.emplace_back(key, JsonValue::Raw(json));
  }
  return extras;
}

// One benchmark line in bench_json.h's format plus extra descriptive keys (context, config,
// note), which PrintResult has no room for. `baseline` is the ceiling or reference measured in
// the same run; `ratio` is value / baseline.
void Emit(const std::string& metric, JsonValue value, const std::string& unit, JsonValue baseline,
          JsonValue ratio, const Extras& extras = {}) {
  std::ostringstream line;
  line << "{\"bench\":\"model\",\"metric\":" << JsonValue(metric).text()
       << ",\"value\":" << value.text() << ",\"unit\":" << JsonValue(unit).text()
       << ",\"baseline\":" << baseline.text() << ",\"ratio\":" << ratio.text();
  for (const auto& [key, extra] : extras) line << "," << JsonValue(key).text() << ":" << extra.text();
  line << bench::ExtraFieldsText({}) << "}";
  std::cout << line.str() << std::endl;
}

JsonValue RatioOrNull(double value, double baseline) {
  if (!std::isfinite(value) || !std::isfinite(baseline) || baseline == 0) return JsonValue::Null();
  return JsonValue(value / baseline);
}

at::Tensor RandomTokens(int64_t batch, int64_t length) {
  // Byte tokens only: special ids such as the image-patch placeholder would need images.
  return at::randint(0, 256, {batch, length}, at::kLong);
}

// ---------------------------------------------------------------------------------------------
// Training throughput.

// Model FLOPs per token for one training step (forward plus backward = 3x forward):
//   6 * N_active                               matmuls of every active parameter except the
//                                              embedding lookup (no multiply); routed experts
//                                              counted at k/n, vision and value head excluded
//   + 3 * sum over latent layers of 2 * H * (Dn + Dr + Dv) * (T + 1) / 2
//                                              causal attention scores and weighted values
//   + 3 * sum over incremental layers of 6 * H * Dk * Dv
//                                              the recurrence's work per token (state decay
//                                              and update, S^T k and S^T q), not the chunkwise
//                                              form's intra-chunk extra terms
struct TrainingFlops {
  double parameters = 0;
  double latent_attention = 0;
  double incremental_attention = 0;
  double Total() const { return parameters + latent_attention + incremental_attention; }
};

TrainingFlops TrainingFlopsPerToken(const ModelConfig& config, int64_t length) {
  const ParameterCounts counts = CountParameters(config);
  const auto embedding = counts.active_by_component.find("embedding");
  const double embedding_params =
      embedding == counts.active_by_component.end() ? 0.0 : embedding->second;
  TrainingFlops flops;
  flops.parameters = 6.0 * (counts.active - embedding_params);
  const LatentAttentionConfig& g = config.latent;
  flops.latent_attention = 3.0 * config.CountLayers('G') * 2.0 * g.heads *
                           (g.nope_dim + g.rope_dim + g.value_dim) * (length + 1) / 2.0;
  const IncrementalAttentionConfig& i = config.incremental;
  flops.incremental_attention =
      3.0 * config.CountLayers('I') * 6.0 * i.heads * i.key_dim * i.value_dim;
  return flops;
}

void RunTraining(const Options& options) {
  ModelConfig config = Unwrap(LoadModelConfig(options.config_path), "loading the small config");
  const int64_t batch = options.quick ? 1 : 4;
  const int64_t length = options.quick ? 256 : 512;
  const int steps = options.quick ? 2 : 5;
  config.context = std::max(config.context, length);
  Progress("training: " + config.name + " config, batch " + std::to_string(batch) + " x " +
           std::to_string(length) + " tokens, " + std::to_string(steps) + " timed steps");

  std::unique_ptr<Model> model = Unwrap(Model::Create(config, /*seed=*/1), "creating the model");
  model->SetRequiresGrad(true);
  const std::vector<at::Tensor> parameters = model->TrainableParameters();
  const at::Tensor tokens = RandomTokens(batch, length);
  ModelInput input;
  input.tokens = tokens;

  std::vector<double> forward_times, backward_times, step_times;
  for (int step = -1; step < steps; ++step) {  // step -1 warms up allocations and thread pools
    const double start = Seconds();
    ForwardOutput out = Unwrap(model->Forward(input), "training forward");
    at::Tensor loss = -NextTokenLogProbs(out.logits, tokens).mean();
    const double forward_end = Seconds();
    loss.backward();
    const double end = Seconds();
    for (const at::Tensor& p : parameters) p.mutable_grad().reset();
    if (step >= 0) {
      forward_times.push_back(forward_end - start);
      backward_times.push_back(end - forward_end);
      step_times.push_back(end - start);
    }
  }
  // The peak is measured right after the steps so both see the same neighbours.
  const int64_t matmul_size = options.quick ? 1024 : 2048;
  bench::CeilingSpec spec;
  spec.size = matmul_size;
  spec.repeats = options.quick ? 4 : 8;
  spec.threads = options.threads;
  const bench::Ceiling ceiling = Unwrap(bench::MeasureCeiling(spec), "matmul peak");
  const double peak = ceiling.value;

  const TrainingFlops flops = TrainingFlopsPerToken(config, length);
  const double tokens_per_step = static_cast<double>(batch * length);
  const double best_step = Min(step_times);
  const double median_step = Median(step_times);
  const double achieved = flops.Total() * tokens_per_step / best_step / 1e9;
  const double tokens_per_second = tokens_per_step / median_step;
  const double peak_tokens_per_second = peak * 1e9 / flops.Total();
  const std::string formula =
      "model FLOPs/token = 6*(active params - embedding) + 3*sum_G 2*H*(Dn+Dr+Dv)*(T+1)/2 + "
      "3*sum_I 6*H*Dk*Dv; achieved = FLOPs/token * tokens / best step time";

  Emit("matmul_peak_fp32", peak, "GFLOP/s", peak, 1.0,
       WithCeiling({{"note", "best of at::mm on " + std::to_string(matmul_size) + "^2 fp32, " +
                                 std::to_string(options.threads) + " threads"},
                    {"threads", options.threads}},
                   ceiling));
  Emit("train_flop_rate", achieved, "GFLOP/s", peak, RatioOrNull(achieved, peak),
       WithCeiling({{"config", config.name},
                    {"batch", batch},
                    {"length", length},
                    {"flops_per_token", flops.Total()},
                    {"flops_per_token_parameters", flops.parameters},
                    {"flops_per_token_latent_attention", flops.latent_attention},
                    {"flops_per_token_incremental_attention", flops.incremental_attention},
                    {"target_ratio_min", 0.35},
                    {"met", achieved / peak >= 0.35},
                    {"note", formula}},
                   ceiling));
  Emit("train_tokens_per_second", tokens_per_second, "tokens/s", peak_tokens_per_second,
       RatioOrNull(tokens_per_second, peak_tokens_per_second),
       WithCeiling(
           {{"config", config.name},
            {"median_step_s", median_step},
            {"median_forward_s", Median(forward_times)},
            {"median_backward_s", Median(backward_times)},
            {"note", "baseline: tokens/s if every model FLOP ran at the matmul peak; median step"}},
           ceiling));
}

// ---------------------------------------------------------------------------------------------
// Decode cost against context length.

// Decode configs: the small config's layer shapes shrunk to width 256 and 4 layers so a 1M
// prefill takes minutes on 2 cores. Every feed-forward is dense (hidden 512): the decode curve is
// about attention, experts would add the same per-token cost at every context and slow the
// prefill. Incremental and latent attention both use 4 heads of width 64, so the multi-head
// baseline (4 heads of width 64) is the same size.
ModelConfig DecodeConfig(const ModelConfig& base, const std::string& pattern,
                         int64_t max_context) {
  ModelConfig c = base;
  c.name = pattern == "I" ? "decode_incremental" : "decode_hybrid";
  c.width = 256;
  c.layers = 4;
  c.layer_pattern = pattern;
  c.last_layer = "";
  c.residual_block = 2;
  c.context = max_context + 4 * kKi;  // room for the timed tokens after the longest prefill
  c.cache_dtype = "float32";
  c.vision.enabled = false;
  c.incremental.heads = 4;
  c.incremental.key_dim = 64;
  c.incremental.value_dim = 64;
  c.incremental.decay_rank = 16;
  c.latent.heads = 4;
  c.latent.query_rank = 128;
  c.latent.kv_rank = 64;
  c.latent.nope_dim = 32;
  c.latent.rope_dim = 16;
  c.latent.value_dim = 64;
  c.feed_forward.dense_layers = c.layers;
  c.feed_forward.dense_hidden = 512;
  Check(ValidateModelConfig(c, c.name), "decode config");
  return c;
}

struct DecodePoint {
  int64_t context = 0;
  std::vector<double> seconds;  // one single-token Append each
  int64_t cache_bytes = 0;      // InferenceState::CacheBytes at the snapshot
  int64_t state_bytes = 0;
};

// Prefills one sequence to each context in `contexts` (ascending) with large chunks, keeps a
// snapshot at each, then times single-token appends round-robin over the snapshots so that
// noise from neighbouring jobs spreads evenly over the contexts.
//
// Snapshots are copies of the state's handles. Incremental states are replaced, never written
// in place, so copies are independent. Latent caches append in place past their own length, so
// a copy decoding at a short context may overwrite cached values that a longer snapshot holds
// in the same storage: values change, shapes and costs do not, which is all this measures.
std::vector<DecodePoint> MeasureModelDecode(const ModelConfig& config,
                                            const std::vector<int64_t>& contexts, int rounds) {
  at::NoGradGuard no_grad;
  std::unique_ptr<Model> model = Unwrap(Model::Create(config, /*seed=*/2), "creating " + config.name);
  model->SetRequiresGrad(false);
  InferenceState live = Unwrap(model->NewState(1), "new state");
  const int64_t latent_heads = config.CountLayers('G') > 0 ? config.latent.heads : 0;

  std::vector<DecodePoint> points;
  std::vector<InferenceState> snapshots;
  const double start = Seconds();
  for (int64_t context : contexts) {
    while (live.length() < context) {
      // Chunk length: large for the incremental layers' chunkwise kernel, but small enough that
      // a latent layer's (heads x chunk x context) fp32 score matrix stays near 512 MiB.
      int64_t chunk = 16 * kKi;
      if (latent_heads > 0) {
        const int64_t keys = std::max<int64_t>(live.length() + 1, 1);
        chunk = std::clamp<int64_t>((128 << 20) / (latent_heads * keys), 64, 16 * kKi);
      }
      chunk = std::min(chunk, context - live.length());
      ModelInput input;
      input.tokens = RandomTokens(1, chunk);
      Unwrap(model->Append(&live, input), "prefill");
    }
    Progress(config.name + ": prefilled " + ContextLabel(context) + " in " +
             std::to_string(static_cast<int64_t>(Seconds() - start)) + " s");
    DecodePoint point;
    point.context = context;
    point.cache_bytes = live.CacheBytes();
    point.state_bytes = live.StateBytes();
    points.push_back(point);
    snapshots.push_back(live);
  }

  ModelInput one;
  one.tokens = RandomTokens(1, 1);
  constexpr int kWarmupRounds = 3;  // first appends may grow a latent cache's storage
  for (int round = -kWarmupRounds; round < rounds; ++round) {
    for (size_t i = 0; i < snapshots.size(); ++i) {
      const double t0 = Seconds();
      Unwrap(model->Append(&snapshots[i], one), "decode");
      const double elapsed = Seconds() - t0;
      if (round >= 0) points[i].seconds.push_back(elapsed);
    }
  }
  return points;
}

// An equal-size decoder with full multi-head attention, written here because the model has no
// such layer kind. Per layer: RMSNorm, q/k/v projections (H heads of width Dh), the new key and
// value written into a preallocated cache (no copy of the past), softmax attention of the one
// query over every cached token, the output projection, RMSNorm and a dense SwiGLU feed-forward
// of the decode configs' hidden size; then the final norm and output head. It has no output gate
// and no attention-residual reads, so apart from attending over the cache it does a little less
// work per token than the model it is compared with. Cached keys and values are random: only the
// cost is measured.
class MultiHeadBaseline {
 public:
  MultiHeadBaseline(const ModelConfig& config, int64_t capacity)
      : heads_(config.latent.heads),
        head_dim_(config.latent.value_dim),
        capacity_(capacity) {
    at::NoGradGuard no_grad;
    const int64_t d = config.width;
    const int64_t inner = heads_ * head_dim_;
    const int64_t hidden = config.feed_forward.dense_hidden;
    auto weight = [](int64_t rows, int64_t columns) { return at::randn({rows, columns}) * 0.02; };
    for (int64_t i = 0; i < config.layers; ++i) {
      Layer layer;
      layer.attention_norm = at::ones({d});
      layer.query = weight(inner, d);
      layer.key = weight(inner, d);
      layer.value = weight(inner, d);
      layer.output = weight(d, inner);
      layer.feed_forward_norm = at::ones({d});
      layer.gate = weight(hidden, d);
      layer.up = weight(hidden, d);
      layer.down = weight(d, hidden);
      layer.keys = at::empty({heads_, capacity, head_dim_}).uniform_(-1, 1);
      layer.values = at::empty({heads_, capacity, head_dim_}).uniform_(-1, 1);
      layers_.push_back(std::move(layer));
    }
    final_norm_ = at::ones({d});
    output_ = weight(config.vocabulary, d);
    input_ = at::randn({1, d});
    epsilon_ = config.norm_epsilon;
  }

  static int64_t BytesPerToken(const ModelConfig& config) {
    return config.layers * 2 * config.latent.heads * config.latent.value_dim *
           static_cast<int64_t>(sizeof(float));
  }
  int64_t MeasuredBytesPerToken() const {
    int64_t bytes = 0;
    for (const Layer& layer : layers_) bytes += layer.keys.nbytes() + layer.values.nbytes();
    return bytes / capacity_;
  }

  // Decodes one token at position `context` (attending to context + 1 keys).
  at::Tensor Step(int64_t context) {
    at::NoGradGuard no_grad;
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
    at::Tensor x = input_;
    for (Layer& layer : layers_) {
      at::Tensor h = model::RmsNorm(x, layer.attention_norm, epsilon_);
      at::Tensor q = model::Linear(h, layer.query).view({heads_, 1, head_dim_});
      layer.keys.narrow(1, context, 1).copy_(
          model::Linear(h, layer.key).view({heads_, 1, head_dim_}));
      layer.values.narrow(1, context, 1).copy_(
          model::Linear(h, layer.value).view({heads_, 1, head_dim_}));
      at::Tensor keys = layer.keys.narrow(1, 0, context + 1);
      at::Tensor values = layer.values.narrow(1, 0, context + 1);
      at::Tensor probabilities = at::softmax(at::bmm(q, keys.transpose(1, 2)) * scale, -1);
      at::Tensor attended = at::bmm(probabilities, values).view({1, heads_ * head_dim_});
      x = x + model::Linear(attended, layer.output);
      h = model::RmsNorm(x, layer.feed_forward_norm, epsilon_);
      x = x + model::Linear(at::silu(model::Linear(h, layer.gate)) * model::Linear(h, layer.up),
                            layer.down);
    }
    return model::Linear(model::RmsNorm(x, final_norm_, epsilon_), output_);
  }

 private:
  struct Layer {
    at::Tensor attention_norm, query, key, value, output;
    at::Tensor feed_forward_norm, gate, up, down;
    at::Tensor keys, values;  // (H, capacity, Dh)
  };
  int64_t heads_;
  int64_t head_dim_;
  int64_t capacity_;
  double epsilon_ = 1e-6;
  std::vector<Layer> layers_;
  at::Tensor final_norm_, output_, input_;
};

std::vector<DecodePoint> MeasureBaselineDecode(const ModelConfig& config,
                                               const std::vector<int64_t>& contexts, int rounds) {
  const int64_t capacity = contexts.back() + 1;
  MultiHeadBaseline baseline(config, capacity);
  std::vector<DecodePoint> points;
  for (int64_t context : contexts) {
    DecodePoint point;
    point.context = context;
    point.cache_bytes = context * baseline.MeasuredBytesPerToken();
    points.push_back(point);
  }
  constexpr int kWarmupRounds = 3;
  for (int round = -kWarmupRounds; round < rounds; ++round) {
    for (DecodePoint& point : points) {
      const double t0 = Seconds();
      baseline.Step(point.context);
      const double elapsed = Seconds() - t0;
      if (round >= 0) point.seconds.push_back(elapsed);
    }
  }
  return points;
}

void RunDecode(const Options& options) {
  const ModelConfig small = Unwrap(LoadModelConfig(options.config_path), "loading the config");
  std::vector<int64_t> incremental_contexts =
      options.quick ? std::vector<int64_t>{kKi, 4 * kKi, 16 * kKi}
                    : std::vector<int64_t>{kKi, 16 * kKi, 128 * kKi, kKi * kKi};
  std::vector<int64_t> hybrid_contexts =
      options.quick ? std::vector<int64_t>{kKi, 4 * kKi, 16 * kKi}
                    : std::vector<int64_t>{kKi, 16 * kKi, 128 * kKi, 256 * kKi};
  const int rounds = options.quick ? 10 : 40;
  auto capped = [](std::vector<int64_t> contexts, int64_t cap) {
    if (cap <= 0) return contexts;
    std::vector<int64_t> kept;
    for (int64_t context : contexts) {
      if (context <= cap) kept.push_back(context);
    }
    if (kept.empty() || kept.back() < cap) kept.push_back(cap);
    return kept;
  };
  incremental_contexts = capped(incremental_contexts, options.max_context);
  hybrid_contexts = capped(hybrid_contexts, options.hybrid_max_context > 0
                                                ? options.hybrid_max_context
                                                : options.max_context);

  const ModelConfig incremental = DecodeConfig(small, "I", incremental_contexts.back());
  const ModelConfig hybrid = DecodeConfig(small, "IIIG", hybrid_contexts.back());

  // Multi-head baseline contexts: every context either model reached (plus 512K to show the
  // growth), as far as the KV cache fits the budget.
  const int64_t baseline_bytes_per_token = MultiHeadBaseline::BytesPerToken(incremental);
  const double budget_bytes = options.mha_budget_gib * kKi * kKi * kKi;
  std::vector<int64_t> baseline_contexts;
  std::vector<int64_t> wanted = incremental_contexts;
  wanted.insert(wanted.end(), hybrid_contexts.begin(), hybrid_contexts.end());
  if (!options.quick) wanted.push_back(512 * kKi);
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  int64_t largest_unfit = 0;
  for (int64_t context : wanted) {
    if (static_cast<double>(context + 1) * baseline_bytes_per_token <= budget_bytes) {
      baseline_contexts.push_back(context);
    } else if (largest_unfit == 0) {
      largest_unfit = context;
    }
  }

  Progress("decode: incremental-only config to " + ContextLabel(incremental_contexts.back()));
  const std::vector<DecodePoint> ours_incremental =
      MeasureModelDecode(incremental, incremental_contexts, rounds);
  Progress("decode: hybrid config to " + ContextLabel(hybrid_contexts.back()));
  const std::vector<DecodePoint> ours_hybrid = MeasureModelDecode(hybrid, hybrid_contexts, rounds);
  Progress("decode: multi-head baseline to " + ContextLabel(baseline_contexts.back()));
  const std::vector<DecodePoint> baseline =
      MeasureBaselineDecode(incremental, baseline_contexts, rounds);

  std::map<int64_t, double> baseline_ms;
  for (const DecodePoint& point : baseline) baseline_ms[point.context] = 1e3 * Median(point.seconds);

  const std::string shape =
      "width 256, 4 layers, 4 heads of width 64, dense SiTU-GLU hidden 512, fp32, batch 1";
  auto emit_curve = [&](const std::string& metric, const ModelConfig& config,
                        const std::vector<DecodePoint>& points) {
    for (const DecodePoint& point : points) {
      const double ms = 1e3 * Median(point.seconds);
      const auto b = baseline_ms.find(point.context);
      const double base = b == baseline_ms.end() ? std::nan("") : b->second;
      Emit(metric, ms, "ms/token", base, RatioOrNull(ms, base),
           {{"context", point.context},
            {"config", config.name + " (" + config.layer_pattern + "; " + shape + ")"},
            {"cache_bytes", point.cache_bytes},
            {"state_bytes", point.state_bytes},
            {"min_ms", 1e3 * Min(point.seconds)},
            {"samples", static_cast<int64_t>(point.seconds.size())},
            {"note", b == baseline_ms.end()
                         ? "multi-head baseline KV cache does not fit the memory budget here"
                         : "baseline: equal-size full multi-head attention decode step"}});
    }
  };
  emit_curve("decode_incremental", incremental, ours_incremental);
  emit_curve("decode_hybrid", hybrid, ours_hybrid);
  for (const DecodePoint& point : baseline) {
    Emit("decode_mha_baseline", 1e3 * Median(point.seconds), "ms/token", JsonValue::Null(),
         JsonValue::Null(),
         {{"context", point.context},
          {"kv_cache_bytes", point.cache_bytes},
          {"min_ms", 1e3 * Min(point.seconds)},
          {"note", "full multi-head attention, " + shape + "; KV cache preallocated, random"}});
  }
  if (largest_unfit > 0) {
    Emit("decode_mha_baseline", JsonValue::Null(), "ms/token", JsonValue::Null(),
         JsonValue::Null(),
         {{"context", largest_unfit},
          {"kv_cache_bytes", largest_unfit * baseline_bytes_per_token},
          {"note", "not run: KV cache exceeds the " + JsonValue(options.mha_budget_gib).text() +
                       " GiB budget"}});
  }

  // Long-over-short cost ratios: flat for incremental layers, growing for cached attention.
  auto long_over_short = [](const std::vector<DecodePoint>& points) {
    return Median(points.back().seconds) / Median(points.front().seconds);
  };
  auto label = [](const std::vector<DecodePoint>& points) {
    return ContextLabel(points.back().context) + "/" + ContextLabel(points.front().context);
  };
  const double incremental_ratio = long_over_short(ours_incremental);
  const double baseline_ratio = long_over_short(baseline);
  Emit("decode_incremental_cost_ratio", incremental_ratio, "x", baseline_ratio,
       RatioOrNull(incremental_ratio, baseline_ratio),
       {{"contexts", label(ours_incremental)},
        {"baseline_contexts", label(baseline)},
        {"target_max", 1.3},
        {"met", incremental_ratio <= 1.3},
        {"note", "median decode cost at the longest over the shortest context; baseline: the "
                 "multi-head decoder's ratio over its own range"}});
  const double hybrid_ratio = long_over_short(ours_hybrid);
  Emit("decode_hybrid_cost_ratio", hybrid_ratio, "x", baseline_ratio,
       RatioOrNull(hybrid_ratio, baseline_ratio),
       {{"contexts", label(ours_hybrid)}, {"baseline_contexts", label(baseline)}});

  // Measured cache growth of the hybrid against the baseline's allocated KV bytes per token.
  const DecodePoint& first = ours_hybrid.front();
  const DecodePoint& last = ours_hybrid.back();
  const double hybrid_bytes_per_token =
      static_cast<double>(last.cache_bytes - first.cache_bytes) / (last.context - first.context);
  const double measured_baseline = static_cast<double>(baseline_bytes_per_token);
  Emit("cache_bytes_per_token_measured", hybrid_bytes_per_token, "bytes/token", measured_baseline,
       RatioOrNull(hybrid_bytes_per_token, measured_baseline),
       {{"config", hybrid.name},
        {"note", "growth of InferenceState::CacheBytes between " + ContextLabel(first.context) +
                     " and " + ContextLabel(last.context) +
                     " (1 latent layer of 4) against the multi-head baseline's KV bytes per "
                     "token (4 layers)"}});
}

// ---------------------------------------------------------------------------------------------
// Cache bytes per token, from the configs' accounting.

void RunCache(const Options& options) {
  const std::string configs_dir = std::string(STRIDER_SOURCE_DIR) + "/configs/model/";
  std::vector<std::pair<std::string, ModelConfig>> configs;
  configs.emplace_back("reference",
                       Unwrap(LoadModelConfig(configs_dir + "reference.yaml"), "reference config"));
  configs.emplace_back("small", Unwrap(LoadModelConfig(options.config_path), "small config"));
  for (const auto& [label, config] : configs) {
    const CacheAccounting a = AccountCaches(config);
    const int64_t bytes = config.CacheDtypeBytes();
    const double ours_layer = static_cast<double>(a.kv_cache_values_per_token_per_layer * bytes);
    const double base_layer =
        static_cast<double>(a.baseline_kv_values_per_token_per_layer * bytes);
    Emit("latent_cache_bytes_per_token_per_layer", ours_layer, "bytes/token", base_layer,
         RatioOrNull(ours_layer, base_layer),
         {{"config", config.name},
          {"cache_dtype", config.cache_dtype},
          {"target_ratio_max", 0.1},
          {"met", ours_layer <= 0.1 * base_layer},
          {"note", "(d_c + d_rope) per latent layer against 2*H*d_h of multi-head attention "
                   "with the same heads (AccountCaches)"}});
    const double ours_model = static_cast<double>(a.kv_cache_bytes_per_token);
    const double base_model = static_cast<double>(a.baseline_kv_cache_bytes_per_token);
    Emit("cache_bytes_per_token", ours_model, "bytes/token", base_model,
         RatioOrNull(ours_model, base_model),
         {{"config", config.name},
          {"latent_layers", config.CountLayers('G')},
          {"layers", config.layers},
          {"state_bytes_per_sequence", a.state_bytes_per_sequence},
          {"sequence_bytes_at_context", a.sequence_bytes_at_context},
          {"baseline_sequence_bytes_at_context", a.baseline_sequence_bytes_at_context},
          {"context", config.context},
          {"note", "whole model: latent layers only cache; baseline caches keys and values in "
                   "every layer"}});
  }
}

// ---------------------------------------------------------------------------------------------
// Latent attention's long prefill (kernels::LatentAttentionPrefill, the inference path) and the
// blockwise training kernel (kernels::LatentAttentionBlockwise, forward and backward), as
// attention FLOP rates against the fp32 matmul peak and against the matmul rate at the kernels'
// own tile shapes, both measured in this run.
//
// FLOPs count query-key pairs the causal mask keeps, per head: 2W for the score and 2Dc for the
// weighted latent forward (W = Dc + Dr); the backward recomputes the score and adds dV, dP, dQ
// and dK: 6W + 4Dc. Exponentials and the softmax's bookkeeping are not counted, which is what
// bounds narrow heads: with Dc 16 a score costs 80 counted FLOPs and about as much elementwise
// work again.

void RunAttention(const Options& options) {
  bench::CeilingSpec spec;
  spec.threads = options.threads;
  const bench::Ceiling ceiling = Unwrap(bench::MeasureCeiling(spec), "matmul peak");
  const std::string configs_dir = std::string(STRIDER_SOURCE_DIR) + "/configs/model/";
  struct Shape {
    std::string label;
    int64_t tokens, past;
    bool backward;
  };
  std::vector<Shape> shapes;
  if (options.quick) {
    shapes = {{"2K", 2 * kKi, 0, true}, {"1K_after_8K", kKi, 8 * kKi, false}};
  } else {
    shapes = {{"16K", 16 * kKi, 0, true},
              {"64K", 64 * kKi, 0, false},
              {"4K_after_256K", 4 * kKi, 256 * kKi, false}};
  }
  for (const std::string name : {"small", "tiny"}) {
    const ModelConfig config =
        Unwrap(LoadModelConfig(configs_dir + name + ".yaml"), name + " config");
    const LatentAttentionConfig& c = config.latent;
    const int64_t heads = c.heads, rank = c.kv_rank, width = c.kv_rank + c.rope_dim;
    // The kernels' products: prefill tiles of 2048 query rows against 512 keys (scores, then
    // the weighted latent), blockwise tiles of 1024 x 1024.
    const double prefill_tile = bench::LatentPrefillTileRate(width, rank);
    const double blockwise_tile = std::min(bench::MatmulRateHere(1024, width, 1024, 5, 20),
                                           bench::MatmulRateHere(1024, 1024, rank, 5, 20));
    for (const Shape& shape : shapes) {
      const int64_t keys = shape.past + shape.tokens;
      const double pairs = static_cast<double>(shape.tokens) * shape.past +
                           0.5 * static_cast<double>(shape.tokens) * (shape.tokens + 1);
      const double forward_flops = pairs * heads * (2.0 * width + 2.0 * rank);
      const double backward_flops = pairs * heads * (6.0 * width + 4.0 * rank);
      at::Tensor query = at::randn({1, shape.tokens, heads, width}) * 0.1;
      at::Tensor latent = at::randn({1, keys, rank});
      at::Tensor rope = at::randn({1, keys, c.rope_dim});
      kernels::LatentAttentionPages pages(1);
      if (shape.past > 0) {
        pages[0].push_back({latent[0].narrow(0, 0, shape.past), rope[0].narrow(0, 0, shape.past)});
      }
      at::Tensor new_latent = latent.narrow(1, shape.past, shape.tokens).contiguous();
      at::Tensor new_rope = rope.narrow(1, shape.past, shape.tokens).contiguous();
      Progress("attention: " + config.name + " " + shape.label + " prefill");
      double t0 = Seconds();
      at::Tensor out = kernels::LatentAttentionPrefill(query, pages, new_latent, new_rope);
      const double prefill_seconds = Seconds() - t0;
      const double prefill_rate = forward_flops / prefill_seconds / 1e9;
      Extras extras = {{"config", config.name},
                       {"tokens", shape.tokens},
                       {"past", shape.past},
                       {"heads", heads},
                       {"kv_rank", rank},
                       {"rope_dim", c.rope_dim},
                       {"seconds", prefill_seconds},
                       {"attention_gflop", forward_flops / 1e9},
                       {"tile_matmul_gflops", prefill_tile},
                       {"ratio_to_tile_matmul", RatioOrNull(prefill_rate, prefill_tile)},
                       {"target_ratio_min", config.name == "small" ? JsonValue(0.5) : JsonValue::Null()}};
      Emit("prefill_attention_flop_rate_" + config.name + "_" + shape.label, prefill_rate,
           "GFLOP/s", ceiling.value, RatioOrNull(prefill_rate, ceiling.value),
           WithCeiling(extras, ceiling));
      if (!shape.backward) continue;
      Progress("attention: " + config.name + " " + shape.label + " blockwise forward and backward");
      at::Tensor q = query.clone().requires_grad_();
      at::Tensor l = latent.clone().requires_grad_();
      at::Tensor r = rope.clone().requires_grad_();
      t0 = Seconds();
      at::Tensor y = kernels::LatentAttentionBlockwise(q, l, r);
      const double forward_seconds = Seconds() - t0;
      at::Tensor upstream = at::randn_like(y);
      t0 = Seconds();
      y.backward(upstream);
      const double backward_seconds = Seconds() - t0;
      const double difference = (y.detach() - out).abs().max().item<double>();
      if (!(difference < 1e-3)) {
        std::cerr << "model_bench: the blockwise forward differs from the prefill kernel by "
                  << difference << "\n";
        std::exit(1);
      }
      for (const auto& [metric, flops, seconds] :
           {std::tuple{"blockwise_forward", forward_flops, forward_seconds},
            std::tuple{"blockwise_backward", backward_flops, backward_seconds}}) {
        const double rate = flops / seconds / 1e9;
        Extras more = {{"config", config.name},
                       {"tokens", shape.tokens},
                       {"past", shape.past},
                       {"seconds", seconds},
                       {"attention_gflop", flops / 1e9},
                       {"tile_matmul_gflops", blockwise_tile},
                       {"ratio_to_tile_matmul", RatioOrNull(rate, blockwise_tile)},
                       {"scores_bytes_materialised",
                        static_cast<double>(heads) * shape.tokens * keys * 4.0},
                       {"note", "memory O(T x H x Dc) plus one 1024 x 1024 tile; the "
                                "materialised form would hold scores_bytes_materialised"}};
        Emit(std::string(metric) + "_flop_rate_" + config.name + "_" + shape.label, rate,
             "GFLOP/s", ceiling.value, RatioOrNull(rate, ceiling.value),
             WithCeiling(more, ceiling));
      }
    }
  }
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  auto usage = [&]() {
    std::cerr << "usage: " << argv[0]
              << " [--quick] [--only train|decode|cache|attention] [--config PATH] [--threads N]"
                 " [--mha-budget-gib G] [--max-context N] [--hybrid-max-context N]\n"
              << "       " << argv[0]
              << " --device cuda[:N] [--quick] [--gpu-sections decode,prefill,train,publish]"
                 " [--gpu-configs gpu_1b,small]\n";
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (arg == "--quick") {
      options.quick = true;
    } else if (arg == "--only") {
      options.only = next();
      if (options.only != "train" && options.only != "decode" && options.only != "cache" &&
          options.only != "attention") {
        usage();
      }
    } else if (arg == "--config") {
      options.config_path = next();
    } else if (arg == "--threads") {
      options.threads = std::stoll(next());
    } else if (arg == "--max-context") {
      options.max_context = std::stoll(next());
    } else if (arg == "--hybrid-max-context") {
      options.hybrid_max_context = std::stoll(next());
    } else if (arg == "--mha-budget-gib") {
      options.mha_budget_gib = std::stod(next());
    } else if (arg == "--device") {
      options.device = next();
    } else if (arg == "--gpu-sections") {
      options.gpu.sections = SplitCommas(next());
    } else if (arg == "--gpu-configs") {
      options.gpu.configs = SplitCommas(next());
      if (options.gpu.configs.empty()) usage();
    } else {
      usage();
    }
  }
  return options;
}

}  // namespace
}  // namespace strider

int main(int argc, char** argv) {
  using namespace strider;
  if (std::optional<int> child = bench::RunCeilingChild(argc, argv)) return *child;
  bench::EveryLineFields() = bench::RunPolicyFields();
  Options options = ParseOptions(argc, argv);
  if (!options.device.empty() && options.device != "cpu") {
    options.gpu.device = options.device;
    options.gpu.quick = options.quick;
    bench::EveryLineFields().clear();  // the CPU's OpenMP wait policy says nothing here
    return bench::RunGpuSections(options.gpu);
  }
  ConfigureRuntime(options.threads);
  at::manual_seed(0);
  const double start = Seconds();
  if (options.only.empty() || options.only == "cache") RunCache(options);
  if (options.only.empty() || options.only == "train") RunTraining(options);
  if (options.only.empty() || options.only == "decode") RunDecode(options);
  if (options.only.empty() || options.only == "attention") RunAttention(options);
  Progress("done in " + std::to_string(static_cast<int64_t>(Seconds() - start)) + " s");
  return 0;
}
