// Routing and quantile balancing. See routing.h for the dual problem these functions descend.
//
// Why q = floor(M k / N): the dual term for expert j is c beta_j + sum_i max(0, m_ij - beta_j)
// with c = M k / N. Its subgradient in beta_j is c - #{i : m_ij > beta_j} down to
// c - #{i : m_ij >= beta_j}. At the (q+1)-th largest margin at most q <= c margins are strictly
// above and at least q + 1 > c are at or above, so zero is in the subgradient: the value is an
// exact minimiser whether or not c is an integer. Rounding c up instead (q = round(c) > c) would
// overshoot the capacity and break the monotone descent.
#include "common/kernels/routing.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

namespace strider::kernels {
namespace {

// Working dtype of the balancing arithmetic: at least fp32 (bf16 scores would put many
// margins in one representable value and turn the quantiles into ties).
at::ScalarType BalanceDtype(const at::Tensor& scores, const at::Tensor& bias) {
  at::ScalarType type = at::promote_types(scores.scalar_type(), bias.scalar_type());
  return at::promote_types(type, at::kFloat);
}

void CheckScoresAndBias(const at::Tensor& scores, const at::Tensor& bias) {
  TORCH_CHECK(scores.dim() == 2, "routing: scores must be (M, N), got ", scores.sizes());
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == scores.size(1),
              "routing: bias must be (N) with N = ", scores.size(1), ", got ", bias.sizes());
}

// The (k+1)-th largest biased score of every token: the optimal token thresholds alpha for
// beta = -bias. kthvalue counts from the smallest, so it is the (N - k)-th smallest. Values
// are unambiguous under ties, unlike indices.
at::Tensor TokenThresholds(const at::Tensor& biased, int64_t k) {           // biased: (M, N)
  return std::get<0>(at::kthvalue(biased, biased.size(1) - k, /*dim=*/1));  // (M)
}

// Weights of the given experts. The gather is the only place scores enter, so the gradient wrt
// scores is that of s_j / sum_r s_r (times the scale) and nothing else. The default options take
// exactly the operations Strider's router always took, so its figures stay bit-identical.
at::Tensor GatherWeights(const at::Tensor& scores, const at::Tensor& experts,
                         const RouterOptions& options) {
  at::Tensor weights = scores.gather(1, experts);  // (M, k)
  if (options.renormalize) {
    at::Tensor sum = weights.sum(-1, /*keepdim=*/true);
    if (options.renormalize_epsilon != 0) sum = sum + options.renormalize_epsilon;
    weights = weights / sum;
  }
  if (options.scaling != 1) weights = weights * options.scaling;
  return weights;
}

// Grouped top-k's first stage: `biased` (M, N) with every expert outside the token's kept groups
// set to -inf, so the top-k that follows picks only inside them. A group's score is the sum of
// its two largest biased scores (the serving engines' rule when a correction bias is present,
// which Strider's router always has); values, not indices, so ties cannot make it ambiguous.
at::Tensor MaskToKeptGroups(const at::Tensor& biased, const RouterOptions& options) {
  const int64_t m = biased.size(0);
  const int64_t n = biased.size(1);
  const int64_t groups = options.groups;
  TORCH_CHECK(n % groups == 0 && n / groups >= 2, "RouteTopK: ", groups,
              " expert groups do not split ", n, " experts into groups of two or more");
  TORCH_CHECK(options.groups_per_token >= 1 && options.groups_per_token <= groups,
              "RouteTopK: groups_per_token = ", options.groups_per_token, " outside [1, ", groups,
              "]");
  const at::Tensor grouped = biased.reshape({m, groups, n / groups});
  const at::Tensor group_scores = std::get<0>(grouped.topk(2, /*dim=*/-1)).sum(-1);  // (M, G)
  // As for experts below: a stable sort keeps the lower group id first among equal scores.
  const at::Tensor group_order =
      std::get<1>(at::sort(group_scores, /*stable=*/true, /*dim=*/1, /*descending=*/true));
  const at::Tensor dropped = at::ones({m, groups}, biased.options().dtype(at::kBool))
                                 .scatter_(1, group_order.narrow(1, 0, options.groups_per_token),
                                           false);
  const at::Tensor expert_dropped =
      dropped.unsqueeze(-1).expand({m, groups, n / groups}).reshape({m, n});
  return biased.masked_fill(expert_dropped, -std::numeric_limits<double>::infinity());
}

}  // namespace

