#include "learner/rl/losses.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <string>

#include "common/model/torch_status.h"

namespace strider::rl {
namespace {

Status CheckShape(const at::Tensor& tensor, const at::Tensor& like, const char* name) {
  if (!tensor.defined()) return Status::InvalidArgument(std::string(name) + " is required");
  if (tensor.sizes() != like.sizes()) {
    return Status::InvalidArgument(std::string(name) + " has shape " + c10::str(tensor.sizes()) +
                                   ", the log-probs " + c10::str(like.sizes()));
  }
  return Status::Ok();
}

Status CheckInputs(const PolicyLossInputs& in, const PolicyLossOptions& options) {
  if (!in.logprobs.defined() || in.logprobs.dim() != 2) {
    return Status::InvalidArgument("logprobs must be a (B, T) tensor");
  }
  const at::Tensor& like = in.logprobs;
  STRIDER_RETURN_IF_ERROR(CheckShape(in.behaviour_logprobs, like, "behaviour_logprobs"));
  STRIDER_RETURN_IF_ERROR(CheckShape(in.advantages, like, "advantages"));
  STRIDER_RETURN_IF_ERROR(CheckShape(in.action_mask, like, "action_mask"));
  if (in.proximal_logprobs.defined()) {
    STRIDER_RETURN_IF_ERROR(CheckShape(in.proximal_logprobs, like, "proximal_logprobs"));
  }
  if (options.kl_coef > 0 || in.reference_logprobs.defined()) {
    STRIDER_RETURN_IF_ERROR(
        CheckShape(in.reference_logprobs, like, "reference_logprobs (kl_coef > 0)"));
  }
  if (options.entropy_coef != 0 || in.entropy.defined()) {
    STRIDER_RETURN_IF_ERROR(CheckShape(in.entropy, like, "entropy (entropy_coef set)"));
  }
  if (options.value_coef > 0) {
    STRIDER_RETURN_IF_ERROR(CheckShape(in.values, like, "values (value_coef > 0)"));
    STRIDER_RETURN_IF_ERROR(CheckShape(in.returns, like, "returns (value_coef > 0)"));
    if (options.value_clip > 0) {
      STRIDER_RETURN_IF_ERROR(CheckShape(in.old_values, like, "old_values (value_clip > 0)"));
    }
  }
  if (in.row_weight.defined() &&
      (in.row_weight.dim() != 1 || in.row_weight.size(0) != like.size(0))) {
    return Status::InvalidArgument("row_weight must have one entry per row");
  }
  if (in.sequence_log_ratio.defined() &&
      (in.sequence_log_ratio.dim() != 1 || in.sequence_log_ratio.size(0) != like.size(0))) {
    return Status::InvalidArgument("sequence_log_ratio must have one entry per row");
  }
  return Status::Ok();
}

double MaskedSum(const at::Tensor& values, const at::Tensor& keep) {
  return at::where(keep, values, at::zeros_like(values)).sum().item<double>();
}

}  // namespace

void PolicyLossMetrics::Add(const PolicyLossMetrics& other) {
  tokens += other.tokens;
  clipped += other.clipped;
  approx_kl_sum += other.approx_kl_sum;
  kl_sum += other.kl_sum;
  kl_tokens += other.kl_tokens;
  entropy_sum += other.entropy_sum;
  importance_sum += other.importance_sum;
  truncated += other.truncated;
  value_clipped += other.value_clipped;
  mismatch_tokens += other.mismatch_tokens;
  mismatch_kl_sum += other.mismatch_kl_sum;
  token_masked += other.token_masked;
  sequence_masked += other.sequence_masked;
}

Result<std::vector<double>> SequenceLossWeights(LossAggregation aggregation,
                                                const std::vector<int64_t>& action_tokens,
                                                double loss_constant) {
  int64_t total = 0;
  int64_t with_actions = 0;
  for (int64_t n : action_tokens) {
    if (n < 0) return Status::InvalidArgument("negative action-token count");
    total += n;
    if (n > 0) ++with_actions;
  }
  // A sequence without action tokens has no loss term: counting it would shrink every other
  // sequence's weight (veRL's agg_loss leaves such sequences out of the mean too).
  const double sequences = static_cast<double>(with_actions);
  std::vector<double> weights(action_tokens.size(), 0.0);
  for (size_t i = 0; i < action_tokens.size(); ++i) {
    switch (aggregation) {
      case LossAggregation::kTokenMean:
        weights[i] = total > 0 ? 1.0 / static_cast<double>(total) : 0.0;
        break;
      case LossAggregation::kSequenceMeanTokenSum:
        weights[i] = action_tokens[i] > 0 ? 1.0 / sequences : 0.0;
        break;
      case LossAggregation::kSequenceMeanTokenMean:
        weights[i] =
            action_tokens[i] > 0 ? 1.0 / (sequences * static_cast<double>(action_tokens[i])) : 0.0;
        break;
      case LossAggregation::kConstant:
        if (!(loss_constant > 0)) {
          return Status::InvalidArgument("aggregation constant needs a positive loss_constant");
        }
        weights[i] = 1.0 / loss_constant;
        break;
    }
  }
  return weights;
}

Result<PolicyLossResult> PolicyLoss(const PolicyLossInputs& in, const PolicyLossOptions& options) {
  STRIDER_RETURN_IF_ERROR(CheckInputs(in, options));
  return model::Guarded("policy loss", [&]() -> Result<PolicyLossResult> {
    const at::Tensor& logprobs = in.logprobs;
    const auto as = [&](const at::Tensor& t) { return t.to(logprobs.options()).detach(); };
    const at::Tensor keep = in.action_mask.ne(0);
    const at::Tensor zeros = at::zeros_like(logprobs).detach();
    // Masked positions are replaced by zero before any non-linearity, so whatever they hold
    // (an unscored -inf, a huge stale log-ratio) can neither overflow nor leak a NaN gradient.
    const auto masked = [&](const at::Tensor& t) { return at::where(keep, t, zeros); };

    at::Tensor row_weight;
    if (in.row_weight.defined()) {
      row_weight = as(in.row_weight);
    } else {
      // Each row's token count to the host, where the aggregation's weights are chosen.
      const at::Tensor counts = keep.sum(1).to(at::kCPU, at::kLong).contiguous();
      const std::vector<int64_t> counts_vector(counts.data_ptr<int64_t>(),
                                               counts.data_ptr<int64_t>() + counts.numel());
      STRIDER_ASSIGN_OR_RETURN(
          std::vector<double> weights,
          SequenceLossWeights(options.aggregation, counts_vector, options.loss_constant));
      row_weight = as(at::tensor(weights, at::kDouble));
    }
    const at::Tensor token_weight = keep.to(logprobs.scalar_type()) * row_weight.unsqueeze(1);
    const auto aggregate = [&](const at::Tensor& t) { return (masked(t) * token_weight).sum(); };

    const at::Tensor behaviour = as(in.behaviour_logprobs);
    const bool has_proximal = in.proximal_logprobs.defined();
    const at::Tensor anchor = has_proximal ? as(in.proximal_logprobs) : behaviour;
    const at::Tensor advantages = masked(as(in.advantages));

    const at::Tensor log_ratio = masked(logprobs - anchor);
    const at::Tensor ratio = at::exp(log_ratio);
    const at::Tensor unclipped = -advantages * ratio;
    const at::Tensor clipped =
        -advantages * at::clamp(ratio, 1.0 - options.eps_low, 1.0 + options.eps_high);
    at::Tensor token_loss = at::maximum(unclipped, clipped);
    at::Tensor clip_active = clipped.gt(unclipped);
    if (options.dual_clip > 0) {
      const at::Tensor bound = -advantages * options.dual_clip;
      const at::Tensor negative = advantages.lt(0);
      clip_active = clip_active.logical_or(negative.logical_and(token_loss.gt(bound)));
      token_loss = at::where(negative, at::minimum(token_loss, bound), token_loss);
    }
    // The ratio of the proximal to the behaviour policy: the truncated importance weight, and
    // what mismatch masking and weighting go by.
    const at::Tensor mismatch_log_ratio = masked(anchor - behaviour);
    const at::Tensor mismatch_ratio = at::exp(mismatch_log_ratio);
    at::Tensor importance = at::ones_like(zeros);
    at::Tensor capped = at::zeros_like(keep);
    if (options.truncated_importance && has_proximal) {
      capped = mismatch_ratio.gt(options.importance_cap);
      importance = at::clamp_max(mismatch_ratio, options.importance_cap);
    }
    at::Tensor token_out = at::zeros_like(keep);
    at::Tensor sequence_out = at::zeros_like(keep);
    if (has_proximal && options.token_mask) {
      token_out = mismatch_ratio.lt(options.token_mask_low)
                      .logical_or(mismatch_ratio.gt(options.token_mask_high))
                      .logical_and(keep);
    }
    if (has_proximal && options.sequence_ratio != SequenceRatio::kOff) {
      const at::Tensor log_g =
          in.sequence_log_ratio.defined()
              ? as(in.sequence_log_ratio)
              : mismatch_log_ratio.sum(1) / keep.sum(1).clamp_min(1).to(logprobs.scalar_type());
      const at::Tensor g = at::exp(log_g);
      if (options.sequence_ratio == SequenceRatio::kMask) {
        sequence_out = g.lt(options.sequence_ratio_low)
                           .logical_or(g.gt(options.sequence_ratio_high))
                           .unsqueeze(1)
                           .logical_and(keep);
      } else {
        importance = importance * at::clamp_max(g, options.sequence_ratio_high).unsqueeze(1);
      }
    }
    const at::Tensor trained = token_out.logical_or(sequence_out).logical_not();
    // Masked tokens keep their place in the aggregation's weights: masking removes their
    // signal, not their share of the batch.
    const at::Tensor policy = aggregate(at::where(trained, token_loss * importance, zeros));
    at::Tensor loss = policy;

    PolicyLossResult result;
    PolicyLossMetrics& metrics = result.metrics;
    {
      at::NoGradGuard no_grad;
      metrics.tokens = keep.sum().item<double>();
      if (has_proximal) {
        metrics.mismatch_tokens = metrics.tokens;
        metrics.mismatch_kl_sum = MaskedSum(mismatch_ratio - 1 - mismatch_log_ratio, keep);
        metrics.token_masked = token_out.sum().item<double>();
        metrics.sequence_masked =
            sequence_out.logical_and(token_out.logical_not()).sum().item<double>();
      }
      metrics.clipped = clip_active.logical_and(keep).sum().item<double>();
      metrics.approx_kl_sum = MaskedSum(ratio - 1 - log_ratio, keep);
      metrics.importance_sum = MaskedSum(importance, keep);
      metrics.truncated = capped.logical_and(keep).sum().item<double>();
      result.policy_loss = policy.item<double>();
      result.importance = importance.detach();
      result.trained = trained.logical_and(keep);
      result.token_weight = token_weight.detach();
    }

    if (in.reference_logprobs.defined()) {
      // d = log pi_ref - log pi on tokens sampled from (about) pi.
      const at::Tensor d = masked(as(in.reference_logprobs) - logprobs);
      at::Tensor kl;
      switch (options.kl_estimator) {
        case KlEstimator::kK1:
          kl = -d;
          break;
        case KlEstimator::kK2:
          kl = 0.5 * d * d;
          break;
        case KlEstimator::kK3:
          kl = at::exp(d) - d - 1;
          break;
        case KlEstimator::kK3Plus: {
          // k3's value, k2's gradient: k3 is the better reported estimate (unbiased, never
          // negative), but its gradient is that of KL(pi_ref || pi).
          const at::Tensor k2 = 0.5 * d * d;
          kl = (at::exp(d) - d - 1).detach() + (k2 - k2.detach());
          break;
        }
      }
      const at::Tensor kl_loss = aggregate(kl);
      if (options.kl_coef > 0) loss = loss + options.kl_coef * kl_loss;
      at::NoGradGuard no_grad;
      metrics.kl_sum = MaskedSum(kl, keep);
      metrics.kl_tokens = metrics.tokens;
      result.kl_loss = kl_loss.item<double>();
    }

    if (in.entropy.defined()) {
      const at::Tensor entropy = in.entropy.to(logprobs.scalar_type());
      const at::Tensor bonus = aggregate(entropy);
      if (options.entropy_coef != 0) loss = loss - options.entropy_coef * bonus;
      at::NoGradGuard no_grad;
      metrics.entropy_sum = MaskedSum(entropy, keep);
      result.entropy = bonus.item<double>();
    }

    if (options.value_coef > 0) {
      const at::Tensor values = in.values.to(logprobs.scalar_type());
      const at::Tensor returns = as(in.returns);
      const at::Tensor error = masked(values - returns);
      at::Tensor squared = error * error;
      if (options.value_clip > 0) {
        const at::Tensor old_values = as(in.old_values);
        const at::Tensor moved =
            old_values + at::clamp(values - old_values, -options.value_clip, options.value_clip);
        const at::Tensor clipped_error = masked(moved - returns);
        const at::Tensor clipped_squared = clipped_error * clipped_error;
        {
          at::NoGradGuard no_grad;
          metrics.value_clipped =
              clipped_squared.gt(squared).logical_and(keep).sum().item<double>();
        }
        squared = at::maximum(squared, clipped_squared);
      }
      const at::Tensor value_loss = aggregate(0.5 * squared);
      loss = loss + options.value_coef * value_loss;
      at::NoGradGuard no_grad;
      result.value_loss = value_loss.item<double>();
    }

    result.loss = loss;
    return result;
  });
}

}  // namespace strider::rl
