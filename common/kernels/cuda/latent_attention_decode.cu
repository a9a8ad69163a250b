// Absorbed latent-attention decode on the GPU (docs/model_math.md#latent-attention), flash-decoding
// style.
//
// Design decisions:
//   - All heads attend to the same cached rows [c_s; kr_s] (Dc + Dr values). A block therefore
//     serves a group of kHeadsPerBlock heads: each cache row is read from global memory once
//     per group rather than once per head, which divides the dominant traffic (the cache, up to
//     1M rows per sequence) by the group size.
//   - The context is cut into splits of whole tiles; grid = (splits, head groups, sequences).
//     Each block runs an online softmax over its split (running max m, running sum l,
//     unnormalised weighted latent), writes (O, m, l) to the workspace, and a second kernel
//     merges the splits of each (sequence, head) with weights exp(m_i - M) / L. The split count
//     depends only on the dims (not the device), so results are reproducible across GPUs.
//   - Per tile of kTile rows: the rows are staged in shared memory (odd row stride, so that
//     the 32 lanes of a warp, one row each, hit 32 different banks); warp w scores its two
//     heads against the tile with lane = row; then every thread accumulates 4 heads x
//     kCols latent columns, reading each staged value once for 4 multiply-adds.
//   - Where the rows live is a policy (ContiguousRows, PagedRows): at the start of each tile the
//     first kTile threads resolve the addresses of the tile's rows into shared memory, so the
//     paged form costs one table read per row, not per value, and both forms share every
//     arithmetic step (the paged form reproduces the contiguous one exactly).
//   - fp32 throughout with plain expf: the tests hold the kernel to 1e-5 of an fp64 reference.
//     With many heads the kernel does about 2 H FLOP per cached byte, so fp32 on CUDA cores is
//     compute bound; a bf16 tensor-core variant is future work (docs/cuda.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/kernels/cuda/cuda_util.h"
#include "common/kernels/cuda/decode_kernels.h"

