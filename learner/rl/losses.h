// The RL update's loss on per-token tensors: the clipped-ratio policy loss, the KL penalty to a
// reference policy, the entropy bonus and the value loss, aggregated as the config says. The
// model is not involved: the caller (the learner's chunked pass) gives the log-probs it computed
// along the inference path, with their autograd graph, and backpropagates `loss`.
//
// Tensors are (B, T): rows are sequences or chunks of sequences, padded to one length; only
// action tokens (action_mask 1: roles model and tool_call) contribute to any term, and a masked
// position gets exactly zero gradient whatever its inputs hold. Equations and conventions:
// docs/rl_objective.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "learner/rl/objective_config.h"

namespace strider::rl {

struct PolicyLossInputs {
  at::Tensor logprobs;            // (B, T) the learner's log-probs of the tokens, with gradient
  at::Tensor behaviour_logprobs;  // (B, T) stored with the segment: the actor's distribution
  // (B, T) optional: the learner's own log-probs before this update (its scoring pass, no
  // gradient). When given, the ratio is taken against them and, with truncated_importance, each
  // token's loss is weighted by min(exp(proximal - behaviour), importance_cap). Without them
  // the ratio is against the behaviour log-probs and no weight applies.
  at::Tensor proximal_logprobs;
  at::Tensor reference_logprobs;  // (B, T) the reference policy's; required when kl_coef > 0
  at::Tensor advantages;          // (B, T) learner/rl/advantages.h's per-token advantages
  at::Tensor action_mask;         // (B, T) 1 for action tokens, 0 elsewhere
  at::Tensor entropy;             // (B, T) optional, with gradient: the policy's entropy per token
  // Value loss, when value_coef > 0: the value head's outputs (with gradient), the values the
  // advantages were computed with (the clipping anchor, needed when value_clip > 0), and the
  // value targets (per-token returns).
  at::Tensor values;
  at::Tensor old_values;
  at::Tensor returns;
  // (B) optional: each row's aggregation weight from SequenceLossWeights, so chunks of one
  // batch add up to the batch's loss. Absent: each row is one sequence and the weights come from
  // this call's rows.
  at::Tensor row_weight;
  // (B) optional, with sequence_ratio on: each row's sequence's mean log-ratio of proximal to
  // behaviour over all its action tokens (rows that are chunks of one sequence share it).
  // Absent: each row is one sequence and the mean is over this call's row.
  at::Tensor sequence_log_ratio;
};

// Sums and counts over action tokens, so the metrics of several chunks or mini-batches merge by
// adding before the ratios are taken.
struct PolicyLossMetrics {
  double tokens = 0;         // action tokens
  double clipped = 0;        // tokens whose loss is the clipped (or dual-clipped) term
  double approx_kl_sum = 0;  // k3 of the ratio against the anchor (proximal or behaviour)
  double kl_sum = 0;         // the configured estimator against the reference, when given
  double kl_tokens = 0;      // action tokens with reference log-probs (0: KL not measured)
  double entropy_sum = 0;
  double importance_sum = 0;  // truncated importance weights (1 where none applies)
  double truncated = 0;       // tokens whose weight was capped
  double value_clipped = 0;   // tokens whose value loss is the clipped term
  // The mismatch between learner and behaviour, over tokens with proximal log-probs: k3 of
  // KL(behaviour || proximal) (r - 1 - log r, r = pi_proximal / pi_behaviour, on tokens the
  // behaviour policy sampled), and the tokens masked per token and per sequence.
  double mismatch_tokens = 0;
  double mismatch_kl_sum = 0;
  double token_masked = 0;
  double sequence_masked = 0;

  void Add(const PolicyLossMetrics& other);
  double clip_fraction() const { return tokens > 0 ? clipped / tokens : 0; }
  double approx_kl() const { return tokens > 0 ? approx_kl_sum / tokens : 0; }
  double kl() const { return kl_tokens > 0 ? kl_sum / kl_tokens : 0; }
  double entropy() const { return tokens > 0 ? entropy_sum / tokens : 0; }
  double importance_mean() const { return tokens > 0 ? importance_sum / tokens : 0; }
  double truncated_fraction() const { return tokens > 0 ? truncated / tokens : 0; }
  double value_clip_fraction() const { return tokens > 0 ? value_clipped / tokens : 0; }
  double mismatch_kl() const {
    return mismatch_tokens > 0 ? mismatch_kl_sum / mismatch_tokens : 0;
  }
  double token_masked_fraction() const { return tokens > 0 ? token_masked / tokens : 0; }
  double sequence_masked_fraction() const { return tokens > 0 ? sequence_masked / tokens : 0; }
};

struct PolicyLossResult {
  at::Tensor loss;  // scalar: policy + kl_coef kl - entropy_coef entropy + value_coef value
  // The aggregated terms, unweighted by their coefficients (0 where off), for logs.
  double policy_loss = 0;
  double kl_loss = 0;
  double entropy = 0;
  double value_loss = 0;
  PolicyLossMetrics metrics;
  // Per token (B, T), detached, for inspection (the step dump): the weight the token's policy
  // term was multiplied by (truncated importance and MIS weighting; 1 where none applies),
  // whether it was trained (1) or masked by IcePop or MIS (0), and its aggregation weight (its
  // row's weight; 0 off the action mask).
  at::Tensor importance;
  at::Tensor trained;
  at::Tensor token_weight;
};

// Each sequence's weight w_i such that the aggregated loss is sum_i w_i sum_{t in i} l_t, from
// the sequences' action-token counts n_i (S the sequences with n_i > 0; one without action
// tokens has weight 0 and is not counted):
//   token_mean                1 / sum_j n_j
//   sequence_mean_token_sum   1 / S
//   sequence_mean_token_mean  1 / (S n_i)      (longer sequences weigh less)
//   constant                  1 / loss_constant
// InvalidArgument for a negative count, or constant without a positive loss_constant.
Result<std::vector<double>> SequenceLossWeights(LossAggregation aggregation,
                                                const std::vector<int64_t>& action_tokens,
                                                double loss_constant);

// The loss and its metrics. InvalidArgument for missing or mis-shaped inputs a setting needs;
// LibTorch errors become Internal.
Result<PolicyLossResult> PolicyLoss(const PolicyLossInputs& inputs,
                                    const PolicyLossOptions& options);

}  // namespace strider::rl
