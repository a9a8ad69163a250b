#include "learner/rl/step_dump.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "common/durable_file.h"

namespace strider::rl {
namespace {

using Json = nlohmann::ordered_json;

constexpr float kMissing = std::numeric_limits<float>::quiet_NaN();

// A (1, T) tensor's entries as floats.
std::vector<float> Row(const at::Tensor& tensor) {
  const at::Tensor row = tensor.detach().reshape({-1}).to(at::kCPU, at::kFloat).contiguous();
  return std::vector<float>(row.data_ptr<float>(), row.data_ptr<float>() + row.numel());
}

// Not finite (an unscored -inf, a NaN left for a token no chunk gave) is null: JSON has no
// infinities, and a reader should not take one for a number.
Json Number(double value) {
  if (!std::isfinite(value)) return nullptr;
  return value;
}
Json Number(float value) {
  if (!std::isfinite(value)) return nullptr;
  return value;
}

Json Column(const std::vector<float>& values) {
  Json out = Json::array();
  for (float v : values) out.push_back(Number(v));
  return out;
}

Json Objective(const PolicyLossOptions& loss) {
  return {
      {"eps_low", loss.eps_low},
      {"eps_high", loss.eps_high},
      {"dual_clip", loss.dual_clip},
      {"truncated_importance", loss.truncated_importance},
      {"importance_cap", loss.importance_cap},
      {"token_mask", loss.token_mask},
      {"token_mask_low", loss.token_mask_low},
      {"token_mask_high", loss.token_mask_high},
      {"sequence_ratio", SequenceRatioName(loss.sequence_ratio)},
      {"sequence_ratio_low", loss.sequence_ratio_low},
      {"sequence_ratio_high", loss.sequence_ratio_high},
      {"kl_coef", loss.kl_coef},
      {"kl_estimator", KlEstimatorName(loss.kl_estimator)},
      {"entropy_coef", loss.entropy_coef},
      {"value_coef", loss.value_coef},
      {"value_clip", loss.value_clip},
      {"aggregation", LossAggregationName(loss.aggregation)},
      {"loss_constant", loss.loss_constant},
  };
}

// The step of `joined` that holds `position` (steps are in order, not overlapping); -1: none.
int64_t StepOf(const schema::StoredTrajectory& joined, int64_t position) {
  auto it =
      std::upper_bound(joined.steps.begin(), joined.steps.end(), static_cast<uint64_t>(position),
                       [](uint64_t p, const schema::StoredStep& step) { return p < step.end; });
  if (it == joined.steps.end() || static_cast<uint64_t>(position) < it->begin) return -1;
  return static_cast<int64_t>(it - joined.steps.begin());
}

Json TrajectoryLine(int64_t step, const TrainingTrajectory& t,
                    const std::vector<DumpedPass>& passes) {
  const schema::StoredTrajectory& joined = t.prepared.joined;
  const TrajectoryScores& scores = t.scores;
  const size_t n = t.prepared.positions.size();
  Json line = {
      {"type", "trajectory"},
      {"step", step},
      {"id", joined.id.Hex()},
      {"group", t.group_id.Hex()},
      {"env", joined.env},
      {"end_reason", std::string(schema::EndReasonName(joined.end_reason))},
      {"status", joined.status},
      {"outcome", Number(t.outcome)},
      {"finished", t.finished},
      {"truncated", t.truncated},
      {"bootstrap_value", Number(scores.final_value)},
      {"excluded", t.excluded},
      {"excluded_reason", t.excluded ? Json(t.excluded_reason) : nullptr},
      {"min_version", t.min_version},
      {"max_version", t.max_version},
      {"length", static_cast<int64_t>(joined.tokens.size())},
      {"action_tokens", static_cast<int64_t>(n)},
      {"mismatch_verdict", std::string(MismatchVerdictName(scores.mismatch.verdict))},
  };
  Json steps = Json::array();
  for (size_t k = 0; k < joined.steps.size(); ++k) {
    const schema::StoredStep& s = joined.steps[k];
    steps.push_back(
        {{"index", static_cast<int64_t>(k)},
         {"begin", s.begin},
         {"end", s.end},
         {"reward", s.has_reward ? Number(s.stored_reward) : nullptr},
         {"value", k < scores.step_values.size() ? Number(scores.step_values[k]) : nullptr}});
  }
  line["steps"] = std::move(steps);

  const DumpedPass* first = passes.empty() ? nullptr : &passes.front();
  const bool trained = !t.excluded && t.advantages.size() == n && first != nullptr;
  const bool reference = scores.reference_logprobs.size() == n;
  Json passes_json = Json::array();
  for (size_t p = 0; p < passes.size(); ++p) {
    const DumpedPass& pass = passes[p];
    Json entry = {{"epoch", pass.epoch},
                  {"update", pass.update},
                  {"sequence_weight", Number(pass.sequence_weight)}};
    if (p > 0) {  // the first pass's figures are in `tokens`
      entry["current"] = Column(pass.current);
      entry["current_value"] = Column(pass.value);
      entry["entropy"] = Column(pass.entropy);
      entry["importance_weight"] = Column(pass.importance);
      entry["mask"] = Json(pass.trained);
      entry["loss_weight"] = Column(pass.loss_weight);
    }
    passes_json.push_back(std::move(entry));
  }
  line["passes"] = std::move(passes_json);

  Json tokens = Json::array();
  for (size_t i = 0; i < n; ++i) {
    const int64_t position = t.prepared.positions[i];
    const int64_t in_step = StepOf(joined, position);
    Json token = {
        {"position", position},
        {"token", joined.tokens[position]},
        {"role", std::string(schema::RoleName(joined.roles[position]))},
        {"step", in_step >= 0 ? Json(in_step) : nullptr},
        {"version", i < scores.versions.size() ? Json(scores.versions[i]) : nullptr},
        {"behaviour", Number(t.prepared.behaviour_logprobs[i])},
        {"proximal", Number(scores.logprobs[i])},
        {"current", trained ? Number(first->current[i]) : nullptr},
        {"reference", reference ? Number(scores.reference_logprobs[i]) : nullptr},
        {"value", i < scores.action_values.size() ? Number(scores.action_values[i]) : nullptr},
        {"current_value", trained && !first->value.empty() ? Number(first->value[i]) : nullptr},
        {"advantage", i < t.advantages.size() ? Number(t.advantages[i]) : nullptr},
        {"return", i < t.returns.size() ? Number(t.returns[i]) : nullptr},
        {"importance_weight", trained ? Number(first->importance[i]) : nullptr},
        {"mask", trained ? static_cast<int>(first->trained[i]) : 0},
        {"loss_weight", trained ? Number(first->loss_weight[i]) : Json(0.0)},
        {"entropy", trained ? Number(first->entropy[i]) : nullptr},
    };
    tokens.push_back(std::move(token));
  }
  line["tokens"] = std::move(tokens);
  return line;
}

}  // namespace

void StepRecorder::BeginUpdate(int64_t epoch, int64_t update) {
  epoch_ = epoch;
  update_ = update;
}

void StepRecorder::Record(const TrainingTrajectory& trajectory, std::span<const int64_t> slots,
                          const PolicyLossInputs& in, const PolicyLossResult& loss) {
  std::vector<DumpedPass>& passes = passes_[&trajectory];
  const size_t n = trajectory.prepared.positions.size();
  if (passes.empty() || passes.back().update != update_ || passes.back().epoch != epoch_) {
    DumpedPass pass;
    pass.epoch = epoch_;
    pass.update = update_;
    pass.current.assign(n, kMissing);
    pass.entropy.assign(n, kMissing);
    pass.importance.assign(n, kMissing);
    pass.loss_weight.assign(n, kMissing);
    pass.trained.assign(n, 0);
    if (in.values.defined()) pass.value.assign(n, kMissing);
    passes.push_back(std::move(pass));
  }
  DumpedPass& pass = passes.back();
  at::NoGradGuard no_grad;
  if (in.row_weight.defined()) pass.sequence_weight = in.row_weight.item<double>();
  const std::vector<float> current = Row(in.logprobs);
  const std::vector<float> entropy = in.entropy.defined() ? Row(in.entropy) : std::vector<float>();
  const std::vector<float> value = in.values.defined() ? Row(in.values) : std::vector<float>();
  const std::vector<float> importance = Row(loss.importance);
  const std::vector<float> weight = Row(loss.token_weight);
  const std::vector<float> trained = Row(loss.trained);
  for (size_t j = 0; j < slots.size(); ++j) {
    const size_t i = static_cast<size_t>(slots[j]);
    if (i >= n) continue;
    pass.current[i] = current[j];
    if (j < entropy.size()) pass.entropy[i] = entropy[j];
    if (j < value.size() && !pass.value.empty()) pass.value[i] = value[j];
    pass.importance[i] = importance[j];
    pass.loss_weight[i] = weight[j];
    pass.trained[i] = trained[j] != 0 ? 1 : 0;
  }
}

const std::vector<DumpedPass>& StepRecorder::Passes(const TrainingTrajectory& trajectory) const {
  static const std::vector<DumpedPass> kNone;
  auto it = passes_.find(&trajectory);
  return it == passes_.end() ? kNone : it->second;
}

std::string StepDumpPath(const std::string& dir, int64_t step, int rank) {
  std::string name = "step-" + std::to_string(step);
  if (rank >= 0) name += ".rank-" + std::to_string(rank);
  return (std::filesystem::path(dir) / (name + ".jsonl")).string();
}

Result<std::string> StepDumpText(int64_t step, const PreparedBatch& batch,
                                 const StepRecorder& recorder, const PolicyLossOptions& loss,
                                 const std::string& metrics_line) {
  const Json metrics = Json::parse(metrics_line, nullptr, false);
  if (!metrics.is_object()) {
    return Status::InvalidArgument("step dump: the metrics line is not a JSON object");
  }
  std::string text;
  int64_t trained = 0, action_tokens = 0;
  for (const TrainingTrajectory& t : batch.trajectories) {
    text += TrajectoryLine(step, t, recorder.Passes(t)).dump() + "\n";
    if (!t.excluded) {
      ++trained;
      action_tokens += static_cast<int64_t>(t.prepared.positions.size());
    }
  }
  // The metrics line's own figures, so the two agree whatever either computes; the dump's own
  // counts beside them (on a rank of a group the metrics' counts are the group's).
  Json totals = {{"type", "totals"}, {"step", step}};
  for (const char* key : {"policy_version",
                          "rank",
                          "world_size",
                          "loss",
                          "policy_loss",
                          "value_loss",
                          "kl",
                          "approx_kl",
                          "entropy",
                          "clip_fraction",
                          "importance_mean",
                          "mismatch_kl",
                          "token_masked_fraction",
                          "sequence_masked_fraction",
                          "logprob_mismatch_max",
                          "logprob_mismatch_p99",
                          "updates",
                          "updates_skipped",
                          "skipped_reason",
                          "trajectories",
                          "trained_trajectories",
                          "excluded_trajectories",
                          "mismatch_excluded",
                          "filtered_groups",
                          "tokens",
                          "action_tokens"}) {
    if (metrics.contains(key)) totals[key] = metrics[key];
  }
  totals["dumped_trajectories"] = static_cast<int64_t>(batch.trajectories.size());
  totals["dumped_trained_trajectories"] = trained;
  totals["dumped_action_tokens"] = action_tokens;
  totals["objective"] = Objective(loss);
  text += totals.dump() + "\n";
  return text;
}

Status WriteStepDump(const std::string& path, int64_t step, const PreparedBatch& batch,
                     const StepRecorder& recorder, const PolicyLossOptions& loss,
                     const std::string& metrics_line) {
  STRIDER_ASSIGN_OR_RETURN(const std::string text,
                           StepDumpText(step, batch, recorder, loss, metrics_line));
  std::error_code error;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  if (error) {
    return Status::IoError("step dump: cannot create " + parent.string() + ": " + error.message());
  }
  return WriteFileDurably(path, text);
}

Result<std::vector<int64_t>> ParseDumpSteps(std::span<const std::string> values) {
  std::vector<int64_t> steps;
  for (const std::string& value : values) {
    size_t begin = 0;
    while (begin <= value.size()) {
      size_t end = value.find(',', begin);
      if (end == std::string::npos) end = value.size();
      const std::string item = value.substr(begin, end - begin);
      char* parsed_end = nullptr;
      errno = 0;
      const long long step = std::strtoll(item.c_str(), &parsed_end, 10);
      if (item.empty() || parsed_end != item.c_str() + item.size() || errno != 0 || step < 1) {
        return Status::InvalidArgument("--dump-step '" + value +
                                       "': expected learner step numbers from 1, as N or N,M,...");
      }
      steps.push_back(step);
      begin = end + 1;
    }
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

}  // namespace strider::rl
