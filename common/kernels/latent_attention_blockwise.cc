// The differentiable blockwise form of latent attention (common/kernels/latent_attention.h):
// FlashAttention's forward and backward over (query rows x keys) tiles, written with ATen matrix
// products so the BLAS does the inner products. Keys and values are shared by the heads, so a
// tile's query rows are (tokens x heads) and one key row serves all of them.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/kernels/latent_attention.h"

namespace strider::kernels {
namespace {

// Query rows (tokens x heads) and keys per tile: a 1024 x 1024 tile of scores is 4 MiB in
// float32, small enough to stay in the last-level cache with its operands, large enough that
// the products run at the BLAS's matrix rate.
constexpr int64_t kQueryRows = 1024;
constexpr int64_t kKeys = 1024;

// Causal visibility inside a tile: query row r (token first_token + r / heads) sees key k0 + j
// when k0 + j <= past + token. Undefined when the whole tile is visible. Made on the scores'
// device.
at::Tensor FutureMask(int64_t first_token, int64_t tokens, int64_t heads, int64_t past,
                      int64_t k0, int64_t keys, const at::Device& device) {
  if (k0 + keys - 1 <= past + first_token) return at::Tensor();
  const at::TensorOptions options = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor key = at::arange(k0, k0 + keys, options);
  // Each token's limit once per head (expanded: repeat_interleave reads its repeats on the host).
  at::Tensor limit = (at::arange(first_token, first_token + tokens, options) + past)
                         .unsqueeze(1)
                         .expand({tokens, heads})
                         .reshape({-1});
  return key.unsqueeze(0) > limit.unsqueeze(1);  // (rows, keys)
}

// Keys a query tile of tokens [t0, t0 + count) needs: 0 .. past + t0 + count - 1.
int64_t VisibleKeys(int64_t past, int64_t t0, int64_t count) { return past + t0 + count; }

struct Tiles {
  int64_t batch, tokens, heads, width, latent_rank, keys, past, tile_tokens;
};

// Where a tile's keys [latent; rope_key] come from: the separate past's rows 0 .. separate - 1
// (no gradient; read where they are and joined a block at a time), then the rows of `joined`
// (with gradient). Without a separate past, every key is a row of `joined`.
struct KeySource {
  at::Tensor past_latent;  // (B, P, Dc) or undefined
  at::Tensor past_rope;    // (B, P, Dr) or undefined
  at::Tensor joined;       // (B, S - P, W), contiguous
  int64_t separate = 0;    // P

  int64_t keys() const { return separate + joined.size(1); }

