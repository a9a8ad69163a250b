#include "reward/shaping.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <set>

#include "envs/tools.h"

namespace strider::reward {
namespace {

bool IsWordByte(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }
bool IsSpaceByte(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// Whitespace only separates words: a run of it between two letters or digits becomes one space,
// anywhere else it goes.
std::string SqueezeSpaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool pending_space = false;
  for (char c : text) {
    if (IsSpaceByte(c)) {
      pending_space = true;
      continue;
    }
    if (pending_space && !out.empty() && IsWordByte(out.back()) && IsWordByte(c)) {
      out.push_back(' ');
    }
    pending_space = false;
    out.push_back(c);
  }
  return out;
}

Status CheckFinite(double value, size_t step, const char* what) {
  if (std::isfinite(value)) return Status::Ok();
  return Status::InvalidArgument("reward shaping: step " + std::to_string(step) + ": " + what +
                                 " is not finite");
}

// Whether every step before the answer passed the gate's verdict. The answer step (the last,
// when it carries the outcome) is judged by the outcome itself.
Result<bool> StepsVerified(const TrajectoryRewards& trajectory, bool answer_in_last,
                           OutcomeGate gate) {
  const size_t judged = trajectory.steps.size() - (answer_in_last ? 1 : 0);
  for (size_t k = 0; k < judged; ++k) {
    const StepRewards& step = trajectory.steps[k];
    if (gate == OutcomeGate::kEnvSteps) {
      if (!step.env_reward.has_value()) {
        return Status::InvalidArgument("reward shaping: outcome_gate env_steps needs the "
                                       "environment's step rewards, and step " +
                                       std::to_string(k) + " has none");
      }
      if (!(*step.env_reward > 0)) return false;
    } else {
      if (!step.learned.has_value()) {
        return Status::InvalidArgument("reward shaping: outcome_gate model_steps needs process "
                                       "model scores, and step " + std::to_string(k) +
                                       " has none");
      }
      if (!(*step.learned > 0)) return false;
    }
  }
  return true;
}

// An optional key whose value is one of `choices` by name; `*value` holds the default.
template <typename Choice>
void ReadChoice(ConfigReader& section, const char* key, std::initializer_list<Choice> choices,
                std::string_view (*name)(Choice), const char* expected, Choice* value) {
  std::string text(name(*value));
  section.Optional(key, &text);
  bool known = false;
  for (Choice candidate : choices) {
    if (text == name(candidate)) {
      *value = candidate;
      known = true;
    }
  }
  section.Check(known, key, std::string("expected ") + expected + ", got '" + text + "'");
}

}  // namespace

std::string_view OutcomeInAnswerStepName(OutcomeInAnswerStep mode) {
  switch (mode) {
    case OutcomeInAnswerStep::kAuto:
      return "auto";
    case OutcomeInAnswerStep::kAlways:
      return "always";
    case OutcomeInAnswerStep::kNever:
      return "never";
  }
  return "auto";
}

std::string_view OutcomeGateName(OutcomeGate gate) {
  switch (gate) {
    case OutcomeGate::kNone:
      return "none";
    case OutcomeGate::kEnvSteps:
      return "env_steps";
    case OutcomeGate::kModelSteps:
      return "model_steps";
  }
  return "none";
}

Result<ShapingConfig> ReadShapingConfig(ConfigReader& reward) {
  ShapingConfig config;
  reward.Optional("step_weight", &config.step_weight);
  reward.Optional("outcome_weight", &config.outcome_weight);
  reward.Optional("process_model_weight", &config.process_model_weight);
  reward.Optional("implicit_weight", &config.implicit_weight);
  reward.Optional("pay_repeats_once", &config.pay_repeats_once);
  reward.Optional("failed_outcome", &config.failed_outcome);
  reward.Optional("steps_as_potential", &config.steps_as_potential);
  ReadChoice(reward, "outcome_in_answer_step",
             {OutcomeInAnswerStep::kAuto, OutcomeInAnswerStep::kAlways,
              OutcomeInAnswerStep::kNever},
             OutcomeInAnswerStepName, "auto, always or never", &config.outcome_in_answer_step);
  ReadChoice(reward, "outcome_gate",
             {OutcomeGate::kNone, OutcomeGate::kEnvSteps, OutcomeGate::kModelSteps},
             OutcomeGateName, "none, env_steps or model_steps", &config.outcome_gate);
  for (const auto& [key, value] : {std::pair{"step_weight", config.step_weight},
                                   std::pair{"outcome_weight", config.outcome_weight},
                                   std::pair{"process_model_weight", config.process_model_weight},
                                   std::pair{"implicit_weight", config.implicit_weight},
                                   std::pair{"failed_outcome", config.failed_outcome}}) {
    reward.Check(std::isfinite(value), key, "must be a finite number");
  }
  STRIDER_RETURN_IF_ERROR(reward.status());
  return config;
}

std::string_view TrajectoryEndName(TrajectoryEnd end) {
  switch (end) {
    case TrajectoryEnd::kFinished:
      return "finished";
    case TrajectoryEnd::kTruncated:
      return "truncated";
    case TrajectoryEnd::kFailed:
      return "failed";
  }
  return "failed";
}

TrajectoryEnd TrajectoryEndFromStatus(std::string_view status) {
  if (status == "done") return TrajectoryEnd::kFinished;
  if (status == "max_turns" || status == "max_tokens" || status == "stopped") {
    return TrajectoryEnd::kTruncated;
  }
  return TrajectoryEnd::kFailed;
}

bool OutcomeInLastStep(const TrajectoryRewards& trajectory, OutcomeInAnswerStep mode) {
  if (trajectory.end != TrajectoryEnd::kFinished || trajectory.steps.empty() ||
      !trajectory.outcome.has_value()) {
    return false;
  }
  switch (mode) {
    case OutcomeInAnswerStep::kAlways:
      return true;
    case OutcomeInAnswerStep::kNever:
      return false;
    case OutcomeInAnswerStep::kAuto: {
      const std::optional<double>& last = trajectory.steps.back().env_reward;
      return last.has_value() && *last == *trajectory.outcome;
    }
  }
  return false;
}

Result<ShapedRewards> Shape(const TrajectoryRewards& trajectory, const ShapingConfig& config) {
  const size_t count = trajectory.steps.size();
  if (trajectory.end == TrajectoryEnd::kFinished) {
    if (count == 0) {
      return Status::InvalidArgument("reward shaping: a finished trajectory without steps");
    }
    if (!trajectory.outcome.has_value()) {
      return Status::InvalidArgument("reward shaping: a finished trajectory without an outcome");
    }
    STRIDER_RETURN_IF_ERROR(CheckFinite(*trajectory.outcome, count - 1, "the outcome"));
  }
  ShapedRewards shaped;
  shaped.end = trajectory.end;
  shaped.rewards.assign(count, 0.0);
  shaped.repeats.assign(count, false);
  shaped.outcome_in_answer_step = OutcomeInLastStep(trajectory, config.outcome_in_answer_step);
  std::set<std::string> paid;
  double verdicts = 0;  // the weighted environment and learned step rewards paid so far
  for (size_t k = 0; k < count; ++k) {
    const StepRewards& step = trajectory.steps[k];
    double env = step.env_reward.value_or(0.0);
    double learned = step.learned.value_or(0.0);
    STRIDER_RETURN_IF_ERROR(CheckFinite(env, k, "the environment reward"));
    if (config.process_model_weight != 0 && !step.learned.has_value()) {
      return Status::InvalidArgument("reward shaping: step " + std::to_string(k) +
                                     " has no process model score, and its weight is " +
                                     std::to_string(config.process_model_weight));
    }
    STRIDER_RETURN_IF_ERROR(CheckFinite(learned, k, "the process model score"));
    if (config.implicit_weight != 0 && !step.implicit.has_value()) {
      return Status::InvalidArgument("reward shaping: step " + std::to_string(k) +
                                     " has no implicit reward, and its weight is " +
                                     std::to_string(config.implicit_weight));
    }
    const double implicit = step.implicit.value_or(0.0);
    STRIDER_RETURN_IF_ERROR(CheckFinite(implicit, k, "the implicit reward"));

    const bool answer = shaped.outcome_in_answer_step && k + 1 == count;
    if (answer) env = 0;  // paid below as the outcome
    if (config.pay_repeats_once && !answer && !step.key.empty()) {
      if (paid.count(step.key) > 0) {
        shaped.repeats[k] = true;
        env = std::min(env, 0.0);
        learned = std::min(learned, 0.0);
      } else if (env > 0 || learned > 0) {
        paid.insert(step.key);
      }
    }
    const double verdict = config.step_weight * env + config.process_model_weight * learned;
    verdicts += verdict;
    shaped.rewards[k] = verdict + config.implicit_weight * implicit;
  }
  // As a potential, what the steps earned is taken back on the last one: the return of every
  // trajectory is its outcome, so no sequence of paid calls can out-earn an answer.
  if (config.steps_as_potential && count > 0) shaped.rewards.back() -= verdicts;
  switch (trajectory.end) {
    case TrajectoryEnd::kFinished:
      shaped.outcome = *trajectory.outcome;
      if (config.outcome_gate != OutcomeGate::kNone) {
        STRIDER_ASSIGN_OR_RETURN(const bool verified,
                                 StepsVerified(trajectory, shaped.outcome_in_answer_step,
                                               config.outcome_gate));
        if (!verified) shaped.outcome = 0;
      }
      break;
    case TrajectoryEnd::kFailed:
      shaped.outcome = config.failed_outcome;
      break;
    case TrajectoryEnd::kTruncated:
      shaped.bootstrap = true;
      break;
  }
  shaped.process_rewards = shaped.rewards;
  if (!shaped.bootstrap && count > 0) {
    shaped.outcome_term = config.outcome_weight * shaped.outcome;
    shaped.rewards.back() += shaped.outcome_term;
  }
  return shaped;
}

std::string StepKey(std::string_view turn_text) {
  const envs::Action action = envs::MakeAction(std::string(turn_text));
  if (!action.tool_call.has_value()) return "text:" + SqueezeSpaces(action.text);
  std::string arguments = SqueezeSpaces(action.tool_call->arguments);
  if (arguments.size() >= 2 && (arguments.front() == '"' || arguments.front() == '\'') &&
      arguments.back() == arguments.front()) {
    arguments = SqueezeSpaces(std::string_view(arguments).substr(1, arguments.size() - 2));
  }
  return "call:" + action.tool_call->name + "(" + arguments + ")";
}

}  // namespace strider::reward
