// Small operations every layer uses. Plain functions over tensors, one definition each, so the
// training path and the inference path cannot drift apart.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace strider::model {

using TensorMap = std::map<std::string, at::Tensor>;

// The tensor named `name`; throws (inside model code) naming it when it is missing.
const at::Tensor& Lookup(const TensorMap& tensors, const std::string& name);

// x W^T for a weight stored (out, in), as checkpoints store linear layers.
at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight);

// x / rms(x) over the last dimension, times `weight` when it is defined.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double epsilon);

// SiTU-GLU feed-forward W_out([c1 tanh(a/c1) sigmoid(a)] * [c2 tanh(b/c2)]), a = W_gate x,
// b = W_up x (MODEL.md s.4). Weights (hidden, in), (hidden, in), (out, hidden).
at::Tensor SituGluFeedForward(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                              const at::Tensor& down, double gate_cap, double up_cap);

}  // namespace strider::model