RoutingDecision RouteTopK(const at::Tensor& scores, const at::Tensor& bias, int64_t k,
                          const RouterOptions& options) {
  CheckScoresAndBias(scores, bias);
  TORCH_CHECK(k >= 1 && k <= scores.size(1), "RouteTopK: k = ", k, " outside [1, ", scores.size(1),
              "]");
  // Selection only: no graph through the bias or through the sort.
  at::Tensor biased = scores.detach() + bias.detach();  // (M, N)
  if (options.groups > 1) {
    const int64_t group_size = scores.size(1) / options.groups;
    TORCH_CHECK(k <= options.groups_per_token * group_size, "RouteTopK: k = ", k,
                " experts do not fit in ", options.groups_per_token, " groups of ", group_size);
    biased = MaskToKeptGroups(biased, options);
  }
  // topk does not specify which index wins a tie; a stable descending sort keeps the lower
  // expert id first, so routing (and therefore replay and checkpoints) is reproducible. The
  // full sort costs N log N per token, small next to the expert matmuls.
  at::Tensor order = std::get<1>(at::sort(biased, /*stable=*/true, /*dim=*/1, /*descending=*/true));
  at::Tensor experts = order.narrow(1, 0, k).contiguous();  // (M, k)
  return {experts, GatherWeights(scores, experts, options)};
}

RoutingDecision RouteWithExperts(const at::Tensor& scores, const at::Tensor& experts,
                                 const RouterOptions& options) {
  TORCH_CHECK(scores.dim() == 2 && experts.dim() == 2 && experts.size(0) == scores.size(0),
              "RouteWithExperts: scores (M, N) and experts (M, k) expected, got ", scores.sizes(),
              " and ", experts.sizes());
  at::Tensor ids = experts.to(scores.device(), at::kLong);
  return {ids, GatherWeights(scores, ids, options)};
}

at::Tensor QuantileBalanceBias(const at::Tensor& scores, const at::Tensor& bias, int64_t k) {
  CheckScoresAndBias(scores, bias);
  const int64_t m = scores.size(0);
  const int64_t n = scores.size(1);
  TORCH_CHECK(k >= 1 && k < n, "QuantileBalanceBias: k = ", k, " outside [1, ", n - 1, "]");
  TORCH_CHECK(m >= 1, "QuantileBalanceBias: empty batch");
  const at::ScalarType type = BalanceDtype(scores, bias);
  at::Tensor s = scores.detach().to(type);  // (M, N)
  at::Tensor b = bias.detach().to(type);    // (N)

  // Step 1: alpha for beta = -bias.
  at::Tensor alpha = TokenThresholds(s + b, k);  // (M)
  at::Tensor margins = s - alpha.unsqueeze(1);   // (M, N)
  // Step 2: beta_j = (q+1)-th largest margin of expert j = (M - q)-th smallest. q <= M - 1
  // because k < N, so the quantile exists.
  const int64_t q = m * k / n;
  at::Tensor beta = std::get<0>(at::kthvalue(margins, m - q, /*dim=*/0));  // (N)
  // Step 3: bias = -beta, centred. Centring is free in the dual (see routing.h) and keeps the
  // bias from drifting over many steps.
  at::Tensor new_bias = -beta;
  new_bias = new_bias - new_bias.mean();
  return new_bias.to(bias.scalar_type());
}

double RoutingDualObjective(const at::Tensor& scores, const at::Tensor& bias, int64_t k) {
  CheckScoresAndBias(scores, bias);
  const int64_t m = scores.size(0);
  const int64_t n = scores.size(1);
  TORCH_CHECK(k >= 1 && k <= n, "RoutingDualObjective: k = ", k, " outside [1, ", n, "]");
  at::Tensor s = scores.detach().to(at::kDouble);
  at::Tensor b = bias.detach().to(at::kDouble);
  // With alpha_i the (k+1)-th biased score, sum_j max(0, s_ij + b_j - alpha_i) + k alpha_i is
  // the sum of the k largest biased scores, hence the closed form.
  const double top_k_sum = std::get<0>((s + b).topk(k, /*dim=*/1)).sum().item<double>();
  const double capacity = static_cast<double>(m) * static_cast<double>(k) / static_cast<double>(n);
  return top_k_sum - capacity * b.sum().item<double>();
}

double MaxViolation(const at::Tensor& experts, int64_t num_experts) {
  TORCH_CHECK(num_experts >= 1, "MaxViolation: num_experts must be positive");
  TORCH_CHECK(experts.numel() > 0, "MaxViolation: no routing decisions");
  at::Tensor load = at::bincount(experts.reshape({-1}).to(at::kLong), /*weights=*/{},
                                 /*minlength=*/num_experts);  // (N)
  TORCH_CHECK(load.size(0) == num_experts, "MaxViolation: expert id >= num_experts");
  const double mean = static_cast<double>(experts.numel()) / static_cast<double>(num_experts);
  return (load.max().item<double>() - mean) / mean;
}

MarginHistogramSpec DefaultMarginHistogramSpec(const at::Tensor& bias, int64_t num_bins) {
  TORCH_CHECK(bias.dim() == 1 && bias.numel() > 0, "DefaultMarginHistogramSpec: bias must be (N)");
  at::Tensor b = bias.detach().to(at::kDouble);
  const double spread = (b.max() - b.min()).item<double>();
  MarginHistogramSpec spec;
  spec.low = -(1.0 + spread);
  spec.high = 1.0 + spread;
  spec.num_bins = num_bins;
  return spec;
}

