// CUDA decode kernels against the ceilings measured in the same run (docs/cuda.md):
//   - the gated delta rule step moves its state through memory, so its rate is compared with a
//     device-to-device copy of the same order of bytes (read + write counted, like the step);
//   - the latent-attention decode is compared with the larger of two bounds: the compressed
//     cache read once at copy bandwidth, and its multiply-adds at the fp32 FMA rate that a
//     register-only kernel reaches on this device.
// Prints JSON lines (bench/bench_json.h). Needs a GPU; exits 2 with the reason without one.
//   cuda_bench [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_json.h"
#include "common/kernels/cuda/decode_kernels.h"

namespace strider::kernels::cuda {
namespace {

using bench::JsonNumber;
using bench::JsonString;
using bench::PrintResult;

#define CHECK_CUDA(call)                                                              \
  do {                                                                                \
    cudaError_t error_ = (call);                                                      \
    if (error_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "cuda_bench: %s: %s\n", #call, cudaGetErrorString(error_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (false)

void CheckStatus(const Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "cuda_bench: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

// Fills device memory with values in [-1, 1) without a host round trip.
__global__ void FillKernel(float* data, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    data[i] = static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

float* DeviceRandom(size_t count, uint32_t seed) {
  float* ptr = nullptr;
  CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(count, 1) * sizeof(float)));
  FillKernel<<<1024, 256>>>(ptr, count, seed);
  CHECK_CUDA(cudaGetLastError());
  return ptr;
}

// Eight independent multiply-add chains per thread, all in registers: the fp32 FMA ceiling.
constexpr int kFmaChains = 8;
__global__ void FmaPeakKernel(float* sink, int iterations, float b, float c) {
  float acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = threadIdx.x * 1e-3f + i;
  for (int it = 0; it < iterations; ++it) {
#pragma unroll
    for (int i = 0; i < kFmaChains; ++i) acc[i] = fmaf(acc[i], b, c);
  }
  float total = 0.0f;
  for (int i = 0; i < kFmaChains; ++i) total += acc[i];
  if (total == 12345.678f) sink[0] = total;  // never true; keeps the loop alive
}

// Milliseconds per call of `fn`, the median of `reps` timed calls after `warmup` untimed ones.
// Every one of `batch` sequences at `context` tokens, in device memory.
int32_t* DeviceLengths(int64_t batch, int64_t context) {
  int32_t* lengths = nullptr;
  CHECK_CUDA(cudaMalloc(&lengths, batch * sizeof(int32_t)));
  std::vector<int32_t> host_lengths(batch, static_cast<int32_t>(context));
  CHECK_CUDA(cudaMemcpy(lengths, host_lengths.data(), batch * sizeof(int32_t),
                        cudaMemcpyHostToDevice));
  return lengths;
}

// A decode workspace of `bytes`; null when the kernel needs none.
void* DeviceWorkspace(size_t bytes) {
  void* ws = nullptr;
  if (bytes > 0) CHECK_CUDA(cudaMalloc(&ws, bytes));
  return ws;
}

template <typename Fn>
double MedianMs(int warmup, int reps, Fn fn) {
  for (int i = 0; i < warmup; ++i) fn();
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    fn();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Device-to-device copy rate in bytes/s, read and written bytes both counted.
double CopyBandwidth(size_t bytes, int reps) {
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  CHECK_CUDA(cudaMemset(src, 1, bytes));
  const double ms = MedianMs(2, reps, [&] {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
  });
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  return 2.0 * bytes / (ms * 1e-3);
}

// fp32 FLOP/s (an FMA counted as 2) of FmaPeakKernel over the whole device.
double FmaPeak(int sms) {
  float* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&sink, sizeof(float)));
  const int blocks = sms * 8, threads = 256, iterations = 1 << 14;
  const double ms = MedianMs(2, 10, [&] {
    FmaPeakKernel<<<blocks, threads>>>(sink, iterations, 0.999f, 1e-3f);
  });
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaFree(sink));
  return 2.0 * kFmaChains * double(iterations) * blocks * threads / (ms * 1e-3);
}

void BenchDeltaRule(int64_t batch, int64_t heads, int64_t dk, int64_t dv, double copy_bw,
                    int reps) {
  const GatedDeltaRuleDecodeDims dims{batch, heads, dk, dv};
  const size_t bh = batch * heads;
  float* state = DeviceRandom(bh * dk * dv, 1);
  float* q = DeviceRandom(bh * dk, 2);
  float* k = DeviceRandom(bh * dk, 3);
  float* v = DeviceRandom(bh * dv, 4);
  float* g = DeviceRandom(bh * dk, 5);
  float* beta = DeviceRandom(bh, 6);
  float* out = DeviceRandom(bh * dv, 7);
  // Keys must be unit vectors and decays <= 0 for a stable recurrence; for timing, any finite
  // values do, but they must stay finite over the repetitions: scale them down once.
  CHECK_CUDA(cudaMemset(g, 0x80, bh * dk * sizeof(float)));   // -tiny: decay ~ 1
  CHECK_CUDA(cudaMemset(beta, 0, bh * sizeof(float)));        // beta = 0: state only decays
  const double ms = MedianMs(3, reps, [&] {
    CheckStatus(GatedDeltaRuleDecodeStep(dims, state, q, k, v, g, beta, out, nullptr),
                "GatedDeltaRuleDecodeStep");
  });
  CHECK_CUDA(cudaDeviceSynchronize());
  const double bytes = 4.0 * bh * (2.0 * dk * dv + 3.0 * dk + 2.0 * dv + 1.0);
  const double rate = bytes / (ms * 1e-3);
  char shape[96];
  std::snprintf(shape, sizeof(shape), "B%lldH%lldDk%lldDv%lld", (long long)batch,
                (long long)heads, (long long)dk, (long long)dv);
  PrintResult("cuda_bench", "gated_delta_rule_step_bandwidth", rate / 1e9, "GB/s", copy_bw / 1e9,
              {{"shape", JsonString(shape)},
               {"state_bytes", JsonNumber(4.0 * bh * dk * dv)},
               {"step_us", JsonNumber(ms * 1e3)},
               {"baseline_is", JsonString("device-to-device copy, read+write bytes")}});
  for (float* p : {state, q, k, v, g, beta, out}) CHECK_CUDA(cudaFree(p));
}

void BenchLatent(const char* name, int64_t batch, int64_t heads, int64_t context,
                 double copy_bw, double fma_peak, int reps) {
  LatentAttentionDecodeDims dims;
  dims.batch = batch;
  dims.heads = heads;
  dims.latent_dim = 512;  // reference widths (docs/model_math.md)
  dims.rope_dim = 64;
  dims.capacity = context;
  dims.scale = 1.0f / std::sqrt(192.0f);
  const size_t rows = size_t(batch) * context;
  float* aq = DeviceRandom(batch * heads * dims.latent_dim, 11);
  float* rq = DeviceRandom(batch * heads * dims.rope_dim, 12);
  float* latent = DeviceRandom(rows * dims.latent_dim, 13);
  float* rope = DeviceRandom(rows * dims.rope_dim, 14);
  float* out = DeviceRandom(batch * heads * dims.latent_dim, 15);
  float* lse = DeviceRandom(batch * heads, 16);
  int32_t* lengths = DeviceLengths(batch, context);
  const size_t ws_bytes = LatentAttentionDecodeWorkspaceBytes(dims);
  void* ws = DeviceWorkspace(ws_bytes);
  const double ms = MedianMs(3, reps, [&] {
    CheckStatus(LatentAttentionDecode(dims, aq, rq, latent, rope, lengths, out, lse, ws,
                                      ws_bytes, nullptr),
                "LatentAttentionDecode");
  });
  CHECK_CUDA(cudaDeviceSynchronize());
  const double cache_bytes = 4.0 * rows * (dims.latent_dim + dims.rope_dim);
  const double flops =
      2.0 * rows * heads * (2.0 * dims.latent_dim + dims.rope_dim);  // scores + weighted sum
  const double bound_ms = 1e3 * std::max(cache_bytes / copy_bw, flops / fma_peak);
  const char* limit = cache_bytes / copy_bw > flops / fma_peak ? "memory" : "fp32 FMA";
  PrintResult("cuda_bench", std::string("latent_decode_") + name, ms, "ms", bound_ms,
              {{"batch", JsonNumber(batch)},
               {"heads", JsonNumber(heads)},
               {"context", JsonNumber(context)},
               {"cache_bytes", JsonNumber(cache_bytes)},
               {"gflop", JsonNumber(flops / 1e9)},
               {"tflops", JsonNumber(flops / (ms * 1e-3) / 1e12)},
               {"cache_read_gbs", JsonNumber(cache_bytes / (ms * 1e-3) / 1e9)},
               {"bound", JsonString(limit)},
               {"baseline_is", JsonString("max(cache once at copy bandwidth, FLOP at FMA peak); "
                                          "ratio = time / bound, 1 is the roofline")}});
  for (float* p : {aq, rq, latent, rope, out, lse}) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(lengths));
  if (ws != nullptr) CHECK_CUDA(cudaFree(ws));
}

// Gathers scattered pages into a contiguous (S, W) cache, one block per page: the alternative
// to reading the pages in place (the paged kernel), timed with the contiguous kernel after it.
__global__ void GatherPagesKernel(const float* const* pages, int64_t page_rows, int64_t width,
                                  float* out) {
  const float* page = pages[blockIdx.x];
  float* target = out + static_cast<int64_t>(blockIdx.x) * page_rows * width;
  for (int64_t i = threadIdx.x; i < page_rows * width; i += blockDim.x) target[i] = page[i];
}

// The latent decode over the rollout engine's layout (256-row blocks of [c_kv; k_rope] rows,
// scattered through a pool) against the contiguous kernel on the same rows, and against
// gathering the pages into a contiguous cache first.
void BenchLatentPaged(const char* name, int64_t batch, int64_t heads, int64_t context,
                      double copy_bw, int reps) {
  constexpr int64_t kPageRows = 256;
  LatentAttentionDecodeDims dims;
  dims.batch = batch;
  dims.heads = heads;
  dims.latent_dim = 512;
  dims.rope_dim = 64;
  const int64_t width = dims.latent_dim + dims.rope_dim;
  const int64_t pages_per_row = (context + kPageRows - 1) / kPageRows;
  dims.capacity = pages_per_row * kPageRows;
  dims.scale = 1.0f / std::sqrt(192.0f);
  const int64_t blocks = batch * pages_per_row;
  float* pool = DeviceRandom(size_t(blocks) * kPageRows * width, 21);
  float* aq = DeviceRandom(batch * heads * dims.latent_dim, 22);
  float* rq = DeviceRandom(batch * heads * dims.rope_dim, 23);
  float* out = DeviceRandom(batch * heads * dims.latent_dim, 24);
  float* gathered = nullptr;
  CHECK_CUDA(cudaMalloc(&gathered, size_t(blocks) * kPageRows * width * sizeof(float)));
  // Sequence b's page p is pool block (p * batch + b) reversed: no two neighbours adjacent.
  std::vector<const float*> latent_pages(blocks), rope_pages(blocks);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t p = 0; p < pages_per_row; ++p) {
      const int64_t block = blocks - 1 - (p * batch + b);
      latent_pages[b * pages_per_row + p] = pool + block * kPageRows * width;
      rope_pages[b * pages_per_row + p] = latent_pages[b * pages_per_row + p] + dims.latent_dim;
    }
  }
  const float** tables = nullptr;
  CHECK_CUDA(cudaMalloc(&tables, 2 * blocks * sizeof(float*)));
  CHECK_CUDA(cudaMemcpy(tables, latent_pages.data(), blocks * sizeof(float*),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(tables + blocks, rope_pages.data(), blocks * sizeof(float*),
                        cudaMemcpyHostToDevice));
  int32_t* lengths = DeviceLengths(batch, context);
  const size_t ws_bytes = LatentAttentionDecodeWorkspaceBytes(dims);
  void* ws = DeviceWorkspace(ws_bytes);
  LatentAttentionPagedCache cache;
  cache.latent_pages = tables;
  cache.rope_pages = tables + blocks;
  cache.max_pages = pages_per_row;
  cache.page_rows = kPageRows;
  cache.latent_row_stride = width;
  cache.rope_row_stride = width;
  const double paged_ms = MedianMs(3, reps, [&] {
    CheckStatus(LatentAttentionDecodePaged(dims, aq, rq, cache, lengths, out, nullptr, ws,
                                           ws_bytes, nullptr),
                "LatentAttentionDecodePaged");
  });
  // The same rows gathered once, read contiguously: [c_kv; k_rope] rows of one buffer, so the
  // contiguous kernel's separate latent and rope arrays are strided views it cannot take; the
  // paged kernel with one page per sequence reads exactly the contiguous layout instead.
  GatherPagesKernel<<<static_cast<unsigned>(blocks), 256>>>(tables, kPageRows, width, gathered);
  CHECK_CUDA(cudaGetLastError());
  std::vector<const float*> whole(2 * batch);
  for (int64_t b = 0; b < batch; ++b) {
    whole[b] = gathered + b * pages_per_row * kPageRows * width;
    whole[batch + b] = whole[b] + dims.latent_dim;
  }
  const float** whole_tables = nullptr;
  CHECK_CUDA(cudaMalloc(&whole_tables, 2 * batch * sizeof(float*)));
  CHECK_CUDA(cudaMemcpy(whole_tables, whole.data(), 2 * batch * sizeof(float*),
                        cudaMemcpyHostToDevice));
  LatentAttentionPagedCache contiguous = cache;
  contiguous.latent_pages = whole_tables;
  contiguous.rope_pages = whole_tables + batch;
  contiguous.max_pages = 1;
  contiguous.page_rows = dims.capacity;
  const double contiguous_ms = MedianMs(3, reps, [&] {
    CheckStatus(LatentAttentionDecodePaged(dims, aq, rq, contiguous, lengths, out, nullptr, ws,
                                           ws_bytes, nullptr),
                "LatentAttentionDecodePaged (one page)");
  });
  const double gather_ms = MedianMs(3, reps, [&] {
    GatherPagesKernel<<<static_cast<unsigned>(blocks), 256>>>(tables, kPageRows, width, gathered);
    CheckStatus(LatentAttentionDecodePaged(dims, aq, rq, contiguous, lengths, out, nullptr, ws,
                                           ws_bytes, nullptr),
                "LatentAttentionDecodePaged after a gather");
  });
  CHECK_CUDA(cudaDeviceSynchronize());
  const double cache_bytes = 4.0 * double(batch) * context * width;
  const bench::JsonFields fields = {{"batch", JsonNumber(batch)},
                                    {"heads", JsonNumber(heads)},
                                    {"context", JsonNumber(context)},
                                    {"page_rows", JsonNumber(kPageRows)},
                                    {"cache_bytes", JsonNumber(cache_bytes)}};
  bench::JsonFields paged_fields = fields;
  paged_fields.push_back({"baseline_is", JsonString("the same rows read contiguously (one page "
                                                    "per sequence); ratio 1: paging is free")});
  PrintResult("cuda_bench", std::string("latent_decode_paged_") + name, paged_ms, "ms",
              contiguous_ms, paged_fields);
  bench::JsonFields gather_fields = fields;
  gather_fields.push_back({"baseline_is", JsonString("the paged kernel reading the pages in "
                                                     "place; ratio > 1: gathering first costs")});
  gather_fields.push_back({"gather_copy_bound_ms", JsonNumber(1e3 * 2 * cache_bytes / copy_bw)});
  PrintResult("cuda_bench", std::string("latent_decode_gather_then_contiguous_") + name,
              gather_ms, "ms", paged_ms, gather_fields);
  for (float* p : {pool, aq, rq, out, gathered}) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFree(tables));
  CHECK_CUDA(cudaFree(whole_tables));
  CHECK_CUDA(cudaFree(lengths));
  if (ws != nullptr) CHECK_CUDA(cudaFree(ws));
}

