// The one episode loop (envs/episode.h) that `strider env run`, the tests and envs_bench share.
#include "envs/episode.h"

#include <gtest/gtest.h>

#include "envs/environment.h"
#include "envs/tools.h"

namespace strider::envs {
namespace {

std::unique_ptr<Environment> Calculator() {
  Result<std::unique_ptr<Environment>> env =
      MakeEnvironment({.name = "calculator", .options = {{"difficulty", "3"}}});
  EXPECT_TRUE(env.ok()) << env.status().ToString();
  return env.ok() ? std::move(*env) : nullptr;
}

TEST(PlayEpisode, CountsEveryStepAndKeepsWhatThePolicySaw) {
  std::unique_ptr<Environment> env = Calculator();
  Result<std::unique_ptr<ScriptedPolicy>> policy = MakeScriptedPolicy({.name = "calculator"});
  ASSERT_TRUE(policy.ok());
  int steps = 0;
  size_t step_bytes = 0;
  const EpisodeReport report =
      PlayEpisode(*env, **policy, 7, env->Describe().max_turns, {}, [&](const StepResult& step) {
        ++steps;
        step_bytes += step.observation.text.size();
      });
  ASSERT_FALSE(report.error) << report.end;
  EXPECT_EQ(report.end, "done");
  EXPECT_EQ(report.outcome, 1.0);
  EXPECT_EQ(report.turns, steps);
  EXPECT_EQ(report.correct, steps);  // the solver's steps are all correct
  ASSERT_EQ(report.observations.size(), static_cast<size_t>(steps) + 1);
  EXPECT_EQ(report.observation_bytes, report.observations[0].text.size() + step_bytes);
}

TEST(PlayEpisode, StopsAtMaxTurnsAndReportsErrorsAsData) {
  std::unique_ptr<Environment> env = Calculator();
  Result<std::unique_ptr<ScriptedPolicy>> policy = MakeScriptedPolicy({.name = "calculator"});
  ASSERT_TRUE(policy.ok());
  EpisodeReport report = PlayEpisode(*env, **policy, 7, 1);
  EXPECT_FALSE(report.error);
  EXPECT_EQ(report.end, "turn limit");
  EXPECT_EQ(report.turns, 1);
  EXPECT_FALSE(report.outcome.has_value());

  class FailingPolicy : public ScriptedPolicy {
   public:
    Result<std::string> NextTurn(const std::vector<Observation>&) override {
      return Status::Internal("out of ideas");
    }
  } failing;
  report = PlayEpisode(*env, failing, 7, 4);
  EXPECT_TRUE(report.error);
  EXPECT_EQ(report.end.rfind("policy: ", 0), 0u) << report.end;
  EXPECT_NE(report.end.find("out of ideas"), std::string::npos) << report.end;
  EXPECT_EQ(report.turns, 0);

  report = PlayEpisode(*env, **policy, 7, 4, {{"difficulty", "99"}});
  EXPECT_TRUE(report.error);
  EXPECT_EQ(report.end.rfind("reset: ", 0), 0u) << report.end;
}

TEST(RandomPolicy, SameSeedSameTurnsAndItReachesTheErrorPaths) {
  std::unique_ptr<Environment> env = Calculator();
  const EnvironmentSpec spec = env->Describe();
  std::unique_ptr<ScriptedPolicy> a = MakeRandomPolicy(3, spec.tools);
  std::unique_ptr<ScriptedPolicy> b = MakeRandomPolicy(3, spec.tools);
  bool malformed = false, unknown_tool = false;
  for (int turn = 0; turn < 200; ++turn) {
    Result<std::string> first = a->NextTurn({});
    Result<std::string> second = b->NextTurn({});
    ASSERT_TRUE(first.ok() && second.ok());
    ASSERT_EQ(*first, *second);
    const Action action = MakeAction(*first);
    malformed |= !action.tool_call_error.empty();
    unknown_tool |= action.tool_call && action.tool_call->name == "nosuchtool";
  }
  EXPECT_TRUE(malformed);
  EXPECT_TRUE(unknown_tool);
  const EpisodeReport report =
      PlayEpisode(*env, *MakeRandomPolicy(3, spec.tools), 3, spec.max_turns);
  EXPECT_FALSE(report.error) << report.end;
  EXPECT_EQ(report.correct + report.incorrect + report.unknown, report.turns);
}

}  // namespace
}  // namespace strider::envs
