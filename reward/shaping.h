// Reward shaping: one trajectory's reward sources combined into one reward per step, each reward
// counted once (docs/design.md#advantages-from-process-rewards, "bias correction").
//
//   environment step rewards ──┐
//   learned process rewards  ──┼─> Shape ──> r_1 .. r_K, and how the return ends after step K:
//   implicit process rewards ──┤              terminal (the outcome is in r_K), or
//   outcome (end of episode) ──┘              bootstrap from the value at the cut (truncated)
//
//   r_k = step_weight * env_k + process_model_weight * learned_k + implicit_weight * implicit_k
//   r_K += outcome_weight * outcome            (terminal trajectories only; see below)
//
// Three rules keep a reward from being paid twice or a cut from being scored as a failure:
//   - Repeats. A step whose normalised action (StepKey: the same tool call, or the same text)
//     equals that of an earlier step that was paid a positive environment or learned reward keeps
//     only the negative part of those two rewards: calling calc(12*7) five times earns once.
//     Implicit rewards are a log-ratio of two policies, not a verdict, and are kept as they are.
//   - The outcome on the answer step. The built-in environments (calculator, retrieval,
//     vision_count) give the answer step a reward equal to the outcome (1 right, 0 wrong) and
//     set the outcome on the same step; the environment's own turn limit (envs::EndAtTurnLimit)
//     instead ends on a tool step with its own reward and outcome 0. Under `auto`, the last step
//     of a finished trajectory carries the outcome exactly when its environment reward equals the
//     outcome; that reward is then replaced by the outcome (weighted as the outcome), not added
//     to it. Where both are 0 by chance (a wrong tool call at the turn limit) either reading pays
//     0; an environment that pays a last step as much as the outcome on top of it says `never`.
//     Labels play no part, since schema 1.1 segments do not store them.
//   - Truncation. A trajectory the actor cut (its max_turns or max_episode_tokens, a stop) has
//     no outcome: ShapedRewards::bootstrap says the return continues with the value at the cut,
//     instead of an outcome of 0. Failed trajectories (an environment or engine error) are
//     terminal with `failed_outcome`. An episode the environment itself ended at its turn limit
//     is finished: the environment gave its outcome.
//
// Everything here is a pure function of its arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "envs/environment.h"

namespace strider::reward {

enum class OutcomeInAnswerStep {
  kAuto,    // the rule above
  kAlways,  // the last step of a finished trajectory always carries the outcome
  kNever,   // the outcome is always added to the last step's own rewards
};

enum class OutcomeGate { kNone, kEnvSteps, kModelSteps };
std::string_view OutcomeGateName(OutcomeGate gate);

struct ShapingConfig {
  // --- Weights ---
  // Environment step rewards. An outcome worth ten correct steps keeps the answer the main
  // source of return while correct tool calls still earn credit.
  double step_weight = 0.1;
  double outcome_weight = 1.0;
  double process_model_weight = 0.0;  // a learned process reward model's step scores
  double implicit_weight = 0.0;       // implicit process rewards (implicit.h)

  // --- Counting each reward once ---
  bool pay_repeats_once = true;
  OutcomeInAnswerStep outcome_in_answer_step = OutcomeInAnswerStep::kAuto;
  // The outcome of a trajectory that failed (environment or engine error).
  double failed_outcome = 0.0;
  // Step rewards as a potential (Ng, Harada and Russell, 1999): each paid when earned and their
  // sum taken back on the last step, so credit arrives early but a trajectory's return is its
  // outcome term alone and the optimal policy is the outcome's.
  bool steps_as_potential = false;
  // Whether a right answer needs right steps. `kNone` pays the outcome as the environment gave
  // it. `kEnvSteps` pays it only when every step before the answer earned a positive
  // environment reward, `kModelSteps` only when the process model scored every one of them
  // above 0.5; otherwise the outcome counts as 0 (a failure), as in process-supervised
  // verification, where a solution is as good as its worst step. A right answer reached
  // through a wrong call (calc(12/4) then calc(3-2) for (12-8)/4, or a guess that ignores the
  // tool's result) is a lucky one: reinforcing it teaches the wrong calls.
  OutcomeGate outcome_gate = OutcomeGate::kNone;

  // Whether shaping reads process model scores (their weight, or the gate's verdict).
  bool UsesProcessModel() const {
    return process_model_weight != 0 || outcome_gate == OutcomeGate::kModelSteps;
  }
};

// Reads the keys of a `reward:` mapping (pass root.Section("reward")), strictly: unknown keys
// and wrong types are errors naming the file, line and key. The caller calls Finish on its
// document. Keys are the field names above; outcome_in_answer_step is auto, always or never;
// outcome_gate is none, env_steps or model_steps.
Result<ShapingConfig> ReadShapingConfig(ConfigReader& reward);
std::string_view OutcomeInAnswerStepName(OutcomeInAnswerStep mode);

// How a trajectory ended, as far as its return is concerned.
enum class TrajectoryEnd {
  kFinished,   // the environment said done and gave the outcome
  kTruncated,  // cut before the environment was done: bootstrap from the value at the cut
  kFailed,     // an error ended it
};
std::string_view TrajectoryEndName(TrajectoryEnd end);
// The actor's episode status (the `status` metadata of a trajectory's last segment): "done" is
// finished; "max_turns", "max_tokens" and "stopped" are cuts; anything else is a failure.
TrajectoryEnd TrajectoryEndFromStatus(std::string_view status);

struct StepRewards {
  std::optional<double> env_reward;  // the environment's step reward, when it gave one
  envs::StepLabel label = envs::StepLabel::kUnknown;
  std::string key;                 // StepKey of the step's action; empty: never a repeat
  std::optional<double> learned;   // required when process_model_weight != 0
  std::optional<double> implicit;  // required when implicit_weight != 0
};

struct TrajectoryRewards {
  std::vector<StepRewards> steps;
  TrajectoryEnd end = TrajectoryEnd::kFinished;
  std::optional<double> outcome;  // required when finished
};

struct ShapedRewards {
  std::vector<double> rewards;  // one per step, the outcome term included on the last
  // The same without the outcome term: what estimators that add the outcome themselves take
  // (learner/rl/advantages.h, StepInput::reward, with outcome_term as the outcome).
  std::vector<double> process_rewards;
  std::vector<bool> repeats;  // the step repeated an earlier paid one
  // The outcome counted (0 when bootstrapping), its weighted term in the last reward, and
  // whether it replaced the last step's environment reward.
  double outcome = 0;
  double outcome_term = 0;
  bool outcome_in_answer_step = false;
  // Truncated: the return after the last step is the value at the cut, not 0.
  bool bootstrap = false;
  TrajectoryEnd end = TrajectoryEnd::kFinished;
};

// Errors (InvalidArgument): a finished trajectory without steps or without an outcome, a
// weighted source missing on some step, a non-finite reward.
Result<ShapedRewards> Shape(const TrajectoryRewards& trajectory, const ShapingConfig& config);

// Whether the last step of `trajectory` carries its outcome under `mode` (the rule above).
bool OutcomeInLastStep(const TrajectoryRewards& trajectory, OutcomeInAnswerStep mode);

// The normalised action of a model turn (its text as decoded, envs/tools.h): for a valid tool
// call "call:" + name + "(" + arguments + ")", else "text:" + the text. Whitespace is dropped
// except one space between two letters or digits, and one pair of matching quotes around the
// arguments goes, so calc(12 * 7) and calc(12*7), search("Agent Kalo") and search(Agent  Kalo)
// are one call.
std::string StepKey(std::string_view turn_text);

}  // namespace strider::reward
