#include "common/model/sampling_distribution.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/tokenizer.h"

namespace strider::model {
namespace {

constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

}  // namespace

SamplingSettings RolloutSamplingSettings(double temperature, int64_t top_k, double top_p) {
  SamplingSettings settings;
  settings.temperature = temperature;
  settings.top_k = top_k;
  settings.top_p = top_p;
  settings.never_sampled = {token::kImagePatch};
  return settings;
}

Status ValidateSamplingSettings(const SamplingSettings& s, int64_t vocabulary) {
  if (!std::isfinite(s.temperature) || s.temperature < 0) {
    return Status::InvalidArgument("sampling: temperature must be finite and >= 0, got " +
                                   std::to_string(s.temperature));
  }
  if (s.top_k < 0) {
    return Status::InvalidArgument("sampling: top_k must be >= 0, got " + std::to_string(s.top_k));
  }
  if (!(s.top_p > 0 && s.top_p <= 1)) {
    return Status::InvalidArgument("sampling: top_p must be in (0, 1], got " +
                                   std::to_string(s.top_p));
  }
  std::vector<bool> banned(vocabulary > 0 ? vocabulary : 0, false);
  int64_t remaining = vocabulary;
  for (int64_t id : s.never_sampled) {
    if (id < 0 || id >= vocabulary) {
      return Status::InvalidArgument("sampling: never-sampled id " + std::to_string(id) +
                                     " is outside the vocabulary [0, " +
                                     std::to_string(vocabulary) + ")");
    }
    if (!banned[id]) --remaining;
    banned[id] = true;
  }
  if (remaining < 1) {
    return Status::InvalidArgument("sampling: every id of the vocabulary is never sampled");
  }
  return Status::Ok();
}

at::Tensor SamplingSupport(const at::Tensor& logits, const SamplingSettings& s) {
  TORCH_CHECK(logits.dim() >= 1 && logits.size(-1) > 0, "sampling: logits must be (..., V)");
  const int64_t vocabulary = logits.size(-1);
  const Status valid = ValidateSamplingSettings(s, vocabulary);
  TORCH_CHECK(valid.ok(), valid.message());
  at::NoGradGuard no_grad;
  // fp64, so the cuts are decided on values as exact as the logits allow: a learner computing
  // in fp32 and the sampler then draw the same line wherever their logits agree.
  at::Tensor x = logits.detach().to(at::kDouble);
  at::Tensor allowed = at::ones(x.sizes(), x.options().dtype(at::kBool));
  if (!s.never_sampled.empty()) {
    allowed.index_fill_(-1, at::tensor(s.never_sampled, at::kLong), false);
  }
  const bool greedy = s.temperature == 0;
  const int64_t top_k = greedy ? 1 : s.top_k;
  if (top_k == 0 && s.top_p >= 1) return allowed;

  // Ranked by logit, descending; a stable sort keeps equal logits in id order, so ties rank the
  // lower id first and every cut is a pure function of the row.
  auto [sorted, order] =
      x.masked_fill(allowed.logical_not(), kMinusInfinity).sort(/*stable=*/true, -1, true);
  at::Tensor kept = sorted > kMinusInfinity;
  if (top_k > 0 && top_k < vocabulary) kept.narrow(-1, top_k, vocabulary - top_k).fill_(false);
  if (!greedy && s.top_p < 1) {
    at::Tensor q =
        at::softmax((sorted / s.temperature).masked_fill(kept.logical_not(), kMinusInfinity), -1);
    // Mass ranked strictly before each token, accumulated in rank order.
    at::Tensor before = at::cat(
        {at::zeros_like(q.narrow(-1, 0, 1)), q.cumsum(-1).narrow(-1, 0, vocabulary - 1)}, -1);
    kept.logical_and_(before < s.top_p);
  }
  return at::zeros_like(allowed).scatter_(-1, order, kept);
}

at::Tensor SamplingLogProbs(const at::Tensor& logits, const SamplingSettings& s) {
  const at::Tensor support = SamplingSupport(logits, s);
  // fp16 and bf16 are widened: their rounding would swamp the ratios a learner takes.
  const at::ScalarType dtype = logits.scalar_type();
  const at::Tensor x =
      dtype == at::kHalf || dtype == at::kBFloat16 ? logits.to(at::kFloat) : logits;
  const at::Tensor cut = support.logical_not();
  if (s.temperature == 0) {
    // A point mass does not move with the logits; (x - x) * 0 keeps the result in the graph
    // with zero gradient, so a loss over greedy tokens needs no special case.
    return ((x - x.detach()) * 0).masked_fill(cut, kMinusInfinity);
  }
  return at::log_softmax((x / s.temperature).masked_fill(cut, kMinusInfinity), -1);
}

at::Tensor SampledTokenLogProbs(const at::Tensor& logits, const at::Tensor& tokens,
                                const SamplingSettings& settings) {
  TORCH_CHECK(tokens.dim() + 1 == logits.dim(),
              "sampling: tokens must have the logits' shape without V");
  return SamplingLogProbs(logits, settings)
      .gather(-1, tokens.to(at::kLong).unsqueeze(-1))
      .squeeze(-1);
}

at::Tensor SamplingEntropy(const at::Tensor& log_probs) {
  // p log p with p = 0 is 0; replacing -inf by 0 before the product (rather than masking the
  // product) keeps -inf out of the backward pass, where 0 * -inf would be NaN.
  const at::Tensor finite = log_probs.masked_fill(at::isinf(log_probs), 0);
  return -(log_probs.exp() * finite).sum(-1);
}

}  // namespace strider::model
