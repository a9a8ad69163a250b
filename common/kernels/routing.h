// Sparse expert routing and quantile balancing (MODEL.md s.4 and s.5).
//
// The router's scores are sigmoid(W_r x). Experts are chosen by top-k over scores + bias; the
// weights are the chosen scores renormalised to sum to one. The bias only changes which experts
// are chosen, never the weights or the gradients (it enters through argmax, not arithmetic).
//
// Quantile balancing computes the bias from the dual of the balanced assignment problem: per
// token the threshold alpha_i is its (k+1)-th largest biased score; per expert beta_j is the
// (q+1)-th largest margin s_ij - alpha_i over the batch, q = m k / n; the new bias is -beta,
// centred. One pass per training step, used from the next step on.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace strider::kernels {

struct RoutingDecision {
  at::Tensor experts;  // (M, k) int64: chosen expert ids, best biased score first
  at::Tensor weights;  // (M, k) scores of the chosen experts / their sum; differentiable
};

// scores: (M, N) in (0, 1); bias: (N). k in [1, N].
RoutingDecision RouteTopK(const at::Tensor& scores, const at::Tensor& bias, int64_t k);

// Chosen experts given from outside (routing replay): the weights are recomputed from `scores`
// so gradients flow, but the choice is exactly `experts` (M, k).
RoutingDecision RouteWithExperts(const at::Tensor& scores, const at::Tensor& experts);

// One quantile-balancing update. scores: (M, N) (detached internally); bias: (N) current bias.
// Returns the new bias (N), centred to zero mean.
at::Tensor QuantileBalanceBias(const at::Tensor& scores, const at::Tensor& bias, int64_t k);

// (max_j load_j - mean load) / mean load for experts (M, k) over n experts.
double MaxViolation(const at::Tensor& experts, int64_t num_experts);

}  // namespace strider::kernels
