// Absorbed latent attention over a paged past (docs/model_math.md#latent-attention), the kernel of
// the inference path's latent attention layers; the CPU twin of
// common/kernels/cuda/latent_attention_decode.cu.
//
// The model layer (common/model/latent_attention.cc) computes the queries and the new rows and
// maps the result back to the heads; these kernels compute only the softmax-weighted latent
// vector per (token, head):
//   out[b, t, h] = sum_j softmax_j(q[b, t, h] . key_j) latent_j
// over the keys of row b that token t sees: every cached row of its past, then the new tokens'
// own rows up to and including t (causal). A key is one row [c_kv (Dc); k_rope (Dr)], a query
// one vector [W_uk,h^T q_nope (Dc); q_rope (Dr)] already multiplied by the score scale, so one
// dot product is the score.
//
// Shapes (B rows, T new tokens per row, H heads, Dc latent rank, Dr rope width, W = Dc + Dr):
//   query:         (B, T, H, W)  contiguous, float32 or float64 (the compute dtype)
//   pages[b]:      row b's past in position order (may be empty); see LatentAttentionPage
//   new_latent:    (B, T, Dc)    contiguous, in the compute dtype
//   new_rope_key:  (B, T, Dr)    contiguous, in the compute dtype
//   result:        (B, T, H, Dc) in the compute dtype
// Bad arguments throw c10::Error (TORCH_CHECK), like any ATen operation; the model turns that
// into a Status at its boundary.
//
// Three implementations of that one contract:
//   - Reference: one materialised softmax over the whole (padded) past. Plain and obviously
//     right, memory O(T x past); the reference the tests compare the other two against.
//   - Decode: plain loops, one pass over each cached row for all heads and new tokens, split
//     over threads by pages (memory bound; the kernel for a few new tokens per row).
//   - Prefill: tiles with an online softmax (compute bound; many tokens). In float32 on a CPU
//     with AVX2 one fused pass of register tiles per block of keys (scores, softmax, weighted
//     latent; latent_attention_prefill.h), split over threads by runs of query tokens;
//     otherwise ATen matrix products per tile.
// Decode and prefill read the past where it lives, block by block, with a running maximum and
// sum per query row, so their transient memory is bounded by a block of scores whatever the
// past's length; their results equal the reference up to rounding.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace strider::kernels {

// A run of consecutive cached tokens of one sequence, read where it lives (a block of the rollout
// engine's paged cache, or a row of a contiguous cache). float32, float64 or bfloat16 (both
// views of one dtype); both views have unit stride in their last dimension; rows may be strided.
struct LatentAttentionPage {
  at::Tensor latent;    // (n, Dc)
  at::Tensor rope_key;  // (n, Dr)
};

using LatentAttentionPages = std::vector<std::vector<LatentAttentionPage>>;  // [B][pages]

// Up to this many new tokens per row, LatentAttentionOverPages takes the decode kernel.
constexpr int64_t kLatentAttentionDecodeMaxTokens = 4;

// The decode kernel for T <= kLatentAttentionDecodeMaxTokens, the prefill kernel above.
at::Tensor LatentAttentionOverPages(const at::Tensor& query, const LatentAttentionPages& pages,
                                    const at::Tensor& new_latent, const at::Tensor& new_rope_key);

// Any T; fastest for a few new tokens per row.
at::Tensor LatentAttentionDecode(const at::Tensor& query, const LatentAttentionPages& pages,
                                 const at::Tensor& new_latent, const at::Tensor& new_rope_key);

// Any T; fastest for many new tokens per row.
at::Tensor LatentAttentionPrefill(const at::Tensor& query, const LatentAttentionPages& pages,
                                  const at::Tensor& new_latent, const at::Tensor& new_rope_key);

// The same attention, differentiable, for training through the absorbed form (chunked passes
// under autograd). The past is one contiguous tensor per operand, with its graph: the keys are
// [latent; rope_key] of S = past + T tokens, the new tokens being the last T, and token t sees
// keys 0 .. past + t. query (B, T, H, Dc+Dr), latent (B, S, Dc), rope_key (B, S, Dr), all of
// one dtype (float32 or float64); the result is (B, T, H, Dc).
//
// Forward and backward run over tiles of query rows and keys (FlashAttention's schedule: an
// online softmax forward that keeps each query row's log-sum-exp, and a backward that
// recomputes every tile's probabilities from it), so nothing of size T x S is allocated:
// memory is O(T x H x Dc) for the saved output plus one (query rows x keys) tile of scores.
// Tiles wholly in a query tile's future are skipped. Gradients reach the query, the latent
// (as keys and as values) and the rope keys; double backward is not supported.
//
// With `past_latent` (B, P, Dc) and `past_rope_key` (B, P, Dr), the keys are those P rows
// followed by latent/rope_key's: a past without a graph (truncated backpropagation, a prefix
// scored earlier) read where it is, a block of keys at a time, and given no gradient, so neither
// a joined copy of it nor gradient buffers of its size exist. For a chunk against a long past
// those would be several times the past's cache (the learner's pass over a million tokens).
at::Tensor LatentAttentionBlockwise(const at::Tensor& query, const at::Tensor& latent,
                                    const at::Tensor& rope_key,
                                    const at::Tensor& past_latent = at::Tensor(),
                                    const at::Tensor& past_rope_key = at::Tensor());

// Materialises (B, H, T, past + T) scores; for tests and equality checks only.
at::Tensor LatentAttentionReference(const at::Tensor& query, const LatentAttentionPages& pages,
                                    const at::Tensor& new_latent, const at::Tensor& new_rope_key);

}  // namespace strider::kernels
