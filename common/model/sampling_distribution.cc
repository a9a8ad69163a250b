#include "common/model/sampling_distribution.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>

#include "common/token_ids.h"

namespace strider::model {
namespace {

constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

// Marks the kept set of one row of `vocabulary` fp64 logits in `kept` (all false on entry);
// false when nothing can be kept. `order` is scratch space.
bool KeepRow(const double* x, int64_t vocabulary, const SamplingSettings& s,
             const std::vector<char>& banned, std::vector<int32_t>* order, bool* kept) {
  order->clear();
  for (int64_t i = 0; i < vocabulary; ++i) {
    // NaN fails the comparison and is never kept.
    if (!banned[i] && x[i] > kMinusInfinity) order->push_back(static_cast<int32_t>(i));
  }
  if (order->empty()) return false;
  const bool greedy = s.temperature == 0;
  const int64_t top_k = greedy ? 1 : s.top_k;
  int64_t keep = static_cast<int64_t>(order->size());
  if (top_k > 0 || s.top_p < 1) {
    // Ranked by logit, descending, ties to the lower id: every cut is a pure function of the row.
    auto more_likely = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
    if (top_k > 0 && top_k < keep) {
      std::partial_sort(order->begin(), order->begin() + top_k, order->end(), more_likely);
      keep = top_k;
    } else {
      std::sort(order->begin(), order->end(), more_likely);
    }
    if (!greedy && s.top_p < 1) {
      const double top = x[(*order)[0]];
      double total = 0;
      for (int64_t j = 0; j < keep; ++j) total += std::exp((x[(*order)[j]] - top) / s.temperature);
      // The first tokens whose mass reaches top_p, accumulated in rank order: a token is kept
      // when the mass ranked before it is below top_p.
      double mass = 0;
      for (int64_t j = 0; j < keep; ++j) {
        mass += std::exp((x[(*order)[j]] - top) / s.temperature) / total;
        if (mass >= s.top_p) {
          keep = j + 1;
          break;
        }
      }
    }
  }
  for (int64_t j = 0; j < keep; ++j) kept[(*order)[j]] = true;
  return true;
}

}  // namespace

namespace internal {

at::Tensor SupportByTensorOps(const at::Tensor& x, const SamplingSettings& s) {
  const int64_t vocabulary = x.size(1);
  at::Tensor candidate = x > kMinusInfinity;  // NaN fails the comparison and is never kept
  if (!s.never_sampled.empty()) {
    candidate.index_fill_(1, at::tensor(s.never_sampled, at::kLong).to(x.device()), false);
  }
  const at::Tensor count = candidate.sum(1, /*keepdim=*/true);  // (R, 1)
  // One bool for the whole batch: the host must know whether to fail.
  TORCH_CHECK((count > 0).all().item<bool>(),
              "sampling: a row has no token with a finite logit to sample");
  const bool greedy = s.temperature == 0;
  const int64_t top_k = greedy ? 1 : s.top_k;
  if (top_k <= 0 && s.top_p >= 1) return candidate;
  // Ranked by logit, descending, ties to the lower id (a stable sort keeps id order among equal
  // values), the tokens that cannot be kept last: the loop's order.
  const auto [sorted, order] = at::sort(x.masked_fill(candidate.logical_not(), kMinusInfinity),
                                        /*stable=*/true, /*dim=*/1, /*descending=*/true);
  const at::Tensor rank = at::arange(vocabulary, x.options().dtype(at::kLong)).unsqueeze(0);
  at::Tensor keep = rank < count;  // (R, V) in rank order
  if (top_k > 0) keep = keep & (rank < top_k);
  if (!greedy && s.top_p < 1) {
    // The first tokens whose mass reaches top_p: a token is kept when the mass ranked before it
    // (within the top-k cut) is below top_p.
    const at::Tensor weight =
        ((sorted - sorted.narrow(1, 0, 1)) / s.temperature).exp().masked_fill(
            keep.logical_not(), 0.0);
    const at::Tensor mass = (weight / weight.sum(1, /*keepdim=*/true)).cumsum(1);
    const at::Tensor before =
        at::cat({at::zeros({x.size(0), 1}, mass.options()), mass.narrow(1, 0, vocabulary - 1)}, 1);
    keep = keep & (before < s.top_p);
  }
  return at::zeros_like(candidate).scatter_(1, order, keep);
}

}  // namespace internal

std::vector<int64_t> ByteFormatNeverSampled() { return {token::kImagePatch}; }

SamplingSettings RolloutSamplingSettings(double temperature, int64_t top_k, double top_p) {
  return RolloutSamplingSettings(temperature, top_k, top_p, ByteFormatNeverSampled());
}

SamplingSettings RolloutSamplingSettings(double temperature, int64_t top_k, double top_p,
                                         std::vector<int64_t> never_sampled) {
  SamplingSettings settings;
  settings.temperature = temperature;
  settings.top_k = top_k;
  settings.top_p = top_p;
  settings.never_sampled = std::move(never_sampled);
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
  // fp64, so the cuts are decided on values as exact as the logits allow.
  const at::Tensor x = logits.detach().to(at::kDouble).contiguous().reshape({-1, vocabulary});
  // Off the CPU the same cuts as tensor operations where the logits are.
  if (!x.device().is_cpu()) return internal::SupportByTensorOps(x, s).view(logits.sizes());
  at::Tensor kept = at::zeros(x.sizes(), x.options().dtype(at::kBool));
  std::vector<char> banned(vocabulary, 0);
  for (int64_t id : s.never_sampled) banned[id] = 1;
  const double* data = x.data_ptr<double>();
  bool* out = kept.data_ptr<bool>();
  // Row by row in plain loops: a row's cut depends on that row only, and a decode step's few
  // hundred short rows cost microseconds here against milliseconds for tensor sorts.
  std::atomic<bool> empty{false};
  at::parallel_for(0, x.size(0), /*grain_size=*/256, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> order;
    for (int64_t row = begin; row < end; ++row) {
      if (!KeepRow(data + row * vocabulary, vocabulary, s, banned, &order,
                   out + row * vocabulary)) {
        empty = true;
      }
    }
  });
  TORCH_CHECK(!empty, "sampling: a row has no token with a finite logit to sample");
  return kept.view(logits.sizes());
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