  // Keys k0 .. k0 + n - 1 of row b as one (n, W) matrix: a view of `joined`, or a copy of n
  // rows where the block reads the separate past.
  at::Tensor Block(int64_t b, int64_t k0, int64_t n) const {
    if (k0 >= separate) return joined[b].narrow(0, k0 - separate, n);
    const int64_t from_past = std::min(n, separate - k0);
    at::Tensor past = at::cat(
        {past_latent[b].narrow(0, k0, from_past), past_rope[b].narrow(0, k0, from_past)}, 1);
    if (from_past == n) return past;
    return at::cat({past, joined[b].narrow(0, 0, n - from_past)}, 0);
  }
};

// query (B, T, H, W); the values are the keys' first `latent_rank` columns.
Tiles Shape(const at::Tensor& query, const KeySource& keys, int64_t latent_rank) {
  Tiles t;
  t.batch = query.size(0);
  t.tokens = query.size(1);
  t.heads = query.size(2);
  t.width = query.size(3);
  t.latent_rank = latent_rank;
  t.keys = keys.keys();
  t.past = t.keys - t.tokens;
  t.tile_tokens = std::max<int64_t>(1, kQueryRows / t.heads);
  return t;
}

// Returns the output (B, T, H, Dc) and the log-sum-exp of every query row (B, T * H).
// The values are the keys' first Dc columns (the latent).
std::pair<at::Tensor, at::Tensor> Forward(const at::Tensor& query, const KeySource& keys,
                                          const Tiles& s) {
  const double inf = std::numeric_limits<double>::infinity();
  at::Tensor out = at::empty({s.batch, s.tokens, s.heads, s.latent_rank}, query.options());
  at::Tensor lse = at::empty({s.batch, s.tokens * s.heads}, query.options());
  for (int64_t b = 0; b < s.batch; ++b) {
    at::Tensor q = query[b].reshape({s.tokens * s.heads, s.width});
    at::Tensor out_rows = out[b].view({s.tokens * s.heads, s.latent_rank});
    for (int64_t t0 = 0; t0 < s.tokens; t0 += s.tile_tokens) {
      const int64_t count = std::min(s.tile_tokens, s.tokens - t0);
      const int64_t rows = count * s.heads;
      at::Tensor q_tile = q.narrow(0, t0 * s.heads, rows);
      at::Tensor max = at::full({rows}, -inf, q.options());
      at::Tensor sum = at::zeros({rows}, q.options());
      at::Tensor acc = at::zeros({rows, s.latent_rank}, q.options());
      const int64_t visible = VisibleKeys(s.past, t0, count);
      for (int64_t k0 = 0; k0 < visible; k0 += kKeys) {
        const int64_t n = std::min(kKeys, visible - k0);
        at::Tensor block = keys.Block(b, k0, n);
        at::Tensor scores = at::mm(q_tile, block.t());
        at::Tensor future = FutureMask(t0, count, s.heads, s.past, k0, n, scores.device());
        if (future.defined()) scores.masked_fill_(future, -inf);
        at::Tensor top = at::maximum(max, std::get<0>(scores.max(1)));
        at::Tensor correction = at::exp(max - top);
        // In place: a tile's scores are not needed after this, and a second (rows x keys)
        // buffer would be 4 MiB more at the forward's peak.
        at::Tensor p = scores.sub_(top.unsqueeze(1)).exp_();
        sum.mul_(correction).add_(p.sum(1));
        acc.mul_(correction.unsqueeze(1)).addmm_(p, block.narrow(1, 0, s.latent_rank));
        max = top;
      }
      // Every query row sees at least its own key, so sum >= 1 at the maximum.
      out_rows.narrow(0, t0 * s.heads, rows).copy_(acc / sum.unsqueeze(1));
      lse[b].narrow(0, t0 * s.heads, rows).copy_(max + at::log(sum));
    }
  }
  return {out, lse};
}

class BlockwiseFunction : public torch::autograd::Function<BlockwiseFunction> {
 public:
  // `past`: empty, or the separate past's latent and rope key (no gradient; not inputs of the
  // graph, so no gradient slot is made for them).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& query,
                            const at::Tensor& latent, const at::Tensor& rope_key,
                            const std::vector<at::Tensor>& past) {
    at::NoGradGuard no_grad;
    at::Tensor q = query.contiguous();
    KeySource keys{past.empty() ? at::Tensor() : past[0], past.empty() ? at::Tensor() : past[1],
                   at::cat({latent, rope_key}, 2),  // (B, S - P, W)
                   past.empty() ? 0 : past[0].size(1)};
    const Tiles s = Shape(q, keys, latent.size(2));
    auto [out, lse] = Forward(q, keys, s);
    ctx->save_for_backward({q, keys.joined, out, lse});
    if (!past.empty()) {
      ctx->saved_data["past_latent"] = past[0];
      ctx->saved_data["past_rope"] = past[1];
    }
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::NoGradGuard no_grad;
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& query = saved[0];
    const at::Tensor& out = saved[2];
    const at::Tensor& lse = saved[3];
    KeySource keys;
    keys.joined = saved[1];
    if (ctx->saved_data.count("past_latent") > 0) {
      keys.past_latent = ctx->saved_data["past_latent"].toTensor();
      keys.past_rope = ctx->saved_data["past_rope"].toTensor();
      keys.separate = keys.past_latent.size(1);
    }
    const int64_t latent_rank = out.size(3);
    const Tiles s = Shape(query, keys, latent_rank);
    const double inf = std::numeric_limits<double>::infinity();
    at::Tensor d_out = grads[0].contiguous();
    at::Tensor d_query = at::zeros_like(query);
    // Gradients only for the joined keys: the separate past has none, so nothing of its size is
    // allocated.
    at::Tensor d_keys = at::zeros_like(keys.joined);  // (B, S - P, W)
    at::Tensor d_values = at::zeros({s.batch, keys.joined.size(1), latent_rank}, query.options());
    for (int64_t b = 0; b < s.batch; ++b) {
      at::Tensor q = query[b].view({s.tokens * s.heads, s.width});
      at::Tensor dq = d_query[b].view({s.tokens * s.heads, s.width});
      at::Tensor o = out[b].view({s.tokens * s.heads, latent_rank});
      at::Tensor d_o = d_out[b].view({s.tokens * s.heads, latent_rank});
      // D_r = sum_c dO_rc O_rc: the softmax's backward in one number per query row.
      at::Tensor delta = (d_o * o).sum(1);
      for (int64_t t0 = 0; t0 < s.tokens; t0 += s.tile_tokens) {
        const int64_t count = std::min(s.tile_tokens, s.tokens - t0);
        const int64_t rows = count * s.heads;
        const int64_t r0 = t0 * s.heads;
        at::Tensor q_tile = q.narrow(0, r0, rows);
        at::Tensor d_o_tile = d_o.narrow(0, r0, rows);
        at::Tensor lse_tile = lse[b].narrow(0, r0, rows).unsqueeze(1);
        at::Tensor delta_tile = delta.narrow(0, r0, rows).unsqueeze(1);
        at::Tensor dq_tile = dq.narrow(0, r0, rows);
        const int64_t visible = VisibleKeys(s.past, t0, count);
        for (int64_t k0 = 0; k0 < visible; k0 += kKeys) {
          const int64_t n = std::min(kKeys, visible - k0);
          at::Tensor k = keys.Block(b, k0, n);
          at::Tensor v = k.narrow(1, 0, latent_rank);
          at::Tensor scores = at::mm(q_tile, k.t());
          at::Tensor future = FutureMask(t0, count, s.heads, s.past, k0, n, scores.device());
          if (future.defined()) scores.masked_fill_(future, -inf);
          at::Tensor p = scores.sub_(lse_tile).exp_();  // (rows, n), in place
          at::Tensor d_scores = at::mm(d_o_tile, v.t());  // dP = dO V^T
          d_scores.sub_(delta_tile).mul_(p);              // dS = P (dP - D)
          dq_tile.addmm_(d_scores, k);                    // dQ += dS K
          // Keys of the block that have gradients: those past the separate past.
          const int64_t skip = std::max<int64_t>(0, keys.separate - k0);
          if (skip < n) {
            const int64_t j0 = k0 + skip - keys.separate;  // row in `joined`
            d_values[b].narrow(0, j0, n - skip).addmm_(p.narrow(1, skip, n - skip).t(),
                                                         d_o_tile);  // dV += P^T dO
            d_keys[b].narrow(0, j0, n - skip).addmm_(d_scores.narrow(1, skip, n - skip).t(),
                                                       q_tile);  // dK += dS^T Q
          }
        }
      }
    }
    at::Tensor d_latent = d_keys.narrow(2, 0, latent_rank) + d_values;
    at::Tensor d_rope = d_keys.narrow(2, latent_rank, s.width - latent_rank).contiguous();
    return {d_query, d_latent, d_rope, at::Tensor()};
  }
};

}  // namespace

