// Block attention residuals (docs/model_math.md#attention-residuals).
//
// Instead of one running sum of sublayer outputs, each sublayer reads a learned mixture of the
// token embedding, the sealed sums of earlier blocks of layers, and the current block's partial
// sum. A read with pseudo-query w weights source v_i by softmax_i(w . RMSNorm(v_i)) and mixes
// the raw sources. Queries start at zero, so the first mixtures are uniform averages. It mixes
// across depth within one token, so it adds nothing to the inference cache.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace strider::model {

// The sources a read can see, in order: embedding, sealed blocks, then the partial sum.
class ResidualSources {
 public:
  explicit ResidualSources(at::Tensor embedding) { sealed_.push_back(std::move(embedding)); }

  // Adds a sublayer output to the current block's partial sum.
  void Add(const at::Tensor& sublayer_output);
  // Turns the partial sum into a sealed source and starts a new one (no-op when empty).
  void Seal();
  // All current sources, partial sum last when present: each (B, T, d).
  std::vector<at::Tensor> All() const;
  size_t size() const { return sealed_.size() + (partial_.defined() ? 1 : 0); }

 private:
  std::vector<at::Tensor> sealed_;
  at::Tensor partial_;
};

struct ResidualReadTrace {
  at::Tensor weights;  // (S, B, T) softmax weights over sources
};

// Mixture sum_i a_i v_i with a_i = softmax_i(query . RMSNorm(v_i)); query: (d). Computed in
// fp32 at least, returned in the sources' dtype.
at::Tensor ReadResidual(const ResidualSources& sources, const at::Tensor& query,
                        double norm_epsilon, ResidualReadTrace* trace = nullptr);

}  // namespace strider::model
