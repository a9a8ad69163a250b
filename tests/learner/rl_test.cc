// The RL objective against hand-computed numbers: advantage estimators (also over trajectories
// split into segments, truncated or cut at a segment boundary, and in groups), the bias
// corrections switched on and off, the policy loss's gradients (by hand and by finite
// differences in float64, clipped and masked tokens), and the strict config reader.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "common/config.h"
#include "learner/rl/advantages.h"
#include "learner/rl/losses.h"
#include "learner/rl/objective_config.h"

namespace strider::rl {
namespace {

constexpr double kTight = 1e-9;  // double-precision arithmetic on a few terms

// Ten tokens: a three-token prompt (context, no step), step 0 over [3, 6) with actions at 3 and
// 4 and an observation at 5, step 1 over [6, 10) with actions at 6, 7, 8 and an end-of-turn
// observation at 9.
TrajectoryInput TwoStepTrajectory() {
  TrajectoryInput t;
  t.action = {0, 0, 0, 1, 1, 0, 1, 1, 1, 0};
  t.steps = {{.begin = 3, .end = 6, .reward = 0.5, .value = 0.4},
             {.begin = 6, .end = 10, .reward = 0.2, .value = 0.6}};
  t.outcome = 1.0;
  return t;
}

AdvantageOptions GaeOptions() {
  AdvantageOptions options;
  options.estimator = "process_gae";
  options.gamma = 0.9;
  options.lambda = 0.8;
  options.normalize_in_group = false;
  return options;
}

GroupAdvantages Compute(const std::vector<TrajectoryInput>& members,
                        const AdvantageOptions& options) {
  Result<GroupAdvantages> result = ComputeAdvantages(GroupInput{members}, options);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return result.ok() ? *result : GroupAdvantages{};
}

void ExpectTokens(const std::vector<float>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-6) << i;
}

TEST(ProcessGae, FinishedTrajectoryMatchesHandComputedSteps) {
  // Outcome paid at the last step: r = (0.5, 1.2), V_3 = 0.
  // delta_1 = 1.2 - 0.6 = 0.6 = A_1; delta_0 = 0.5 + 0.9 * 0.6 - 0.4 = 0.64;
  // A_0 = 0.64 + 0.9 * 0.8 * 0.6 = 1.072. Returns A + V: 1.472, 1.2.
  const GroupAdvantages out = Compute({TwoStepTrajectory()}, GaeOptions());
  ASSERT_EQ(out.members.size(), 1u);
  const TrajectoryAdvantages& a = out.members[0];
  EXPECT_NEAR(a.step_advantages[0], 1.072, kTight);
  EXPECT_NEAR(a.step_advantages[1], 0.6, kTight);
  EXPECT_NEAR(a.step_returns[0], 1.472, kTight);
  EXPECT_NEAR(a.step_returns[1], 1.2, kTight);
  ExpectTokens(a.advantages, {0, 0, 0, 1.072, 1.072, 0, 0.6, 0.6, 0.6, 0});
  ExpectTokens(a.returns, {0, 0, 0, 1.472, 1.472, 0, 1.2, 1.2, 1.2, 0});
}

TEST(ProcessGae, TruncatedTrajectoryBootstrapsFromTheValueUnlessSwitchedOff) {
  TrajectoryInput t = TwoStepTrajectory();
  t.end = TrajectoryEnd::kTruncated;
  t.outcome = 0;  // scored as a failure
  t.bootstrap_value = 0.5;
  AdvantageOptions options = GaeOptions();
  options.bootstrap_truncated = true;
  // Bootstrapped: delta_1 = 0.2 + 0.9 * 0.5 - 0.6 = 0.05; A_0 = 0.64 + 0.72 * 0.05 = 0.676.
  GroupAdvantages out = Compute({t}, options);
  EXPECT_NEAR(out.members[0].step_advantages[1], 0.05, kTight);
  EXPECT_NEAR(out.members[0].step_advantages[0], 0.676, kTight);
  // Off: the outcome 0 is paid and nothing follows: delta_1 = 0.2 - 0.6 = -0.4;
  // A_0 = 0.64 - 0.72 * 0.4 = 0.352.
  options.bootstrap_truncated = false;
  out = Compute({t}, options);
  EXPECT_NEAR(out.members[0].step_advantages[1], -0.4, kTight);
  EXPECT_NEAR(out.members[0].step_advantages[0], 0.352, kTight);
}

TEST(ProcessGae, TrajectorySplitAcrossSegmentsGetsTheWholeTrajectorysAdvantages) {
  // Segments [0, 7) and [7, 10): the boundary falls inside step 1, whose tokens on both sides
  // get A_1.
  const TrajectoryInput whole = TwoStepTrajectory();
  TrajectoryInput first = whole;
  first.action.assign(whole.action.begin(), whole.action.begin() + 7);
  TrajectoryInput second = whole;
  second.token_begin = 7;
  second.action.assign(whole.action.begin() + 7, whole.action.end());
  const GroupAdvantages w = Compute({whole}, GaeOptions());
  const GroupAdvantages s = Compute({first, second}, GaeOptions());
  std::vector<float> joined = s.members[0].advantages;
  joined.insert(joined.end(), s.members[1].advantages.begin(), s.members[1].advantages.end());
  EXPECT_EQ(joined, w.members[0].advantages);
  ExpectTokens(s.members[1].advantages, {0.6, 0.6, 0});
}

TEST(ProcessGae, SegmentCutBootstrapsFromTheValueAtTheBoundaryUnlessSwitchedOff) {
  // Only the first segment [0, 7) is given; step 1 is cut at 7 (reward not earned yet) and the
  // value at position 7 is 0.7.
  TrajectoryInput t = TwoStepTrajectory();
  t.action.resize(7);
  t.steps[1].end = 7;
  t.steps[1].reward = 0;
  t.end = TrajectoryEnd::kSegmentCut;
  t.bootstrap_value = 0.7;
  AdvantageOptions options = GaeOptions();
  // delta_1 = 0 + 0.9 * 0.7 - 0.6 = 0.03; A_0 = 0.64 + 0.72 * 0.03 = 0.6616. No outcome.
  GroupAdvantages out = Compute({t}, options);
  EXPECT_NEAR(out.members[0].step_advantages[1], 0.03, kTight);
  EXPECT_NEAR(out.members[0].step_advantages[0], 0.6616, kTight);
  ExpectTokens(out.members[0].advantages, {0, 0, 0, 0.6616, 0.6616, 0, 0.03});
  // Off: V after the cut is 0: delta_1 = -0.6; A_0 = 0.64 - 0.432 = 0.208.
  options.bootstrap_segment_cut = false;
  out = Compute({t}, options);
  EXPECT_NEAR(out.members[0].step_advantages[1], -0.6, kTight);
  EXPECT_NEAR(out.members[0].step_advantages[0], 0.208, kTight);
}

TEST(ProcessGae, NormalisesOverTheGroupsStepsAndKeepsReturnsUnnormalised) {
  // gamma = lambda = 1, values 0: member 0 has one step and outcome 1 (A = 1), member 1 two
  // steps and outcome 0 (A = 0, 0). Steps {1, 0, 0}: mean 1/3, sample std sqrt(1/3).
  AdvantageOptions options;
  options.estimator = "process_gae";
  options.normalize_in_group = true;
  TrajectoryInput a;
  a.action = {1, 1};
  a.steps = {{.begin = 0, .end = 2}};
  a.outcome = 1;
  TrajectoryInput b;
  b.action = {1, 1};
  b.steps = {{.begin = 0, .end = 1}, {.begin = 1, .end = 2}};
  const GroupAdvantages out = Compute({a, b}, options);
  const double std = std::sqrt(1.0 / 3.0) + options.epsilon;
  EXPECT_NEAR(out.members[0].step_advantages[0], (2.0 / 3.0) / std, kTight);
  EXPECT_NEAR(out.members[1].step_advantages[0], (-1.0 / 3.0) / std, kTight);
  EXPECT_NEAR(out.members[1].step_advantages[1], (-1.0 / 3.0) / std, kTight);
  EXPECT_NEAR(out.members[0].step_returns[0], 1.0, kTight);
  EXPECT_NEAR(out.members[1].step_returns[0], 0.0, kTight);
}

TEST(ProcessGae, GroupsOfOneAreNormalisedOverTheBatch) {
  // gamma = lambda = 1, values 0. Trajectory a: two steps, rewards 0.4 each: A = (0.8, 0.4).
  // Normalised within itself it became (+0.707, -0.707), pushing down a step with a positive
  // TD error. Groups of one are standardised together: with b (one step, A = -0.6) the steps
  // {0.8, 0.4, -0.6} have mean 0.2 and sample std sqrt(0.52).
  AdvantageOptions options;
  options.estimator = "process_gae";
  options.normalize_in_group = true;
  TrajectoryInput a;
  a.action = {1, 1};
  a.steps = {{.begin = 0, .end = 1, .reward = 0.4}, {.begin = 1, .end = 2, .reward = 0.4}};
  TrajectoryInput b;
  b.action = {1};
  b.steps = {{.begin = 0, .end = 1, .reward = -0.6}};
  Result<std::vector<GroupAdvantages>> out =
      ComputeBatchAdvantages({GroupInput{{a}}, GroupInput{{b}}}, options);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const double std = std::sqrt(0.52) + options.epsilon;
  EXPECT_NEAR((*out)[0].members[0].step_advantages[0], 0.6 / std, kTight);
  EXPECT_NEAR((*out)[0].members[0].step_advantages[1], 0.2 / std, kTight);
  EXPECT_NEAR((*out)[1].members[0].step_advantages[0], -0.8 / std, kTight);
  ExpectTokens((*out)[0].members[0].advantages, {0.6 / std, 0.2 / std});
  EXPECT_NEAR((*out)[0].members[0].step_returns[0], 0.8, kTight);  // unnormalised
  // Groups of two or more keep their own normalisation, and negative_weight applies after.
  options.negative_weight = 0.5;
  out = ComputeBatchAdvantages({GroupInput{{a}}, GroupInput{{b}}, GroupInput{{a, b}}}, options);
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR((*out)[1].members[0].advantages[0], -0.5 * 0.8 / std, 1e-6);
  const GroupAdvantages pair = Compute({a, b}, options);
  EXPECT_EQ((*out)[2].members[1].advantages, pair.members[1].advantages);
}

TEST(OutcomeGroup, OutcomeMinusGroupMeanOverSampleStd) {
  AdvantageOptions options;  // outcome_group
  std::vector<TrajectoryInput> members(4);
  const double outcomes[] = {1, 0, 0, 1};
  for (size_t i = 0; i < 4; ++i) {
    members[i].action = {0, 1, 1};
    members[i].outcome = outcomes[i];
  }
  // mean 0.5, sample std sqrt(4 * 0.25 / 3) = sqrt(1/3): A = +-0.5 / sqrt(1/3).
  const double a = 0.5 / (std::sqrt(1.0 / 3.0) + options.epsilon);
  const GroupAdvantages out = Compute(members, options);
  ExpectTokens(out.members[0].advantages, {0, a, a});
  ExpectTokens(out.members[1].advantages, {0, -a, -a});
  ExpectTokens(out.members[1].returns, {0, 0, 0});
  ExpectTokens(out.members[3].returns, {0, 1, 1});

  options.divide_by_std = false;  // mean-centred only
  ExpectTokens(Compute(members, options).members[0].advantages, {0, 0.5, 0.5});
}

TEST(OutcomeGroup, NoSpreadOrNoPeerGivesZeroAdvantages) {
  AdvantageOptions options;
  std::vector<TrajectoryInput> members(3);
  for (TrajectoryInput& m : members) {
    m.action = {1, 1};
    m.outcome = 0.1 + 0.2;  // equal up to rounding across members computed alike
  }
  members[1].outcome = 0.3;  // differs from 0.1 + 0.2 in the last bit
  for (const TrajectoryAdvantages& m : Compute(members, options).members) {
    ExpectTokens(m.advantages, {0, 0});
  }
  members.resize(1);
  members[0].outcome = 1;
  ExpectTokens(Compute(members, options).members[0].advantages, {0, 0});
}

TEST(OutcomeGroup, TruncatedMemberIsScoredByItsValueNotAsAFailure) {
  AdvantageOptions options;
  options.bootstrap_truncated = true;
  std::vector<TrajectoryInput> members(3);
  for (TrajectoryInput& m : members) m.action = {1};
  members[0].outcome = 1;
  members[1].end = TrajectoryEnd::kTruncated;
  members[1].bootstrap_value = 0.5;
  // Scores (1, 0.5, 0): mean 0.5, sample std 0.5: A = (1, 0, -1) / (0.5 + eps) * 0.5.
  const double scale = 0.5 / (0.5 + options.epsilon);
  GroupAdvantages out = Compute(members, options);
  EXPECT_NEAR(out.members[0].advantages[0], scale, 1e-6);
  EXPECT_NEAR(out.members[1].advantages[0], 0.0, 1e-6);
  EXPECT_NEAR(out.members[2].advantages[0], -scale, 1e-6);
  // Off: the truncated member counts as the failure its outcome says: scores (1, 0, 0).
  options.bootstrap_truncated = false;
  out = Compute(members, options);
  const double a = (1.0 / 3.0) / (std::sqrt(1.0 / 3.0) + options.epsilon);
  EXPECT_NEAR(out.members[1].advantages[0], -a, 1e-6);
}

TEST(OutcomeGroup, TruncationIsNotBootstrappedByDefault) {
  // Scores (1, 0, 0) and a member cut with value 0.4 and no outcome: bootstrapped, the staller
  // would get +0.106 while the wrong answers get -0.741. By default it is the failure it is.
  AdvantageOptions options;
  EXPECT_FALSE(options.bootstrap_truncated);
  std::vector<TrajectoryInput> members(4);
  for (TrajectoryInput& m : members) m.action = {1};
  members[0].outcome = 1;
  members[3].end = TrajectoryEnd::kTruncated;
  members[3].bootstrap_value = 0.4;
  GroupAdvantages out = Compute(members, options);
  // Scores (1, 0, 0, 0): mean 0.25, sample std 0.5.
  EXPECT_NEAR(out.members[3].advantages[0], -0.25 / (0.5 + options.epsilon), 1e-6);
  EXPECT_NEAR(out.members[1].advantages[0], out.members[3].advantages[0], 1e-6);
  options.bootstrap_truncated = true;
  out = Compute(members, options);
  EXPECT_NEAR(out.members[3].advantages[0], 0.106, 1e-3);
  EXPECT_NEAR(out.members[1].advantages[0], -0.741, 1e-3);
}

TEST(OutcomeGroup, SegmentCutMemberIsScoredByItsValueAtTheBoundaryUnlessSwitchedOff) {
  AdvantageOptions options;
  std::vector<TrajectoryInput> members(2);
  for (TrajectoryInput& m : members) m.action = {1};
  members[0].end = TrajectoryEnd::kSegmentCut;
  members[0].outcome = 1;  // not read: a cut trajectory's outcome is not known yet
  members[0].bootstrap_value = 0.25;
  members[1].outcome = 0.75;
  // Scores (0.25, 0.75): mean 0.5, sample std sqrt(2 * 0.0625) = 0.3536.
  const double a = 0.25 / (std::sqrt(0.125) + options.epsilon);
  EXPECT_NEAR(Compute(members, options).members[0].advantages[0], -a, 1e-6);
  // Off: scores (0, 0.75): mean 0.375, sample std sqrt(2 * 0.375^2).
  options.bootstrap_segment_cut = false;
  const double b = 0.375 / (std::sqrt(2 * 0.375 * 0.375) + options.epsilon);
  EXPECT_NEAR(Compute(members, options).members[0].advantages[0], -b, 1e-6);
}

TEST(GroupFilter, GroupsWhoseMembersAllGotTheSameRewardAreFilteredWhenAsked) {
  AdvantageOptions options = GaeOptions();
  TrajectoryInput a = TwoStepTrajectory();
  TrajectoryInput b = TwoStepTrajectory();
  b.steps[0].value = 0.1;  // different values: GAE alone would give non-zero advantages
  GroupAdvantages out = Compute({a, b}, options);
  EXPECT_FALSE(out.filtered);
  EXPECT_NE(out.members[1].advantages[3], 0.0f);
  options.filter_constant_groups = true;
  out = Compute({a, b}, options);
  EXPECT_TRUE(out.filtered);
  for (const TrajectoryAdvantages& m : out.members) {
    for (float v : m.advantages) EXPECT_EQ(v, 0.0f);
  }
  b.outcome = 0;
  EXPECT_FALSE(Compute({a, b}, options).filtered);
}

TEST(NegativeWeight, ScalesOnlyNegativeTokenAdvantages) {
  AdvantageOptions options;
  options.estimator = "outcome_group";
  options.bootstrap_truncated = false;
  std::vector<TrajectoryInput> members(4);
  for (size_t i = 0; i < members.size(); ++i) {
    members[i].action = {0, 1, 1};
    members[i].steps = {{.begin = 1, .end = 3}};
    members[i].outcome = i == 0 ? 1.0 : 0.0;
  }
  const GroupAdvantages plain = Compute(members, options);
  ASSERT_GT(plain.members[0].advantages[1], 0.0f);
  ASSERT_LT(plain.members[1].advantages[1], 0.0f);
  for (double weight : {0.0, 0.25}) {
    options.negative_weight = weight;
    const GroupAdvantages scaled = Compute(members, options);
    for (size_t i = 0; i < members.size(); ++i) {
      for (size_t t = 0; t < 3; ++t) {
        const float a = plain.members[i].advantages[t];
        EXPECT_FLOAT_EQ(scaled.members[i].advantages[t], a < 0 ? a * weight : a) << i << "," << t;
      }
      // The estimate itself is unchanged: value targets and step advantages.
      EXPECT_EQ(scaled.members[i].step_advantages, plain.members[i].step_advantages);
      EXPECT_EQ(scaled.members[i].returns, plain.members[i].returns);
    }
  }
}

TEST(ImplicitProcess, AGroupOfOneTakesDiscountedReturnsOfItsTokenRewardsAndTheOutcome) {
  AdvantageOptions options;
  options.estimator = "implicit_process";
  options.gamma = 0.5;
  options.normalize_in_group = false;
  TrajectoryInput t;
  t.action = {1, 1, 1};
  // Process rewards and values are not read by this estimator.
  t.steps = {{.begin = 0, .end = 1, .reward = 9, .value = 5},
             {.begin = 1, .end = 2, .reward = 9, .value = 5},
             {.begin = 2, .end = 3, .reward = 9, .value = 5}};
  t.implicit_rewards = {0.2, -0.1, 0.4};
  t.outcome = 1;
  t.bootstrap_value = 7;  // never read
  // No one to leave out: A_2 = 0.4 + 1 = 1.4; A_1 = -0.1 + 0.5 * 1.4 = 0.6;
  // A_0 = 0.2 + 0.5 * 0.6 = 0.5.
  ExpectTokens(Compute({t}, options).members[0].advantages, {0.5, 0.6, 1.4});
}

TEST(AdvantageEstimators, FactoryCallsTheNamedEstimatorAndRefusesUnknownNames) {
  const std::vector<std::string> names = RegisteredAdvantageEstimators();
  EXPECT_EQ(names, (std::vector<std::string>{"process_gae", "outcome_group", "implicit_process"}));
  TrajectoryInput t = TwoStepTrajectory();
  t.implicit_rewards.assign(t.action.size(), 0.3);
  AdvantageOptions options = GaeOptions();
  const GroupInput group{{t, TwoStepTrajectory()}};
  using Fn = Result<GroupAdvantages> (*)(const GroupInput&, const AdvantageOptions&);
  const Fn direct[] = {ProcessGae, OutcomeGroup, ImplicitProcess};
  for (size_t i = 0; i < names.size(); ++i) {
    options.estimator = names[i];
    EXPECT_EQ(ComputeAdvantages(group, options)->members[0].advantages,
              direct[i](group, options)->members[0].advantages)
        << names[i];
  }
  options.estimator = "gae";
  const Result<GroupAdvantages> unknown = ComputeAdvantages(group, options);
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(unknown.status().IsNotFound());
  EXPECT_NE(unknown.status().message().find("process_gae"), std::string::npos);
}

TEST(AdvantageEstimators, OverlappingStepsAreRefused) {
  TrajectoryInput t = TwoStepTrajectory();
  t.steps[1].begin = 5;
  const Result<GroupAdvantages> out = ProcessGae(GroupInput{{t}}, GaeOptions());
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(out.status().IsInvalidArgument());
}

// ---- Losses ----

at::Tensor Row(std::vector<double> values) { return at::tensor(values, at::kDouble).unsqueeze(0); }

struct Grad {
  PolicyLossResult result;
  std::vector<double> dlogp;
};

std::vector<double> ToVector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous().to(at::kDouble).reshape({-1});
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// The loss and d loss / d logprobs.
Grad Backward(PolicyLossInputs inputs, const PolicyLossOptions& options) {
  inputs.logprobs = inputs.logprobs.detach().clone().requires_grad_(true);
  Result<PolicyLossResult> result = PolicyLoss(inputs, options);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  if (!result.ok()) return {};
  result->loss.backward();
  return {*result, ToVector(inputs.logprobs.grad())};
}

PolicyLossOptions PolicyOnly() {
  PolicyLossOptions options;
  options.value_coef = 0;
  return options;
}

TEST(PolicyLoss, GradientMatchesHandComputedValuesWithClippedAndMaskedTokensAtZero) {
  PolicyLossOptions options = PolicyOnly();
  options.eps_low = 0.2;
  options.eps_high = 0.28;
  PolicyLossInputs in;
  // Tokens: in range (A > 0); below range with A > 0 (the unclipped term is the larger loss,
  // so it keeps its gradient); above 1 + eps_high with A > 0 (clipped); below 1 - eps_low with
  // A < 0 (clipped); masked, with a log-prob far off and an advantage that would matter.
  in.behaviour_logprobs = Row({-1, -1, -1, -1, -1});
  in.logprobs = Row({-0.9, -1.5, -0.5, -1.5, -60});
  in.advantages = Row({1, 1, 2, -1, 5});
  in.action_mask = Row({1, 1, 1, 1, 0});
  const Grad g = Backward(in, options);
  // token_mean over 4 action tokens: d/dlogp = -A ratio / 4 where unclipped.
  EXPECT_NEAR(g.dlogp[0], -std::exp(0.1) / 4, kTight);
  EXPECT_NEAR(g.dlogp[1], -std::exp(-0.5) / 4, kTight);
  EXPECT_EQ(g.dlogp[2], 0.0);
  EXPECT_EQ(g.dlogp[3], 0.0);
  EXPECT_EQ(g.dlogp[4], 0.0);
  const double loss = (-std::exp(0.1) - std::exp(-0.5) - 2 * 1.28 + 0.8) / 4;
  EXPECT_NEAR(g.result.policy_loss, loss, kTight);
  EXPECT_NEAR(g.result.loss.item<double>(), loss, kTight);
  EXPECT_DOUBLE_EQ(g.result.metrics.tokens, 4);
  EXPECT_DOUBLE_EQ(g.result.metrics.clip_fraction(), 0.5);
  // approx KL: mean of (r - 1 - log r) over the action tokens.
  double k3 = 0;
  for (double lr : {0.1, -0.5, 0.5, -0.5}) k3 += std::exp(lr) - 1 - lr;
  EXPECT_NEAR(g.result.metrics.approx_kl(), k3 / 4, kTight);
}

TEST(PolicyLoss, DualClipBoundsNegativeAdvantagesWithLargeRatios) {
  PolicyLossOptions options = PolicyOnly();
  PolicyLossInputs in;
  in.behaviour_logprobs = Row({-2});
  in.logprobs = Row({-0.5});  // ratio e^1.5 = 4.48
  in.advantages = Row({-1});
  in.action_mask = Row({1});
  EXPECT_NEAR(Backward(in, options).dlogp[0], std::exp(1.5), kTight);
  options.dual_clip = 3;
  const Grad g = Backward(in, options);
  EXPECT_EQ(g.dlogp[0], 0.0);
  EXPECT_NEAR(g.result.policy_loss, 3.0, kTight);
  EXPECT_DOUBLE_EQ(g.result.metrics.clip_fraction(), 1.0);
}

TEST(PolicyLoss, TruncatedImportanceWeightsAgainstTheProximalPolicy) {
  PolicyLossOptions options = PolicyOnly();
  options.importance_cap = 1.5;
  PolicyLossInputs in;
  in.logprobs = Row({-1, -1});
  in.proximal_logprobs = Row({-1, -1});       // ratio 1 against the learner's own log-probs
  in.behaviour_logprobs = Row({-1.5, -0.8});  // stale: weights e^0.5 = 1.65 (capped), e^-0.2
  in.advantages = Row({1, 1});
  in.action_mask = Row({1, 1});
  Grad g = Backward(in, options);
  EXPECT_NEAR(g.dlogp[0], -1.5 / 2, kTight);
  EXPECT_NEAR(g.dlogp[1], -std::exp(-0.2) / 2, kTight);
  EXPECT_DOUBLE_EQ(g.result.metrics.truncated_fraction(), 0.5);
  EXPECT_NEAR(g.result.metrics.importance_mean(), (1.5 + std::exp(-0.2)) / 2, kTight);
  options.truncated_importance = false;
  g = Backward(in, options);
  EXPECT_NEAR(g.dlogp[0], -0.5, kTight);
  EXPECT_NEAR(g.dlogp[1], -0.5, kTight);
  // Without proximal log-probs the ratio is against the behaviour's: e^0.5 is above 1 + 0.2,
  // clipped for a positive advantage.
  options.truncated_importance = true;
  in.proximal_logprobs = at::Tensor();
  g = Backward(in, options);
  EXPECT_EQ(g.dlogp[0], 0.0);
  EXPECT_NEAR(g.dlogp[1], -std::exp(-0.2) / 2, kTight);
}

TEST(PolicyLoss, KlEstimatorsGradients) {
  PolicyLossOptions options = PolicyOnly();
  options.kl_coef = 0.1;
  PolicyLossInputs in;
  in.logprobs = Row({-1});
  in.behaviour_logprobs = Row({-1});
  in.reference_logprobs = Row({-1.2});
  in.advantages = Row({0});
  in.action_mask = Row({1});
  // d = ref - logp = -0.2. k1 = -d: d/dlogp 1; k2 = d^2 / 2: -d; k3 = e^d - d - 1: 1 - e^d.
  const std::pair<KlEstimator, double> cases[] = {
      {KlEstimator::kK1, 1.0}, {KlEstimator::kK2, 0.2}, {KlEstimator::kK3, 1 - std::exp(-0.2)}};
  for (const auto& [estimator, derivative] : cases) {
    options.kl_estimator = estimator;
    const Grad g = Backward(in, options);
    EXPECT_NEAR(g.dlogp[0], 0.1 * derivative, kTight) << KlEstimatorName(estimator);
  }
  EXPECT_NEAR(Backward(in, options).result.metrics.kl(), std::exp(-0.2) + 0.2 - 1, kTight);
}

// KL(pi || pi_ref) of softmax(logits) against a fixed reference, in float64.
double TrueKl(const std::vector<double>& logits, const std::vector<double>& reference) {
  double top = logits[0];
  for (double l : logits) top = std::max(top, l);
  double z = 0;
  for (double l : logits) z += std::exp(l - top);
  double kl = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double log_p = logits[i] - top - std::log(z);
    kl += std::exp(log_p) * (log_p - std::log(reference[i]));
  }
  return kl;
}

