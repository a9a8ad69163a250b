#include "learner/rl/objective_config.h"

#include <array>
#include <utility>

#include "learner/rl/advantages.h"

namespace strider::rl {
namespace {

constexpr std::array<std::pair<const char*, KlEstimator>, 4> kKlEstimators = {{
    {"k1", KlEstimator::kK1},
    {"k2", KlEstimator::kK2},
    {"k3", KlEstimator::kK3},
    {"k3+", KlEstimator::kK3Plus},
}};

constexpr std::array<std::pair<const char*, SequenceRatio>, 3> kSequenceRatios = {{
    {"off", SequenceRatio::kOff},
    {"mask", SequenceRatio::kMask},
    {"weight", SequenceRatio::kWeight},
}};

constexpr std::array<std::pair<const char*, LossAggregation>, 4> kAggregations = {{
    {"token_mean", LossAggregation::kTokenMean},
    {"sequence_mean_token_sum", LossAggregation::kSequenceMeanTokenSum},
    {"sequence_mean_token_mean", LossAggregation::kSequenceMeanTokenMean},
    {"constant", LossAggregation::kConstant},
}};

template <typename Enum, size_t N>
Result<Enum> ParseName(const std::array<std::pair<const char*, Enum>, N>& names,
                       const std::string& name, const char* what) {
  std::string known;
  for (const auto& [text, value] : names) {
    if (name == text) return value;
    known += (known.empty() ? "" : ", ") + std::string(text);
  }
  return Status::InvalidArgument("unknown " + std::string(what) + " '" + name +
                                 "' (known: " + known + ")");
}

template <typename Enum, size_t N>
std::string NameOf(const std::array<std::pair<const char*, Enum>, N>& names, Enum value) {
  for (const auto& [text, entry] : names) {
    if (entry == value) return text;
  }
  return "unknown";
}

// Reads `key` as one of `names` into `out`, keeping `out` where the key is absent.
template <typename Enum, size_t N>
void ReadName(ConfigReader& reader, const std::string& key,
              const std::array<std::pair<const char*, Enum>, N>& names, const char* what,
              Enum* out) {
  std::string name = NameOf(names, *out);
  reader.Optional(key, &name);
  Result<Enum> parsed = ParseName(names, name, what);
  if (parsed.ok()) {
    *out = *parsed;
  } else {
    reader.Fail(key, parsed.status().message());
  }
}

}  // namespace

Result<SequenceRatio> ParseSequenceRatio(const std::string& name) {
  return ParseName(kSequenceRatios, name, "sequence ratio mode");
}
std::string SequenceRatioName(SequenceRatio mode) { return NameOf(kSequenceRatios, mode); }

Result<KlEstimator> ParseKlEstimator(const std::string& name) {
  return ParseName(kKlEstimators, name, "KL estimator");
}
std::string KlEstimatorName(KlEstimator estimator) { return NameOf(kKlEstimators, estimator); }

Result<LossAggregation> ParseLossAggregation(const std::string& name) {
  return ParseName(kAggregations, name, "loss aggregation");
}
std::string LossAggregationName(LossAggregation aggregation) {
  return NameOf(kAggregations, aggregation);
}

Status ReadObjectiveConfig(ConfigReader& section, ObjectiveConfig* config) {
  AdvantageOptions& a = config->advantages;
  ConfigReader advantages = section.Section("advantages");
  advantages.Optional("estimator", &a.estimator);
  if (const Status known = CheckAdvantageEstimator(a.estimator); !known.ok()) {
    advantages.Fail("estimator", known.message());
  }
  advantages.Optional("gamma", &a.gamma);
  advantages.Check(a.gamma >= 0 && a.gamma <= 1, "gamma", "must be in [0, 1]");
  advantages.Optional("lambda", &a.lambda);
  advantages.Check(a.lambda >= 0 && a.lambda <= 1, "lambda", "must be in [0, 1]");
  advantages.Optional("normalize_in_group", &a.normalize_in_group);
  advantages.Optional("divide_by_std", &a.divide_by_std);
  advantages.Optional("epsilon", &a.epsilon);
  advantages.Check(a.epsilon >= 0, "epsilon", "must not be negative");
  advantages.Optional("bootstrap_truncated", &a.bootstrap_truncated);
  advantages.Optional("bootstrap_segment_cut", &a.bootstrap_segment_cut);
  advantages.Optional("filter_constant_groups", &a.filter_constant_groups);
  advantages.Optional("negative_weight", &a.negative_weight);
  advantages.Check(a.negative_weight >= 0 && a.negative_weight <= 1, "negative_weight",
                   "must be in [0, 1]");

  PolicyLossOptions& p = config->loss;
  ConfigReader policy = section.Section("policy");
  policy.Optional("eps_low", &p.eps_low);
  policy.Check(p.eps_low >= 0 && p.eps_low < 1, "eps_low", "must be in [0, 1)");
  policy.Optional("eps_high", &p.eps_high);
  policy.Check(p.eps_high >= 0, "eps_high", "must not be negative");
  policy.Optional("dual_clip", &p.dual_clip);
  policy.Check(p.dual_clip == 0 || p.dual_clip > 1, "dual_clip", "must be 0 (off) or above 1");
  policy.Optional("truncated_importance", &p.truncated_importance);
  policy.Optional("importance_cap", &p.importance_cap);
  policy.Check(p.importance_cap > 0, "importance_cap", "must be positive");
  policy.Optional("token_mask", &p.token_mask);
  policy.Optional("token_mask_low", &p.token_mask_low);
  policy.Check(p.token_mask_low >= 0 && p.token_mask_low < 1, "token_mask_low",
               "must be in [0, 1)");
  policy.Optional("token_mask_high", &p.token_mask_high);
  policy.Check(p.token_mask_high > 1, "token_mask_high", "must be above 1");
  ReadName(policy, "sequence_ratio", kSequenceRatios, "sequence ratio mode", &p.sequence_ratio);
  policy.Optional("sequence_ratio_low", &p.sequence_ratio_low);
  policy.Check(p.sequence_ratio_low >= 0 && p.sequence_ratio_low < 1, "sequence_ratio_low",
               "must be in [0, 1)");
  policy.Optional("sequence_ratio_high", &p.sequence_ratio_high);
  policy.Check(p.sequence_ratio_high > 1, "sequence_ratio_high", "must be above 1");
  policy.Optional("kl_coef", &p.kl_coef);
  policy.Check(p.kl_coef >= 0, "kl_coef", "must not be negative");
  ReadName(policy, "kl_estimator", kKlEstimators, "KL estimator", &p.kl_estimator);
  policy.Optional("entropy_coef", &p.entropy_coef);
  policy.Check(p.entropy_coef >= 0, "entropy_coef",
               "must not be negative (a bonus on the entropy; 0: off)");

  ConfigReader value = section.Section("value");
  value.Optional("coef", &p.value_coef);
  value.Check(p.value_coef >= 0, "coef", "must not be negative");
  value.Optional("clip", &p.value_clip);
  value.Check(p.value_clip >= 0, "clip", "must not be negative (0: unclipped)");

  // The bootstrap is the value head's estimate: a head without a loss is never trained, and
  // implicit_process is documented as needing none.
  advantages.Check(
      !a.bootstrap_truncated || (p.value_coef > 0 && a.estimator != "implicit_process"),
      "bootstrap_truncated",
      "reads the value head: needs objective.value.coef > 0 and an estimator other than "
      "implicit_process");

  ReadName(section, "aggregation", kAggregations, "loss aggregation", &p.aggregation);
  section.Optional("loss_constant", &p.loss_constant);
  section.Check(p.aggregation != LossAggregation::kConstant || p.loss_constant > 0, "loss_constant",
                "must be positive with aggregation: constant");
  return section.status();
}

}  // namespace strider::rl
