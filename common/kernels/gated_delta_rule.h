// Gated delta rule with per-channel decay: the kernel of incremental attention
// (docs/model_math.md#gated-delta-rule).
//
// Two forms of one recurrence, shared by the training path and the inference path:
//   - Recurrent: one position at a time. The reference, and the decode kernel.
//   - Chunkwise: chunks of C positions processed with matrix products; equal to the recurrent
//     form up to rounding. The training and prefill kernel.
// Both are written with differentiable ATen operations, so autograd gives their gradients.
//
// Shapes (B batch, H heads, T positions, Dk key width, Dv value width):
//   query, key:     (B, H, T, Dk)  key L2-normalised; query already scaled by Dk^-1/2
//   value:          (B, H, T, Dv)
//   log_decay:      (B, H, T, Dk)  g <= 0, alpha = exp(g)
//   beta:           (B, H, T)      write strength in (0, 1)
//   initial_state:  (B, H, Dk, Dv) S before the first position; fp32 or fp64
// Per position t:  S <- Diag(alpha_t) S;  S <- S + beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T q_t.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace strider::kernels {

struct GatedDeltaRuleOutput {
  at::Tensor output;       // (B, H, T, Dv)
  at::Tensor final_state;  // (B, H, Dk, Dv)
};

GatedDeltaRuleOutput GatedDeltaRuleRecurrent(const at::Tensor& query, const at::Tensor& key,
                                             const at::Tensor& value, const at::Tensor& log_decay,
                                             const at::Tensor& beta,
                                             const at::Tensor& initial_state);

// T need not be a multiple of chunk_size; the last chunk is shorter.
GatedDeltaRuleOutput GatedDeltaRuleChunkwise(const at::Tensor& query, const at::Tensor& key,
                                             const at::Tensor& value, const at::Tensor& log_decay,
                                             const at::Tensor& beta,
                                             const at::Tensor& initial_state,
                                             int64_t chunk_size = 64);

}  // namespace strider::kernels
