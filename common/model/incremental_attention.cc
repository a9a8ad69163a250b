#include "common/model/incremental_attention.h"

#include <ATen/ATen.h>

#include <cmath>

#include "common/kernels/gated_delta_rule.h"

namespace strider::model {

IncrementalAttentionWeights IncrementalAttentionWeights::Bind(const TensorMap& t,
                                                             const std::string& p) {
  IncrementalAttentionWeights w;
  w.query = Lookup(t, p + "query");
  w.key = Lookup(t, p + "key");
  w.value = Lookup(t, p + "value");
  w.query_conv = Lookup(t, p + "query_conv");
  w.key_conv = Lookup(t, p + "key_conv");
  w.value_conv = Lookup(t, p + "value_conv");
  w.beta = Lookup(t, p + "beta");
  w.decay_down = Lookup(t, p + "decay_down");
  w.decay_up = Lookup(t, p + "decay_up");
  w.decay_bias = Lookup(t, p + "decay_bias");
  w.decay_log_scale = Lookup(t, p + "decay_log_scale");
  if (auto it = t.find(p + "joined_input"); it != t.end()) w.joined_input = it->second;
  w.output_norm = Lookup(t, p + "output_norm");
  // A low-rank output gate (gate_rank > 0) replaces the full-rank one.
  if (t.count(p + "gate_down") > 0) {
    w.gate_down = Lookup(t, p + "gate_down");
    w.gate_up = Lookup(t, p + "gate_up");
  } else {
    w.gate = Lookup(t, p + "gate");
  }
  w.output = Lookup(t, p + "output");
  return w;
}

IncrementalAttentionState IncrementalAttentionState::Zeros(const IncrementalAttentionConfig& c,
                                                           int64_t batch,
                                                           const at::TensorOptions& options) {
  IncrementalAttentionState state;
  // The recurrent state accumulates over up to a million steps: never below fp32.
  const at::ScalarType state_type =
      options.dtype() == at::kDouble ? at::kDouble : at::kFloat;
  state.recurrent =
      at::zeros({batch, c.heads, c.key_dim, c.value_dim}, options.dtype(state_type));
  state.conv_tail = at::zeros(
      {batch, c.conv_width - 1, c.heads * (2 * c.key_dim + c.value_dim)}, options);
  return state;
}

namespace {

// exp(A_h) broadcast over the head's Dk channels: (H*Dk). Expanded, not repeat_interleave'd:
// that sizes its output from a tensor of repeats, read on the host (a sync per layer on a GPU).
at::Tensor HeadScale(const at::Tensor& decay_log_scale, int64_t heads, int64_t width) {
  const int64_t key_dim = width / heads;
  return at::exp(decay_log_scale.reshape({heads}))
      .unsqueeze(-1)
      .expand({heads, key_dim})
      .reshape({-1});
}

}  // namespace

at::Tensor DecayGate(const at::Tensor& z, const at::Tensor& decay_log_scale, int64_t heads,
                     double min_log_decay) {
  return min_log_decay * at::sigmoid(HeadScale(decay_log_scale, heads, z.size(-1)) * z);
}

at::Tensor SoftplusDecayGate(const at::Tensor& z, const at::Tensor& decay_log_scale,
                             int64_t heads) {
  // Threshold 20 as torch's default and the published kernels: above it softplus(z) = z.
  return -HeadScale(decay_log_scale, heads, z.size(-1)) * at::softplus(z, 1, 20);
}

namespace {

// Causal depthwise convolution over time: out[t] = sum_j w[:, j] * x[t - (w-1) + j], with the
// positions before the first read from `tail` (zeros on the training path). Returns the
// output and the new tail (the last w-1 inputs).
std::pair<at::Tensor, at::Tensor> CausalConv(const at::Tensor& x,       // (B, T, C)
                                             const at::Tensor& weight,  // (C, w)
                                             const at::Tensor& tail) {  // (B, w-1, C)
  const int64_t width = weight.size(1);
  const int64_t length = x.size(1);
  at::Tensor extended = at::cat({tail, x}, 1);  // (B, T+w-1, C)
  at::Tensor out = extended.narrow(1, 0, length) * weight.select(1, 0);
  for (int64_t j = 1; j < width; ++j) {
    out = out + extended.narrow(1, j, length) * weight.select(1, j);
  }
  at::Tensor new_tail = extended.narrow(1, extended.size(1) - (width - 1), width - 1);
  return {out, new_tail};
}

// (B, T, H*D) -> (B, H, T, D)
at::Tensor SplitHeads(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
}

}  // namespace

at::Tensor IncrementalAttentionForward(const IncrementalAttentionWeights& w,
                                       const IncrementalAttentionConfig& c, const at::Tensor& x,
                                       IncrementalAttentionState* state, double norm_epsilon,
                                       IncrementalAttentionTrace* trace) {
  const int64_t batch = x.size(0);
  const int64_t length = x.size(1);
  const int64_t hk = c.heads * c.key_dim;
  const int64_t hv = c.heads * c.value_dim;

  // q, k, v projections share one convolution call: their channels are concatenated so the
  // state keeps one tail.
  const at::Tensor& gate_input = w.gate.defined() ? w.gate : w.gate_down;
  const std::vector<at::Tensor> inputs = LinearParts(
      x, w.joined_input, {&w.query, &w.key, &w.value, &gate_input, &w.beta, &w.decay_down});
  at::Tensor projected = at::cat({inputs[0], inputs[1], inputs[2]}, -1);
  at::Tensor conv_weight = at::cat({w.query_conv, w.key_conv, w.value_conv}, 0);
  at::Tensor tail = state != nullptr
                        ? state->conv_tail
                        : at::zeros({batch, c.conv_width - 1, projected.size(2)}, x.options());
  auto [convolved, new_tail] = CausalConv(projected, conv_weight, tail);
  convolved = at::silu(convolved);
  at::Tensor q = SplitHeads(convolved.narrow(-1, 0, hk), c.heads);
  at::Tensor k = SplitHeads(convolved.narrow(-1, hk, hk), c.heads);
  at::Tensor v = SplitHeads(convolved.narrow(-1, 2 * hk, hv), c.heads);
  // L2 normalisation keeps the delta rule's write a contraction (|k| = 1). The epsilon is
  // added to the squared norm (not config.norm_epsilon, which RMSNorm adds to a mean square):
  // it only keeps an all-zero head finite; docs/model.md says how large it is at init.
  constexpr double kSquaredNormEpsilon = 1e-6;
  q = q / at::sqrt(q.pow(2).sum(-1, true) + kSquaredNormEpsilon) /
      std::sqrt(static_cast<double>(c.key_dim));
  k = k / at::sqrt(k.pow(2).sum(-1, true) + kSquaredNormEpsilon);

  at::Tensor beta = at::sigmoid(inputs[4]).transpose(1, 2);  // (B, H, T)
  at::Tensor z = Linear(inputs[5], w.decay_up) + w.decay_bias;
  at::Tensor g = SplitHeads(c.decay_gate == "softplus"
                                ? SoftplusDecayGate(z, w.decay_log_scale, c.heads)
                                : DecayGate(z, w.decay_log_scale, c.heads, c.min_log_decay),
                            c.heads);
  if (trace != nullptr) {
    trace->log_decay = g;
    trace->beta = beta;
  }

  at::Tensor initial = state != nullptr
                           ? state->recurrent
                           : at::zeros({batch, c.heads, c.key_dim, c.value_dim},
                                       x.options().dtype(x.scalar_type() == at::kDouble
                                                             ? at::kDouble
                                                             : at::kFloat));
  const at::ScalarType kernel_type = initial.scalar_type();
  kernels::GatedDeltaRuleOutput result =
      (state != nullptr && length == 1)
          ? kernels::GatedDeltaRuleRecurrent(q.to(kernel_type), k.to(kernel_type),
                                             v.to(kernel_type), g.to(kernel_type),
                                             beta.to(kernel_type), initial)
          : kernels::GatedDeltaRuleChunkwise(q.to(kernel_type), k.to(kernel_type),
                                             v.to(kernel_type), g.to(kernel_type),
                                             beta.to(kernel_type), initial, c.chunk_size);
  if (state != nullptr) {
    state->recurrent = result.final_state;
    // A copy: the tail is a view of the call's (T + w - 1)-row input buffer, which the state
    // would otherwise keep alive until its next call (1.5 MiB per layer after a 2,048-token
    // chunk of the tiny model, 6 MiB after 8,192).
    state->conv_tail = new_tail.clone();
  }

  at::Tensor o = result.output.to(x.scalar_type()).transpose(1, 2);  // (B, T, H, Dv)
  const double output_epsilon = c.output_norm_epsilon > 0 ? c.output_norm_epsilon : norm_epsilon;
  o = RmsNorm(o, w.output_norm, output_epsilon).reshape({batch, length, hv});
  const at::Tensor gate = w.gate.defined() ? inputs[3] : Linear(inputs[3], w.gate_up);
  o = at::sigmoid(gate) * o;
  return Linear(o, w.output);
}

}  // namespace strider::model
