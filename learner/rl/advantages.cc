#include "learner/rl/advantages.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace strider::rl {
namespace {

// Scores this close (relative) count as equal: a group whose members differ only by rounding
// has no spread to normalise by, and dividing would turn rounding into full-size advantages.
constexpr double kEqualTolerance = 1e-12;

Status CheckTrajectory(const TrajectoryInput& trajectory, size_t index) {
  const std::string where = "group member " + std::to_string(index) + ": ";
  if (trajectory.token_begin < 0) return Status::InvalidArgument(where + "negative token_begin");
  if (!std::isfinite(trajectory.outcome) || !std::isfinite(trajectory.bootstrap_value)) {
    return Status::InvalidArgument(where + "outcome and bootstrap value must be finite");
  }
  int64_t previous_end = 0;
  for (size_t k = 0; k < trajectory.steps.size(); ++k) {
    const StepInput& step = trajectory.steps[k];
    const std::string name = where + "step " + std::to_string(k) + ": ";
    if (step.begin < previous_end || step.end <= step.begin) {
      return Status::InvalidArgument(name + "token range [" + std::to_string(step.begin) + ", " +
                                     std::to_string(step.end) +
                                     ") is empty or overlaps the step before");
    }
    if (!std::isfinite(step.reward) || !std::isfinite(step.value)) {
      return Status::InvalidArgument(name + "reward and value must be finite");
    }
    previous_end = step.end;
  }
  if (!trajectory.implicit_rewards.empty() &&
      trajectory.implicit_rewards.size() != trajectory.action.size()) {
    return Status::InvalidArgument(where + std::to_string(trajectory.implicit_rewards.size()) +
                                   " implicit rewards for " +
                                   std::to_string(trajectory.action.size()) + " tokens");
  }
  for (size_t i = 0; i < trajectory.implicit_rewards.size(); ++i) {
    if (trajectory.action[i] != 0 && !std::isfinite(trajectory.implicit_rewards[i])) {
      return Status::InvalidArgument(where + "implicit reward of token " + std::to_string(i) +
                                     " is not finite");
    }
  }
  return Status::Ok();
}

Status CheckGroup(const GroupInput& group) {
  for (size_t i = 0; i < group.members.size(); ++i) {
    STRIDER_RETURN_IF_ERROR(CheckTrajectory(group.members[i], i));
  }
  return Status::Ok();
}

bool Bootstraps(const TrajectoryInput& trajectory, const AdvantageOptions& options) {
  return (trajectory.end == TrajectoryEnd::kTruncated && options.bootstrap_truncated) ||
         (trajectory.end == TrajectoryEnd::kSegmentCut && options.bootstrap_segment_cut);
}

// Whether the outcome is paid at the last step: a cut trajectory's outcome is not known yet,
// and a bootstrapped truncated one is not scored as a failure.
bool PaysOutcome(const TrajectoryInput& trajectory, const AdvantageOptions& options) {
  return trajectory.end == TrajectoryEnd::kFinished ||
         (trajectory.end == TrajectoryEnd::kTruncated && !options.bootstrap_truncated);
}

// The number a group baseline compares: the outcome, or the value at the cut where the
// trajectory bootstraps.
double Score(const TrajectoryInput& trajectory, const AdvantageOptions& options) {
  if (Bootstraps(trajectory, options)) return trajectory.bootstrap_value;
  return PaysOutcome(trajectory, options) ? trajectory.outcome : 0.0;
}

bool AllEqual(const std::vector<double>& values) {
  if (values.empty()) return true;
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  const double scale = std::max({1.0, std::abs(*lo), std::abs(*hi)});
  return *hi - *lo <= kEqualTolerance * scale;
}

// (x - mean) / (sample std + epsilon) in place; all zeros for fewer than two values or no
// spread (std = 0), where there is nothing to compare against.
void Standardise(std::vector<double*>& values, bool divide_by_std, double epsilon) {
  std::vector<double> copy;
  for (const double* v : values) copy.push_back(*v);
  if (copy.size() < 2 || AllEqual(copy)) {
    for (double* v : values) *v = 0;
    return;
  }
  double mean = 0;
  for (double v : copy) mean += v;
  mean /= static_cast<double>(copy.size());
  double squares = 0;
  for (double v : copy) squares += (v - mean) * (v - mean);
  const double std = std::sqrt(squares / static_cast<double>(copy.size() - 1));
  for (double* v : values) *v = divide_by_std ? (*v - mean) / (std + epsilon) : *v - mean;
}

// Per covered token: the advantage and return of the step holding it, on action tokens.
void FillTokens(const TrajectoryInput& trajectory, TrajectoryAdvantages& out) {
  const size_t n = trajectory.action.size();
  out.advantages.assign(n, 0.0f);
  out.returns.assign(n, 0.0f);
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t position = trajectory.token_begin + static_cast<int64_t>(i);
    while (k < trajectory.steps.size() && trajectory.steps[k].end <= position) ++k;
    if (k == trajectory.steps.size()) break;
    if (position < trajectory.steps[k].begin || trajectory.action[i] == 0) continue;
    out.advantages[i] = static_cast<float>(out.step_advantages[k]);
    out.returns[i] = static_cast<float>(out.step_returns[k]);
  }
}