// The expected gradient of the KL term with respect to the policy's logits: every token of the
// vocabulary is a row weighted by its probability (the expectation over tokens sampled from pi,
// exactly), the term's autograd gradient taken through log_softmax.
std::vector<double> ExpectedKlGradient(KlEstimator estimator, const std::vector<double>& logits,
                                       const std::vector<double>& reference) {
  PolicyLossOptions options = PolicyOnly();
  options.kl_coef = 1;
  options.kl_estimator = estimator;
  const int64_t v = static_cast<int64_t>(logits.size());
  const at::Tensor theta = at::tensor(logits, at::kDouble).requires_grad_(true);
  const at::Tensor log_p = at::log_softmax(theta, 0);
  PolicyLossInputs in;
  in.logprobs = log_p.unsqueeze(1);  // (V, 1): one row per token
  in.behaviour_logprobs = log_p.detach().unsqueeze(1);
  in.reference_logprobs = at::tensor(reference, at::kDouble).log().unsqueeze(1);
  in.advantages = at::zeros({v, 1}, at::kDouble);
  in.action_mask = at::ones({v, 1}, at::kDouble);
  in.row_weight = log_p.detach().exp();
  Result<PolicyLossResult> result = PolicyLoss(in, options);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  if (!result.ok()) return {};
  result->loss.backward();
  return ToVector(theta.grad());
}

