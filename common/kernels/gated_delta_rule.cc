// Gated delta rule, recurrent and chunkwise forms (docs/model_math.md#gated-delta-rule).
//
// Design decisions:
//   - Batch and heads are flattened into one batch dimension BH so every product is a plain
//     bmm; nothing here depends on B and H separately.
//   - The recurrent form has two loops over the same equations: a fused in-place one when no
//     gradient is needed on the CPU (decode: one copy of the state per call, one parallel loop
//     over batch and heads, no temporary beyond one Dv row per thread) and an out-of-place one
//     of ATen products that autograd can differentiate and that runs on any device. With the
//     CUDA LibTorch a single position on a GPU without autograd goes to the CUDA step instead
//     (gated_delta_rule_cuda.h), which does the fused loop's work in one launch.
//   - The chunkwise form never exponentiates a positive number. Within a chunk the cumulative
//     log-decay G is non-increasing, so exp(G_r - G_s) <= 1 for s <= r. The chunk is cut into
//     sub-blocks of kSubBlock positions: pairs (r, s) in the same sub-block use the explicit
//     (c, c, Dk) tensor of differences, masked to -inf above the diagonal before exp; pairs
//     in different sub-blocks factor through the last position e of s's sub-block,
//     exp(G_r - G_s) = exp(G_r - G_e) * exp(G_e - G_s), where both exponents are <= 0 because
//     s <= e < r. That turns about 3/4 of the pairs of a 64-chunk into matrix products with no risk
//     of overflow (a single per-chunk reference point would need exp(+320) at g = -5).
//   - (I + A_kk)^{-1} Diag(beta) is never formed: one unit-lower-triangular solve is applied
//     to beta * [exp(G) * K, V], which gives W and U together for all chunks at once.
#include "common/kernels/gated_delta_rule.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#if defined(STRIDER_CUDA_DECODE)
#include "common/kernels/gated_delta_rule_cuda.h"
#endif

namespace strider::kernels {
namespace {

// Sub-block size for the intra-chunk pairwise terms; see the file comment.
constexpr int64_t kSubBlock = 16;

struct Dims {
  int64_t b, h, t, dk, dv;
};

Dims CheckInputs(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                 const at::Tensor& log_decay, const at::Tensor& beta,
                 const at::Tensor& initial_state) {
  TORCH_CHECK(query.dim() == 4, "gated delta rule: query must be (B, H, T, Dk), got ",
              query.sizes());
  const Dims d{query.size(0), query.size(1), query.size(2), query.size(3), value.size(-1)};
  TORCH_CHECK(key.sizes() == query.sizes(), "gated delta rule: key ", key.sizes(),
              " differs from query ", query.sizes());
  TORCH_CHECK(log_decay.sizes() == query.sizes(), "gated delta rule: log_decay ",
              log_decay.sizes(), " differs from query ", query.sizes());
  TORCH_CHECK(value.dim() == 4 && value.size(0) == d.b && value.size(1) == d.h &&
                  value.size(2) == d.t,
              "gated delta rule: value must be (B, H, T, Dv), got ", value.sizes());
  TORCH_CHECK(beta.dim() == 3 && beta.size(0) == d.b && beta.size(1) == d.h && beta.size(2) == d.t,
              "gated delta rule: beta must be (B, H, T), got ", beta.sizes());
  TORCH_CHECK(initial_state.dim() == 4 && initial_state.size(0) == d.b &&
                  initial_state.size(1) == d.h && initial_state.size(2) == d.dk &&
                  initial_state.size(3) == d.dv,
              "gated delta rule: initial_state must be (B, H, Dk, Dv), got ",
              initial_state.sizes());
  const auto dtype = query.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble,
              "gated delta rule: only fp32 and fp64 are supported, got ", dtype);
  for (const at::Tensor* t : {&key, &value, &log_decay, &beta, &initial_state}) {
    TORCH_CHECK(t->scalar_type() == dtype, "gated delta rule: all inputs must share dtype ",
                dtype, ", got ", t->scalar_type());
  }
  return d;
}

bool NeedsGradient(std::initializer_list<const at::Tensor*> tensors) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : tensors) {
    if (t->requires_grad()) return true;
  }
  return false;
}