// The common end of every estimator: the constant-group filter, then the per-token fill.
GroupAdvantages Finish(const GroupInput& group, const AdvantageOptions& options,
                       GroupAdvantages result) {
  if (options.filter_constant_groups) {
    std::vector<double> scores;
    for (const TrajectoryInput& member : group.members) scores.push_back(Score(member, options));
    if (AllEqual(scores)) {
      result.filtered = true;
      for (TrajectoryAdvantages& member : result.members) {
        std::fill(member.step_advantages.begin(), member.step_advantages.end(), 0.0);
      }
    }
  }
  for (size_t i = 0; i < group.members.size(); ++i) FillTokens(group.members[i], result.members[i]);
  return result;
}

// Backward GAE recursion over one trajectory's steps.
TrajectoryAdvantages StepGae(const TrajectoryInput& trajectory, const AdvantageOptions& options,
                             double lambda) {
  const size_t steps = trajectory.steps.size();
  TrajectoryAdvantages out;
  out.step_advantages.assign(steps, 0.0);
  out.step_returns.assign(steps, 0.0);
  double next_value = Bootstraps(trajectory, options) ? trajectory.bootstrap_value : 0.0;
  double advantage = 0;
  for (size_t k = steps; k-- > 0;) {
    const StepInput& step = trajectory.steps[k];
    double reward = step.reward;
    if (k + 1 == steps && PaysOutcome(trajectory, options)) reward += trajectory.outcome;
    const double value = step.value;
    const double delta = reward + options.gamma * next_value - value;
    advantage = delta + options.gamma * lambda * advantage;
    out.step_advantages[k] = advantage;
    out.step_returns[k] = advantage + value;
    next_value = value;
  }
  return out;
}

// Per covered token, the index of the step holding it; a token between steps takes the next
// step's, a token after the last step the number of steps.
std::vector<size_t> StepIndices(const TrajectoryInput& trajectory) {
  std::vector<size_t> index(trajectory.action.size());
  size_t k = 0;
  for (size_t i = 0; i < index.size(); ++i) {
    const int64_t position = trajectory.token_begin + static_cast<int64_t>(i);
    while (k < trajectory.steps.size() && trajectory.steps[k].end <= position) ++k;
    index[i] = k;
  }
  return index;
}

// Each step's advantage as its first action token's (0 for a step without one).
void StepAdvantagesFromTokens(const TrajectoryInput& trajectory, TrajectoryAdvantages& out) {
  out.step_advantages.assign(trajectory.steps.size(), 0.0);
  std::vector<bool> seen(trajectory.steps.size(), false);
  const std::vector<size_t> index = StepIndices(trajectory);
  for (size_t i = 0; i < index.size(); ++i) {
    const size_t k = index[i];
    if (k >= seen.size() || seen[k] || trajectory.action[i] == 0) continue;
    const int64_t position = trajectory.token_begin + static_cast<int64_t>(i);
    if (position < trajectory.steps[k].begin) continue;
    seen[k] = true;
    out.step_advantages[k] = out.advantages[i];
  }
}

