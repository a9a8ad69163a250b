#include "common/model/attention_residuals.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

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

namespace {

// The read without autograd for fp32 sources of one shape: per row, the scores of all sources,
// their softmax and the weighted sum in one pass, no (S, B, T, d) stack. At decode the ATen form
// was about ten small operations per read, two reads per layer. Single-threaded: a decode read
// is a few microseconds of arithmetic, less than waking a second thread.
#pragma GCC push_options
#pragma GCC optimize("O3")
at::Tensor ReadResidualFused(const std::vector<at::Tensor>& all, const at::Tensor& query,
                             double norm_epsilon) {
  const int64_t sources = static_cast<int64_t>(all.size());
  const int64_t width = all.front().size(-1);
  const int64_t rows = all.front().numel() / width;
  std::vector<at::Tensor> contiguous;
  std::vector<const float*> data;
  for (const at::Tensor& source : all) {
    contiguous.push_back(source.contiguous());
    data.push_back(contiguous.back().data_ptr<float>());
  }
  at::Tensor q = query.contiguous();
  const float* __restrict q_data = q.data_ptr<float>();
  at::Tensor out = at::empty(all.front().sizes(), all.front().options());
  float* __restrict out_data = out.data_ptr<float>();
  std::vector<double> scores(sources);
  for (int64_t r = 0; r < rows; ++r) {
    double top = -std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s < sources; ++s) {
      const float* __restrict x = data[s] + r * width;
      double square = 0, dot = 0;
      for (int64_t c = 0; c < width; ++c) {
        square += static_cast<double>(x[c]) * x[c];
        dot += static_cast<double>(x[c]) * q_data[c];
      }
      // RMSNorm(x) . q = (x . q) / rms(x)
      scores[s] = dot / std::sqrt(square / width + norm_epsilon);
      top = std::max(top, scores[s]);
    }
    double total = 0;
    for (int64_t s = 0; s < sources; ++s) total += (scores[s] = std::exp(scores[s] - top));
    float* __restrict y = out_data + r * width;
    for (int64_t c = 0; c < width; ++c) y[c] = 0;
    for (int64_t s = 0; s < sources; ++s) {
      const float weight = static_cast<float>(scores[s] / total);
      const float* __restrict x = data[s] + r * width;
      for (int64_t c = 0; c < width; ++c) y[c] += weight * x[c];
    }
  }
  return out;
}
#pragma GCC pop_options

}  // namespace

at::Tensor ReadResidual(const ResidualSources& sources, const at::Tensor& query,
                        double norm_epsilon, ResidualReadTrace* trace) {
  std::vector<at::Tensor> all = sources.All();
  bool fused = trace == nullptr && !c10::GradMode::is_enabled() &&
               query.scalar_type() == at::kFloat && query.dim() == 1;
  for (const at::Tensor& source : all) {
    fused = fused && source.scalar_type() == at::kFloat && source.device().is_cpu() &&
            source.sizes() == all.front().sizes();
  }
  if (fused) return ReadResidualFused(all, query, norm_epsilon);
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