// Pairwise decayed products inside each chunk, for all chunks at once:
//   A_kk[r, s] = sum_c k_{r,c} k_{s,c} exp(G_{r,c} - G_{s,c})  for s < r, else 0
//   A_qk[r, s] = sum_c q_{r,c} k_{s,c} exp(G_{r,c} - G_{s,c})  for s <= r, else 0
// q, k, cum_decay: (M, C, Dk) with M = BH * N chunks. Returns {A_kk, A_qk}, each (M, C, C).
std::pair<at::Tensor, at::Tensor> IntraChunkProducts(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& cum_decay) {
  const int64_t m = q.size(0);
  const int64_t c = q.size(1);
  const int64_t dk = q.size(2);
  // A chunk that does not split evenly is handled as one sub-block (still exact, just slower).
  const int64_t sub = (c > kSubBlock && c % kSubBlock == 0) ? kSubBlock : c;
  const int64_t num_sub = c / sub;
  const auto opts = q.options();

  // Diagonal sub-blocks: explicit differences, masked above the diagonal before exp. These are
  // the largest temporaries of the kernel (c Dk values per position), so they are updated in
  // place: autograd allows it (subtraction and masking save no values, exp saves its result),
  // and without autograd the product with k reuses the same buffer too.
  auto g_sub = cum_decay.reshape({m, num_sub, sub, dk});                  // (M, n, c, Dk)
  auto k_sub = k.reshape({m, num_sub, sub, dk});                          // (M, n, c, Dk)
  auto q_sub = q.reshape({m, num_sub, sub, dk});                          // (M, n, c, Dk)
  auto upper = at::ones({sub, sub}, opts.dtype(at::kBool)).triu(1).view({sub, sub, 1});
  auto decay = g_sub.unsqueeze(3) - g_sub.unsqueeze(2);                   // (M, n, r, s, Dk)
  decay.masked_fill_(upper, -std::numeric_limits<double>::infinity()).exp_();
  auto decayed_k = NeedsGradient({&q, &k, &cum_decay})
                       ? decay * k_sub.unsqueeze(2)                       // (M, n, r, s, Dk)
                       : decay.mul_(k_sub.unsqueeze(2));
  // Contract over channels with the row vectors k_r and q_r in one product.
  auto rows = at::stack({k_sub, q_sub}, -1);                             // (M, n, r, Dk, 2)
  auto diag = at::matmul(decayed_k, rows);                                // (M, n, r, s, 2)
  auto diag_kk = diag.select(-1, 0);                                      // (M, n, r, s)
  auto diag_qk = diag.select(-1, 1);                                      // (M, n, r, s)

  // Assemble column blocks: for the sub-block j of columns, rows before it are zero, its own
  // rows come from the diagonal block, later rows from the factored product through e.
  std::vector<at::Tensor> cols_kk, cols_qk;
  cols_kk.reserve(num_sub);
  cols_qk.reserve(num_sub);
  for (int64_t j = 0; j < num_sub; ++j) {
    std::vector<at::Tensor> parts_kk, parts_qk;
    if (j > 0) {
      auto zeros = at::zeros({m, j * sub, sub}, opts);
      parts_kk.push_back(zeros);
      parts_qk.push_back(zeros);
    }
    parts_kk.push_back(diag_kk.select(1, j));                             // (M, c, c)
    parts_qk.push_back(diag_qk.select(1, j));
    const int64_t end = (j + 1) * sub;  // first row after sub-block j
    if (end < c) {
      auto g_ref = cum_decay.narrow(1, end - 1, 1);                       // (M, 1, Dk)
      auto g_cols = cum_decay.narrow(1, j * sub, sub);                    // (M, c, Dk)
      auto g_rows = cum_decay.narrow(1, end, c - end);                    // (M, R, Dk)
      auto right = k.narrow(1, j * sub, sub) * (g_ref - g_cols).exp();    // (M, c, Dk)
      auto row_decay = (g_rows - g_ref).exp();                            // (M, R, Dk)
      auto right_t = right.transpose(1, 2);                               // (M, Dk, c)
      parts_kk.push_back(at::bmm(k.narrow(1, end, c - end) * row_decay, right_t));  // (M, R, c)
      parts_qk.push_back(at::bmm(q.narrow(1, end, c - end) * row_decay, right_t));  // (M, R, c)
    }
    cols_kk.push_back(at::cat(parts_kk, 1));                              // (M, C, c)
    cols_qk.push_back(at::cat(parts_qk, 1));
  }
  auto a_kk = num_sub == 1 ? cols_kk[0] : at::cat(cols_kk, 2);            // (M, C, C)
  auto a_qk = num_sub == 1 ? cols_qk[0] : at::cat(cols_qk, 2);            // (M, C, C)
  // The diagonal of A_kk holds |k_r|^2 from the shared mask; the recurrence excludes s = r.
  a_kk = a_kk.tril(-1);
  return {a_kk, a_qk};
}