// (x - mean) / (sample std + epsilon) over the action tokens of the given members; zeros for
// fewer than two tokens or no spread.
void StandardiseTokens(const std::vector<const TrajectoryInput*>& inputs,
                       const std::vector<TrajectoryAdvantages*>& members, double epsilon) {
  std::vector<double*> values;
  std::vector<std::vector<double>> copies(members.size());
  for (size_t m = 0; m < members.size(); ++m) {
    copies[m].assign(members[m]->advantages.begin(), members[m]->advantages.end());
    for (size_t i = 0; i < copies[m].size(); ++i) {
      if (inputs[m]->action[i] != 0) values.push_back(&copies[m][i]);
    }
  }
  Standardise(values, /*divide_by_std=*/true, epsilon);
  for (size_t m = 0; m < members.size(); ++m) {
    for (size_t i = 0; i < copies[m].size(); ++i) {
      members[m]->advantages[i] =
          inputs[m]->action[i] != 0 ? static_cast<float>(copies[m][i]) : 0.0f;
    }
    StepAdvantagesFromTokens(*inputs[m], *members[m]);
  }
}

// PRIME's leave-one-out returns of one group (ImplicitProcess), before any standardisation.
GroupAdvantages ImplicitRloo(const GroupInput& group, const AdvantageOptions& options) {
  const size_t n = group.members.size();
  // The outcome of a trajectory cut at a segment boundary is not known yet; no value stands in.
  std::vector<double> outcomes(n, 0.0), means(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const TrajectoryInput& member = group.members[i];
    if (member.end != TrajectoryEnd::kSegmentCut) outcomes[i] = member.outcome;
    double sum = 0;
    int64_t count = 0;
    for (size_t t = 0; t < member.implicit_rewards.size(); ++t) {
      if (member.action[t] == 0) continue;
      sum += member.implicit_rewards[t];
      ++count;
    }
    means[i] = count > 0 ? sum / static_cast<double>(count) : 0.0;
  }
  double outcome_sum = 0, mean_sum = 0;
  for (size_t i = 0; i < n; ++i) {
    outcome_sum += outcomes[i];
    mean_sum += means[i];
  }
  // r' = r n / (n - 1) - sum_j mean_j / (n - 1): the leave-one-out form PRIME applies to each
  // reward source; a group of one has no one to leave out.
  const double scale = n > 1 ? static_cast<double>(n) / static_cast<double>(n - 1) : 1.0;
  const double divisor = n > 1 ? static_cast<double>(n - 1) : 0.0;
  GroupAdvantages result;
  if (options.filter_constant_groups && AllEqual(outcomes)) result.filtered = true;
  for (size_t i = 0; i < n; ++i) {
    const TrajectoryInput& member = group.members[i];
    const size_t steps = member.steps.size();
    const double outcome =
        n > 1 ? outcomes[i] * scale - outcome_sum / divisor : outcomes[i];
    const double baseline = n > 1 ? mean_sum / divisor : 0.0;
    const std::vector<size_t> index = StepIndices(member);
    TrajectoryAdvantages out;
    out.advantages.assign(member.action.size(), 0.0f);
    out.returns.assign(member.action.size(), 0.0f);
    double to_end = 0;
    size_t later = SIZE_MAX;  // the step of the token after this one
    for (size_t t = member.action.size(); t-- > 0;) {
      const size_t k = index[t];
      // Discounted once per step boundary crossed.
      if (later != SIZE_MAX && k < later) {
        to_end *= std::pow(options.gamma, static_cast<double>(later - k));
      }
      later = k;
      if (member.action[t] == 0) continue;
      const double reward =
          member.implicit_rewards.empty() ? 0.0 : member.implicit_rewards[t];
      to_end += reward * scale - baseline;
      const double outcome_share =
          outcome * std::pow(options.gamma, static_cast<double>(steps > k + 1 ? steps - 1 - k : 0));
      const double advantage = result.filtered ? 0.0 : to_end + outcome_share;
      out.advantages[t] = static_cast<float>(advantage);
      out.returns[t] = static_cast<float>(to_end + outcome_share);
    }
    StepAdvantagesFromTokens(member, out);
    out.step_returns = out.step_advantages;
    result.members.push_back(std::move(out));
  }
  return result;
}