namespace strider::kernels::cuda {
namespace {

constexpr int kMaxLatentDim = 1024;
constexpr int kMaxRopeDim = 256;
// (kHeadsPerBlock + kTile) rows of D + 1 floats must fit in 227 KiB of shared memory.
constexpr int kMaxRowWidth = 1152;
constexpr int kHeadsPerBlock = 16;
constexpr int kTile = 32;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kHeadsPerWarp = kHeadsPerBlock / kWarps;  // scoring: 2 heads per warp
constexpr int kHeadsPerThread = 4;                      // accumulation: 4 heads per thread
constexpr int kColumnThreads = kThreads / (kHeadsPerBlock / kHeadsPerThread);  // 64
// The split count aims at this many blocks in all, and never goes below kMinSplitRows rows per
// split, so the merge stays cheap next to the splits.
constexpr int64_t kTargetBlocks = 1024;
constexpr int64_t kMinSplitRows = 256;
constexpr int kCombineThreads = 128;
constexpr int kMaxSplits = static_cast<int>(kTargetBlocks);

static_assert(kHeadsPerWarp == 2, "the scoring loop is written for two heads per warp");
static_assert(kColumnThreads == 64, "the accumulation layout assumes 64 column threads");

struct SplitPlan {
  int64_t splits = 1;
  int64_t split_rows = kTile;  // a multiple of kTile
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

SplitPlan PlanSplits(const LatentAttentionDecodeDims& dims) {
  const int64_t capacity = std::max<int64_t>(dims.capacity, 1);
  const int64_t blocks_per_split =
      std::max<int64_t>(1, dims.batch * CeilDiv(dims.heads, kHeadsPerBlock));
  int64_t splits = CeilDiv(kTargetBlocks, blocks_per_split);
  splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, capacity / kMinSplitRows));
  SplitPlan plan;
  plan.split_rows = CeilDiv(CeilDiv(capacity, splits), kTile) * kTile;
  plan.splits = CeilDiv(capacity, plan.split_rows);
  return plan;
}

// Shared-memory row stride: odd, so that 32 lanes reading one word of 32 different rows hit 32
// different banks.
__host__ __device__ constexpr int RowStride(int width) { return width | 1; }

// The tile's row addresses (latent and rope, kTile each) come first, then the floats.
constexpr size_t kRowAddressBytes = 2 * kTile * sizeof(const float*);

size_t SharedBytes(int width) {
  const int64_t ld = RowStride(width);
  return kRowAddressBytes +
         sizeof(float) * static_cast<size_t>((kHeadsPerBlock + kTile) * ld +
                                             kHeadsPerBlock * (kTile + 1) + kHeadsPerBlock);
}

// Rows of one contiguous (B, S, .) cache per part.
struct ContiguousRows {
  const float* latent;    // (B, S, Dc)
  const float* rope_key;  // (B, S, Dr)
  int64_t capacity;
  int latent_dim, rope_dim;
  __device__ const float* Latent(int64_t b, int64_t s) const {
    return latent + (b * capacity + s) * latent_dim;
  }
  __device__ const float* Rope(int64_t b, int64_t s) const {
    return rope_key == nullptr ? nullptr : rope_key + (b * capacity + s) * rope_dim;
  }
};

// Rows found through a page table (LatentAttentionPagedCache).
struct PagedRows {
  const float* const* latent_pages;  // (B, max_pages)
  const float* const* rope_pages;    // (B, max_pages) or null
  int64_t max_pages, page_rows, latent_row_stride, rope_row_stride;
  __device__ const float* Latent(int64_t b, int64_t s) const {
    return latent_pages[b * max_pages + s / page_rows] + (s % page_rows) * latent_row_stride;
  }
  __device__ const float* Rope(int64_t b, int64_t s) const {
    return rope_pages == nullptr
               ? nullptr
               : rope_pages[b * max_pages + s / page_rows] + (s % page_rows) * rope_row_stride;
  }
};

template <typename Rows>
struct SplitArgs {
  const float* absorbed_query;  // (B, H, Dc)
  const float* rope_query;      // (B, H, Dr)
  Rows rows;                    // the cached rows of every sequence
  const int32_t* lengths;       // (B)
  float* partial_out;           // (B, splits, H, Dc) unnormalised sum_s p_s c_s
  float* partial_ml;            // (B, splits, H, 2) running max m and sum l
  int heads, latent_dim, rope_dim;
  int64_t capacity, split_rows, splits;
  float scale;
};

__device__ __forceinline__ float WarpMax(float x) {
  for (int offset = 16; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

__device__ __forceinline__ float WarpSum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// One (split, head group, sequence) per block. kCols latent columns per thread: Dc <= 64 kCols.
template <int kCols, typename Rows>
__global__ void __launch_bounds__(kThreads) LatentDecodeSplitKernel(SplitArgs<Rows> a) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  const float** latent_row_s = reinterpret_cast<const float**>(smem_bytes);  // (kTile)
  const float** rope_row_s = latent_row_s + kTile;                           // (kTile)
  float* smem = reinterpret_cast<float*>(smem_bytes + kRowAddressBytes);
  const int dc = a.latent_dim;
  const int dr = a.rope_dim;
  const int width = dc + dr;
  const int ld = RowStride(width);
  float* q_s = smem;                          // (kHeadsPerBlock, ld)
  float* c_s = q_s + kHeadsPerBlock * ld;     // (kTile, ld)
  float* p_s = c_s + kTile * ld;              // (kHeadsPerBlock, kTile + 1)
  float* corr_s = p_s + kHeadsPerBlock * (kTile + 1);  // (kHeadsPerBlock)

  const int64_t split = blockIdx.x;
  const int head0 = blockIdx.y * kHeadsPerBlock;
  const int64_t b = blockIdx.z;
  const int group_heads = min(kHeadsPerBlock, a.heads - head0);
  const int64_t stored = a.lengths[b];
  const int64_t length = stored < 0 ? 0 : (stored > a.capacity ? a.capacity : stored);
  const int64_t begin = split * a.split_rows;
  const int64_t end = begin + a.split_rows < length ? begin + a.split_rows : length;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int64_t out_base = (b * a.splits + split) * a.heads + head0;  // row of (B, splits, H)

  if (begin >= end) {
    // Nothing of this sequence falls in the split: m = -inf, l = 0 tells the merge to skip it.
    if (tid < group_heads) {
      a.partial_ml[(out_base + tid) * 2] = -INFINITY;
      a.partial_ml[(out_base + tid) * 2 + 1] = 0.0f;
    }
    return;
  }

  // The head group's queries, [q~_h; q_rope_h]; rows of heads past H stay zero.
  for (int idx = tid; idx < kHeadsPerBlock * width; idx += kThreads) {
    const int hh = idx / width;
    const int d = idx - hh * width;
    float value = 0.0f;
    if (hh < group_heads) {
      const int64_t row = b * a.heads + head0 + hh;
      value = d < dc ? a.absorbed_query[row * dc + d] : a.rope_query[row * dr + (d - dc)];
    }
    q_s[hh * ld + d] = value;
  }

  // Scoring state: warp w owns heads 2w and 2w + 1 (every lane holds the same m and l).
  float m_run[kHeadsPerWarp] = {-INFINITY, -INFINITY};
  float l_run[kHeadsPerWarp] = {0.0f, 0.0f};
  // Accumulation state: thread owns heads hq*4 .. hq*4+3 and columns col0 + 64 m.
  const int hq = tid / kColumnThreads;
  const int col0 = tid % kColumnThreads;
  float acc[kHeadsPerThread][kCols];
#pragma unroll
  for (int i = 0; i < kHeadsPerThread; ++i) {
#pragma unroll
    for (int m = 0; m < kCols; ++m) acc[i][m] = 0.0f;
  }

  for (int64_t tile = begin; tile < end; tile += kTile) {
    const int valid = end - tile < kTile ? static_cast<int>(end - tile) : kTile;
    __syncthreads();  // the previous tile's c_s and p_s are no longer read (and q_s is stored)
    if (tid < valid) {
      latent_row_s[tid] = a.rows.Latent(b, tile + tid);
      rope_row_s[tid] = a.rows.Rope(b, tile + tid);
    }
    __syncthreads();
    for (int idx = tid; idx < kTile * width; idx += kThreads) {
      const int s = idx / width;
      const int d = idx - s * width;
      float value = 0.0f;
      if (s < valid) value = d < dc ? latent_row_s[s][d] : rope_row_s[s][d - dc];
      c_s[s * ld + d] = value;
    }
    __syncthreads();

    // Scores of the warp's two heads against row `lane`; two partial sums per head for ILP.
    const float* q0 = q_s + (warp * kHeadsPerWarp) * ld;
    const float* q1 = q0 + ld;
    const float* c_row = c_s + lane * ld;
    float dot0a = 0.0f, dot0b = 0.0f, dot1a = 0.0f, dot1b = 0.0f;
    int d = 0;
    for (; d + 1 < width; d += 2) {
      const float c0 = c_row[d];
      const float c1 = c_row[d + 1];
      dot0a = fmaf(q0[d], c0, dot0a);
      dot0b = fmaf(q0[d + 1], c1, dot0b);
      dot1a = fmaf(q1[d], c0, dot1a);
      dot1b = fmaf(q1[d + 1], c1, dot1b);
    }
    if (d < width) {
      dot0a = fmaf(q0[d], c_row[d], dot0a);
      dot1a = fmaf(q1[d], c_row[d], dot1a);
    }
    const float dots[kHeadsPerWarp] = {dot0a + dot0b, dot1a + dot1b};
#pragma unroll
    for (int j = 0; j < kHeadsPerWarp; ++j) {
      const float score = lane < valid ? dots[j] * a.scale : -INFINITY;
      // valid >= 1, so m_new is finite and exp(-inf - m_new) = 0 handles the first tile.
      const float m_new = fmaxf(m_run[j], WarpMax(score));
      const float p = lane < valid ? expf(score - m_new) : 0.0f;
      const float corr = expf(m_run[j] - m_new);
      l_run[j] = fmaf(l_run[j], corr, WarpSum(p));
      m_run[j] = m_new;
      const int hh = warp * kHeadsPerWarp + j;
      p_s[hh * (kTile + 1) + lane] = p;
      if (lane == 0) corr_s[hh] = corr;
    }
    __syncthreads();

    // O <- corr O + sum_s p_s c_s for the thread's 4 heads and kCols columns. Rows past `valid`
    // have p = 0 and zeroed latents, so the loop runs over the whole tile without a branch.
#pragma unroll
    for (int i = 0; i < kHeadsPerThread; ++i) {
      const float corr = corr_s[hq * kHeadsPerThread + i];
#pragma unroll
      for (int m = 0; m < kCols; ++m) acc[i][m] *= corr;
    }
#pragma unroll 4
    for (int s = 0; s < kTile; ++s) {
      float p[kHeadsPerThread];
#pragma unroll
      for (int i = 0; i < kHeadsPerThread; ++i) p[i] = p_s[(hq * kHeadsPerThread + i) * (kTile + 1) + s];
      const float* c_row_s = c_s + s * ld;
#pragma unroll
      for (int m = 0; m < kCols; ++m) {
        const int c = col0 + m * kColumnThreads;
        const float value = c < dc ? c_row_s[c] : 0.0f;
#pragma unroll
        for (int i = 0; i < kHeadsPerThread; ++i) acc[i][m] = fmaf(p[i], value, acc[i][m]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kHeadsPerThread; ++i) {
    const int hh = hq * kHeadsPerThread + i;
    if (hh >= group_heads) continue;
    float* out = a.partial_out + (out_base + hh) * dc;
#pragma unroll
    for (int m = 0; m < kCols; ++m) {
      const int c = col0 + m * kColumnThreads;
      if (c < dc) out[c] = acc[i][m];
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < kHeadsPerWarp; ++j) {
      const int hh = warp * kHeadsPerWarp + j;
      if (hh < group_heads) {
        a.partial_ml[(out_base + hh) * 2] = m_run[j];
        a.partial_ml[(out_base + hh) * 2 + 1] = l_run[j];
      }
    }
  }
}

// Merges the splits of one (head, sequence): o~ = sum_i exp(m_i - M) O_i / L with
// M = max_i m_i and L = sum_i exp(m_i - M) l_i. Splits with l = 0 are skipped, so their O
// (never written) is never read.
__global__ void __launch_bounds__(kCombineThreads)
    LatentDecodeCombineKernel(const float* __restrict__ partial_out,
                              const float* __restrict__ partial_ml, int heads, int dc,
                              int64_t splits, float* __restrict__ output,
                              float* __restrict__ lse) {
  __shared__ float weight_s[kMaxSplits];
  __shared__ float total_s;
  const int h = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int tid = threadIdx.x;
  auto ml = [&](int64_t split) { return partial_ml + ((b * splits + split) * heads + h) * 2; };

  if (tid == 0) {
    float max_m = -INFINITY;
    for (int64_t i = 0; i < splits; ++i) {
      if (ml(i)[1] > 0.0f) max_m = fmaxf(max_m, ml(i)[0]);
    }
    float total = 0.0f;
    for (int64_t i = 0; i < splits; ++i) {
      const float w = (ml(i)[1] > 0.0f) ? expf(ml(i)[0] - max_m) : 0.0f;
      weight_s[i] = w;
      total = fmaf(w, ml(i)[1], total);
    }
    total_s = total;
    if (lse != nullptr) lse[b * heads + h] = total > 0.0f ? max_m + logf(total) : -INFINITY;
  }
  __syncthreads();
  const float total = total_s;
  const float inv_total = total > 0.0f ? 1.0f / total : 0.0f;
  for (int c = tid; c < dc; c += kCombineThreads) {
    float sum = 0.0f;
    for (int64_t i = 0; i < splits; ++i) {
      const float w = weight_s[i];
      if (w != 0.0f) sum = fmaf(w, partial_out[((b * splits + i) * heads + h) * dc + c], sum);
    }
    output[(b * heads + h) * dc + c] = sum * inv_total;
  }
}

Status CheckDims(const LatentAttentionDecodeDims& dims) {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("latent attention decode: " + what);
  };
  if (dims.batch < 0 || dims.heads < 0 || dims.capacity < 0) {
    return bad("batch, heads and capacity must be >= 0");
  }
  if (dims.latent_dim < 1 || dims.latent_dim > kMaxLatentDim) {
    return bad("latent width Dc must be in [1, 1024], got " + std::to_string(dims.latent_dim));
  }
  if (dims.rope_dim < 0 || dims.rope_dim > kMaxRopeDim) {
    return bad("rope width Dr must be in [0, 256], got " + std::to_string(dims.rope_dim));
  }
  if (dims.latent_dim + dims.rope_dim > kMaxRowWidth) {
    return bad("Dc + Dr must be at most 1152 (shared memory), got " +
               std::to_string(dims.latent_dim + dims.rope_dim));
  }
  if (dims.batch > 65535 || CeilDiv(dims.heads, kHeadsPerBlock) > 65535) {
    return bad("batch and head groups must each be at most 65535 (grid limit)");
  }
  if (!std::isfinite(dims.scale)) return bad("scale must be finite");
  return Status::Ok();
}

}  // namespace

size_t LatentAttentionDecodeWorkspaceBytes(const LatentAttentionDecodeDims& dims) {
  if (!CheckDims(dims).ok() || dims.batch == 0 || dims.heads == 0) return 0;
  const SplitPlan plan = PlanSplits(dims);
  const int64_t rows = dims.batch * plan.splits * dims.heads;  // (B, splits, H)
  return sizeof(float) * static_cast<size_t>(rows * (dims.latent_dim + 2));
}

namespace {

// Both launchers after their own checks: dims are valid, the workspace is large enough and
// there is work to do.
template <typename Rows>
Status LaunchDecode(const LatentAttentionDecodeDims& dims, const float* absorbed_query,
                    const float* rope_query, const Rows& rows, const int32_t* lengths,
                    float* output, float* lse, void* workspace, void* stream) {
  const SplitPlan plan = PlanSplits(dims);
  const int64_t partial_rows = dims.batch * plan.splits * dims.heads;
  SplitArgs<Rows> args;
  args.absorbed_query = absorbed_query;
  args.rope_query = rope_query;
  args.rows = rows;
  args.lengths = lengths;
  args.partial_out = static_cast<float*>(workspace);
  args.partial_ml = args.partial_out + partial_rows * dims.latent_dim;
  args.heads = static_cast<int>(dims.heads);
  args.latent_dim = static_cast<int>(dims.latent_dim);
  args.rope_dim = static_cast<int>(dims.rope_dim);
  args.capacity = dims.capacity;
  args.split_rows = plan.split_rows;
  args.splits = plan.splits;
  args.scale = dims.scale;

  const size_t shared = SharedBytes(static_cast<int>(dims.latent_dim + dims.rope_dim));
  int device = 0;
  STRIDER_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
  int max_shared = 0;
  STRIDER_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
      "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)"));
  if (shared > static_cast<size_t>(max_shared)) {
    return Status::InvalidArgument("latent attention decode: Dc + Dr = " +
                                   std::to_string(dims.latent_dim + dims.rope_dim) + " needs " +
                                   std::to_string(shared) + " bytes of shared memory, device " +
                                   std::to_string(device) + " allows " +
                                   std::to_string(max_shared));
  }
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(plan.splits),
                  static_cast<unsigned>(CeilDiv(dims.heads, kHeadsPerBlock)),
                  static_cast<unsigned>(dims.batch));
  auto launch = [&](auto kernel) -> Status {
    STRIDER_RETURN_IF_ERROR(CudaStatus(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared)),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)"));
    kernel<<<grid, kThreads, shared, cuda_stream>>>(args);
    return LaunchStatus("latent attention decode split kernel launch");
  };
  if (dims.latent_dim <= 8 * kColumnThreads) {
    STRIDER_RETURN_IF_ERROR(launch(LatentDecodeSplitKernel<8, Rows>));
  } else {
    STRIDER_RETURN_IF_ERROR(launch(LatentDecodeSplitKernel<16, Rows>));
  }

