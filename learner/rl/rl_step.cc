#include "learner/rl/rl_step.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "common/clock.h"
#include "common/model/torch_status.h"
#include "learner/learner.h"
#include "learner/rl/advantages.h"
#include "learner/rl/implicit_prm.h"
#include "learner/rl/losses.h"
#include "learner/rl/step_dump.h"
#include "learner/prm/process_model.h"
#include "reward/trajectory.h"

namespace strider::rl {
namespace {

// Positions of one trajectory whose routing the update records for the routing balance: enough
// for the quantile update's estimate, bounded so a long trajectory's record does not grow.
constexpr int64_t kBalancePositions = 16384;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::string IdString(const schema::TrajectoryId& id) { return std::string(id.View()); }

// Each step's share of the implicit PRM's per-token rewards (reward::StepRewards::implicit, for
// shaping with reward.implicit_weight): their sum over the step's action tokens.
std::vector<double> StepSums(const PreparedTrajectory& prepared,
                             const std::vector<double>& token_rewards) {
  const std::vector<schema::StoredStep>& steps = prepared.joined.steps;
  std::vector<double> sums(steps.size(), 0.0);
  size_t k = 0;
  for (size_t i = 0; i < prepared.positions.size() && i < token_rewards.size(); ++i) {
    const uint64_t position = static_cast<uint64_t>(prepared.positions[i]);
    while (k < steps.size() && steps[k].end <= position) ++k;
    if (k == steps.size()) break;
    if (position >= steps[k].begin) sums[k] += token_rewards[i];
  }
  return sums;
}

// The advantage estimator's view of one trajectory.
TrajectoryInput EstimatorInput(const TrainingTrajectory& t, const reward::ShapedRewards& shaped,
                               const std::vector<double>& implicit_tokens) {
  const schema::StoredTrajectory& joined = t.prepared.joined;
  TrajectoryInput input;
  input.token_begin = 0;
  input.action.resize(joined.roles.size());
  for (size_t i = 0; i < joined.roles.size(); ++i) {
    input.action[i] = i > 0 && schema::IsAction(joined.roles[i]) ? 1 : 0;
  }
  for (size_t k = 0; k < joined.steps.size(); ++k) {
    StepInput step;
    step.begin = static_cast<int64_t>(joined.steps[k].begin);
    step.end = static_cast<int64_t>(joined.steps[k].end);
    step.reward = shaped.process_rewards[k];
    step.value = k < t.scores.step_values.size() ? t.scores.step_values[k] : 0.0;
    input.steps.push_back(step);
  }
  input.outcome = shaped.outcome_term;
  // The task's own turn limit is part of the task: an episode that stalls until it ends there
  // failed (its outcome term, 0 when none was paid), and is never bootstrapped from its value.
  const bool turn_limit = joined.end_reason == schema::EndReason::kTruncatedTurns ||
                          (joined.end_reason == schema::EndReason::kNone &&
                           joined.status == "max_turns");
  input.end = shaped.bootstrap && !turn_limit ? TrajectoryEnd::kTruncated
                                              : TrajectoryEnd::kFinished;
  input.bootstrap_value = t.scores.final_value;
  if (!implicit_tokens.empty()) {
    input.implicit_rewards.assign(joined.roles.size(), 0.0);
    for (size_t i = 0; i < t.prepared.positions.size() && i < implicit_tokens.size(); ++i) {
      input.implicit_rewards[t.prepared.positions[i]] = implicit_tokens[i];
    }
  }
  return input;
}

}  // namespace

std::vector<SampledGroup> SplitBatch(std::vector<schema::SegmentData> segments) {
  std::vector<SampledGroup> groups;
  std::map<std::string, size_t> group_of;                        // group id -> index
  std::map<std::string, std::pair<size_t, size_t>> trajectory_of;  // id -> (group, member)
  for (schema::SegmentData& segment : segments) {
    const std::string id = IdString(segment.trajectory_id);
    auto known = trajectory_of.find(id);
    if (known != trajectory_of.end()) {
      groups[known->second.first].members[known->second.second].push_back(std::move(segment));
      continue;
    }
    const bool grouped = segment.group_size > 0;
    const std::string group = grouped ? IdString(segment.group_id) : id;
    auto g = group_of.find(group);
    if (g == group_of.end()) {
      g = group_of.emplace(group, groups.size()).first;
      SampledGroup fresh;
      fresh.group_id = grouped ? segment.group_id : segment.trajectory_id;
      groups.push_back(std::move(fresh));
    }
    SampledGroup& target = groups[g->second];
    trajectory_of[id] = {g->second, target.members.size()};
    target.members.emplace_back();
    target.members.back().push_back(std::move(segment));
  }
  for (SampledGroup& group : groups) {
    for (auto& member : group.members) {
      std::sort(member.begin(), member.end(), [](const auto& a, const auto& b) {
        return a.segment_index < b.segment_index;
      });
    }
  }
  return groups;
}

namespace {

struct Provenance {
  std::string actor;
  uint64_t episode = UINT64_MAX;  // missing sorts last
  std::string id;

