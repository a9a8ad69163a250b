// Sparse expert routing and quantile balancing (docs/model_math.md#sparse-experts-and-routing and
// #quantile-balancing).
//
// The router's scores are sigmoid(W_r x) (or softmax, model config). Experts are chosen by top-k
// over scores + bias; the weights are the chosen scores renormalised to sum to one. The bias only
// changes which experts are chosen, never the weights or the gradients (it enters through
// argmax, not arithmetic). RouterOptions add what DeepSeek-V3-style routers (Kimi Linear's)
// also do: renormalisation optional and with an epsilon, a constant scale on the weights, and
// grouped top-k, where a token first keeps the groups of experts whose two best biased scores
// sum highest and then picks its k experts inside them.
//
// Quantile balancing computes the bias from the dual of the balanced assignment problem
//
//   max sum_ij s_ij x_ij  s.t.  sum_j x_ij = k (each token),  sum_i x_ij = c = M k / N (each
//   expert),  0 <= x_ij <= 1,
//
// whose dual is
//
//   L(alpha, beta) = k sum_i alpha_i + c sum_j beta_j + sum_ij max(0, s_ij - alpha_i - beta_j),
//
// and token i takes expert j iff s_ij - alpha_i - beta_j > 0. Routing keeps bias = -beta, so the
// rule becomes "s_ij + bias_j above the token's threshold alpha_i", which is top-k of s + bias.
// One update is one sweep of exact block coordinate descent on L:
//   1. alpha_i = the (k+1)-th largest of s_ij + bias_j (minimises L over alpha for beta = -bias);
//   2. beta_j  = the (q+1)-th largest over tokens of the margin s_ij - alpha_i with
//      q = floor(M k / N) (minimises L over beta for that alpha, see routing.cc);
//   3. new bias = -beta minus its mean (a common shift of all biases is absorbed by alpha and
//      leaves L unchanged because c N = M k).
// Because each step minimises L exactly, the dual objective D(bias) = min_alpha L never
// increases from one call to the next (RoutingDualObjective). Exact balance is not guaranteed.
// One update per training step, computed on that step's batch and used from the next step on.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace strider::kernels {

struct RoutingDecision {
  at::Tensor experts;  // (M, k) int64: chosen expert ids, best biased score first
  at::Tensor weights;  // (M, k) scores of the chosen experts / their sum; differentiable
};

// The defaults are Strider's router; Kimi Linear's config names are beside each field.
struct RouterOptions {
  // weights = s_chosen / (sum of s_chosen + epsilon) when true, s_chosen as they are when false
  // (moe_renormalize).
  bool renormalize = true;
  double renormalize_epsilon = 0;
  double scaling = 1;  // then times this (routed_scaling_factor)
  // Grouped top-k: N / groups consecutive experts per group (num_expert_group); each token keeps
  // the groups_per_token groups (topk_group) whose two best biased scores sum highest. groups
  // must divide N with at least two experts per group when groups > 1, and k must fit in the
  // kept groups.
  int64_t groups = 1;
  int64_t groups_per_token = 1;
};

// scores: (M, N) router scores; bias: (N). k in [1, N]. Ties in scores + bias go to the lower
// expert id (and ties between group scores to the lower group), so the choice is deterministic
// on every platform and thread count.
RoutingDecision RouteTopK(const at::Tensor& scores, const at::Tensor& bias, int64_t k,
                          const RouterOptions& options = {});

// Chosen experts given from outside (routing replay): the weights are recomputed from `scores`
// with the same options so gradients flow, but the choice is exactly `experts` (M, k).
RoutingDecision RouteWithExperts(const at::Tensor& scores, const at::Tensor& experts,
                                 const RouterOptions& options = {});

// One quantile-balancing update. scores: (M, N) (detached internally); bias: (N) current bias.
// k in [1, N - 1] (the threshold is the (k+1)-th score). Returns the new bias (N) in bias's
// dtype, centred to zero mean. A pure function of (scores, bias): calling it again on the same
// batch with its own output continues the coordinate descent.
at::Tensor QuantileBalanceBias(const at::Tensor& scores, const at::Tensor& bias, int64_t k);

// The dual objective at beta = -bias with the best alpha, in fp64:
//   D(bias) = sum_i (sum of the k largest s_ij + bias_j) - (M k / N) sum_j bias_j.
// QuantileBalanceBias never increases it (for fixed scores); a monitor of convergence.
double RoutingDualObjective(const at::Tensor& scores, const at::Tensor& bias, int64_t k);

// (max_j load_j - mean load) / mean load for experts (M, k) over n experts.
double MaxViolation(const at::Tensor& experts, int64_t num_experts);

// ---- Quantile balancing across data-parallel ranks ----
//
// The per-expert quantile needs every rank's margins. Each rank histograms its local margins
// into fixed bins, the ranks sum the histograms with one all-reduce, and the bias follows from
// the summed histogram:
//
//   MarginHistogramSpec spec = DefaultMarginHistogramSpec(bias, 1024);  // same on every rank
//   at::Tensor hist = QuantileMarginHistogram(local_scores, bias, k, spec);
//   process_group->allreduce(hist);                                      // sum
//   bias = QuantileBalanceBiasFromHistogram(hist, bias, k, spec);
//
// The histogram holds the shifted margins d_ij = s_ij + bias_j - alpha_i (the margin relative to
// the current threshold -bias_j), so the bins are centred on the values that matter. As long as
// every d_ij lies in [low, high] (values outside go to the edge bins), each expert's quantile is
// found in the right bin, so it is within one bin width of the exact one computed by
// QuantileBalanceBias on the union of the ranks' tokens. After centring, the two biases agree
// within one bin width up to a common shift, which routing ignores:
//   min_c max_j |approx_j - exact_j - c| = (max_j d_j - min_j d_j) / 2 <= bin width,
// with d = approx - exact.

struct MarginHistogramSpec {
  double low = -2.0;        // lower edge of the first bin
  double high = 2.0;        // upper edge of the last bin
  int64_t num_bins = 1024;  // bin width = (high - low) / num_bins
};

// For scores in [0, 1] every d_ij lies in [-(1 + spread), 1 + spread] with spread =
// max(bias) - min(bias), so this range loses nothing. It depends only on the bias, which is
// replicated, so every rank computes the same spec without communication.
MarginHistogramSpec DefaultMarginHistogramSpec(const at::Tensor& bias, int64_t num_bins);

// Local histogram (N, num_bins) int64 of d_ij for this rank's scores (M_local, N). Every token
// adds exactly one count to each expert's row. Sum it over ranks before the next call.
at::Tensor QuantileMarginHistogram(const at::Tensor& scores, const at::Tensor& bias, int64_t k,
                                   const MarginHistogramSpec& spec);

// New bias (N), centred, from the histogram summed over all ranks (its row sums give the global
// token count M). Each expert's quantile is interpolated inside the bin that holds it.
at::Tensor QuantileBalanceBiasFromHistogram(const at::Tensor& histogram, const at::Tensor& bias,
                                            int64_t k, const MarginHistogramSpec& spec);

}  // namespace strider::kernels