  LatentDecodeCombineKernel<<<dim3(static_cast<unsigned>(dims.heads),
                                   static_cast<unsigned>(dims.batch)),
                              kCombineThreads, 0, cuda_stream>>>(
      args.partial_out, args.partial_ml, args.heads, args.latent_dim, plan.splits, output, lse);
  return LaunchStatus("latent attention decode combine kernel launch");
}

Status CheckWorkspace(const LatentAttentionDecodeDims& dims, size_t workspace_bytes) {
  const size_t needed = LatentAttentionDecodeWorkspaceBytes(dims);
  if (workspace_bytes < needed) {
    return Status::InvalidArgument("latent attention decode: workspace of " +
                                   std::to_string(workspace_bytes) + " bytes, " +
                                   std::to_string(needed) + " needed");
  }
  return Status::Ok();
}

}  // namespace

Status LatentAttentionDecode(const LatentAttentionDecodeDims& dims, const float* absorbed_query,
                             const float* rope_query, const float* latent,
                             const float* rope_key, const int32_t* lengths, float* output,
                             float* lse, void* workspace, size_t workspace_bytes,
                             void* stream) {
  STRIDER_RETURN_IF_ERROR(CheckDims(dims));
  if (dims.batch == 0 || dims.heads == 0) return Status::Ok();
  STRIDER_RETURN_IF_ERROR(CheckWorkspace(dims, workspace_bytes));
  const bool has_rope = dims.rope_dim > 0;
  if (absorbed_query == nullptr || latent == nullptr || lengths == nullptr ||
      output == nullptr || workspace == nullptr ||
      (has_rope && (rope_query == nullptr || rope_key == nullptr))) {
    return Status::InvalidArgument("latent attention decode: a device pointer is null");
  }
  ContiguousRows rows;
  rows.latent = latent;
  rows.rope_key = has_rope ? rope_key : nullptr;
  rows.capacity = dims.capacity;
  rows.latent_dim = static_cast<int>(dims.latent_dim);
  rows.rope_dim = static_cast<int>(dims.rope_dim);
  return LaunchDecode(dims, absorbed_query, rope_query, rows, lengths, output, lse, workspace,
                      stream);
}