  bool operator<(const Provenance& other) const {
    return std::tie(actor, episode, id) < std::tie(other.actor, other.episode, other.id);
  }
};

Provenance ProvenanceOf(const std::vector<schema::SegmentData>& member) {
  Provenance p;
  if (member.empty()) return p;
  p.id = IdString(member.front().trajectory_id);
  for (const auto& [key, value] : member.back().metadata) {
    if (key == "actor") {
      p.actor = value;
    } else if (key == "episode") {
      char* end = nullptr;
      const unsigned long long episode = std::strtoull(value.c_str(), &end, 10);
      if (end != value.c_str() && *end == '\0') p.episode = episode;
    }
  }
  return p;
}

}  // namespace

void OrderByProvenance(std::vector<SampledGroup>& groups) {
  // A group sorts by its first member after its members are sorted; an empty one by its id.
  std::vector<std::pair<Provenance, size_t>> group_keys;
  for (size_t g = 0; g < groups.size(); ++g) {
    SampledGroup& group = groups[g];
    std::vector<std::pair<std::pair<uint32_t, Provenance>, size_t>> keys;
    for (size_t m = 0; m < group.members.size(); ++m) {
      const auto& member = group.members[m];
      const uint32_t index = member.empty() ? UINT32_MAX : member.front().group_index;
      keys.push_back({{index, ProvenanceOf(member)}, m});
    }
    std::sort(keys.begin(), keys.end());
    std::vector<std::vector<schema::SegmentData>> members;
    members.reserve(keys.size());
    for (const auto& key : keys) members.push_back(std::move(group.members[key.second]));
    group.members = std::move(members);
    Provenance first;
    if (keys.empty()) {
      first.id = IdString(group.group_id);
    } else {
      first = std::move(keys.front().first.second);
    }
    group_keys.push_back({std::move(first), g});
  }
  std::sort(group_keys.begin(), group_keys.end());
  std::vector<SampledGroup> ordered;
  ordered.reserve(groups.size());
  for (const auto& key : group_keys) ordered.push_back(std::move(groups[key.second]));
  groups = std::move(ordered);
}

Result<PreparedBatch> PrepareBatch(const Model& model, const Model* reference,
                                   const std::vector<SampledGroup>& groups,
                                   const StepSettings& settings) {
  PreparedBatch batch;
  const bool implicit_process = settings.objective.advantages.estimator == "implicit_process";
  const bool implicit = settings.reward.implicit_weight != 0 || implicit_process;
  if (implicit && (reference == nullptr || settings.implicit_prm == nullptr)) {
    return Status::InvalidArgument(
        "implicit process rewards need a reference policy and an implicit PRM");
  }
  const bool wants_reference =
      reference != nullptr && (implicit || settings.objective.loss.kl_coef > 0);
  ScoringOptions scoring = settings.scoring;
  // implicit_process never reads the value head; the values are scored only for a value loss.
  scoring.values = !implicit_process || settings.objective.loss.value_coef > 0;
  // Per group: its members' indices in batch.trajectories, [first, end).
  std::vector<std::pair<size_t, size_t>> members_of;
  for (const SampledGroup& group : groups) {
    ++batch.groups;
    const size_t first = batch.trajectories.size();
    for (const std::vector<schema::SegmentData>& segments : group.members) {
      TrainingTrajectory t;
      t.group_id = group.group_id;
      STRIDER_ASSIGN_OR_RETURN(t.prepared, PrepareTrajectory(segments, scoring.replay_routing,
                                                             model.config().vocabulary));
      const auto started = Clock::now();
      STRIDER_ASSIGN_OR_RETURN(
          t.scores,
          ScorePrepared(model, t.prepared, scoring, wants_reference ? reference : nullptr));
      batch.score_seconds += Seconds(started);
      batch.tokens += t.prepared.length();
      t.outcome = t.prepared.joined.outcome;
      t.min_version = segments.front().MinPolicyVersion();
      t.max_version = segments.front().MaxPolicyVersion();
      for (const schema::SegmentData& s : segments) {
        t.min_version = std::min(t.min_version, s.MinPolicyVersion());
        t.max_version = std::max(t.max_version, s.MaxPolicyVersion());
      }
      if (!settings.weights_version.has_value() || t.min_version != t.max_version ||
          t.min_version != *settings.weights_version) {
        t.scores.mismatch = MismatchStats();  // another policy's log-probs: not comparable
      }
      const MismatchStats& mismatch = t.scores.mismatch;
      if (mismatch.verdict != MismatchVerdict::kNotMeasured) {
        ++batch.mismatch_measured;
        batch.mismatch_max = std::max(batch.mismatch_max, mismatch.max);
        batch.mismatch_p99 = std::max(batch.mismatch_p99, mismatch.p99);
      }
      if (mismatch.verdict == MismatchVerdict::kAboveThreshold) {
        ++batch.mismatch_excluded;
        t.excluded = true;
        t.excluded_reason = "log-prob mismatch " + std::to_string(mismatch.max) + " above " +
                            std::to_string(scoring.mismatch_threshold) + " on " +
                            std::to_string(mismatch.above) + " of " +
                            std::to_string(mismatch.tokens) + " action tokens";
      }
      batch.trajectories.push_back(std::move(t));
    }
    members_of.push_back({first, batch.trajectories.size()});
  }
  // PRIME's order: the reward model learns from this batch's outcomes first, then scores it.
  std::vector<std::vector<double>> implicit_tokens(batch.trajectories.size());
  if (implicit) {
    std::vector<ImplicitPrmSample> samples;
    for (const TrainingTrajectory& t : batch.trajectories) {
      if (t.excluded) continue;
      samples.push_back({.trajectory = &t.prepared,
                         .reference_logprobs = t.scores.reference_logprobs,
                         .label = std::clamp(t.outcome, 0.0, 1.0)});
    }
    STRIDER_ASSIGN_OR_RETURN(batch.implicit_prm,
                             settings.implicit_prm->Update(samples));
    const auto started = Clock::now();
    for (size_t i = 0; i < batch.trajectories.size(); ++i) {
      const TrainingTrajectory& t = batch.trajectories[i];
      if (t.excluded) continue;
      STRIDER_ASSIGN_OR_RETURN(
          implicit_tokens[i],
          settings.implicit_prm->TokenRewards(t.prepared, t.scores.reference_logprobs));
    }
    if (settings.implicit_prm->normalizes()) NormalizeByLargestReturn(implicit_tokens);
    batch.implicit_prm.seconds += Seconds(started);
  }
  // Per group with a member kept: the estimator's input and the members' batch indices.
  std::vector<GroupInput> inputs;
  std::vector<std::vector<size_t>> kept_of;
  for (const auto& [first, end] : members_of) {
    std::vector<reward::ShapedRewards> shaped;
    for (size_t m = first; m < end; ++m) {
      TrainingTrajectory& t = batch.trajectories[m];
      reward::TrajectoryRewards rewards = reward::StoredRewards(t.prepared.joined);
      if (implicit) {
        const std::vector<double> sums = StepSums(t.prepared, implicit_tokens[m]);
        for (size_t k = 0; k < rewards.steps.size() && k < sums.size(); ++k) {
          rewards.steps[k].implicit = sums[k];
        }
      }
      if (settings.process_model != nullptr && settings.reward.UsesProcessModel()) {
        STRIDER_ASSIGN_OR_RETURN(std::vector<double> judged,
                                 settings.process_model->ScoreSteps(t.prepared.joined));
        for (size_t k = 0; k < rewards.steps.size() && k < judged.size(); ++k) {
          rewards.steps[k].learned = 2 * judged[k] - 1;
        }
      }
      t.finished = rewards.end == reward::TrajectoryEnd::kFinished;
      t.truncated = rewards.end == reward::TrajectoryEnd::kTruncated;
      Result<reward::ShapedRewards> shape = reward::Shape(rewards, settings.reward);
      if (!shape.ok()) {
        if (!t.excluded) {
          t.excluded = true;
          t.excluded_reason = "rewards: " + shape.status().message();
        }
        shaped.emplace_back();
      } else {
        shaped.push_back(*shape);
      }
    }
    // The group's baseline is over the members kept.
    GroupInput input;
    std::vector<size_t> kept;
    for (size_t m = first; m < end; ++m) {
      const TrainingTrajectory& t = batch.trajectories[m];
      if (t.excluded) continue;
      kept.push_back(m);
      input.members.push_back(EstimatorInput(
          t, shaped[m - first], implicit_process ? implicit_tokens[m] : std::vector<double>()));
    }
    if (kept.empty()) continue;
    inputs.push_back(std::move(input));
    kept_of.push_back(std::move(kept));
  }
  // Over the whole batch at once: groups of one are normalised together (advantages.h).
  STRIDER_ASSIGN_OR_RETURN(std::vector<GroupAdvantages> all_advantages,
                           ComputeBatchAdvantages(inputs, settings.objective.advantages));
  for (size_t g = 0; g < inputs.size(); ++g) {
    const GroupAdvantages& advantages = all_advantages[g];
    const std::vector<size_t>& kept = kept_of[g];
    if (advantages.filtered) ++batch.filtered_groups;
    for (size_t i = 0; i < kept.size(); ++i) {
      TrainingTrajectory& t = batch.trajectories[kept[i]];
      if (advantages.filtered) {
        t.excluded = true;
        t.excluded_reason = "group filtered: every member got the same outcome";
        continue;
      }
      const TrajectoryAdvantages& a = advantages.members[i];
      for (int64_t position : t.prepared.positions) {
        t.advantages.push_back(a.advantages[position]);
        t.returns.push_back(a.returns[position]);
      }
      batch.action_tokens += static_cast<int64_t>(t.prepared.positions.size());
    }
  }
  return batch;
}

Result<UpdateMetrics> AccumulateGradients(const Model& model,
                                          std::span<const TrainingTrajectory* const> trajectories,
                                          const StepSettings& settings, RoutingRecord* routing,
                                          const std::vector<int64_t>* all_counts, size_t offset,
                                          const std::function<void(const at::Tensor&)>& before_last_backward) {
  UpdateMetrics result;
  const PolicyLossOptions& loss_options = settings.objective.loss;
  std::vector<int64_t> counts;
  for (const TrainingTrajectory* t : trajectories) {
    counts.push_back(static_cast<int64_t>(t->prepared.positions.size()));
  }
  if (all_counts != nullptr) {
    if (offset + counts.size() > all_counts->size() ||
        !std::equal(counts.begin(), counts.end(), all_counts->begin() + offset)) {
      return Status::InvalidArgument("update pass: this rank's action-token counts are not at " +
                                     std::to_string(offset) + " of the group's " +
                                     std::to_string(all_counts->size()));
    }
  } else {
    offset = 0;
  }
  STRIDER_ASSIGN_OR_RETURN(
      std::vector<double> weights,
      SequenceLossWeights(loss_options.aggregation, all_counts ? *all_counts : counts,
                          loss_options.loss_constant));
  weights.erase(weights.begin(), weights.begin() + offset);
  const bool values = loss_options.value_coef > 0;
  // Entropy is always measured (a metric); it is in the graph only when it has a weight.
  const bool entropy_bonus = loss_options.entropy_coef > 0;
  size_t last = trajectories.size();  // the last trajectory with a loss
  for (size_t i = 0; i < trajectories.size(); ++i) {
    if (!trajectories[i]->prepared.positions.empty()) last = i;
  }
  STRIDER_RETURN_IF_ERROR(model::Guarded("update pass", [&]() -> Status {
    for (size_t i = 0; i < trajectories.size(); ++i) {
      const TrainingTrajectory& t = *trajectories[i];
      if (t.prepared.positions.empty()) continue;
      if (t.excluded || t.advantages.size() != t.prepared.positions.size() ||
          t.returns.size() != t.prepared.positions.size()) {
        return Status::InvalidArgument(
            "update pass: trajectory " + t.prepared.joined.id.Hex() +
            (t.excluded ? " is excluded (" + t.excluded_reason + ")"
                        : " has no advantages for its action tokens"));
      }
      const at::Tensor behaviour = at::tensor(t.prepared.behaviour_logprobs, at::kFloat);
      const at::Tensor proximal = at::tensor(t.scores.logprobs, at::kFloat);
      const at::Tensor advantages = at::tensor(t.advantages, at::kFloat);
      const at::Tensor returns = at::tensor(t.returns, at::kFloat);
      const at::Tensor old_values =
          values ? at::tensor(t.scores.action_values, at::kFloat) : at::Tensor();
      // Whenever the reference was scored (a KL penalty, implicit rewards) its log-probs go to
      // the loss, which adds the KL only for kl_coef > 0 but measures it either way: with
      // kl_coef 0 the metrics line reports how far the policy drifted instead of 0.
      const at::Tensor reference =
          t.scores.reference_logprobs.size() == t.prepared.positions.size()
              ? at::tensor(t.scores.reference_logprobs, at::kFloat)
              : at::Tensor();
      const at::Tensor row_weight = at::full({1}, weights[i], at::kFloat);
      // The sequence-level mismatch ratio is the whole trajectory's, not a chunk's.
      double log_ratio_sum = 0;
      for (size_t k = 0; k < t.scores.logprobs.size(); ++k) {
        log_ratio_sum += static_cast<double>(t.scores.logprobs[k]) -
                         static_cast<double>(t.prepared.behaviour_logprobs[k]);
      }
      const at::Tensor sequence_log_ratio = at::full(
          {1}, log_ratio_sum / static_cast<double>(std::max<size_t>(1, t.scores.logprobs.size())),
          at::kFloat);
      ChunkedPassOptions pass;
      pass.path = TrainingPath::kInference;
      pass.chunk_tokens = settings.scoring.chunk_tokens;
      pass.backward = true;
      pass.truncated = settings.truncated_backprop;
      // A chunk's logits at p - 1 score the action at p: the chunk [begin, begin + count) has a
      // loss when some action lies in [begin + 1, begin + count].
      const std::vector<int64_t>& actions = t.prepared.positions;
      if (std::is_sorted(actions.begin(), actions.end())) {
        pass.chunk_has_loss = [&actions](int64_t begin, int64_t count) {
          auto first = std::lower_bound(actions.begin(), actions.end(), begin + 1);
          return first != actions.end() && *first <= begin + count;
        };
      }
      if (i == last) pass.before_last_backward = before_last_backward;
      pass.rounds = settings.scoring.rounds;
      pass.values = values;
      pass.record_routing = routing != nullptr;
      // The balance needs a sample of positions: at most kBalancePositions per trajectory.
      pass.record_routing_stride =
          std::max<int64_t>(1, (t.prepared.length() + kBalancePositions - 1) / kBalancePositions);
      pass.replay_routing = t.prepared.replaying && settings.scoring.replay_routing
                                ? &t.prepared.replay
                                : nullptr;
      auto objective = [&](const ChunkView& chunk) -> Result<at::Tensor> {
        std::vector<int64_t> slots;
        at::Tensor chunk_entropy;
        const at::Tensor lp =
            ChunkActionLogProbs(chunk.logits, chunk.begin, t.prepared, &slots, &chunk_entropy);
        if (slots.empty()) return at::Tensor();
        const at::Tensor index = at::tensor(slots, at::kLong);
        PolicyLossInputs in;
        in.logprobs = lp.to(at::kFloat).unsqueeze(0);
        in.behaviour_logprobs = behaviour.index_select(0, index).unsqueeze(0);
        in.proximal_logprobs = proximal.index_select(0, index).unsqueeze(0);
        if (reference.defined()) {
          in.reference_logprobs = reference.index_select(0, index).unsqueeze(0);
        }
        in.advantages = advantages.index_select(0, index).unsqueeze(0);
        in.action_mask = at::ones_like(in.advantages);
        in.entropy = (entropy_bonus ? chunk_entropy : chunk_entropy.detach())
                         .to(at::kFloat)
                         .unsqueeze(0);
        if (values) {
          std::vector<int64_t> rows;
          for (int64_t slot : slots) rows.push_back(t.prepared.positions[slot] - 1 - chunk.begin);
          in.values = chunk.values[0]
                          .index_select(0, at::tensor(rows, at::kLong).to(chunk.values.device()))
                          .unsqueeze(0);
          in.old_values = old_values.index_select(0, index).unsqueeze(0);
          in.returns = returns.index_select(0, index).unsqueeze(0);
        }
        in.row_weight = row_weight;
        in.sequence_log_ratio = sequence_log_ratio;
        STRIDER_ASSIGN_OR_RETURN(PolicyLossResult loss, PolicyLoss(in, loss_options));
        if (settings.recorder != nullptr) settings.recorder->Record(t, slots, in, loss);
        result.loss += loss.loss.item<double>();
        result.policy_loss += loss.policy_loss;
        result.kl_loss += loss.kl_loss;
        result.entropy_loss += loss.entropy;
        result.value_loss += loss.value_loss;
        result.metrics.Add(loss.metrics);
        return loss.loss;
      };
      STRIDER_ASSIGN_OR_RETURN(ChunkedPassResult pass_result,
                               RunChunkedPass(model, t.prepared.input, pass, objective));
      if (routing != nullptr && !pass_result.routing.layers.empty()) {
        *routing = routing->layers.empty()
                       ? std::move(pass_result.routing)
                       : RoutingRecord::Concatenate({std::move(*routing),
                                                     std::move(pass_result.routing)});
      }
      result.tokens += t.prepared.length();
      result.chunk_activation_bytes =
          std::max(result.chunk_activation_bytes, pass_result.chunk_activation_bytes);
    }
    if (!std::isfinite(result.loss)) PoisonGradients(model);
    return Status::Ok();
  }));
  return result;
}

void PoisonGradients(const Model& model) {
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : model.tensors()) {
    if (!tensor.requires_grad()) continue;
    at::Tensor& grad = const_cast<at::Tensor&>(tensor).mutable_grad();
    if (grad.defined()) {
      grad.fill_(std::numeric_limits<double>::quiet_NaN());
    } else {
      grad = at::full_like(tensor, std::numeric_limits<double>::quiet_NaN());
    }
    return;  // one non-finite entry makes the norm non-finite
  }
}

}  // namespace strider::rl
