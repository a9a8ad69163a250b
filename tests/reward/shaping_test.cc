// Reward shaping against rewards worked out by hand, one rule at a time (reward/shaping.h).
#include "reward/shaping.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "envs/tools.h"

namespace strider::reward {
namespace {

using envs::StepLabel;

StepRewards EnvStep(double reward, std::string key) {
  StepRewards step;
  step.env_reward = reward;
  step.label = reward > 0 ? StepLabel::kCorrect : StepLabel::kIncorrect;
  step.key = std::move(key);
  return step;
}

ShapingConfig Weights(double step, double outcome, double learned = 0, double implicit = 0) {
  ShapingConfig config;
  config.step_weight = step;
  config.outcome_weight = outcome;
  config.process_model_weight = learned;
  config.implicit_weight = implicit;
  return config;
}

void ExpectRewards(const ShapedRewards& shaped, const std::vector<double>& expected) {
  ASSERT_EQ(shaped.rewards.size(), expected.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    EXPECT_NEAR(shaped.rewards[k], expected[k], 1e-12) << "step " << k;
  }
}

TEST(Shape, WeighsEverySourceAndPaysTheOutcomeOnTheAnswerStep) {
  TrajectoryRewards t;
  t.steps = {EnvStep(1, "call:calc(2+3)"), EnvStep(0, "call:calc(5*9)"), EnvStep(1, "text:A")};
  const double learned[] = {0.5, -0.2, 0.3}, implicit[] = {0.1, 0.2, -0.3};
  for (size_t k = 0; k < 3; ++k) {
    t.steps[k].learned = learned[k];
    t.steps[k].implicit = implicit[k];
  }
  t.outcome = 1;
  Result<ShapedRewards> shaped = Shape(t, Weights(0.1, 1.0, 0.5, 2.0));
  ASSERT_TRUE(shaped.ok()) << shaped.status().ToString();
  // 0.1*1 + 0.5*0.5 + 2*0.1; 0.5*-0.2 + 2*0.2; the answer's env reward becomes the outcome:
  // 0.5*0.3 + 2*-0.3 + 1*1.
  ExpectRewards(*shaped, {0.55, 0.3, 0.55});
  EXPECT_TRUE(shaped->outcome_in_answer_step);
  EXPECT_FALSE(shaped->bootstrap);
  EXPECT_EQ(shaped->outcome, 1.0);
  EXPECT_EQ(shaped->outcome_term, 1.0);
  ASSERT_EQ(shaped->process_rewards.size(), 3u);
  EXPECT_NEAR(shaped->process_rewards[0], 0.55, 1e-12);
  EXPECT_NEAR(shaped->process_rewards[1], 0.3, 1e-12);
  EXPECT_NEAR(shaped->process_rewards[2], -0.45, 1e-12) << "without the outcome term";
}

TEST(Shape, AnOutcomeAlreadyOnTheAnswerStepIsCountedOnce) {
  // Calculator: two correct calls, then a correct "Answer: N" whose step reward is the outcome.
  TrajectoryRewards t;
  t.steps = {EnvStep(1, "call:calc(4+5)"), EnvStep(1, "call:calc(9*2)"),
             EnvStep(1, "text:Answer: 18")};
  t.outcome = 1;
  ShapingConfig config = Weights(0.1, 1.0);
  Result<ShapedRewards> once = Shape(t, config);
  ASSERT_TRUE(once.ok());
  ExpectRewards(*once, {0.1, 0.1, 1.0});
  config.outcome_in_answer_step = OutcomeInAnswerStep::kNever;
  Result<ShapedRewards> both = Shape(t, config);
  ASSERT_TRUE(both.ok());
  ExpectRewards(*both, {0.1, 0.1, 1.1});
  EXPECT_FALSE(both->outcome_in_answer_step);
  // A wrong answer: reward 0 equals outcome 0, nothing paid on the last step either way.
  t.steps.back() = EnvStep(0, "text:Answer: 17");
  t.outcome = 0;
  config.outcome_in_answer_step = OutcomeInAnswerStep::kAuto;
  Result<ShapedRewards> wrong = Shape(t, config);
  ASSERT_TRUE(wrong.ok());
  ExpectRewards(*wrong, {0.1, 0.1, 0.0});
}

TEST(Shape, AnEnvironmentsTurnLimitKeepsTheLastToolCallsReward) {
  // envs::EndAtTurnLimit: the last step is a correct tool call (reward 1), the outcome is 0.
  TrajectoryRewards t;
  t.steps = {EnvStep(0, "call:calc(1/0)"), EnvStep(1, "call:calc(3+4)")};
  t.outcome = 0;
  Result<ShapedRewards> shaped = Shape(t, Weights(0.25, 2.0));
  ASSERT_TRUE(shaped.ok());
  EXPECT_FALSE(shaped->outcome_in_answer_step);
  ExpectRewards(*shaped, {0.0, 0.25});
  EXPECT_FALSE(shaped->bootstrap) << "the environment gave its outcome";
  // `always` would take the tool call's reward for the (zero) outcome.
  ShapingConfig always = Weights(0.25, 2.0);
  always.outcome_in_answer_step = OutcomeInAnswerStep::kAlways;
  Result<ShapedRewards> replaced = Shape(t, always);
  ASSERT_TRUE(replaced.ok());
  ExpectRewards(*replaced, {0.0, 0.0});
}

TEST(Shape, ACorrectStepRepeatingAnEarlierOneIsPaidOnce) {
  TrajectoryRewards t;
  t.end = TrajectoryEnd::kTruncated;
  t.steps = {EnvStep(1, "call:calc(2+3)"), EnvStep(1, "call:calc(2+3)"),
             EnvStep(1, "call:calc(5*4)"), EnvStep(1, "call:calc(2+3)")};
  Result<ShapedRewards> shaped = Shape(t, Weights(0.1, 1.0));
  ASSERT_TRUE(shaped.ok());
  ExpectRewards(*shaped, {0.1, 0.0, 0.1, 0.0});
  EXPECT_EQ(shaped->repeats, (std::vector<bool>{false, true, false, true}));
  ShapingConfig every = Weights(0.1, 1.0);
  every.pay_repeats_once = false;
  Result<ShapedRewards> paid = Shape(t, every);
  ASSERT_TRUE(paid.ok());
  ExpectRewards(*paid, {0.1, 0.1, 0.1, 0.1});
}

TEST(Shape, OnlyAPaidStepMakesLaterOnesRepeats) {
  // A search that found nothing before its part was shown, then found the record: paid.
  TrajectoryRewards unpaid_first;
  unpaid_first.end = TrajectoryEnd::kTruncated;
  unpaid_first.steps = {EnvStep(0, "call:search(Kalo)"), EnvStep(1, "call:search(Kalo)")};
  Result<ShapedRewards> shaped = Shape(unpaid_first, Weights(0.1, 1.0));
  ASSERT_TRUE(shaped.ok());
  ExpectRewards(*shaped, {0.0, 0.1});
  EXPECT_EQ(shaped->repeats, (std::vector<bool>{false, false}));
  // A penalty is not a payment: a repeat keeps it.
  TrajectoryRewards penalty;
  penalty.end = TrajectoryEnd::kTruncated;
  penalty.steps = {EnvStep(1, "call:x()"), EnvStep(-1, "call:x()")};
  shaped = Shape(penalty, Weights(0.1, 1.0));
  ASSERT_TRUE(shaped.ok());
  ExpectRewards(*shaped, {0.1, -0.1});
  // Learned scores are payments too: a process reward model cannot be farmed by repeating.
  TrajectoryRewards learned;
  learned.end = TrajectoryEnd::kTruncated;
  for (int i = 0; i < 2; ++i) {
    StepRewards step;
    step.key = "text:next";
    step.learned = 0.4;
    step.implicit = 0.25;
    learned.steps.push_back(step);
  }
  shaped = Shape(learned, Weights(0.1, 1.0, 1.0, 1.0));
  ASSERT_TRUE(shaped.ok());
  ExpectRewards(*shaped, {0.65, 0.25});
  // An empty key never repeats.
  for (StepRewards& step : learned.steps) step.key.clear();
  shaped = Shape(learned, Weights(0.1, 1.0, 1.0, 1.0));
  ASSERT_TRUE(shaped.ok());
  ExpectRewards(*shaped, {0.65, 0.65});
}

TEST(Shape, ATruncatedTrajectoryBootstrapsInsteadOfScoringZero) {
  TrajectoryRewards t;
  t.end = TrajectoryEnd::kTruncated;
  t.steps = {EnvStep(1, "call:a()"), EnvStep(0, "call:b()")};
  t.outcome = 0;  // what a 1.1 segment stores for a cut episode: ignored
  Result<ShapedRewards> shaped = Shape(t, Weights(0.5, 3.0));
  ASSERT_TRUE(shaped.ok());
  EXPECT_TRUE(shaped->bootstrap);
  EXPECT_EQ(shaped->end, TrajectoryEnd::kTruncated);
  EXPECT_FALSE(shaped->outcome_in_answer_step);
  ExpectRewards(*shaped, {0.5, 0.0});
  EXPECT_EQ(shaped->process_rewards, shaped->rewards);
  EXPECT_EQ(shaped->outcome_term, 0.0);
  // Cut before its first step was answered: no rewards, still a bootstrap.
  t.steps.clear();
  shaped = Shape(t, Weights(0.5, 3.0));
  ASSERT_TRUE(shaped.ok());
  EXPECT_TRUE(shaped->bootstrap);
  EXPECT_TRUE(shaped->rewards.empty());
}

TEST(Shape, StepsAsAPotentialAreTakenBackOnTheLastStep) {
  // Three correct calls and a wrong answer: the calls are paid as earned, and the last step
  // returns what they earned, so the trajectory's return is its outcome (0) whatever it called.
  TrajectoryRewards t;
  t.steps = {EnvStep(1, "call:calc(2+3)"), EnvStep(1, "call:calc(5*9)"), EnvStep(1, "call:calc(1+1)"),
             EnvStep(0, "text:Answer: 7")};
  t.outcome = 0;
  ShapingConfig config = Weights(0.3, 1.0);
  config.steps_as_potential = true;
  Result<ShapedRewards> shaped = Shape(t, config);
  ASSERT_TRUE(shaped.ok()) << shaped.status().ToString();
  ExpectRewards(*shaped, {0.3, 0.3, 0.3, -0.9});
  double total = 0;
  for (double r : shaped->rewards) total += r;
  EXPECT_NEAR(total, 0.0, 1e-12);
  // Right answer: the return is the outcome term alone.
  t.steps.back() = EnvStep(1, "text:Answer: 45");
  t.outcome = 1;
  shaped = Shape(t, config);
  ASSERT_TRUE(shaped.ok());
  ExpectRewards(*shaped, {0.3, 0.3, 0.3, 1.0 - 0.9});
  // Cut at the turn limit after calling: the take-back still comes, on the last call.
  t.steps.pop_back();
  t.end = TrajectoryEnd::kTruncated;
  shaped = Shape(t, config);
  ASSERT_TRUE(shaped.ok());
  ExpectRewards(*shaped, {0.3, 0.3, -0.6});
  config.steps_as_potential = false;
  shaped = Shape(t, config);
  ASSERT_TRUE(shaped.ok());
  ExpectRewards(*shaped, {0.3, 0.3, 0.3});
}

TEST(Shape, TheOutcomeGateZeroesARightAnswerReachedThroughAWrongStep) {
  // (12-8)/4 = 1 answered after calc(12/4) and calc(3-2): right by luck.
  TrajectoryRewards lucky;
  lucky.steps = {EnvStep(0, "call:calc(12/4)"), EnvStep(1, "call:calc(3-2)"),
                 EnvStep(1, "text:Answer: 1")};
  lucky.outcome = 1;
  TrajectoryRewards clean = lucky;
  clean.steps[0] = EnvStep(1, "call:calc(12-8)");
  ShapingConfig config = Weights(0.0, 1.0);
  Result<ShapedRewards> ungated = Shape(lucky, config);
  ASSERT_TRUE(ungated.ok());
  EXPECT_EQ(ungated->outcome, 1.0);
  config.outcome_gate = OutcomeGate::kEnvSteps;
  Result<ShapedRewards> gated = Shape(lucky, config);
  ASSERT_TRUE(gated.ok()) << gated.status().ToString();
  EXPECT_EQ(gated->outcome, 0.0);
  ExpectRewards(*gated, {0, 0, 0});
  Result<ShapedRewards> verified = Shape(clean, config);
  ASSERT_TRUE(verified.ok());
  EXPECT_EQ(verified->outcome, 1.0);
  ExpectRewards(*verified, {0, 0, 1});
  // The answer step is judged by the outcome alone: a wrong answer after right calls scores 0
  // with or without the gate, and a steps-only verdict cannot raise it.
  TrajectoryRewards wrong = clean;
  wrong.steps.back() = EnvStep(0, "text:Answer: 2");
  wrong.outcome = 0;
  EXPECT_EQ(Shape(wrong, config)->outcome, 0.0);
  // With the outcome not on the answer step (`never`), every step is judged.
  config.outcome_in_answer_step = OutcomeInAnswerStep::kNever;
  TrajectoryRewards unpaid_last = clean;
  unpaid_last.steps.back() = EnvStep(0, "text:Answer: 1");
  EXPECT_EQ(Shape(unpaid_last, config)->outcome, 0.0);
  config.outcome_in_answer_step = OutcomeInAnswerStep::kAuto;
  // The process model's verdict (2 * score - 1) gates with model_steps.
  config.outcome_gate = OutcomeGate::kModelSteps;
  TrajectoryRewards judged = lucky;
  const double scores[] = {0.4, 0.9, 0.0};
  for (size_t k = 0; k < 3; ++k) judged.steps[k].learned = 2 * scores[k] - 1;
  EXPECT_EQ(Shape(judged, config)->outcome, 0.0);
  judged.steps[0].learned = 2 * 0.6 - 1;
  EXPECT_EQ(Shape(judged, config)->outcome, 1.0);
  // A gate without its signal is an error naming it, not a silent pass.
  Result<ShapedRewards> no_scores = Shape(lucky, config);
  ASSERT_FALSE(no_scores.ok());
  EXPECT_NE(no_scores.status().message().find("model_steps"), std::string::npos);
  config.outcome_gate = OutcomeGate::kEnvSteps;
  TrajectoryRewards silent = clean;
  silent.steps[0].env_reward.reset();
  Result<ShapedRewards> no_env = Shape(silent, config);
  ASSERT_FALSE(no_env.ok());
  EXPECT_NE(no_env.status().message().find("env_steps"), std::string::npos);
  // A cut trajectory has no outcome to gate.
  TrajectoryRewards cut = lucky;
  cut.steps.pop_back();
  cut.end = TrajectoryEnd::kTruncated;
  ASSERT_TRUE(Shape(cut, config).ok());
  EXPECT_TRUE(Shape(cut, config)->bootstrap);
}

TEST(Shape, AFailedTrajectoryEndsWithTheFailedOutcome) {
  TrajectoryRewards t;
  t.end = TrajectoryEnd::kFailed;
  t.steps = {EnvStep(1, "call:a()"), EnvStep(0, "call:b()")};
  ShapingConfig config = Weights(0.5, 2.0);
  config.failed_outcome = -0.5;
  Result<ShapedRewards> shaped = Shape(t, config);
  ASSERT_TRUE(shaped.ok());
  EXPECT_FALSE(shaped->bootstrap);
  EXPECT_EQ(shaped->outcome, -0.5);
  EXPECT_EQ(shaped->outcome_term, -1.0);
  ExpectRewards(*shaped, {0.5, -1.0});
  EXPECT_EQ(shaped->process_rewards, (std::vector<double>{0.5, 0.0}));
}

TEST(Shape, RefusesInputsItCannotScore) {
  TrajectoryRewards empty;
  empty.outcome = 1;
  EXPECT_TRUE(Shape(empty, ShapingConfig()).status().IsInvalidArgument());
  TrajectoryRewards no_outcome;
  no_outcome.steps = {EnvStep(1, "a")};
  EXPECT_TRUE(Shape(no_outcome, ShapingConfig()).status().IsInvalidArgument());
  TrajectoryRewards unscored;
  unscored.steps = {EnvStep(1, "a")};
  unscored.outcome = 1;
  Result<ShapedRewards> missing = Shape(unscored, Weights(0.1, 1.0, 0.5));
  EXPECT_TRUE(missing.status().IsInvalidArgument());
  EXPECT_NE(missing.status().message().find("process model"), std::string::npos);
  EXPECT_TRUE(Shape(unscored, Weights(0.1, 1.0, 0, 0.5)).status().IsInvalidArgument());
  EXPECT_TRUE(Shape(unscored, Weights(0.1, 1.0)).ok()) << "unweighted sources may be absent";
  TrajectoryRewards nan = unscored;
  nan.steps[0].env_reward = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(Shape(nan, ShapingConfig()).status().IsInvalidArgument());
}

TEST(StepKey, NormalisesSpacingAndQuotesButNotContent) {
  using envs::FormatToolCall;
  EXPECT_EQ(StepKey("Add." + FormatToolCall("calc", "12 * 7")), "call:calc(12*7)");
  EXPECT_EQ(StepKey("Add." + FormatToolCall("calc", "12*7")),
            StepKey("Sum first. " + FormatToolCall("calc", " 12 *7 ")));
  EXPECT_NE(StepKey(FormatToolCall("calc", "12*7")), StepKey(FormatToolCall("calc", "12*8")));
  EXPECT_EQ(StepKey(FormatToolCall("search", "\"Agent Kalo\"")),
            StepKey(FormatToolCall("search", "Agent   Kalo")));
  EXPECT_EQ(StepKey(FormatToolCall("search", "Agent Kalo")), "call:search(Agent Kalo)");
  EXPECT_NE(StepKey(FormatToolCall("search", "Agent Kalo")),
            StepKey(FormatToolCall("search", "AgentKalo")));
  EXPECT_NE(StepKey(FormatToolCall("search", "kalo")), StepKey(FormatToolCall("zoom", "kalo")));
  EXPECT_EQ(StepKey(" Answer:  87\n"), "text:Answer:87");
  EXPECT_EQ(StepKey("the  next\tpart"), "text:the next part");
  EXPECT_NE(StepKey("calc(1+2)"), StepKey(FormatToolCall("calc", "1+2")))
      << "text that only looks like a call is text";
}

TEST(ReadShapingConfig, ReadsEveryKeyStrictly) {
  Result<ConfigReader> root = ConfigReader::FromString(
      "reward:\n  step_weight: 0.2\n  outcome_weight: 2\n  process_model_weight: 0.5\n"
      "  implicit_weight: 0.05\n  pay_repeats_once: false\n  outcome_in_answer_step: never\n"
      "  failed_outcome: -1\n  steps_as_potential: true\n  outcome_gate: env_steps\n",
      "<inline>");
  ASSERT_TRUE(root.ok());
  ConfigReader section = root->Section("reward");
  Result<ShapingConfig> config = ReadShapingConfig(section);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_TRUE(root->Finish().ok());
  EXPECT_EQ(config->step_weight, 0.2);
  EXPECT_EQ(config->outcome_weight, 2.0);
  EXPECT_EQ(config->process_model_weight, 0.5);
  EXPECT_EQ(config->implicit_weight, 0.05);
  EXPECT_FALSE(config->pay_repeats_once);
  EXPECT_EQ(config->outcome_in_answer_step, OutcomeInAnswerStep::kNever);
  EXPECT_EQ(config->failed_outcome, -1.0);
  EXPECT_TRUE(config->steps_as_potential);
  EXPECT_EQ(config->outcome_gate, OutcomeGate::kEnvSteps);
}

TEST(ReadShapingConfig, NamesTheKeyThatIsWrong) {
  auto read = [](const std::string& text) -> Status {
    Result<ConfigReader> root = ConfigReader::FromString(text, "rl.yaml");
    if (!root.ok()) return root.status();
    ConfigReader section = root->Section("reward");
    Result<ShapingConfig> config = ReadShapingConfig(section);
    if (!config.ok()) return config.status();
    return root->Finish();
  };
  Status misspelt = read("reward:\n  step_wieght: 0.2\n");
  ASSERT_FALSE(misspelt.ok());
  EXPECT_NE(misspelt.message().find("reward.step_wieght"), std::string::npos) << misspelt.message();
  EXPECT_NE(misspelt.message().find("step_weight"), std::string::npos);
  Status mode = read("reward:\n  outcome_in_answer_step: twice\n");
  ASSERT_FALSE(mode.ok());
  EXPECT_NE(mode.message().find("auto, always or never"), std::string::npos) << mode.message();
  Status gate = read("reward:\n  outcome_gate: lucky\n");
  ASSERT_FALSE(gate.ok());
  EXPECT_NE(gate.message().find("none, env_steps or model_steps"), std::string::npos)
      << gate.message();
  Status type = read("reward:\n  outcome_weight: heavy\n");
  ASSERT_FALSE(type.ok());
  EXPECT_NE(type.message().find("rl.yaml:2"), std::string::npos) << type.message();
  EXPECT_TRUE(read("reward: {}\n").ok());
}

TEST(TrajectoryEndFromStatus, CutsBootstrapAndErrorsFail) {
  EXPECT_EQ(TrajectoryEndFromStatus("done"), TrajectoryEnd::kFinished);
  for (const char* cut : {"max_turns", "max_tokens", "stopped"}) {
    EXPECT_EQ(TrajectoryEndFromStatus(cut), TrajectoryEnd::kTruncated) << cut;
  }
  for (const char* failed : {"env_error", "env_timeout", "engine", "bad_image", "", "routing"}) {
    EXPECT_EQ(TrajectoryEndFromStatus(failed), TrajectoryEnd::kFailed) << failed;
  }
}

}  // namespace
}  // namespace strider::reward
