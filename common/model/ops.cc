#include "common/model/ops.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <vector>

#include "common/kernels/matmul.h"
#include "common/kernels/situ.h"

namespace strider::model {

const at::Tensor& Lookup(const TensorMap& tensors, const std::string& name) {
  auto it = tensors.find(name);
  TORCH_CHECK(it != tensors.end(), "model weights have no tensor named '", name, "'");
  return it->second;
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight) {
  // Without autograd (decode, prefill, scoring), products that read the weight where it is
  // stored: OpenBLAS packs the whole weight into a scratch copy first, and sums in an order that
  // depends on the shape. The training path keeps the matrix product, whose gradients autograd
  // already knows.
  if (!c10::GradMode::is_enabled() && x.dim() >= 1 && weight.dim() == 2 &&
      x.size(-1) == weight.size(1)) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    // Any number of rows (a decode batch, one expert's rows, a prefill or scoring chunk): one
    // product whose every output is the same sum wherever its row sits, so a token's numbers
    // do not depend on what it was computed with. The actor decodes a sampled token in a batch
    // of rows, the learner scores it in a chunk of its own trajectory (docs/rl_learner.md).
    const at::Tensor rows = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
    if (kernels::CanMultiplyByTransposed(rows, weight)) {
      return kernels::MultiplyByTransposed(rows, weight).view(shape);
    }
    // One row without AVX2: a matrix-vector product reads each weight once.
    if (x.numel() == x.size(-1)) return at::mv(weight, x.reshape({x.size(-1)})).view(shape);
  }
  return at::matmul(x, weight.t());
}

std::vector<at::Tensor> LinearParts(const at::Tensor& x, const at::Tensor& joined,
                                    std::initializer_list<const at::Tensor*> weights) {
  std::vector<at::Tensor> outputs;
  outputs.reserve(weights.size());
  if (joined.defined() && !c10::GradMode::is_enabled()) {
    at::Tensor all = Linear(x, joined);
    int64_t offset = 0;
    for (const at::Tensor* weight : weights) {
      const int64_t rows = weight->numel() / weight->size(-1);
      outputs.push_back(all.narrow(-1, offset, rows));
      offset += rows;
    }
    TORCH_CHECK(offset == joined.size(0), "joined weights have ", joined.size(0),
                " rows, the parts ", offset);
    return outputs;
  }
  for (const at::Tensor* weight : weights) {
    outputs.push_back(
        Linear(x, weight->dim() == 2 ? *weight : weight->reshape({-1, weight->size(-1)})));
  }
  return outputs;
}

at::Tensor JoinRows(TensorMap* tensors, const std::vector<std::string>& names) {
  std::vector<at::Tensor*> parts;
  for (const std::string& name : names) {
    auto it = tensors->find(name);
    if (it == tensors->end() || !it->second.defined()) return at::Tensor();
    parts.push_back(&it->second);
  }
  if (parts.empty()) return at::Tensor();
  const at::Tensor& first = *parts.front();
  const int64_t width = first.size(-1);
  int64_t rows = 0;
  bool adjacent = true;  // already consecutive blocks of one storage, in this order
  for (const at::Tensor* part : parts) {
    if (part->scalar_type() != first.scalar_type() || part->device() != first.device() ||
        part->dim() < 2 || part->size(-1) != width) {
      return at::Tensor();
    }
    adjacent = adjacent && part->is_contiguous() && part->is_alias_of(first) &&
               part->storage_offset() == first.storage_offset() + rows * width;
    rows += part->numel() / width;
  }
  if (adjacent && first.storage().nbytes() >=
                      static_cast<size_t>((first.storage_offset() + rows * width) *
                                          first.element_size())) {
    return first.detach().as_strided({rows, width}, {width, 1}, first.storage_offset());
  }
  at::NoGradGuard no_grad;
  at::Tensor joined = at::empty({rows, width}, first.options().requires_grad(false));
  int64_t offset = 0;
  for (at::Tensor* part : parts) {
    const int64_t count = part->numel() / width;
    at::Tensor view = joined.narrow(0, offset, count).view(part->sizes());
    view.copy_(part->detach());
    const bool requires_grad = part->requires_grad();
    *part = view;
    if (requires_grad) part->requires_grad_(true);
    offset += count;
  }
  return joined;
}

namespace {

// RmsNorm without autograd for fp32: one pass per row instead of six operations. Runs at every
// sublayer input of every decode step, where the operations' dispatch cost more than the math.
#pragma GCC push_options
#pragma GCC optimize("O3")
at::Tensor RmsNormFused(const at::Tensor& x, const at::Tensor& weight, double epsilon) {
  at::Tensor input = x.contiguous();
  const int64_t width = input.size(-1);
  const int64_t rows = width == 0 ? 0 : input.numel() / width;
  at::Tensor out = at::empty(input.sizes(), input.options());
  const float* __restrict in_data = input.data_ptr<float>();
  float* __restrict out_data = out.data_ptr<float>();
  at::Tensor scale = weight.defined() ? weight.contiguous() : at::Tensor();
  const float* __restrict w = weight.defined() ? scale.data_ptr<float>() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict row = in_data + r * width;
    float* __restrict y = out_data + r * width;
    double square = 0;
    for (int64_t c = 0; c < width; ++c) square += static_cast<double>(row[c]) * row[c];
    const float inverse = static_cast<float>(1.0 / std::sqrt(square / width + epsilon));
    if (w != nullptr) {
      for (int64_t c = 0; c < width; ++c) y[c] = row[c] * inverse * w[c];
    } else {
      for (int64_t c = 0; c < width; ++c) y[c] = row[c] * inverse;
    }
  }
  return out;
}
#pragma GCC pop_options

}  // namespace

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double epsilon) {
  if (!c10::GradMode::is_enabled() && x.scalar_type() == at::kFloat && x.device().is_cpu() &&
      x.dim() >= 1 &&
      (!weight.defined() || (weight.scalar_type() == at::kFloat && weight.dim() == 1 &&
                             weight.size(0) == x.size(-1)))) {
    return RmsNormFused(x, weight, epsilon);
  }
  at::Tensor normed = x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + epsilon);
  return weight.defined() ? normed * weight : normed;
}

at::Tensor SituGluFeedForward(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                              const at::Tensor& down, double gate_cap, double up_cap) {
  return Linear(kernels::SituGlu(Linear(x, gate), Linear(x, up), gate_cap, up_cap), down);
}

}  // namespace strider::model
