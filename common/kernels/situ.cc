#include "common/kernels/situ.h"

#include <ATen/ATen.h>

namespace strider::kernels {

at::Tensor SituGlu(const at::Tensor& gate_preactivation, const at::Tensor& up_preactivation,
                   double gate_cap, double up_cap) {
  TORCH_CHECK(gate_cap > 0 && up_cap > 0, "SituGlu: caps must be positive, got ", gate_cap, " and ",
              up_cap);
  // c tanh(x / c) rather than a clamp: smooth, so gradients stay nonzero past the cap.
  at::Tensor gate =
      at::tanh(gate_preactivation / gate_cap) * gate_cap * at::sigmoid(gate_preactivation);
  at::Tensor up = at::tanh(up_preactivation / up_cap) * up_cap;
  return gate * up;
}

}  // namespace strider::kernels