// The recurrent form without autograd, fused: per (batch, head) one pass over the positions,
// two sweeps over the state per position (decay and S^T k, then the write and S^T q) while the
// Dk x Dv state sits in L1. One call for the whole batch instead of six small batched products
// per position, which at decode (T = 1) cost more in dispatch and per-matrix BLAS calls than the
// arithmetic. All arguments contiguous: q, k, log_decay (BH, T, Dk), v (BH, T, Dv), beta
// (BH, T), state (BH, Dk, Dv) updated in place, output (BH, T, Dv).
// The loops have run-time trip counts (Dk, Dv), which -O2 leaves scalar; O3 vectorises them.
#pragma GCC push_options
#pragma GCC optimize("O3")
template <typename Scalar>
void RecurrentInPlace(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                      const at::Tensor& log_decay, const at::Tensor& beta, const at::Tensor& state,
                      const at::Tensor& output) {
  const int64_t bh = state.size(0), dk = state.size(1), dv = state.size(2);
  const int64_t t_count = query.size(1);
  const Scalar* q_all = query.data_ptr<Scalar>();
  const Scalar* k_all = key.data_ptr<Scalar>();
  const Scalar* v_all = value.data_ptr<Scalar>();
  const Scalar* g_all = log_decay.data_ptr<Scalar>();
  const Scalar* beta_all = beta.data_ptr<Scalar>();
  Scalar* s_all = state.data_ptr<Scalar>();
  Scalar* o_all = output.data_ptr<Scalar>();
  // A grain of a few heads: one head-step is only ~4 Dk Dv flops.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, t_count * dk * dv));
  at::parallel_for(0, bh, grain, [&](int64_t begin, int64_t end) {
    std::vector<Scalar> u(dv);
    for (int64_t n = begin; n < end; ++n) {
      Scalar* s = s_all + n * dk * dv;
      for (int64_t t = 0; t < t_count; ++t) {
        const int64_t row = n * t_count + t;
        const Scalar* q = q_all + row * dk;
        const Scalar* k = k_all + row * dk;
        const Scalar* g = g_all + row * dk;
        const Scalar* v = v_all + row * dv;
        Scalar* __restrict o = o_all + row * dv;
        Scalar* __restrict uu = u.data();
        std::fill(uu, uu + dv, Scalar(0));
        for (int64_t i = 0; i < dk; ++i) {  // S <- Diag(alpha) S, u = S^T k
          Scalar* __restrict s_row = s + i * dv;
          const Scalar alpha = std::exp(g[i]);
          const Scalar k_i = k[i];
          for (int64_t j = 0; j < dv; ++j) {
            s_row[j] *= alpha;
            uu[j] += k_i * s_row[j];
          }
        }
        const Scalar b = beta_all[row];
        for (int64_t j = 0; j < dv; ++j) uu[j] = b * (uu[j] - v[j]);
        std::fill(o, o + dv, Scalar(0));
        for (int64_t i = 0; i < dk; ++i) {  // S <- S - k u^T, o = S^T q
          Scalar* __restrict s_row = s + i * dv;
          const Scalar k_i = k[i];
          const Scalar q_i = q[i];
          for (int64_t j = 0; j < dv; ++j) {
            s_row[j] -= k_i * uu[j];
            o[j] += q_i * s_row[j];
          }
        }
      }
    }
  });
}
#pragma GCC pop_options

}  // namespace