Status LatentAttentionDecodePaged(const LatentAttentionDecodeDims& dims,
                                  const float* absorbed_query, const float* rope_query,
                                  const LatentAttentionPagedCache& cache,
                                  const int32_t* lengths, float* output, float* lse,
                                  void* workspace, size_t workspace_bytes, void* stream) {
  STRIDER_RETURN_IF_ERROR(CheckDims(dims));
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("paged latent attention decode: " + what);
  };
  if (cache.page_rows < 1 || cache.max_pages < 0) {
    return bad("page_rows must be >= 1 and max_pages >= 0");
  }
  if (cache.max_pages * cache.page_rows != dims.capacity) {
    return bad("capacity " + std::to_string(dims.capacity) + " is not max_pages x page_rows = " +
               std::to_string(cache.max_pages) + " x " + std::to_string(cache.page_rows));
  }
  const bool has_rope = dims.rope_dim > 0;
  if (cache.latent_row_stride < dims.latent_dim ||
      (has_rope && cache.rope_row_stride < dims.rope_dim)) {
    return bad("a row stride is shorter than its part (latent " +
               std::to_string(cache.latent_row_stride) + " < " +
               std::to_string(dims.latent_dim) + " or rope " +
               std::to_string(cache.rope_row_stride) + " < " + std::to_string(dims.rope_dim) +
               ")");
  }
  if (dims.batch == 0 || dims.heads == 0) return Status::Ok();
  STRIDER_RETURN_IF_ERROR(CheckWorkspace(dims, workspace_bytes));
  if (absorbed_query == nullptr || lengths == nullptr || output == nullptr ||
      workspace == nullptr || (dims.capacity > 0 && cache.latent_pages == nullptr) ||
      (has_rope && (rope_query == nullptr ||
                    (dims.capacity > 0 && cache.rope_pages == nullptr)))) {
    return bad("a device pointer is null");
  }
  PagedRows rows;
  rows.latent_pages = cache.latent_pages;
  rows.rope_pages = has_rope ? cache.rope_pages : nullptr;
  rows.max_pages = cache.max_pages;
  rows.page_rows = cache.page_rows;
  rows.latent_row_stride = cache.latent_row_stride;
  rows.rope_row_stride = cache.rope_row_stride;
  return LaunchDecode(dims, absorbed_query, rope_query, rows, lengths, output, lse, workspace,
                      stream);
}

}  // namespace strider::kernels::cuda