TEST(PolicyLoss, KlGradientIsThatOfKlToTheReferenceForK2AndK3Plus) {
  // The issue's case: pi = (0.5, 0.5), pi_ref = (0.9, 0.1). Finite differences of the true
  // KL(pi || pi_ref) give (-0.549, +0.549); k3's gradient is that of KL(pi_ref || pi) (-0.4,
  // +0.4), and k1's is 0 in expectation.
  const std::vector<double> reference = {0.9, 0.1};
  for (const std::vector<double>& logits :
       {std::vector<double>{0.0, 0.0}, std::vector<double>{0.3, -1.1}}) {
    std::vector<double> finite(logits.size());
    constexpr double kStep = 1e-6;
    for (size_t i = 0; i < logits.size(); ++i) {
      std::vector<double> up = logits, down = logits;
      up[i] += kStep;
      down[i] -= kStep;
      finite[i] = (TrueKl(up, reference) - TrueKl(down, reference)) / (2 * kStep);
    }
    for (KlEstimator estimator : {KlEstimator::kK2, KlEstimator::kK3Plus}) {
      const std::vector<double> grad = ExpectedKlGradient(estimator, logits, reference);
      ASSERT_EQ(grad.size(), finite.size());
      for (size_t i = 0; i < grad.size(); ++i) {
        EXPECT_NEAR(grad[i], finite[i], 1e-7) << KlEstimatorName(estimator) << " " << i;
      }
    }
  }
  const std::vector<double> equal = {0.0, 0.0};
  EXPECT_NEAR(TrueKl({1e-6, 0}, reference) - TrueKl({-1e-6, 0}, reference), -0.549 * 2e-6,
              0.001 * 2e-6);
  const std::vector<double> k3 = ExpectedKlGradient(KlEstimator::kK3, equal, reference);
  EXPECT_NEAR(k3[0], -0.4, 1e-12);
  EXPECT_NEAR(k3[1], 0.4, 1e-12);
  const std::vector<double> k1 = ExpectedKlGradient(KlEstimator::kK1, equal, reference);
  EXPECT_NEAR(k1[0], 0.0, 1e-12);
  EXPECT_NEAR(k1[1], 0.0, 1e-12);
  // The default is the estimator with the right gradient, and k3+ reports k3's value.
  EXPECT_EQ(PolicyLossOptions().kl_estimator, KlEstimator::kK3Plus);
  PolicyLossOptions options = PolicyOnly();
  options.kl_coef = 0.1;
  PolicyLossInputs in;
  in.logprobs = Row({-1});
  in.behaviour_logprobs = Row({-1});
  in.reference_logprobs = Row({-1.2});
  in.advantages = Row({0});
  in.action_mask = Row({1});
  const Grad g = Backward(in, options);
  EXPECT_NEAR(g.result.metrics.kl(), std::exp(-0.2) + 0.2 - 1, kTight);
  EXPECT_NEAR(g.result.kl_loss, std::exp(-0.2) + 0.2 - 1, kTight);
  EXPECT_NEAR(g.dlogp[0], 0.1 * 0.2, kTight);
}