GatedDeltaRuleOutput GatedDeltaRuleRecurrent(const at::Tensor& query, const at::Tensor& key,
                                             const at::Tensor& value, const at::Tensor& log_decay,
                                             const at::Tensor& beta,
                                             const at::Tensor& initial_state) {
  const Dims d = CheckInputs(query, key, value, log_decay, beta, initial_state);
#if defined(STRIDER_CUDA_DECODE)
  // A decode position on a GPU: one launch of the CUDA step (docs/cuda.md) in place of the six
  // batched products per position of the loop below.
  if (query.is_cuda() && d.t == 1) {
    GatedDeltaRuleOutput out =
        internal::GatedDeltaRuleDecodeCuda(query, key, value, log_decay, beta, initial_state);
    if (out.output.defined()) return out;
  }
#endif
  const int64_t bh = d.b * d.h;
  auto q = query.reshape({bh, d.t, d.dk});                                // (BH, T, Dk)
  auto k = key.reshape({bh, d.t, d.dk});                                  // (BH, T, Dk)
  auto v = value.reshape({bh, d.t, d.dv});                                // (BH, T, Dv)
  // The fused loop reads host memory; off the CPU the ATen loop below runs where the tensors are.
  if (query.device().is_cpu() &&
      !NeedsGradient({&query, &key, &value, &log_decay, &beta, &initial_state})) {
    auto state = at::empty({bh, d.dk, d.dv}, initial_state.options());   // (BH, Dk, Dv)
    state.view({d.b, d.h, d.dk, d.dv}).copy_(initial_state);
    auto output = at::empty({bh, d.t, d.dv}, value.options());           // (BH, T, Dv)
    AT_DISPATCH_FLOATING_TYPES(query.scalar_type(), "gated delta rule recurrent", [&] {
      RecurrentInPlace<scalar_t>(q.contiguous(), k.contiguous(), v.contiguous(),
                                 log_decay.reshape({bh, d.t, d.dk}).contiguous(),
                                 beta.reshape({bh, d.t}).contiguous(), state, output);
    });
    return {output.view({d.b, d.h, d.t, d.dv}), state.view({d.b, d.h, d.dk, d.dv})};
  }

  // Differentiable loop: every step makes a new state so autograd keeps each one.
  // exp once for all positions; transposed so a position's slice broadcasts over Dv.
  auto alpha = log_decay.reshape({bh, d.t, d.dk}).exp().transpose(1, 2);  // (BH, Dk, T)
  auto b = beta.reshape({bh, d.t, 1});                                    // (BH, T, 1)
  auto state = initial_state.reshape({bh, d.dk, d.dv});                   // (BH, Dk, Dv)
  std::vector<at::Tensor> outputs;
  outputs.reserve(d.t);
  for (int64_t t = 0; t < d.t; ++t) {
    auto k_t = k.narrow(1, t, 1);                                         // (BH, 1, Dk)
    state = state * alpha.narrow(2, t, 1);
    auto u = (v.narrow(1, t, 1) - at::bmm(k_t, state)) * b.narrow(1, t, 1);  // (BH, 1, Dv)
    state = at::baddbmm(state, k_t.transpose(1, 2), u);
    outputs.push_back(at::bmm(q.narrow(1, t, 1), state));                 // (BH, 1, Dv)
  }
  auto output = d.t == 0 ? at::zeros({bh, 0, d.dv}, value.options()) : at::cat(outputs, 1);
  return {output.view({d.b, d.h, d.t, d.dv}), state.reshape({d.b, d.h, d.dk, d.dv})};
}