Result<GroupAdvantages> StepEstimator(const GroupInput& group, const AdvantageOptions& options,
                                      double lambda) {
  STRIDER_RETURN_IF_ERROR(CheckGroup(group));
  GroupAdvantages result;
  for (const TrajectoryInput& member : group.members) {
    result.members.push_back(StepGae(member, options, lambda));
  }
  if (options.normalize_in_group) {
    // Each step is one decision of the step-level process, so each counts once whatever its
    // length in tokens.
    std::vector<double*> all;
    for (TrajectoryAdvantages& member : result.members) {
      for (double& a : member.step_advantages) all.push_back(&a);
    }
    Standardise(all, /*divide_by_std=*/true, options.epsilon);
  }
  return Finish(group, options, std::move(result));
}

// What normalize_in_group standardises over a batch (ComputeBatchAdvantages).
enum class BatchNormalisation {
  kNone,
  kSingleGroupSteps,  // each group's steps, and the groups of one together (the batch's)
  kAllTokens,         // every action token of the batch together
};

struct Estimator {
  const char* name;
  Result<GroupAdvantages> (*compute)(const GroupInput&, const AdvantageOptions&);
  BatchNormalisation batch;
};

// The one place estimators are listed: adding one is an entry here.
constexpr Estimator kEstimators[] = {
    {"process_gae", ProcessGae, BatchNormalisation::kSingleGroupSteps},
    {"outcome_group", OutcomeGroup, BatchNormalisation::kNone},
    {"implicit_process", ImplicitProcess, BatchNormalisation::kAllTokens},
};

void ScaleNegatives(GroupAdvantages& result, double negative_weight) {
  if (negative_weight == 1.0) return;
  // Per token only: step advantages and returns stay as estimated (value targets, metrics).
  for (TrajectoryAdvantages& member : result.members) {
    for (float& a : member.advantages) {
      if (a < 0) a *= static_cast<float>(negative_weight);
    }
  }
}

}  // namespace

Result<GroupAdvantages> ProcessGae(const GroupInput& group, const AdvantageOptions& options) {
  return StepEstimator(group, options, options.lambda);
}

Result<GroupAdvantages> ImplicitProcess(const GroupInput& group, const AdvantageOptions& options) {
  STRIDER_RETURN_IF_ERROR(CheckGroup(group));
  GroupAdvantages result = ImplicitRloo(group, options);
  if (options.normalize_in_group && !result.filtered) {
    std::vector<const TrajectoryInput*> inputs;
    std::vector<TrajectoryAdvantages*> members;
    for (size_t i = 0; i < group.members.size(); ++i) {
      inputs.push_back(&group.members[i]);
      members.push_back(&result.members[i]);
    }
    StandardiseTokens(inputs, members, options.epsilon);
  }
  return result;
}

Result<GroupAdvantages> OutcomeGroup(const GroupInput& group, const AdvantageOptions& options) {
  STRIDER_RETURN_IF_ERROR(CheckGroup(group));
  std::vector<double> scores;
  for (const TrajectoryInput& member : group.members) scores.push_back(Score(member, options));
  std::vector<double> advantages = scores;
  std::vector<double*> pointers;
  for (double& a : advantages) pointers.push_back(&a);
  Standardise(pointers, options.divide_by_std, options.epsilon);

  GroupAdvantages result;
  for (size_t i = 0; i < group.members.size(); ++i) {
    const TrajectoryInput& member = group.members[i];
    TrajectoryAdvantages out;
    out.step_advantages.assign(member.steps.size(), advantages[i]);
    out.step_returns.assign(member.steps.size(), scores[i]);
    result.members.push_back(std::move(out));
  }
  result = Finish(group, options, std::move(result));
  // The outcome belongs to the whole trajectory: action tokens outside every step get it too.
  for (size_t i = 0; i < group.members.size(); ++i) {
    const TrajectoryInput& member = group.members[i];
    TrajectoryAdvantages& out = result.members[i];
    const double advantage = result.filtered ? 0.0 : advantages[i];
    for (size_t t = 0; t < member.action.size(); ++t) {
      out.advantages[t] = member.action[t] ? static_cast<float>(advantage) : 0.0f;
      out.returns[t] = member.action[t] ? static_cast<float>(scores[i]) : 0.0f;
    }
  }
  return result;
}

