// Gated delta rule, one decode step on the GPU (docs/model_math.md#gated-delta-rule).
//
// Design decisions:
//   - One thread block per (sequence, head). A step touches each state value once (read, decay,
//     write) and does O(Dk Dv) arithmetic on 4 Dk Dv bytes, so the kernel is bound by memory
//     bandwidth: the state lives in registers between the read and the write, and the only
//     traffic is the state once in and once out plus the small vectors.
//   - Thread t owns column j = t % Dv of the state and rows i = r, r + R, r + 2R, ... with
//     r = t / Dv and R = kThreads / Dv row groups. Then the flat offset of (i, j) is
//     t + m R Dv for the m-th row of the thread: consecutive threads touch consecutive words for
//     every Dv, so each warp's loads and stores are fully coalesced without shared-memory
//     staging.
//   - The two reductions over rows (S^T k, then S^T q) are per column: each thread sums its own
//     rows, the R partial sums of a column meet in shared memory.
//   - Plain expf, no fast-math: the step is bandwidth bound, so the approximate exponential
//     would save nothing while costing accuracy against the fp64 reference.
#include <cuda_runtime.h>

#include <string>

#include "common/kernels/cuda/cuda_util.h"
#include "common/kernels/cuda/decode_kernels.h"

namespace strider::kernels::cuda {
namespace {

constexpr int kMaxKeyDim = 128;
constexpr int kMaxValueDim = 128;
// 1024 threads keep 16 state values per thread at 128 x 128 and fit in 64 registers without
// spilling (512 threads needed 32 values and spilled at the 128-register limit).
constexpr int kThreads = 1024;
// Rows per thread at the largest shape: Dk / (kThreads / Dv) = 128 / 8.
constexpr int kMaxRowsPerThread = kMaxKeyDim / (kThreads / kMaxValueDim);

__global__ void __launch_bounds__(kThreads)
    GatedDeltaRuleDecodeKernel(int dk, int dv, float* __restrict__ state,
                               const float* __restrict__ query, const float* __restrict__ key,
                               const float* __restrict__ value,
                               const float* __restrict__ log_decay,
                               const float* __restrict__ beta, float* __restrict__ output) {
  __shared__ float q_s[kMaxKeyDim];
  __shared__ float k_s[kMaxKeyDim];
  __shared__ float alpha_s[kMaxKeyDim];
  __shared__ float v_s[kMaxValueDim];
  __shared__ float u_s[kMaxValueDim];
  __shared__ float partial_s[kThreads];  // (R, Dv) per-row-group column sums

  const int64_t bh = blockIdx.x;
  const int tid = threadIdx.x;
  float* s_ptr = state + bh * dk * dv;  // (Dk, Dv) of this head

  for (int i = tid; i < dk; i += kThreads) {
    q_s[i] = query[bh * dk + i];
    k_s[i] = key[bh * dk + i];
    alpha_s[i] = expf(log_decay[bh * dk + i]);
  }
  for (int j = tid; j < dv; j += kThreads) v_s[j] = value[bh * dv + j];
  const float b = beta[bh];
  __syncthreads();

  const int row_groups = kThreads / dv;  // R >= 8 since Dv <= 128
  const int j = tid % dv;
  const int r = tid / dv;
  const bool active = r < row_groups;
  const int row_step = row_groups * dv;  // flat distance between a thread's rows

  // S <- Diag(alpha) S, and this thread's part of (S^T k)_j.
  float s[kMaxRowsPerThread];
  float kts = 0.0f;
#pragma unroll
  for (int m = 0; m < kMaxRowsPerThread; ++m) {
    const int i = r + m * row_groups;
    if (active && i < dk) {
      s[m] = s_ptr[tid + m * row_step] * alpha_s[i];
      kts = fmaf(k_s[i], s[m], kts);
    }
  }
  if (active) partial_s[tid] = kts;
  __syncthreads();

  // u = beta (v - S^T k): the delta-rule correction of column j.
  if (tid < dv) {
    float sum = 0.0f;
    for (int g = 0; g < row_groups; ++g) sum += partial_s[g * dv + tid];
    u_s[tid] = b * (v_s[tid] - sum);
  }
  __syncthreads();  // also: every partial_s read above is done before it is reused below

  // S <- S + k u^T, written back in place, and this thread's part of (S^T q)_j.
  float qts = 0.0f;
  if (active) {
    const float u = u_s[j];
#pragma unroll
    for (int m = 0; m < kMaxRowsPerThread; ++m) {
      const int i = r + m * row_groups;
      if (i < dk) {
        s[m] = fmaf(k_s[i], u, s[m]);
        s_ptr[tid + m * row_step] = s[m];
        qts = fmaf(q_s[i], s[m], qts);
      }
    }
    partial_s[tid] = qts;
  }
  __syncthreads();

  if (tid < dv) {
    float sum = 0.0f;
    for (int g = 0; g < row_groups; ++g) sum += partial_s[g * dv + tid];
    output[bh * dv + tid] = sum;
  }
}

}  // namespace

Status GatedDeltaRuleDecodeStep(const GatedDeltaRuleDecodeDims& dims, float* state,
                                const float* query, const float* key, const float* value,
                                const float* log_decay, const float* beta, float* output,
                                void* stream) {
  if (dims.batch < 0 || dims.heads < 0) {
    return Status::InvalidArgument("gated delta rule decode: batch and heads must be >= 0, got " +
                                   std::to_string(dims.batch) + " and " +
                                   std::to_string(dims.heads));
  }
  if (dims.key_dim < 1 || dims.key_dim > kMaxKeyDim || dims.value_dim < 1 ||
      dims.value_dim > kMaxValueDim) {
    return Status::InvalidArgument(
        "gated delta rule decode: key and value widths must be in [1, 128], got Dk = " +
        std::to_string(dims.key_dim) + ", Dv = " + std::to_string(dims.value_dim));
  }
  const int64_t blocks = dims.batch * dims.heads;
  if (blocks == 0) return Status::Ok();
  if (blocks > 0x7fffffff) {
    return Status::InvalidArgument("gated delta rule decode: B * H = " + std::to_string(blocks) +
                                   " exceeds the grid limit 2^31 - 1");
  }
  if (state == nullptr || query == nullptr || key == nullptr || value == nullptr ||
      log_decay == nullptr || beta == nullptr || output == nullptr) {
    return Status::InvalidArgument("gated delta rule decode: a device pointer is null");
  }
  GatedDeltaRuleDecodeKernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                               static_cast<cudaStream_t>(stream)>>>(
      static_cast<int>(dims.key_dim), static_cast<int>(dims.value_dim), state, query, key, value,
      log_decay, beta, output);
  return LaunchStatus("gated delta rule decode kernel launch");
}

}  // namespace strider::kernels::cuda