at::Tensor LatentAttentionBlockwise(const at::Tensor& query, const at::Tensor& latent,
                                    const at::Tensor& rope_key, const at::Tensor& past_latent,
                                    const at::Tensor& past_rope_key) {
  TORCH_CHECK(query.dim() == 4 && latent.dim() == 3 && rope_key.dim() == 3,
              "latent attention (blockwise): query (B, T, H, W), latent (B, S, Dc) and rope key "
              "(B, S, Dr)");
  TORCH_CHECK(query.scalar_type() == at::kFloat || query.scalar_type() == at::kDouble,
              "latent attention (blockwise): float32 or float64");
  TORCH_CHECK(latent.scalar_type() == query.scalar_type() &&
                  rope_key.scalar_type() == query.scalar_type(),
              "latent attention (blockwise): query, latent and rope key in one dtype");
  int64_t separate = 0;
  if (past_latent.defined() || past_rope_key.defined()) {
    TORCH_CHECK(past_latent.defined() && past_rope_key.defined() && past_latent.dim() == 3 &&
                    past_rope_key.dim() == 3 && past_latent.size(0) == query.size(0) &&
                    past_rope_key.size(0) == query.size(0) &&
                    past_rope_key.size(1) == past_latent.size(1) &&
                    past_latent.size(2) == latent.size(2) &&
                    past_rope_key.size(2) == rope_key.size(2),
                "latent attention (blockwise): a past of ", past_latent.sizes(), " latent and ",
                past_rope_key.sizes(), " rope rows for ", latent.sizes(), " and ",
                rope_key.sizes());
    TORCH_CHECK(past_latent.scalar_type() == query.scalar_type() &&
                    past_rope_key.scalar_type() == query.scalar_type(),
                "latent attention (blockwise): the past in the query's dtype");
    TORCH_CHECK(!past_latent.requires_grad() && !past_rope_key.requires_grad(),
                "latent attention (blockwise): a separate past takes no gradient; join it to "
                "the latent and rope key instead");
    separate = past_latent.size(1);
  }
  TORCH_CHECK(latent.size(0) == query.size(0) && rope_key.size(0) == query.size(0) &&
                  rope_key.size(1) == latent.size(1) &&
                  query.size(3) == latent.size(2) + rope_key.size(2) &&
                  separate + latent.size(1) >= query.size(1),
              "latent attention (blockwise): ", query.sizes(), " queries against ",
              latent.sizes(), " latent and ", rope_key.sizes(), " rope rows");
  std::vector<at::Tensor> past;
  if (separate > 0) past = {past_latent, past_rope_key};  // read in place, strided or not
  return BlockwiseFunction::apply(query, latent, rope_key, past);
}

}  // namespace strider::kernels
