// CUDA decode kernels for the two attention kinds of the hybrid model
// (docs/model_math.md#gated-delta-rule and #latent-attention).
//
// Debian's LibTorch has no CUDA, so these kernels are plain CUDA C++ on raw device pointers and
// this header names no CUDA type: CPU-only code can include it, and a CUDA-enabled LibTorch can
// call it later with tensor data pointers. Everything is fp32, contiguous and row-major, with
// the shapes given beside each argument. The library exists only when CMake found a CUDA
// toolkit (STRIDER_HAVE_CUDA).
//
// Contracts shared by every launcher:
//   - Pointers are device pointers (or managed memory) owned by the caller; nothing is allocated.
//   - `stream` is a cudaStream_t cast to void*; nullptr is the legacy default stream. The launch
//     is asynchronous: the returned Status covers argument checks and launch errors
//     (cudaGetLastError), not faults that happen later while the kernel runs. Synchronise the
//     stream to see those.
//   - Dimensions are checked before any CUDA call, so a bad shape fails the same way on a
//     machine without a GPU. Zero batch or zero heads is a valid no-op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace strider::kernels::cuda {

// True when the CUDA runtime sees at least one device. Otherwise false, with the reason (no
// driver, no device, ...) in *why when why is not null.
bool CudaDeviceAvailable(std::string* why);

// ---------------------------------------------------------------------------------------------
// Gated delta rule, one decode step (docs/model_math.md#gated-delta-rule), the GPU counterpart of
// one position of GatedDeltaRuleRecurrent (common/kernels/gated_delta_rule.h). Per (sequence,
// head):
//   S <- Diag(exp g) S;   S <- S + beta k (v - S^T k)^T;   o = S^T q.
// The caller has already applied the short convolutions, SiLU, L2 norms and the Dk^-1/2 query
// scale, exactly as for the CPU kernel.

struct GatedDeltaRuleDecodeDims {
  int64_t batch = 0;      // B sequences
  int64_t heads = 0;      // H heads per sequence
  int64_t key_dim = 0;    // Dk, 1..128
  int64_t value_dim = 0;  // Dv, 1..128
};

// state is updated in place; output receives o. state and output must not overlap.
Status GatedDeltaRuleDecodeStep(const GatedDeltaRuleDecodeDims& dims,
                                float* state,            // (B, H, Dk, Dv)
                                const float* query,      // (B, H, Dk)
                                const float* key,        // (B, H, Dk)
                                const float* value,      // (B, H, Dv)
                                const float* log_decay,  // (B, H, Dk)  g <= 0
                                const float* beta,       // (B, H)
                                float* output,           // (B, H, Dv)
                                void* stream);

// ---------------------------------------------------------------------------------------------
// Absorbed latent-attention decode (docs/model_math.md#latent-attention), one new token per
// sequence, over the compressed cache. Per (sequence b, head h), with L = lengths[b]:
//   score_s = (q~_h . c_s + q_rope_h . kr_s) * scale    for s < L
//   o~_h    = sum_s softmax(score)_s c_s
// The computation is split along the context (flash decoding): each block takes a range of
// positions for a group of heads, keeps a running max and sum (online softmax), and a second
// kernel merges the ranges. The latent rows are read once per head group, not once per head,
// since every head attends to the same cache.

struct LatentAttentionDecodeDims {
  int64_t batch = 0;       // B sequences
  int64_t heads = 0;       // H query heads
  int64_t latent_dim = 0;  // Dc, 1..1024 (512 in the reference)
  int64_t rope_dim = 0;    // Dr, 0..256 (64 in the reference); 0 means no rope part
  int64_t capacity = 0;    // S, rows per sequence in the cache (>= every length)
  float scale = 1.0f;      // (d_nope + d_rope)^-1/2 in the model
};

// Bytes of device scratch memory LatentAttentionDecode needs for these dims (partial outputs of
// the context splits). Depends only on the dims, not on the device.
size_t LatentAttentionDecodeWorkspaceBytes(const LatentAttentionDecodeDims& dims);

// lengths are read on the device; a length above the capacity is clamped to it. A sequence of
// length 0 gets o~ = 0 and lse = -inf. lse may be null; when given it receives the log of the
// softmax denominator, log sum_s exp(score_s), so results over disjoint parts of a context can
// be merged later. workspace must hold LatentAttentionDecodeWorkspaceBytes(dims) bytes, aligned
// as cudaMalloc aligns; it may be null when that size is 0.
Status LatentAttentionDecode(const LatentAttentionDecodeDims& dims,
                             const float* absorbed_query,  // (B, H, Dc)   q~ = W_uk^T q_nope
                             const float* rope_query,      // (B, H, Dr)
                             const float* latent,          // (B, S, Dc)   cached c_kv
                             const float* rope_key,        // (B, S, Dr)   cached k_rope
                             const int32_t* lengths,       // (B)
                             float* output,                // (B, H, Dc)   o~
                             float* lse,                   // (B, H) or null
                             void* workspace, size_t workspace_bytes, void* stream);

// The same decode over a paged cache (the rollout engine's, rollout_engine/paged_cache.h): a
// sequence's rows live in pages of `page_rows` rows each, found through its row of a page table
// of device addresses, so the kernel reads the blocks where they are, with no gather into a
// contiguous copy first. Row r of sequence b is row r % page_rows of page
// table[b * max_pages + r / page_rows]; consecutive rows of a page are `row_stride` floats
// apart. The latent and rope parts may share a page (the engine's rows are [c_kv; k_rope], so
// the rope table holds the latent addresses plus Dc) or live apart. Only the pages that hold
// rows below lengths[b] are read; other table entries may be anything, null included.
struct LatentAttentionPagedCache {
  const float* const* latent_pages = nullptr;  // (B, max_pages) device addresses, in device memory
  const float* const* rope_pages = nullptr;    // (B, max_pages), or null when Dr = 0
  int64_t max_pages = 0;                       // table columns per sequence
  int64_t page_rows = 0;                       // rows per page, >= 1
  int64_t latent_row_stride = 0;               // floats between rows of a page, >= Dc
  int64_t rope_row_stride = 0;                 // likewise, >= Dr
};

// dims.capacity must equal max_pages * page_rows (lengths are clamped to it, as above), and the
// workspace is LatentAttentionDecodeWorkspaceBytes(dims): for equal dims the split plan, and so
// every sum's order, is that of the contiguous kernel, whose results this one reproduces
// exactly on the same rows.
Status LatentAttentionDecodePaged(const LatentAttentionDecodeDims& dims,
                                  const float* absorbed_query,  // (B, H, Dc)
                                  const float* rope_query,      // (B, H, Dr)
                                  const LatentAttentionPagedCache& cache,
                                  const int32_t* lengths,  // (B)
                                  float* output,           // (B, H, Dc)
                                  float* lse,              // (B, H) or null
                                  void* workspace, size_t workspace_bytes, void* stream);

}  // namespace strider::kernels::cuda
