// The RL objective's settings: which advantage estimator, its bias corrections, the policy and
// value losses and how their per-token terms are aggregated. Plain structs with their defaults,
// and a strict reader for the `objective:` section an RL learner config embeds (an unknown key
// is refused with the file, line and dotted key). The conventions behind every field are in
// docs/rl_objective.md. No LibTorch here, so configs can be checked without it.
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace strider::rl {

// What a trajectory's per-token advantages come from (learner/rl/advantages.h).
struct AdvantageOptions {
  // A registered estimator: process_gae | outcome_group | implicit_process.
  std::string estimator = "outcome_group";
  double gamma = 1.0;   // discount per step (process_gae, implicit_process)
  double lambda = 1.0;  // GAE's lambda (process_gae)
  // process_gae and implicit_process: step advantages minus the group's mean over its steps,
  // over their standard deviation. implicit_process has no value baseline without it.
  bool normalize_in_group = true;
  // outcome_group: divide by the group's standard deviation (false: mean-centred only, as
  // Dr. GRPO, so groups with a small spread are not amplified).
  bool divide_by_std = true;
  double epsilon = 1e-6;  // added to a standard deviation before dividing by it

  // Bias corrections.
  // A trajectory cut by something outside the task (its token limit, a stopped actor) takes its
  // value at the cut as the return beyond it, instead of the outcome it was scored with (usually
  // a failure). The task's own turn limit is never bootstrapped: an episode that stalls until
  // max_turns failed the task, and scoring it by its value reinforced stalling (docs/rl.md).
  // Off by default: every shipped config turned it off.
  bool bootstrap_truncated = false;
  // A trajectory given only up to a segment boundary (it goes on in segments not given) takes
  // its value at the boundary as the return beyond it, instead of zero.
  bool bootstrap_segment_cut = true;
  // Groups whose members all got the same outcome carry no signal for a group baseline: they
  // are marked filtered and get zero advantages (DAPO's dynamic sampling rule).
  bool filter_constant_groups = false;
  // Scale of negative token advantages, after normalisation (every estimator). 1 is the plain
  // estimator. Below 1 a failed trajectory pushes its tokens down less; at 0 only what did
  // better than the baseline is reinforced (rejection-sampling fine-tuning in group form). With
  // outcome rewards a failed trajectory's later steps are often right (copying a wrong tool
  // result correctly); pushing them down as hard as its mistake unlearned them on the
  // calculator (docs/rl.md).
  double negative_weight = 1.0;
};

// Per-token estimators of KL(pi || pi_ref) on tokens sampled from pi, with d = log pi_ref -
// log pi. Their values and their gradients as a loss term are different things: only k2's
// expected gradient is that of KL(pi || pi_ref) (docs/rl_objective.md has the numbers).
// Sequence-level handling of the proximal/behaviour mismatch (MIS), by the geometric mean g of a
// sequence's ratios pi_proximal / pi_behaviour over its action tokens.
enum class SequenceRatio {
  kOff,
  kMask,    // a sequence whose g leaves [sequence_ratio_low, sequence_ratio_high] has no loss
  kWeight,  // every token's policy loss times min(g, sequence_ratio_high)
};

enum class KlEstimator {
  kK1,      // -d: unbiased value, expected gradient 0
  kK2,      // d^2 / 2: biased value, the gradient of KL(pi || pi_ref)
  kK3,      // e^d - d - 1: unbiased value, the gradient of KL(pi_ref || pi)
  kK3Plus,  // k3's value with k2's gradient (veRL's "k3+"): the default
};

// How per-token terms become one number (the length-bias correction is the choice here).
enum class LossAggregation {
  kTokenMean,              // sum over the batch's action tokens / their number
  kSequenceMeanTokenSum,   // mean over sequences of each sequence's token sum
  kSequenceMeanTokenMean,  // mean over sequences of each sequence's token mean (length-biased)
  kConstant,               // sum over the batch's action tokens / loss_constant
};

Result<SequenceRatio> ParseSequenceRatio(const std::string& name);
std::string SequenceRatioName(SequenceRatio mode);
Result<KlEstimator> ParseKlEstimator(const std::string& name);
std::string KlEstimatorName(KlEstimator estimator);
Result<LossAggregation> ParseLossAggregation(const std::string& name);
std::string LossAggregationName(LossAggregation aggregation);

// The policy and value losses (learner/rl/losses.h).
struct PolicyLossOptions {
  // Clip range of the ratio: [1 - eps_low, 1 + eps_high]; a larger eps_high ("clip higher")
  // lets rare tokens with positive advantages grow faster.
  double eps_low = 0.2;
  double eps_high = 0.2;
  // Dual clip: for negative advantages the token loss is at most -A * dual_clip, so a token whose
  // ratio has run far above 1 cannot dominate. 0: off; otherwise it must exceed 1 (3 is usual).
  double dual_clip = 0;
  // Truncated importance weights min(pi_proximal / pi_behaviour, importance_cap) on each token's
  // policy loss, correcting stale and engine-mismatched tokens when the ratio is taken against
  // the learner's own proximal log-probs.
  bool truncated_importance = true;
  double importance_cap = 2.0;
  // Masking against the mismatch between the learner and the engine that sampled (both need the
  // proximal log-probs; the ratio is pi_proximal / pi_behaviour). Per token (IcePop): a token
  // whose ratio leaves [token_mask_low, token_mask_high] has no policy loss.
  bool token_mask = false;
  double token_mask_low = 0.5;
  double token_mask_high = 2.0;
  // Per sequence (MIS), by the geometric mean of its ratios.
  SequenceRatio sequence_ratio = SequenceRatio::kOff;
  double sequence_ratio_low = 0.5;
  double sequence_ratio_high = 2.0;
  // KL penalty to the reference policy, kl_coef * aggregated estimator; 0: off.
  double kl_coef = 0;
  KlEstimator kl_estimator = KlEstimator::kK3Plus;
  // Subtracted times the aggregated entropy. Not negative: the config reader refuses one, since
  // the entropy joins the loss's graph only for a positive coefficient.
  double entropy_coef = 0;
  double value_coef = 0.5;  // value loss weight; 0: no value loss
  // Value clipping around the values the advantages were computed with; 0: unclipped.
  double value_clip = 0;

  LossAggregation aggregation = LossAggregation::kTokenMean;
  // kConstant: the divisor in tokens, fixed for the run (for example sequences per batch times
  // the maximum trajectory length), so neither a trajectory's length nor a batch's token count
  // changes the weight of a token.
  double loss_constant = 0;
};

struct ObjectiveConfig {
  AdvantageOptions advantages;
  PolicyLossOptions loss;
};

// Reads an `objective:` mapping (sections `advantages`, `policy`, `value` and the keys
// `aggregation`, `loss_constant`) into `config`, leaving defaults where keys are absent.
// Problems are recorded on `section`'s document; the caller's root Finish() reports them and
// any unknown key. Returns section.status().
Status ReadObjectiveConfig(ConfigReader& section, ObjectiveConfig* config);

}  // namespace strider::rl
