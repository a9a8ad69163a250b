// Small operations every layer uses. Plain functions over tensors, one definition each, so the
// training path and the inference path cannot drift apart.
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <map>
#include <string>
#include <vector>

namespace strider::model {

using TensorMap = std::map<std::string, at::Tensor>;

// The tensor named `name`; throws (inside model code) naming it when it is missing.
const at::Tensor& Lookup(const TensorMap& tensors, const std::string& name);

// x W^T for a weight stored (out, in), as checkpoints store linear layers.
at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight);

// The outputs of several weights that read the same input x, in order. Model::Bind lays such
// weights out as consecutive row blocks of one matrix, `joined` (JoinRows); without autograd
// that matrix is applied as one product, one pass over x and one BLAS call instead of one per
// weight, and the outputs are column ranges of it (views). With autograd, or when `joined` is
// undefined, each weight is applied on its own so gradients reach it. A 3-D weight (n, rows, in)
// gives one output of n * rows columns.
std::vector<at::Tensor> LinearParts(const at::Tensor& x, const at::Tensor& joined,
                                    std::initializer_list<const at::Tensor*> weights);

// Lays the named tensors out as consecutive row blocks of one new (sum of rows, in) matrix and
// replaces each with its view there, keeping shapes, values and requires_grad; returns the
// matrix. When they already are such views (a second Bind) it only returns the matrix. Returns
// an undefined tensor when any is missing or they differ in dtype, device or input width.
at::Tensor JoinRows(TensorMap* tensors, const std::vector<std::string>& names);

// x / rms(x) over the last dimension, times `weight` when it is defined.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double epsilon);

// SiTU-GLU feed-forward W_out([c1 tanh(a/c1) sigmoid(a)] * [c2 tanh(b/c2)]), a = W_gate x,
// b = W_up x (docs/model_math.md#situ-glu). Weights (hidden, in), (hidden, in), (out, hidden).
at::Tensor SituGluFeedForward(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                              const at::Tensor& down, double gate_cap, double up_cap);

}  // namespace strider::model
