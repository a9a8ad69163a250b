#include "envs/calculator/calculator.h"

#include <gtest/gtest.h>

#include "envs/registry.h"
#include "envs/tools.h"
#include "tests/envs/play.h"

namespace strider::envs {
namespace {

std::unique_ptr<Environment> Make(const Options& options = {}) {
  Result<std::unique_ptr<Environment>> env =
      MakeEnvironment({.name = "calculator", .options = options});
  EXPECT_TRUE(env.ok()) << env.status().ToString();
  return env.ok() ? std::move(*env) : nullptr;
}

TEST(Arithmetic, EvaluatesAndRejects) {
  EXPECT_EQ(*EvaluateArithmetic("12*7+3"), 87);
  EXPECT_EQ(*EvaluateArithmetic(" -(2+3)*4 / 8 "), -2.5);
  EXPECT_EQ(FormatNumber(87), "87");
  EXPECT_EQ(FormatNumber(-2.5), "-2.5");
  EXPECT_NE(EvaluateArithmetic("1/0").status().message().find("division by zero"),
            std::string::npos);
  EXPECT_NE(EvaluateArithmetic("2+").status().message().find("expected a number"),
            std::string::npos);
  EXPECT_NE(EvaluateArithmetic("2+x").status().message().find("'x'"), std::string::npos);
  EXPECT_FALSE(EvaluateArithmetic(std::string(100, '(') + "1" + std::string(100, ')')).ok());
  EXPECT_FALSE(EvaluateArithmetic(std::string(300, '1')).ok());
}

TEST(Calculator, ScriptedPolicySolvesEveryDifficultyWithCorrectSteps) {
  auto env = Make();
  Result<std::unique_ptr<ScriptedPolicy>> policy = MakeScriptedPolicy({.name = "calculator"});
  ASSERT_TRUE(policy.ok());
  for (int difficulty = 1; difficulty <= 5; ++difficulty) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      const std::vector<StepResult> steps =
          testing::Play(*env, **policy, seed, {{"difficulty", std::to_string(difficulty)}}).steps;
      ASSERT_EQ(steps.size(), static_cast<size_t>(difficulty + 2)) << "seed " << seed;
      for (const StepResult& step : steps) {
        EXPECT_EQ(step.label, StepLabel::kCorrect) << step.observation.text;
        EXPECT_EQ(step.reward, 1.0);
      }
      EXPECT_TRUE(steps.back().done);
      EXPECT_EQ(steps.back().outcome_reward, 1.0);
    }
  }
}

TEST(Calculator, SameSeedSameProblemAndWrongStepsAreLabelled) {
  auto env = Make({{"difficulty", "3"}});
  Result<Observation> a = env->Reset(7, {});
  Result<Observation> b = env->Reset(7, {});
  Result<Observation> c = env->Reset(8, {});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->text, b->text);
  EXPECT_NE(a->text, c->text);

  Result<StepResult> wrong = env->Step(MakeAction(FormatToolCall("calc", "123456789+1")));
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ(wrong->observation.role, ObservationRole::kToolResult);
  EXPECT_EQ(wrong->observation.text, "123456790");
  EXPECT_EQ(wrong->label, StepLabel::kIncorrect);
  EXPECT_EQ(wrong->reward, 0.0);

  Result<StepResult> malformed = env->Step(MakeAction("<|tool_call|>calc(1+<|tool_call_end|>"));
  ASSERT_TRUE(malformed.ok());
  EXPECT_EQ(malformed->observation.text.rfind("error: tool call:", 0), 0u)
      << malformed->observation.text;
  EXPECT_EQ(malformed->label, StepLabel::kIncorrect);
  EXPECT_FALSE(malformed->done);

  Result<StepResult> unknown = env->Step(MakeAction(FormatToolCall("python", "print(1)")));
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->observation.text, "error: unknown tool 'python'");

  Result<StepResult> bad_expr = env->Step(MakeAction(FormatToolCall("calc", "1/0")));
  ASSERT_TRUE(bad_expr.ok());
  EXPECT_NE(bad_expr->observation.text.find("division by zero"), std::string::npos);

  Result<StepResult> chat = env->Step(MakeAction("hmm"));
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->observation.role, ObservationRole::kUser);
  EXPECT_EQ(chat->label, StepLabel::kUnknown);

  Result<StepResult> answer = env->Step(MakeAction("Answer: -1"));
  ASSERT_TRUE(answer.ok());
  EXPECT_TRUE(answer->done);
  EXPECT_EQ(answer->outcome_reward, 0.0);
  EXPECT_EQ(answer->label, StepLabel::kIncorrect);
  EXPECT_FALSE(env->Step(MakeAction("Answer: 1")).ok());  // the episode is over
}