TEST(PolicyLoss, TokensWhoseMismatchRatioLeavesTheBandAreMasked) {
  // Ratio 1 to the proximal policy everywhere; proximal/behaviour ratios e^-1 = 0.37 (below
  // 0.5), e^0.5 = 1.65 (inside [0.5, 2]) and e^1 = 2.72 (above 2).
  PolicyLossOptions options = PolicyOnly();
  options.truncated_importance = false;
  PolicyLossInputs in;
  in.logprobs = Row({-1, -1, -1});
  in.proximal_logprobs = Row({-1, -1, -1});
  in.behaviour_logprobs = Row({0, -1.5, -2});
  in.advantages = Row({1, 1, 1});
  in.action_mask = Row({1, 1, 1});
  Grad g = Backward(in, options);
  EXPECT_NEAR(g.dlogp[0], -1.0 / 3, kTight);
  EXPECT_DOUBLE_EQ(g.result.metrics.token_masked_fraction(), 0.0);
  // k3 of KL(behaviour || proximal): mean of e^x - 1 - x over x = (-1, 0.5, 1).
  double k3 = 0;
  for (double x : {-1.0, 0.5, 1.0}) k3 += std::exp(x) - 1 - x;
  EXPECT_NEAR(g.result.metrics.mismatch_kl(), k3 / 3, kTight);
  options.token_mask = true;
  g = Backward(in, options);
  EXPECT_EQ(g.dlogp[0], 0.0);
  EXPECT_NEAR(g.dlogp[1], -1.0 / 3, kTight);  // masked tokens keep their share of the mean
  EXPECT_EQ(g.dlogp[2], 0.0);
  EXPECT_NEAR(g.result.policy_loss, -1.0 / 3, kTight);
  EXPECT_DOUBLE_EQ(g.result.metrics.token_masked_fraction(), 2.0 / 3);
}

