// Shared-library plug-ins: the template environment built by the test suite, loaded by path.
#include <gtest/gtest.h>

#include "envs/environment.h"
#include "envs/registry.h"
#include "envs/tools.h"
#include "tests/envs/play.h"

namespace strider::envs {
namespace {

const char* kLibrary = STRIDER_TEMPLATE_ENV_PATH;
const char* kLibraryV2 = STRIDER_TEMPLATE_ENV_V2_PATH;

TEST(Plugin, TemplateEnvironmentPlaysThroughMakeEnvironment) {
  EnvironmentConfig config;
  config.library = kLibrary;
  config.options = {{"target_max", "40"}};
  Result<std::unique_ptr<Environment>> env = MakeEnvironment(config);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  const EnvironmentSpec spec = (*env)->Describe();
  EXPECT_EQ(spec.name, "template_counter");
  ASSERT_EQ(spec.tools.size(), 1u);
  EXPECT_EQ(spec.tools[0].name, "add");
  EXPECT_EQ(spec.options, std::vector<std::string>{"target_max"});
  Result<std::unique_ptr<ScriptedPolicy>> policy = MakeScriptedPolicy(config);
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  for (uint64_t seed = 0; seed < 10; ++seed) {
    testing::Episode episode = testing::Play(**env, **policy, seed);
    ASSERT_FALSE(episode.steps.empty());
    EXPECT_TRUE(episode.steps.back().done);
    EXPECT_EQ(episode.steps.back().outcome_reward, 1.0) << "seed " << seed;
    for (const StepResult& step : episode.steps) EXPECT_EQ(step.label, StepLabel::kCorrect);
  }
  // Same seed, same episode; a second instance from the same library is independent.
  Result<std::unique_ptr<Environment>> other = MakeEnvironment(config);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*env)->Reset(5, {})->text, (*other)->Reset(5, {})->text);
  Result<StepResult> overshoot = (*other)->Step(MakeAction(FormatToolCall("add", "10")));
  ASSERT_TRUE(overshoot.ok());
  Result<StepResult> malformed = (*other)->Step(MakeAction("<|tool_call|>add 3<|tool_call_end|>"));
  ASSERT_TRUE(malformed.ok());
  EXPECT_EQ(malformed->label, StepLabel::kIncorrect);
  EXPECT_NE(malformed->observation.text.find("error: tool call: expected '('"), std::string::npos);
  (*other)->Close();
  EXPECT_FALSE((*other)->Reset(1, {}).ok());
}

TEST(Plugin, TurnTextThatIsNotUtf8ReachesThePluginRepaired) {
  EnvironmentConfig config;
  config.library = kLibrary;
  Result<std::unique_ptr<Environment>> env = MakeEnvironment(config);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  ASSERT_TRUE((*env)->Reset(1, {}).ok());
  // A byte-level model can end a turn inside a multi-byte character or write stray bytes.
  Result<StepResult> step = (*env)->Step(MakeAction("abc\xff\xc3 <|tool_call|>add(\xe2)<|tool_call_end|>"));
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_FALSE(step->observation.text.empty());
}

TEST(Plugin, ErrorsNameTheLibraryAndTheProblem) {
  Result<std::unique_ptr<Environment>> env =
      MakeEnvironment({.options = {{"target_max", "0"}}, .library = kLibrary});
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("option 'target_max'"), std::string::npos)
      << env.status().message();

  env = MakeEnvironment({.name = "calculator", .library = kLibrary});
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("describes itself as 'template_counter'"),
            std::string::npos);

  env = MakeEnvironment({.library = "/nonexistent/libenv.so"});
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("/nonexistent/libenv.so: cannot load"), std::string::npos);

  // A real shared library that is not a plug-in.
  env = MakeEnvironment({.library = "libm.so.6"});
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("exports no strider_environment_api_v1"), std::string::npos)
      << env.status().message();
}

TEST(Plugin, LibraryBuiltForAnotherApiVersionIsRefused) {
  Result<std::unique_ptr<Environment>> env = MakeEnvironment({.library = kLibraryV2});
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(env.status().message().find("built for environment API version 2"), std::string::npos)
      << env.status().message();
  EXPECT_NE(env.status().message().find("this strider speaks version 1"), std::string::npos);
}

TEST(Plugin, ConfigOptionsAreCheckedAgainstThePlugin) {
  const std::string yaml = std::string("env:\n  library: ") + kLibrary +
                           "\n  options:\n    target_max: 12\n    targt: 3\n";
  Result<ConfigReader> root = ConfigReader::FromString(yaml, "p.yaml");
  ASSERT_TRUE(root.ok());
  ConfigReader section = root->Section("env");
  Result<EnvironmentConfig> config = ReadEnvironmentConfig(section);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->name, "template_counter");
  EXPECT_EQ(config->options.at("target_max"), "12");
  EXPECT_NE(root->Finish().message().find("p.yaml:5: env.options.targt"), std::string::npos);
}

}  // namespace
}  // namespace strider::envs