int Main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::string why;
  if (!CudaDeviceAvailable(&why)) {
    std::fprintf(stderr, "cuda_bench: no CUDA device: %s\n", why.c_str());
    return 2;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int driver = 0;
  CHECK_CUDA(cudaDriverGetVersion(&driver));
  const char* commit = std::getenv("STRIDER_COMMIT");
  bench::EveryLineFields() = {
      {"device", JsonString(prop.name)},
      {"cuda_driver_api", JsonNumber(driver)},
      {"commit", JsonString(commit != nullptr ? commit : "unknown")}};
  const int reps = quick ? 5 : 20;
  const double copy_bw = CopyBandwidth(size_t{1} << 30, reps);
  const double fma_peak = FmaPeak(prop.multiProcessorCount);
  PrintResult("cuda_bench", "copy_bandwidth", copy_bw / 1e9, "GB/s", std::nullopt,
              {{"sms", JsonNumber(prop.multiProcessorCount)},
               {"l2_bytes", JsonNumber(prop.l2CacheSize)}});
  PrintResult("cuda_bench", "fp32_fma_peak", fma_peak / 1e12, "TFLOP/s", std::nullopt);

  // States well beyond L2, so the step really goes to memory: 4096 and 1024 heads of 128 x 128.
  BenchDeltaRule(64, 64, 128, 128, copy_bw, reps);
  BenchDeltaRule(16, 64, 128, 128, copy_bw, reps);
  BenchDeltaRule(1, 96, 128, 128, copy_bw, reps);  // one sequence, reference heads

  BenchLatent("1M_context_16_heads", 1, 16, 1 << 20, copy_bw, fma_peak, reps);
  BenchLatent("1M_context_96_heads", 1, 96, 1 << 20, copy_bw, fma_peak, reps);
  BenchLatent("64K_context_16_heads", 1, 16, 1 << 16, copy_bw, fma_peak, reps);
  BenchLatent("batch32_32K_16_heads", 32, 16, 1 << 15, copy_bw, fma_peak, reps);

  BenchLatentPaged("1M_context_16_heads", 1, 16, 1 << 20, copy_bw, reps);
  BenchLatentPaged("batch32_32K_16_heads", 32, 16, 1 << 15, copy_bw, reps);
  BenchLatentPaged("batch64_4K_12_heads", 64, 12, 4096, copy_bw, reps);
  return 0;
}

}  // namespace
}  // namespace strider::kernels::cuda

int main(int argc, char** argv) { return strider::kernels::cuda::Main(argc, argv); }