TEST(PolicyLoss, SequencesAreMaskedOrWeightedByTheirGeometricMeanRatio) {
  // Row 0: log-ratios (0.2, 0.4): g = e^0.3 = 1.35. Row 1: (1.0, 0.6): g = e^0.8 = 2.23.
  PolicyLossOptions options = PolicyOnly();
  options.truncated_importance = false;
  options.aggregation = LossAggregation::kSequenceMeanTokenSum;
  PolicyLossInputs in;
  in.logprobs = at::full({2, 2}, -1.0, at::kDouble);
  in.proximal_logprobs = at::full({2, 2}, -1.0, at::kDouble);
  in.behaviour_logprobs = at::tensor({-1.2, -1.4, -2.0, -1.6}, at::kDouble).reshape({2, 2});
  in.advantages = at::ones({2, 2}, at::kDouble);
  in.action_mask = at::ones({2, 2}, at::kDouble);
  options.sequence_ratio = SequenceRatio::kMask;
  Grad g = Backward(in, options);
  EXPECT_NEAR(g.dlogp[0], -0.5, kTight);
  EXPECT_NEAR(g.dlogp[1], -0.5, kTight);
  EXPECT_EQ(g.dlogp[2], 0.0);
  EXPECT_EQ(g.dlogp[3], 0.0);
  EXPECT_DOUBLE_EQ(g.result.metrics.sequence_masked_fraction(), 0.5);
  options.sequence_ratio = SequenceRatio::kWeight;  // min(g, 2)
  g = Backward(in, options);
  EXPECT_NEAR(g.dlogp[0], -0.5 * std::exp(0.3), kTight);
  EXPECT_NEAR(g.dlogp[3], -0.5 * 2.0, kTight);
  EXPECT_DOUBLE_EQ(g.result.metrics.sequence_masked_fraction(), 0.0);
  // A row that is a chunk of a longer sequence takes the sequence's ratio, given per row.
  options.sequence_ratio = SequenceRatio::kMask;
  in.sequence_log_ratio = at::tensor({0.9, 0.1}, at::kDouble);
  g = Backward(in, options);
  EXPECT_EQ(g.dlogp[0], 0.0);
  EXPECT_NEAR(g.dlogp[2], -0.5, kTight);
}

