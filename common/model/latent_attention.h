// Gated multi-head latent attention (docs/model_math.md#latent-attention).
//
// Keys and values are cached as one compressed vector c_kv (d_c values) plus a key part shared
// by all heads (d_rope values) per token: 576 values in the reference instead of 24,576. Two
// forms of the same attention:
//   - explicit (training path): per-head keys and values are expanded from c_kv by W_ukv, then
//     ordinary causal softmax attention;
//   - absorbed (inference path): the query is mapped into the latent space by W_uk^T and scores
//     are taken directly against the cached c_kv; the weighted latent is lifted by W_uv after.
// A sigmoid gate computed from x multiplies each head's output before W_o, which is why W_uv
// cannot be folded into W_o. No position encoding: the "rope" part is cached but not rotated;
// the incremental layers carry position.
//
// Two options express Kimi Linear's MLA (docs/model_math.md#latent-attention): query_rank 0, a
// full-rank query projection W_q in place of W_uq RMSNorm(W_dq x); output_gate false, no gate.
// Neither touches what is cached, so every form below (and the paged cache) computes the same
// attention as before from a different query and output.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "common/kernels/latent_attention.h"
#include "common/model/config.h"
#include "common/model/ops.h"

namespace strider::model {

struct LatentAttentionWeights {
  at::Tensor query_down;  // (Rq, d)            query_rank > 0, else undefined
  at::Tensor query_norm;  // (Rq)               query_rank > 0, else undefined
  at::Tensor query_up;    // (H*(Dn+Dr), Rq)    query_rank > 0, else undefined
  at::Tensor query;       // (H*(Dn+Dr), d)     query_rank == 0, else undefined
  at::Tensor kv_down;     // (Dc+Dr, d)
  at::Tensor kv_norm;     // (Dc)
  at::Tensor kv_up;       // (H*(Dn+Dv), Dc)
  at::Tensor gate;        // (H*Dv, d)          output_gate, else undefined
  at::Tensor output;      // (d, H*Dv)
  // The weights that read x (LatentAttentionInputNames) as row blocks of one matrix
  // (Model::Bind), or undefined: what inference multiplies x by.
  at::Tensor joined_input;

  // The query and gate weights a configuration lacks are left undefined; the forward checks that
  // those it needs are there.
  static LatentAttentionWeights Bind(const TensorMap& tensors, const std::string& prefix);
};

// The names, under `prefix`, of the weights that read the layer input x, in the order the
// forward applies them: the query's first map (query_down, or query when query_rank is 0),
// kv_down, then gate when there is an output gate. Model::Bind joins them into joined_input.
std::vector<std::string> LatentAttentionInputNames(const LatentAttentionConfig& config,
                                                   const std::string& prefix);

// The compressed cache of one layer for a batch of sequences of equal length. Storage grows by
// doubling so appending one token is amortised O(1).
struct LatentAttentionCache {
  at::Tensor latent;    // (B, capacity, Dc) normalised c_kv
  at::Tensor rope_key;  // (B, capacity, Dr) shared key part
  int64_t length = 0;
  // Only while autograd records (chunked training through the inference path): the cached rows
  // with their graph, so gradients reach the keys and values of earlier chunks exactly as in one
  // whole-sequence pass. The storage above holds detached copies and may be lower precision.
  // Undefined otherwise; a no-grad append drops them. They cover rows graph_begin .. length - 1:
  // rows before graph_begin were appended without a graph (a prefix scored without one, or
  // chunks before truncated backpropagation's cut) and are read from the storage.
  at::Tensor latent_graph;    // (B, length - graph_begin, Dc)
  at::Tensor rope_key_graph;  // (B, length - graph_begin, Dr)
  int64_t graph_begin = 0;
  // Rows written into the storage by this cache or any copy of it. Copies of a cache (a forked
  // InferenceState, Append's all-or-nothing working copy) share storage; a copy whose length is
  // below this count would overwrite another copy's rows, so it moves to storage of its own first
  // (copy on write).
  std::shared_ptr<int64_t> rows_written = std::make_shared<int64_t>(0);

  void MoveTo(int64_t capacity);  // storage of `capacity` tokens holding the cached rows

  static LatentAttentionCache Empty(const LatentAttentionConfig& config, int64_t batch,
                                    const at::TensorOptions& options);
  void Append(const at::Tensor& latent_rows, const at::Tensor& rope_rows);  // (B, T, .)
  // Storage for `tokens` tokens in all, so appending up to there never moves it: a pass that
  // knows its length holds one cache of that length rather than doubling into it (the copies
  // it left behind would stay resident in the allocator).
  void Reserve(int64_t tokens);
  at::Tensor Latent() const;   // (B, length, Dc)
  at::Tensor RopeKey() const;  // (B, length, Dr)
  int64_t Bytes() const;       // bytes of the `length` cached tokens
};

enum class LatentAttentionForm { kExplicit, kAbsorbed };

// A run of consecutive cached tokens of one sequence, read where it lives (a block of the rollout
// engine's paged cache, or a row of a contiguous cache); defined with the kernels that read it.
using LatentAttentionPage = kernels::LatentAttentionPage;

// The past of a batch whose sequences have different lengths, in one of two forms:
//   - padded: row b holds its `lengths[b]` cached tokens first; entries past that are padding,
//     must be finite (zeros), and are masked out of the softmax;
//   - paged (`pages` non-empty, latent/rope_key undefined): pages[b] lists row b's cached tokens
//     in position order; their sizes sum to lengths[b]. The absorbed form reads them in place,
//     block by block with an online softmax, so nothing of size (past) is copied or allocated.
struct LatentAttentionPast {
  at::Tensor latent;    // (B, P, Dc)
  at::Tensor rope_key;  // (B, P, Dr)
  at::Tensor lengths;   // (B) int64, each <= P
  std::vector<std::vector<LatentAttentionPage>> pages;
};

// The new rows a ragged-batch call produced, in the dtype of the past; the caller stores them.
struct LatentAttentionRows {
  at::Tensor latent;    // (B, T, Dc)
  at::Tensor rope_key;  // (B, T, Dr)
};

// x: (B, T, d). Without a cache: the training path over the whole sequence (explicit form).
// With a cache: the new tokens are appended and attend to everything cached; `form` picks the
// computation (absorbed by default, explicit for tests and equality checks).
at::Tensor LatentAttentionForward(const LatentAttentionWeights& weights,
                                  const LatentAttentionConfig& config, const at::Tensor& x,
                                  LatentAttentionCache* cache, double norm_epsilon,
                                  LatentAttentionForm form = LatentAttentionForm::kAbsorbed);

// The same attention as the cache form (one implementation inside), for a batch whose rows have
// pasts of different lengths: the T new tokens of row b sit at positions lengths[b].. and attend
// to that row's past and to themselves causally. The new compressed rows are returned in *rows.
//
// Unless autograd records or the explicit form is asked for, both entry points take the
// absorbed form blockwise (docs/model_math.md#latent-attention): queries in the latent space score
// the cached rows where they are, in blocks, with a running maximum and sum per query and head
// (online softmax; common/kernels/latent_attention.h). Transient memory is bounded by a block of
// scores, whatever the past's length; the result equals one softmax over everything up to
// rounding. While autograd records, the absorbed form materialises the scores instead.
at::Tensor LatentAttentionForwardRagged(const LatentAttentionWeights& weights,
                                        const LatentAttentionConfig& config, const at::Tensor& x,
                                        const LatentAttentionPast& past, double norm_epsilon,
                                        LatentAttentionForm form, LatentAttentionRows* rows);

}  // namespace strider::model
