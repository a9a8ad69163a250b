// SiTU-GLU activation (docs/model_math.md#situ-glu): the gated product inside every
// feed-forward block of Strider's model,
//
//   SituGlu(a, b) = [c1 tanh(a / c1) * sigmoid(a)] * [c2 tanh(b / c2)],
//
// with a = W_gate x and b = W_up x. Near zero it equals SwiGLU (SiLU(a) * b) to first order;
// the tanh caps bound every coordinate by c1 * c2 (100 by default), so one outlier activation
// cannot blow up the expert output in low precision. The output projection W_out is not here.
//
// SwiGlu is the plain product SiLU(a) * b that Kimi Linear (hidden_act: silu) uses in its place
// (feed_forward.activation: silu).
#pragma once

#include <ATen/core/Tensor.h>

namespace strider::kernels {

// gate_preactivation (a) and up_preactivation (b): same shape (or broadcastable), any floating
// dtype. Built from differentiable ATen operations, so autograd gives the gradients.
// gate_cap (c1) and up_cap (c2) must be positive.
at::Tensor SituGlu(const at::Tensor& gate_preactivation, const at::Tensor& up_preactivation,
                   double gate_cap = 4, double up_cap = 25);

// SiLU(a) * b = a sigmoid(a) * b, same shapes and dtypes as SituGlu; differentiable.
at::Tensor SwiGlu(const at::Tensor& gate_preactivation, const at::Tensor& up_preactivation);

}  // namespace strider::kernels
