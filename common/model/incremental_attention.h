// Incremental attention: gated delta-rule linear attention (docs/model_math.md#gated-delta-rule).
//
// A constant-size state per head replaces the growing key-value cache, so decode cost does not
// depend on context length. One forward function serves both paths: without a state it is the
// training path (zero initial state, chunkwise kernel over the whole sequence); with a state it
// appends tokens to it (recurrent kernel for one token, chunkwise kernel with the carried state
// for a chunk), and the convolution reads its last positions from the state's tail.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "common/model/config.h"
#include "common/model/ops.h"

namespace strider::model {

struct IncrementalAttentionWeights {
  at::Tensor query;            // (H*Dk, d)
  at::Tensor key;              // (H*Dk, d)
  at::Tensor value;            // (H*Dv, d)
  at::Tensor query_conv;       // (H*Dk, w) causal depthwise, no bias
  at::Tensor key_conv;         // (H*Dk, w)
  at::Tensor value_conv;       // (H*Dv, w)
  at::Tensor beta;             // (H, d)
  at::Tensor decay_down;       // (r, d)
  at::Tensor decay_up;         // (H*Dk, r)
  at::Tensor decay_bias;       // (H*Dk)
  at::Tensor decay_log_scale;  // (H) A_h, exp(A_h) scales the gate's input
  at::Tensor output_norm;      // (Dv) RMSNorm weight shared by heads
  at::Tensor gate;             // (H*Dv, d) full rank, or undefined when low rank:
  at::Tensor gate_down;        // (r, d)     gate_rank > 0
  at::Tensor gate_up;          // (H*Dv, r)
  at::Tensor output;           // (d, H*Dv)
  // query, key, value, gate (or gate_down), beta, decay_down as row blocks of one matrix
  // (Model::Bind), or undefined: what inference multiplies x by.
  at::Tensor joined_input;

  static IncrementalAttentionWeights Bind(const TensorMap& tensors, const std::string& prefix);
};

// Per-sequence inference state of one layer; constant size.
struct IncrementalAttentionState {
  at::Tensor recurrent;  // (B, H, Dk, Dv) S, fp32 (fp64 for an fp64 model)
  at::Tensor conv_tail;  // (B, w-1, 2*H*Dk + H*Dv) last projections before the convolution

  static IncrementalAttentionState Zeros(const IncrementalAttentionConfig& config,
                                         int64_t batch, const at::TensorOptions& options);
};

// Intermediates kept for debugging and tests (named as in docs/model_math.md).
struct IncrementalAttentionTrace {
  at::Tensor log_decay;  // (B, H, T, Dk) g
  at::Tensor beta;       // (B, H, T)
};

// x: (B, T, d) pre-normed input. Returns (B, T, d).
at::Tensor IncrementalAttentionForward(const IncrementalAttentionWeights& weights,
                                       const IncrementalAttentionConfig& config,
                                       const at::Tensor& x, IncrementalAttentionState* state,
                                       double norm_epsilon,
                                       IncrementalAttentionTrace* trace = nullptr);

// g = g_min * sigmoid(exp(A_h) * z), z: (B, T, H*Dk), A: (H). Returns (B, T, H*Dk).
at::Tensor DecayGate(const at::Tensor& z, const at::Tensor& decay_log_scale, int64_t heads,
                     double min_log_decay);

// g = -exp(A_h) * softplus(z) (decay_gate: softplus), same shapes as DecayGate.
at::Tensor SoftplusDecayGate(const at::Tensor& z, const at::Tensor& decay_log_scale, int64_t heads);

}  // namespace strider::model
