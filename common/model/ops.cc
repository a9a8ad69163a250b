#include "common/model/ops.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <vector>

#include "common/kernels/situ.h"

namespace strider::model {

const at::Tensor& Lookup(const TensorMap& tensors, const std::string& name) {
  auto it = tensors.find(name);
  TORCH_CHECK(it != tensors.end(), "model weights have no tensor named '", name, "'");
  return it->second;
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight) {
  // One row without autograd (batch-1 decode): a matrix-vector product reads each weight once,
  // where a one-row matrix product first packs the whole weight matrix into a scratch copy. The
  // training path keeps the matrix product, whose gradients autograd already knows.
  if (!c10::GradMode::is_enabled() && x.dim() >= 1 && x.numel() == x.size(-1) &&
      weight.dim() == 2 && x.size(-1) == weight.size(1)) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return at::mv(weight, x.reshape({x.size(-1)})).view(shape);
  }
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