Result<GroupAdvantages> ComputeAdvantages(const GroupInput& group,
                                          const AdvantageOptions& options) {
  STRIDER_RETURN_IF_ERROR(CheckAdvantageEstimator(options.estimator));
  for (const Estimator& estimator : kEstimators) {
    if (options.estimator != estimator.name) continue;
    Result<GroupAdvantages> result = estimator.compute(group, options);
    if (result.ok()) ScaleNegatives(*result, options.negative_weight);
    return result;
  }
  return Status::Internal("estimator '" + options.estimator + "' checked but not found");
}

Result<std::vector<GroupAdvantages>> ComputeBatchAdvantages(const std::vector<GroupInput>& groups,
                                                            const AdvantageOptions& options) {
  STRIDER_RETURN_IF_ERROR(CheckAdvantageEstimator(options.estimator));
  BatchNormalisation batch = BatchNormalisation::kNone;
  for (const Estimator& estimator : kEstimators) {
    if (options.estimator == estimator.name) batch = estimator.batch;
  }
  if (batch == BatchNormalisation::kAllTokens && options.normalize_in_group) {
    // PRIME whitens the whole batch's action tokens at once, groups of one included.
    AdvantageOptions raw = options;
    raw.normalize_in_group = false;
    raw.negative_weight = 1.0;
    std::vector<GroupAdvantages> out(groups.size());
    std::vector<const TrajectoryInput*> inputs;
    std::vector<TrajectoryAdvantages*> members;
    for (size_t g = 0; g < groups.size(); ++g) {
      STRIDER_ASSIGN_OR_RETURN(out[g], ComputeAdvantages(groups[g], raw));
      if (out[g].filtered) continue;
      for (size_t i = 0; i < groups[g].members.size(); ++i) {
        inputs.push_back(&groups[g].members[i]);
        members.push_back(&out[g].members[i]);
      }
    }
    StandardiseTokens(inputs, members, options.epsilon);
    for (GroupAdvantages& group : out) ScaleNegatives(group, options.negative_weight);
    return out;
  }
  const bool normalises_steps = batch == BatchNormalisation::kSingleGroupSteps;
  // A group of one standardised within itself pushes down any step below its own trajectory's
  // mean (GAE advantages (0.8, 0.4) became (+0.707, -0.707)) and zeroes a one-step trajectory:
  // groups of one are standardised together, over the batch, instead.
  AdvantageOptions alone = options;
  alone.normalize_in_group = false;
  alone.negative_weight = 1.0;
  std::vector<GroupAdvantages> out(groups.size());
  std::vector<size_t> singles;
  for (size_t g = 0; g < groups.size(); ++g) {
    const bool single = normalises_steps && options.normalize_in_group &&
                        groups[g].members.size() == 1;
    STRIDER_ASSIGN_OR_RETURN(out[g], ComputeAdvantages(groups[g], single ? alone : options));
    if (single) singles.push_back(g);
  }
  std::vector<double*> steps;
  for (size_t g : singles) {
    if (out[g].filtered) continue;
    for (double& a : out[g].members[0].step_advantages) steps.push_back(&a);
  }
  Standardise(steps, /*divide_by_std=*/true, options.epsilon);
  for (size_t g : singles) {
    FillTokens(groups[g].members[0], out[g].members[0]);
    ScaleNegatives(out[g], options.negative_weight);
  }
  return out;
}

std::vector<std::string> RegisteredAdvantageEstimators() {
  std::vector<std::string> names;
  for (const Estimator& estimator : kEstimators) names.emplace_back(estimator.name);
  return names;
}

Status CheckAdvantageEstimator(const std::string& name) {
  std::string known;
  for (const Estimator& estimator : kEstimators) {
    if (name == estimator.name) return Status::Ok();
    known += (known.empty() ? "" : ", ") + std::string(estimator.name);
  }
  return Status::NotFound("unknown advantage estimator '" + name + "' (known: " + known + ")");
}

}  // namespace strider::rl