TEST(PolicyLoss, LengthBiasDependsOnTheAggregation) {
  // Two sequences with 2 and 6 action tokens, ratio 1, every advantage 1: d/dlogp = -weight.
  PolicyLossInputs in;
  in.logprobs = at::full({2, 6}, -1.0, at::kDouble);
  in.behaviour_logprobs = at::full({2, 6}, -1.0, at::kDouble);
  in.advantages = at::ones({2, 6}, at::kDouble);
  in.action_mask = at::ones({2, 6}, at::kDouble);
  in.action_mask.index_put_({0, at::indexing::Slice(2, at::indexing::None)}, 0);
  PolicyLossOptions options = PolicyOnly();
  const std::pair<LossAggregation, std::pair<double, double>> cases[] = {
      {LossAggregation::kTokenMean, {1.0 / 8, 1.0 / 8}},
      {LossAggregation::kSequenceMeanTokenSum, {1.0 / 2, 1.0 / 2}},
      {LossAggregation::kSequenceMeanTokenMean, {1.0 / 4, 1.0 / 12}},
      {LossAggregation::kConstant, {1.0 / 16, 1.0 / 16}},
  };
  options.loss_constant = 16;
  for (const auto& [aggregation, weights] : cases) {
    options.aggregation = aggregation;
    const Grad g = Backward(in, options);
    EXPECT_NEAR(g.dlogp[0], -weights.first, kTight) << LossAggregationName(aggregation);
    EXPECT_NEAR(g.dlogp[6], -weights.second, kTight) << LossAggregationName(aggregation);
    EXPECT_EQ(g.dlogp[2], 0.0);
  }
  // Rows that are chunks of one sequence: weights given per row add up to the whole's.
  options.aggregation = LossAggregation::kSequenceMeanTokenMean;
  Result<std::vector<double>> weights = SequenceLossWeights(options.aggregation, {2, 6}, 0);
  ASSERT_TRUE(weights.ok());
  in.row_weight = at::tensor(*weights, at::kDouble);
  EXPECT_NEAR(Backward(in, options).dlogp[6], -1.0 / 12, kTight);
  EXPECT_FALSE(SequenceLossWeights(LossAggregation::kConstant, {2}, 0).ok());
}

