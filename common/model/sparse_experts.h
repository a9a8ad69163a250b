// Feed-forward layers: the dense gated block and the sparse expert layer
// (docs/model_math.md#sparse-experts-and-routing).
//
//   latent:      y = sum_{shared j} E_j(x) + W_up RMSNorm( sum_{i in TopK} p_i E_i(W_down x) )
//   full width:  y = sum_{shared j} E_j(x) + sum_{i in TopK} p_i E_i(x)
//
// With latent experts the routed experts share W_down (d -> l) and W_up (l -> d) and work in the
// latent width l, so each is small and many fit; full-width experts (feed_forward.latent_experts:
// false) are Kimi Linear's, each reading and writing x itself. The router reads the full-width
// x; shared experts run on x at full width for every token. Every block's activation is SiTU-GLU
// or SwiGLU (feed_forward.activation). Routed computation is grouped by expert: the tokens that
// chose expert e are gathered, pass through it in one matrix product, and are scattered back
// with their weights, whatever the batch composition (the same code serves training and decode).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "common/kernels/routing.h"
#include "common/model/config.h"
#include "common/model/ops.h"

namespace strider::model {

struct DenseFeedForwardWeights {
  at::Tensor gate;  // (F, d)
  at::Tensor up;    // (F, d)
  at::Tensor down;  // (d, F)
  at::Tensor joined_input;  // gate and up as row blocks of one matrix (Model::Bind), or undefined

  static DenseFeedForwardWeights Bind(const TensorMap& tensors, const std::string& prefix);
};

at::Tensor DenseFeedForward(const DenseFeedForwardWeights& weights,
                            const FeedForwardConfig& config, const at::Tensor& x);

// The configured gated activation of preactivations a = W_gate x and b = W_up x: SiTU-GLU with
// the config's caps, or SwiGLU.
at::Tensor GatedActivation(const at::Tensor& gate_preactivation,
                           const at::Tensor& up_preactivation, const FeedForwardConfig& config);

// One gated block W_down GatedActivation(W_gate x, W_up x): an expert. Weights (hidden, in),
// (hidden, in), (out, hidden).
at::Tensor GatedFeedForward(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& down, const FeedForwardConfig& config);

// The router's options from the config (kernels/routing.h).
kernels::RouterOptions RouterOptionsOf(const FeedForwardConfig& config);

// With full-width experts the latent_* tensors are undefined and l reads d below.
struct SparseExpertWeights {
  at::Tensor router;       // (n, d)
  at::Tensor router_bias;  // (n) quantile-balancing bias; not trained by gradients
  at::Tensor latent_down;  // (l, d)
  at::Tensor latent_norm;  // (l)
  at::Tensor latent_up;    // (d, l)
  at::Tensor routed_gate;  // (n, E, l)
  at::Tensor routed_up;    // (n, E, l)
  at::Tensor routed_down;  // (n, l, E)
  at::Tensor shared_gate;  // (s, S, d) or undefined when there are no shared experts
  at::Tensor shared_up;    // (s, S, d)
  at::Tensor shared_down;  // (s, d, S)
  // router, latent_down (when latent), shared_gate, shared_up as row blocks of one matrix
  // (Model::Bind), or undefined: what inference multiplies the tokens by.
  at::Tensor joined_input;

  static SparseExpertWeights Bind(const TensorMap& tensors, const std::string& prefix,
                                  bool has_shared_experts, bool latent_experts = true);
};

// What one sparse layer decided for its tokens (M = B*T, flattened in row-major order).
struct RoutingRecordEntry {
  at::Tensor experts;  // (M, k) int64 chosen experts
  at::Tensor scores;   // (M, n) router scores, detached; input to quantile balancing
};

class ExpertExchange;

// x: (B, T, d). `replay_experts` (M, k), when defined, fixes the choice (routing replay); the
// weights are recomputed from the scores with the config's router options either way.
// With `exchange` (expert parallelism, expert_parallel.h) the weights' routed_* hold only this
// rank's shard of the experts, and the routed pairs travel to the ranks holding their experts.
at::Tensor SparseExpertForward(const SparseExpertWeights& weights,
                               const FeedForwardConfig& config, const at::Tensor& x,
                               const at::Tensor& replay_experts, RoutingRecordEntry* record,
                               double norm_epsilon, ExpertExchange* exchange = nullptr);

}  // namespace strider::model
