#include "common/model/ops.h"

#include <ATen/ATen.h>

#include "common/kernels/situ.h"

namespace strider::model {

const at::Tensor& Lookup(const TensorMap& tensors, const std::string& name) {
  auto it = tensors.find(name);
  TORCH_CHECK(it != tensors.end(), "model weights have no tensor named '", name, "'");
  return it->second;
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight) {
  return at::matmul(x, weight.t());
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double epsilon) {
  at::Tensor normed = x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + epsilon);
  return weight.defined() ? normed * weight : normed;
}

at::Tensor SituGluFeedForward(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                              const at::Tensor& down, double gate_cap, double up_cap) {
  return Linear(kernels::SituGlu(Linear(x, gate), Linear(x, up), gate_cap, up_cap), down);
}

}  // namespace strider::model