TEST(PolicyLoss, SequencesWithoutActionTokensAreNotCountedPerSequence) {
  // Counts {2, 0, 6}: the middle sequence has no loss term, so S = 2, not 3.
  Result<std::vector<double>> sum =
      SequenceLossWeights(LossAggregation::kSequenceMeanTokenSum, {2, 0, 6}, 0);
  ASSERT_TRUE(sum.ok());
  EXPECT_DOUBLE_EQ((*sum)[0], 1.0 / 2);
  EXPECT_DOUBLE_EQ((*sum)[1], 0.0);
  EXPECT_DOUBLE_EQ((*sum)[2], 1.0 / 2);
  Result<std::vector<double>> mean =
      SequenceLossWeights(LossAggregation::kSequenceMeanTokenMean, {2, 0, 6}, 0);
  ASSERT_TRUE(mean.ok());
  EXPECT_DOUBLE_EQ((*mean)[0], 1.0 / 4);
  EXPECT_DOUBLE_EQ((*mean)[1], 0.0);
  EXPECT_DOUBLE_EQ((*mean)[2], 1.0 / 12);
  // The same through PolicyLoss's own weights: a fully masked row changes nothing.
  PolicyLossInputs in;
  in.logprobs = at::full({2, 3}, -1.0, at::kDouble);
  in.behaviour_logprobs = at::full({2, 3}, -1.0, at::kDouble);
  in.advantages = at::ones({2, 3}, at::kDouble);
  in.action_mask = at::ones({2, 3}, at::kDouble);
  in.action_mask.index_put_({1}, 0);
  PolicyLossOptions options = PolicyOnly();
  options.aggregation = LossAggregation::kSequenceMeanTokenSum;
  EXPECT_NEAR(Backward(in, options).dlogp[0], -1.0, kTight);
  options.aggregation = LossAggregation::kSequenceMeanTokenMean;
  EXPECT_NEAR(Backward(in, options).dlogp[0], -1.0 / 3, kTight);
}

TEST(PolicyLoss, ValueLossClippedAroundTheOldValues) {
  PolicyLossOptions options;
  options.value_coef = 0.5;
  PolicyLossInputs in;
  in.logprobs = Row({-1, -1});
  in.behaviour_logprobs = Row({-1, -1});
  in.advantages = Row({0, 0});
  in.action_mask = Row({1, 1});
  in.values = Row({1.0, 0.6}).requires_grad_(true);
  in.old_values = Row({0.5, 0.5});
  in.returns = Row({1.2, 1.0});
  // Unclipped: 0.5 * mean((v - R)^2), d/dv = coef (v - R) / 2.
  Result<PolicyLossResult> r = PolicyLoss(in, options);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  r->loss.backward();
  std::vector<double> dv = ToVector(in.values.grad());
  EXPECT_NEAR(dv[0], 0.5 * (1.0 - 1.2) / 2, kTight);
  EXPECT_NEAR(dv[1], 0.5 * (0.6 - 1.0) / 2, kTight);
  EXPECT_NEAR(r->value_loss, 0.5 * (0.04 + 0.16) / 2, kTight);
  // Clip 0.2: token 0 moved 0.5 from its old value; clipped to 0.7, error 0.5 beats 0.2, so the
  // clipped (constant) term is used and its gradient is zero. Token 1 moved 0.1: unclipped.
  options.value_clip = 0.2;
  in.values = Row({1.0, 0.6}).requires_grad_(true);
  r = PolicyLoss(in, options);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  r->loss.backward();
  dv = ToVector(in.values.grad());
  EXPECT_EQ(dv[0], 0.0);
  EXPECT_NEAR(dv[1], 0.5 * (0.6 - 1.0) / 2, kTight);
  EXPECT_DOUBLE_EQ(r->metrics.value_clip_fraction(), 0.5);
}

TEST(PolicyLoss, GradientsMatchFiniteDifferencesInFloat64) {
  // Every term on, points away from clip boundaries so the loss is smooth there.
  PolicyLossOptions options;
  options.eps_low = 0.2;
  options.eps_high = 0.3;
  options.kl_coef = 0.05;
  // An estimator whose gradient is its value's (k3+ follows k2's gradient by design).
  options.kl_estimator = KlEstimator::kK3;
  options.entropy_coef = 0.01;
  options.value_coef = 0.5;
  options.value_clip = 0.3;
  options.importance_cap = 1.2;
  options.aggregation = LossAggregation::kSequenceMeanTokenMean;
  PolicyLossInputs in;
  in.logprobs = at::tensor({-1.0, -0.7, -2.2, -0.3, -1.9, -1.1}, at::kDouble).reshape({2, 3});
  in.behaviour_logprobs =
      at::tensor({-1.1, -0.6, -2.0, -0.5, -1.2, -1.0}, at::kDouble).reshape({2, 3});
  in.proximal_logprobs =
      at::tensor({-1.05, -0.65, -2.1, -0.4, -1.8, -1.0}, at::kDouble).reshape({2, 3});
  in.reference_logprobs =
      at::tensor({-0.9, -0.8, -2.5, -0.2, -1.5, -1.3}, at::kDouble).reshape({2, 3});
  in.advantages = at::tensor({0.7, -1.3, 0.4, -0.2, 1.1, 0.9}, at::kDouble).reshape({2, 3});
  in.action_mask = at::tensor({1, 1, 1, 1, 1, 0}, at::kDouble).reshape({2, 3});
  in.entropy = at::tensor({0.5, 0.8, 0.3, 1.2, 0.4, 0.6}, at::kDouble).reshape({2, 3});
  in.old_values = at::tensor({0.2, 0.4, 0.1, -0.3, 0.5, 0.0}, at::kDouble).reshape({2, 3});
  in.returns = at::tensor({0.6, 0.0, 0.3, 0.2, 1.5, 0.0}, at::kDouble).reshape({2, 3});
  const at::Tensor values =
      at::tensor({0.3, 0.3, 0.7, -0.2, 0.6, 0.0}, at::kDouble).reshape({2, 3});

  in.values = values.clone().requires_grad_(true);
  const Grad g = Backward(in, options);
  const std::vector<double> dv = ToVector(in.values.grad());
  const auto loss_at = [&](const at::Tensor& logprobs, const at::Tensor& v) {
    PolicyLossInputs probe = in;
    probe.logprobs = logprobs;
    probe.values = v;
    return PolicyLoss(probe, options)->loss.item<double>();
  };
  constexpr double h = 1e-6;
  for (int64_t i = 0; i < 6; ++i) {
    at::Tensor plus = in.logprobs.clone(), minus = in.logprobs.clone();
    plus.view({-1})[i] += h;
    minus.view({-1})[i] -= h;
    const double fd = (loss_at(plus, values) - loss_at(minus, values)) / (2 * h);
    EXPECT_NEAR(g.dlogp[i], fd, 1e-8) << "logprob " << i;
    at::Tensor vplus = values.clone(), vminus = values.clone();
    vplus.view({-1})[i] += h;
    vminus.view({-1})[i] -= h;
    const double fdv = (loss_at(in.logprobs, vplus) - loss_at(in.logprobs, vminus)) / (2 * h);
    EXPECT_NEAR(dv[i], fdv, 1e-8) << "value " << i;
  }
  EXPECT_EQ(g.dlogp[5], 0.0);  // masked
  EXPECT_NE(g.dlogp[0], 0.0);
}

