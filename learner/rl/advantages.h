// Advantage estimators: pure functions from a group's rewards and value estimates to per-token
// advantages and value targets. They run on plain numbers (no LibTorch, no model), so each is
// checked against hand-computed cases; docs/rl_objective.md has the equations and conventions.
//
// A trajectory is a sequence of steps (a model turn and what follows it until the next one);
// step k covers trajectory positions [begin, end), has a process reward r_k and a value V_k at
// its start. Every action token (role model or tool_call) of step k gets the step's advantage
// A_k; context tokens, and tokens outside every step, get 0. Estimators are selected by name
// (AdvantageOptions::estimator) through one table in advantages.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "learner/rl/objective_config.h"

namespace strider::rl {

struct StepInput {
  int64_t begin = 0;  // trajectory position of the step's first token
  int64_t end = 0;    // one past its last token
  // r_k: the step's process reward (reward/shaping), without the trajectory's outcome.
  double reward = 0;
  double value = 0;  // V_k: the value estimate at the step's first token
};

enum class TrajectoryEnd {
  kFinished,    // the episode ended: nothing follows the last step
  kTruncated,   // stopped at max turns or max length: the episode would have gone on
  kSegmentCut,  // given only up to a segment boundary: later segments exist but are not given
};

struct TrajectoryInput {
  // The tokens the output covers: trajectory positions [token_begin, token_begin +
  // action.size()), for example one segment's. Steps are the whole trajectory's (or all of it up
  // to a cut), so a window that starts inside a step still gets that step's advantage.
  int64_t token_begin = 0;
  std::vector<uint8_t> action;  // per covered token: 1 for an action token, 0 for context
  // In order, non-empty ranges, not overlapping. For kSegmentCut a step the boundary cuts ends
  // at the boundary and has reward 0 (its reward is paid at its end, which is not given).
  std::vector<StepInput> steps;
  double outcome = 0;  // the outcome reward, paid at the last step of a finished trajectory
  TrajectoryEnd end = TrajectoryEnd::kFinished;
  // The value estimate of the state after the last step (at the truncation or the boundary).
  double bootstrap_value = 0;
  // implicit_process only: per covered token, the implicit PRM's reward (learner/rl/
  // implicit_prm.h, beta log pi_phi / pi_ref) on action tokens; context tokens' entries are not
  // read. Empty: 0 everywhere.
  std::vector<double> implicit_rewards;
};

struct GroupInput {
  // Trajectories that share a prompt, and only those the baseline is over: a group with an
  // abandoned member is passed with its finished members.
  std::vector<TrajectoryInput> members;
};

struct TrajectoryAdvantages {
  std::vector<double> step_advantages;  // A_k, after any group normalisation
  std::vector<double> step_returns;     // value targets: unnormalised A_k + V_k
  std::vector<float> advantages;        // per covered token: A_k on action tokens, else 0
  std::vector<float> returns;           // per covered token: the step's return on action tokens
};

struct GroupAdvantages {
  std::vector<TrajectoryAdvantages> members;  // in the input's order
  // filter_constant_groups found every member with the same outcome: advantages are zero and
  // the learner should not train on the group.
  bool filtered = false;
};

// Step-level GAE (docs/design.md#advantages-from-process-rewards):
// delta_k = r_k + gamma V_{k+1} - V_k with the outcome added to the last step's reward and
// V_{K+1} = 0 when the trajectory finished, and V_{K+1} the bootstrap value when it was truncated
// or cut (if those corrections are on; off, a truncated trajectory keeps its outcome and
// V_{K+1} = 0, and a cut one gets V_{K+1} = 0); A_k = sum_j (gamma lambda)^j delta_{k+j}.
// Optionally normalised over the group's steps.
Result<GroupAdvantages> ProcessGae(const GroupInput& group, const AdvantageOptions& options);

// The outcome-only group baseline: A = (s - mean(s)) / (std(s) + epsilon) for every action
// token of the trajectory, s the outcome (or the bootstrap value of a truncated or cut trajectory
// when that correction is on; 0 for a cut one when it is off), std the sample standard deviation over the group. A group of
// one, or whose scores are all equal (std = 0), gets A = 0: it has no baseline to compare to.
// Returns are the scores.
Result<GroupAdvantages> OutcomeGroup(const GroupInput& group, const AdvantageOptions& options);

// PRIME's advantages: a leave-one-out (RLOO) baseline for each of the two reward sources, then
// per-token returns, without a value head. With n members, trajectory i's implicit rewards r_t
// (action tokens) and outcome o_i (0 for a trajectory cut at a segment boundary, whose outcome
// is not known; never a bootstrap value):
//   r'_t = r_t n / (n - 1) - (sum_j mean_j) / (n - 1)   mean_j: trajectory j's mean r over its
//                                                        action tokens
//   o'_i = o_i - mean of the other members' o_j
//   A_t  = sum over action tokens t' >= t of r'_t' (discounted by gamma per step boundary
//          crossed) + gamma^(steps after t's) o'_i
// A group of one has no baseline: its rewards are taken as they are. With normalize_in_group
// the action tokens' advantages are standardised, over the group here and over the whole batch
// in ComputeBatchAdvantages (PRIME whitens the batch). Returns are the advantages before that
// standardisation. step_advantages holds each step's first action token's advantage.
Result<GroupAdvantages> ImplicitProcess(const GroupInput& group, const AdvantageOptions& options);

// The estimator AdvantageOptions::estimator names; CheckAdvantageEstimator's error for a name
// not registered.
Result<GroupAdvantages> ComputeAdvantages(const GroupInput& group, const AdvantageOptions& options);
std::vector<std::string> RegisteredAdvantageEstimators();

// The advantages of a step's groups, each as ComputeAdvantages gives them, except that with
// normalize_in_group on, process_gae standardises the groups of one member together, over the
// steps of all of the batch's groups of one, instead of within a single trajectory (where GAE
// advantages (0.8, 0.4) became (+0.707, -0.707) and a one-step trajectory always got 0), and
// implicit_process standardises every action token of the batch together, as PRIME does.
// negative_weight applies after that normalisation.
Result<std::vector<GroupAdvantages>> ComputeBatchAdvantages(const std::vector<GroupInput>& groups,
                                                            const AdvantageOptions& options);
// OK for a registered name, else NotFound listing the registered ones.
Status CheckAdvantageEstimator(const std::string& name);

}  // namespace strider::rl