TEST(Calculator, PythonToolRunsInTheSandbox) {
  // A generous wall-clock limit, so the CPU limit (2 s) is what stops the loop even on a busy
  // machine.
  auto env = Make({{"python", "true"}, {"steps", "1"}, {"tool_timeout_ms", "30000"}});
  ASSERT_EQ(env->Describe().tools.size(), 2u);
  Result<Observation> first = env->Reset(3, {});
  ASSERT_TRUE(first.ok());
  Result<StepResult> loop = env->Step(MakeAction(FormatToolCall("python", "while True: pass")));
  ASSERT_TRUE(loop.ok()) << loop.status().ToString();
  EXPECT_NE(loop->observation.text.find("CPU limit"), std::string::npos) << loop->observation.text;
  EXPECT_EQ(loop->label, StepLabel::kIncorrect);
  Result<StepResult> print = env->Step(MakeAction(FormatToolCall("python", "print(2+2)")));
  ASSERT_TRUE(print.ok());
  EXPECT_EQ(print->observation.text, "4\n");
}

TEST(Calculator, PythonToolTimeoutIsAnErrorResultAndTheNextEpisodeWorks) {
  auto env = Make({{"python", "true"}, {"steps", "1"}, {"tool_timeout_ms", "300"}});
  ASSERT_TRUE(env->Reset(3, {}).ok());
  Result<StepResult> sleep =
      env->Step(MakeAction(FormatToolCall("python", "import time\ntime.sleep(30)")));
  ASSERT_TRUE(sleep.ok()) << sleep.status().ToString();
  EXPECT_NE(sleep->observation.text.find("wall-clock limit of 300 ms"), std::string::npos)
      << sleep->observation.text;
  EXPECT_EQ(sleep->label, StepLabel::kIncorrect);
  EXPECT_FALSE(sleep->done);
  Result<std::unique_ptr<ScriptedPolicy>> policy = MakeScriptedPolicy({.name = "calculator"});
  ASSERT_TRUE(policy.ok());
  testing::Episode next = testing::Play(*env, **policy, 4);
  ASSERT_FALSE(next.steps.empty());
  EXPECT_EQ(next.steps.back().outcome_reward, 1.0);
}

TEST(Calculator, BadOptionsNameTheKey) {
  Result<std::unique_ptr<Environment>> env =
      MakeEnvironment({.name = "calculator", .options = {{"dificulty", "2"}}});
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("'dificulty': unknown option"), std::string::npos)
      << env.status().message();
  env = MakeEnvironment({.name = "calculator", .options = {{"difficulty", "9"}}});
  EXPECT_NE(env.status().message().find("outside [1, 5]"), std::string::npos);
  auto ok = Make();
  EXPECT_FALSE(ok->Reset(1, {{"steps", "many"}}).ok());
  Result<std::unique_ptr<Environment>> none = MakeEnvironment({.name = "nope"});
  EXPECT_TRUE(none.status().IsNotFound());
  EXPECT_NE(none.status().message().find("calculator"), std::string::npos);
}

}  // namespace
}  // namespace strider::envs