TEST(PolicyLoss, MissingInputsASettingNeedsAreRefused) {
  PolicyLossOptions options;  // value_coef 0.5 needs values and returns
  PolicyLossInputs in;
  in.logprobs = Row({-1});
  in.behaviour_logprobs = Row({-1});
  in.advantages = Row({1});
  in.action_mask = Row({1});
  Result<PolicyLossResult> r = PolicyLoss(in, options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("values"), std::string::npos);
  options.value_coef = 0;
  options.kl_coef = 0.1;
  r = PolicyLoss(in, options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("reference_logprobs"), std::string::npos);
  in.reference_logprobs = Row({-1, -1});
  EXPECT_FALSE(PolicyLoss(in, options).ok());
}

TEST(PolicyLossMetrics, MergeAcrossChunksByAddingSums) {
  PolicyLossMetrics a{.tokens = 2, .clipped = 1, .entropy_sum = 1.0};
  const PolicyLossMetrics b{.tokens = 6, .clipped = 1, .entropy_sum = 3.0};
  a.Add(b);
  EXPECT_DOUBLE_EQ(a.clip_fraction(), 0.25);
  EXPECT_DOUBLE_EQ(a.entropy(), 0.5);
}

// ---- Config ----

// Reads `text` over the defaults (whatever `config` held before).
Status ReadInline(const std::string& text, ObjectiveConfig* config) {
  *config = ObjectiveConfig{};
  Result<ConfigReader> root = ConfigReader::FromString(text, "<inline>");
  if (!root.ok()) return root.status();
  ConfigReader objective = root->Section("objective");
  // As LoadRlLearnerConfig: the document's first error, unknown keys checked, comes before the
  // reader's own.
  const Status read = ReadObjectiveConfig(objective, config);
  STRIDER_RETURN_IF_ERROR(root->Finish());
  return read;
}

TEST(ObjectiveConfig, ReadsEveryKey) {
  ObjectiveConfig config;
  const Status status = ReadInline(R"(objective:
  advantages:
    estimator: process_gae
    gamma: 0.99
    lambda: 0.95
    normalize_in_group: false
    divide_by_std: false
    epsilon: 1.0e-8
    bootstrap_truncated: false
    bootstrap_segment_cut: false
    filter_constant_groups: true
    negative_weight: 0.5
  policy:
    eps_low: 0.2
    eps_high: 0.28
    dual_clip: 3
    truncated_importance: false
    importance_cap: 5
    kl_coef: 0.01
    kl_estimator: k1
    entropy_coef: 0.001
  value:
    coef: 1.0
    clip: 0.2
  aggregation: constant
  loss_constant: 8192
)",
                                   &config);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(config.advantages.estimator, "process_gae");
  EXPECT_DOUBLE_EQ(config.advantages.lambda, 0.95);
  EXPECT_FALSE(config.advantages.bootstrap_segment_cut);
  EXPECT_TRUE(config.advantages.filter_constant_groups);
  EXPECT_DOUBLE_EQ(config.advantages.negative_weight, 0.5);
  EXPECT_DOUBLE_EQ(config.loss.eps_high, 0.28);
  EXPECT_EQ(config.loss.kl_estimator, KlEstimator::kK1);
  EXPECT_DOUBLE_EQ(config.loss.value_clip, 0.2);
  EXPECT_EQ(config.loss.aggregation, LossAggregation::kConstant);
  EXPECT_DOUBLE_EQ(config.loss.loss_constant, 8192);
}

TEST(ObjectiveConfig, RefusesUnknownKeysAndBadValues) {
  ObjectiveConfig config;
  Status status = ReadInline("objective:\n  policy:\n    eps_hgh: 0.3\n", &config);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("objective.policy.eps_hgh"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("eps_high"), std::string::npos) << status.message();

  status = ReadInline("objective:\n  advantages:\n    negative_weight: -1\n", &config);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("negative_weight"), std::string::npos) << status.message();

  status = ReadInline("objective:\n  advantages:\n    estimator: grpo\n", &config);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("outcome_group"), std::string::npos) << status.message();

  status = ReadInline("objective:\n  aggregation: constant\n", &config);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("loss_constant"), std::string::npos) << status.message();

  status = ReadInline("objective:\n  policy:\n    kl_estimator: k4\n", &config);
  EXPECT_FALSE(status.ok());
  // A bootstrap from a value head that is never trained (value.coef 0) or by an estimator
  // that has none.
  status = ReadInline(
      "objective:\n  advantages:\n    bootstrap_truncated: true\n  value:\n    coef: 0\n",
      &config);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("bootstrap_truncated"), std::string::npos) << status.message();
  status = ReadInline(
      "objective:\n  advantages:\n    estimator: implicit_process\n"
      "    bootstrap_truncated: true\n",
      &config);
  EXPECT_FALSE(status.ok());
  status = ReadInline("objective:\n  advantages:\n    bootstrap_truncated: true\n", &config);
  EXPECT_TRUE(status.ok()) << status.ToString();
  status = ReadInline("objective:\n  policy:\n    token_mask_high: 0.9\n", &config);
  EXPECT_FALSE(status.ok());
  status = ReadInline("objective:\n  policy:\n    sequence_ratio: geometric\n", &config);
  EXPECT_FALSE(status.ok());
  status = ReadInline(
      "objective:\n  policy:\n    token_mask: true\n    token_mask_low: 0.2\n"
      "    token_mask_high: 5\n    sequence_ratio: weight\n    sequence_ratio_high: 3\n",
      &config);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(config.loss.token_mask);
  EXPECT_DOUBLE_EQ(config.loss.token_mask_high, 5);
  EXPECT_EQ(config.loss.sequence_ratio, SequenceRatio::kWeight);
  EXPECT_DOUBLE_EQ(config.loss.sequence_ratio_high, 3);
  status = ReadInline("objective:\n  policy:\n    kl_estimator: k3+\n", &config);
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(config.loss.kl_estimator, KlEstimator::kK3Plus);
  status = ReadInline("objective:\n  policy:\n    dual_clip: 0.5\n", &config);
  EXPECT_FALSE(status.ok());
  // The entropy is in the loss's graph only for a positive coefficient: a negative one would
  // change the reported loss and nothing else.
  status = ReadInline("objective:\n  policy:\n    entropy_coef: -0.01\n", &config);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("objective.policy.entropy_coef"), std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace strider::rl