at::Tensor QuantileMarginHistogram(const at::Tensor& scores, const at::Tensor& bias, int64_t k,
                                   const MarginHistogramSpec& spec) {
  CheckScoresAndBias(scores, bias);
  const int64_t n = scores.size(1);
  TORCH_CHECK(k >= 1 && k < n, "QuantileMarginHistogram: k = ", k, " outside [1, ", n - 1, "]");
  TORCH_CHECK(spec.num_bins >= 1 && spec.high > spec.low,
              "QuantileMarginHistogram: need num_bins >= 1 and high > low");
  // fp64 so that the bin of a value is the same on every rank whatever the scores' dtype.
  at::Tensor s = scores.detach().to(at::kDouble);  // (M, N)
  at::Tensor b = bias.detach().to(at::kDouble);    // (N)
  at::Tensor biased = s + b;
  at::Tensor shifted = biased - TokenThresholds(biased, k).unsqueeze(1);  // (M, N): d_ij
  const double width = (spec.high - spec.low) / static_cast<double>(spec.num_bins);
  at::Tensor bin = ((shifted - spec.low) / width).floor().clamp(0, spec.num_bins - 1).to(at::kLong);
  // One flat bincount over expert-major cells: cell = j * num_bins + bin.
  at::Tensor cell = bin + at::arange(n, bin.options()).mul(spec.num_bins).unsqueeze(0);
  return at::bincount(cell.reshape({-1}), /*weights=*/{}, /*minlength=*/n * spec.num_bins)
      .view({n, spec.num_bins});
}

at::Tensor QuantileBalanceBiasFromHistogram(const at::Tensor& histogram, const at::Tensor& bias,
                                            int64_t k, const MarginHistogramSpec& spec) {
  const int64_t n = bias.size(0);
  TORCH_CHECK(histogram.dim() == 2 && histogram.size(0) == n && histogram.size(1) == spec.num_bins,
              "QuantileBalanceBiasFromHistogram: histogram must be (N, num_bins) = (", n, ", ",
              spec.num_bins, "), got ", histogram.sizes());
  TORCH_CHECK(k >= 1 && k < n, "QuantileBalanceBiasFromHistogram: k = ", k, " outside [1, ", n - 1,
              "]");
  at::Tensor counts = histogram.to(at::kLong);
  // Every token counts once per expert, so any row sums to the global token count.
  const int64_t m = counts[0].sum().item<int64_t>();
  TORCH_CHECK(m >= 1 && (counts.sum(1) == m).all().item<bool>(),
              "QuantileBalanceBiasFromHistogram: rows must all sum to the token count");
  const int64_t q = m * k / n;
  // Counts from the top bin down: the (q+1)-th largest value of a row lies in the highest bin
  // whose cumulative count from the top reaches q + 1 (all higher bins together hold at most q
  // values, each strictly larger). Cumulative counts are monotone, so the number of bins whose
  // cumulative count is still <= q is the position of that bin counted from the top.
  at::Tensor from_top = counts.flip({1}).cumsum(1);    // (N, bins)
  at::Tensor top_index = (from_top <= q).sum(1);       // (N): bins from the top
  at::Tensor index = (spec.num_bins - 1) - top_index;  // (N): bin of the quantile
  // Place the quantile inside its bin as if the bin's values were spread evenly: the rank-th of
  // `inside` values, rank counted from the top. This stays inside the bin (so the one-bin bound
  // holds) and balances much better than the bin's midpoint with coarse bins, where a whole bin
  // of tokens would otherwise move across the threshold together.
  at::Tensor above = at::where(
      top_index > 0, from_top.gather(1, (top_index - 1).clamp_min(0).unsqueeze(1)).squeeze(1),
      at::zeros_like(top_index));  // (N): values in higher bins
  at::Tensor inside = counts.gather(1, index.unsqueeze(1)).squeeze(1);  // (N) >= rank >= 1
  at::Tensor rank = (q + 1) - above;                                    // (N)
  const double width = (spec.high - spec.low) / static_cast<double>(spec.num_bins);
  at::Tensor bin_top = (index + 1).to(at::kDouble) * width + spec.low;  // (N)
  at::Tensor quantile = bin_top - (rank.to(at::kDouble) - 0.5) / inside.to(at::kDouble) * width;
  // beta_j = quantile of s_ij - alpha_i = quantile of d_ij - bias_j, so -beta = bias - quantile.
  at::Tensor new_bias = bias.detach().to(at::kDouble) - quantile.to(bias.device());
  new_bias = new_bias - new_bias.mean();
  return new_bias.to(bias.scalar_type());
}

}  // namespace strider::kernels
