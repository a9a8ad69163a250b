#include "common/model/attention_residuals.h"

#include <ATen/ATen.h>

#include "common/model/ops.h"

namespace strider::model {

void ResidualSources::Add(const at::Tensor& sublayer_output) {
  partial_ = partial_.defined() ? partial_ + sublayer_output : sublayer_output;
}

void ResidualSources::Seal() {
  if (!partial_.defined()) return;
  sealed_.push_back(partial_);
  partial_ = at::Tensor();
}

std::vector<at::Tensor> ResidualSources::All() const {
  std::vector<at::Tensor> all = sealed_;
  if (partial_.defined()) all.push_back(partial_);
  return all;
}

at::Tensor ReadResidual(const ResidualSources& sources, const at::Tensor& query,
                        double norm_epsilon, ResidualReadTrace* trace) {
  std::vector<at::Tensor> all = sources.All();
  const at::ScalarType type = all.front().scalar_type();
  const at::ScalarType compute = type == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor stacked = at::stack(all, 0).to(compute);  // (S, B, T, d)
  at::Tensor logits =
      at::matmul(RmsNorm(stacked, at::Tensor(), norm_epsilon), query.to(compute));  // (S, B, T)
  at::Tensor weights = at::softmax(logits, 0);
  if (trace != nullptr) trace->weights = weights;
  return (weights.unsqueeze(-1) * stacked).sum(0).to(type);
}

}  // namespace strider::model
