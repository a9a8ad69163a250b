#include "common/kernels/gated_delta_rule_cuda.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <limits>

#include "common/kernels/cuda/decode_kernels.h"

namespace strider::kernels::internal {
namespace {

// The kernel's limits (decode_kernels.h): widths 1..128, one block per (sequence, head).
constexpr int64_t kMaxWidth = 128;

}  // namespace

GatedDeltaRuleOutput GatedDeltaRuleDecodeCuda(const at::Tensor& query, const at::Tensor& key,
                                              const at::Tensor& value, const at::Tensor& log_decay,
                                              const at::Tensor& beta,
                                              const at::Tensor& initial_state) {
  // The shapes were checked by the caller (gated_delta_rule.cc's CheckInputs); what is left is
  // whether the kernel can take them.
  if (!query.is_cuda() || query.dim() != 4 || query.size(2) != 1) return {};
  for (const at::Tensor* t : {&query, &key, &value, &log_decay, &beta, &initial_state}) {
    if (t->scalar_type() != at::kFloat || t->device() != query.device()) return {};
    // The kernel writes no gradient graph.
    if (at::GradMode::is_enabled() && t->requires_grad()) return {};
  }
  const int64_t batch = query.size(0), heads = query.size(1);
  const int64_t key_dim = query.size(3), value_dim = value.size(3);
  const int64_t rows = batch * heads;
  if (rows < 1 || rows > std::numeric_limits<int32_t>::max() || key_dim < 1 ||
      key_dim > kMaxWidth || value_dim < 1 || value_dim > kMaxWidth) {
    return {};
  }

  const c10::cuda::CUDAGuard guard(query.device());
  // The kernel reads row-major (B, H, D) rows: with T = 1 each input is that as a reshape,
  // copied only where the caller's is strided (the model's q, k, v are transposes of
  // projections). The state is updated in place, so it runs on a fresh contiguous copy.
  const at::Tensor q = query.reshape({rows, key_dim}).contiguous();
  const at::Tensor k = key.reshape({rows, key_dim}).contiguous();
  const at::Tensor v = value.reshape({rows, value_dim}).contiguous();
  const at::Tensor g = log_decay.reshape({rows, key_dim}).contiguous();
  const at::Tensor b = beta.reshape({rows}).contiguous();
  at::Tensor state = at::empty({batch, heads, key_dim, value_dim}, initial_state.options());
  state.copy_(initial_state);
  at::Tensor output = at::empty({batch, heads, 1, value_dim}, value.options());

  cuda::GatedDeltaRuleDecodeDims dims;
  dims.batch = batch;
  dims.heads = heads;
  dims.key_dim = key_dim;
  dims.value_dim = value_dim;
  const Status status = cuda::GatedDeltaRuleDecodeStep(
      dims, state.data_ptr<float>(), q.data_ptr<float>(), k.data_ptr<float>(),
      v.data_ptr<float>(), g.data_ptr<float>(), b.data_ptr<float>(), output.data_ptr<float>(),
      c10::cuda::getCurrentCUDAStream(query.device().index()).stream());
  TORCH_CHECK(status.ok(), status.ToString());
  return {output, state};
}

}  // namespace strider::kernels::internal