GatedDeltaRuleOutput GatedDeltaRuleChunkwise(const at::Tensor& query, const at::Tensor& key,
                                             const at::Tensor& value, const at::Tensor& log_decay,
                                             const at::Tensor& beta,
                                             const at::Tensor& initial_state,
                                             int64_t chunk_size) {
  const Dims d = CheckInputs(query, key, value, log_decay, beta, initial_state);
  TORCH_CHECK(chunk_size > 0, "gated delta rule: chunk_size must be positive, got ", chunk_size);
  const int64_t bh = d.b * d.h;
  // A sequence shorter than a chunk needs no padding beyond itself.
  const int64_t c = std::max<int64_t>(1, std::min(chunk_size, d.t));
  const int64_t n = (d.t + c - 1) / c;
  const int64_t pad = n * c - d.t;
  if (d.t == 0) {
    return {at::zeros({d.b, d.h, 0, d.dv}, value.options()), initial_state.clone()};
  }

  // Pad the last chunk with beta = 0 and g = 0: alpha = 1 and no write, so padded positions
  // leave the state unchanged; their outputs are dropped below.
  auto padded = [&](const at::Tensor& x, int64_t width) {
    auto flat = x.reshape({bh, d.t, width});
    if (pad > 0) flat = at::constant_pad_nd(flat, {0, 0, 0, pad});
    return flat.reshape({bh * n, c, width});
  };
  auto q = padded(query, d.dk);                                           // (M, C, Dk), M = BH N
  auto k = padded(key, d.dk);                                             // (M, C, Dk)
  auto v = padded(value, d.dv);                                           // (M, C, Dv)
  auto g = padded(log_decay, d.dk);                                       // (M, C, Dk)
  auto b = padded(beta.unsqueeze(-1), 1);                                 // (M, C, 1)

  auto cum = g.cumsum(1);                                                 // (M, C, Dk) G
  auto [a_kk, a_qk] = IntraChunkProducts(q, k, cum);                      // (M, C, C) each
  a_kk = a_kk * b;  // row r scaled by beta_r

  // Steps 2-3 for all chunks: [W, U] = (I + A_kk)^{-1} beta [exp(G) K, V]. With
  // unitriangular = true the solver takes the unit diagonal as given and reads only the strict
  // lower triangle, which is exactly A_kk; its backward keeps the gradient strictly lower too.
  auto rhs = at::cat({k * cum.exp(), v}, 2) * b;                          // (M, C, Dk + Dv)
  auto wu = at::linalg_solve_triangular(a_kk, rhs, /*upper=*/false, /*left=*/true,
                                        /*unitriangular=*/true);          // (M, C, Dk + Dv)
  auto w = wu.narrow(2, 0, d.dk);                                         // (M, C, Dk)
  auto u = wu.narrow(2, d.dk, d.dv);                                      // (M, C, Dv)

  // State-independent factors of step 4, for all chunks at once.
  auto g_last = cum.narrow(1, c - 1, 1);                                  // (M, 1, Dk)
  auto q_decayed = q * cum.exp();                                         // (M, C, Dk)
  auto k_to_end = (k * (g_last - cum).exp()).transpose(1, 2);             // (M, Dk, C)
  auto chunk_decay = g_last.exp().transpose(1, 2);                        // (M, Dk, 1)

  // Chunk index second so each step takes a (BH, ...) slice.
  auto by_chunk = [&](const at::Tensor& x) { return x.reshape({bh, n, x.size(1), x.size(2)}); };
  auto w_n = by_chunk(w), u_n = by_chunk(u), q_n = by_chunk(q_decayed);
  auto a_qk_n = by_chunk(a_qk), k_end_n = by_chunk(k_to_end), decay_n = by_chunk(chunk_decay);

  auto state = initial_state.reshape({bh, d.dk, d.dv});                   // (BH, Dk, Dv)
  std::vector<at::Tensor> outputs;
  outputs.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    // V' = U - W S: what each position writes once the incoming state is accounted for.
    auto v_new = at::baddbmm(u_n.select(1, i), w_n.select(1, i), state, 1, -1);  // (BH, C, Dv)
    outputs.push_back(at::baddbmm(at::bmm(q_n.select(1, i), state), a_qk_n.select(1, i),
                                  v_new));                                // (BH, C, Dv)
    state = at::baddbmm(state * decay_n.select(1, i), k_end_n.select(1, i), v_new);
  }
  auto output = at::stack(outputs, 1).view({d.b, d.h, n * c, d.dv});     // (B, H, N C, Dv)
  if (pad > 0) output = output.narrow(2, 0, d.t);
  return {output, state.reshape({d.b, d.h, d.dk, d.dv})};
}

}  // namespace strider::kernels
