// Out-of-process environments: real python3 child processes over ZeroMQ, through MakeEnvironment.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "envs/environment.h"
#include "envs/messages.h"
#include "envs/registry.h"
#include "envs/tools.h"
#include "tests/envs/play.h"

namespace strider::envs {
namespace {

const char* kPython = "/usr/bin/python3";

std::string SourceDir() {
  const char* dir = std::getenv("STRIDER_SOURCE_DIR");
  return dir ? dir : ".";
}

EnvironmentConfig Example() {
  EnvironmentConfig config;
  config.command = std::string(kPython) + " " + SourceDir() + "/envs/external/example_env.py";
  config.step_timeout_ms = 5000;
  return config;
}

EnvironmentConfig Faulty(int64_t step_timeout_ms = 5000) {
  EnvironmentConfig config;
  config.command = std::string(kPython) + " " + SourceDir() + "/tests/envs/faulty_env.py";
  config.step_timeout_ms = step_timeout_ms;
  return config;
}

class ExternalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kPython, X_OK) != 0 ||
        std::system((std::string(kPython) + " -c 'import zmq' 2>/dev/null").c_str()) != 0) {
      GTEST_SKIP() << "needs " << kPython << " with python3-zmq";
    }
  }
};

// Found by env_protocol_fuzz: fields of the wrong JSON type threw out of the decoders (an
// uncaught exception in the actor) instead of failing the request with the field named.
TEST(ExternalMessages, FieldsOfTheWrongTypeAreErrorsNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"observation": {"role": 3, "text": "x"}})", "observation.role must be a string"},
      {R"({"observation": {"text": "x", "images": [{"width": 1, "height": 1, "channels": "3",
          "pixels_base64": "AAAA"}]}})",
       "image channels must be an integer"},
      {R"({"spec": {"name": "e", "description": 5}})", "description must be a string"},
      {R"({"spec": {"name": "e", "tools": [{"name": "t", "description": []}]}})",
       "tool t: description must be a string"},
  };
  for (const auto& [text, message] : cases) {
    Result<nlohmann::json> reply = ParseJsonObject(text, "reply");
    ASSERT_TRUE(reply.ok()) << text;
    Status status = reply->contains("observation")
                        ? ObservationFromJson((*reply)["observation"], "reply").status()
                        : SpecFromJson((*reply)["spec"], "reply").status();
    ASSERT_FALSE(status.ok()) << text;
    EXPECT_NE(status.message().find(message), std::string::npos) << status.message();
  }
}

TEST_F(ExternalTest, PythonExampleEnvironmentPlaysWithItsScriptedPolicy) {
  EnvironmentConfig config = Example();
  config.options = {{"high", "1000"}};
  Result<std::unique_ptr<Environment>> env = MakeEnvironment(config);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  const EnvironmentSpec spec = (*env)->Describe();
  EXPECT_EQ(spec.name, "guess_number");
  ASSERT_EQ(spec.tools.size(), 1u);
  EXPECT_EQ(spec.tools[0].name, "guess");
  EXPECT_EQ(spec.tools[0].arguments, R"({"n":"integer"})");
  Result<std::unique_ptr<ScriptedPolicy>> policy = MakeScriptedPolicy(config);
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  for (uint64_t seed = 0; seed < 5; ++seed) {
    testing::Episode episode = testing::Play(**env, **policy, seed);
    ASSERT_FALSE(episode.steps.empty());
    EXPECT_TRUE(episode.steps.back().done);
    EXPECT_EQ(episode.steps.back().outcome_reward, 1.0);
    EXPECT_LE(episode.steps.size(), 11u);  // binary search over 1000
    for (const StepResult& step : episode.steps) EXPECT_EQ(step.label, StepLabel::kCorrect);
  }
  // Wrong guesses, malformed calls and bad options are answered, not fatal.
  ASSERT_TRUE((*env)->Reset(1, {{"high", "10"}}).ok());
  Result<StepResult> outside = (*env)->Step(MakeAction(FormatToolCall("guess", "50")));
  ASSERT_TRUE(outside.ok()) << outside.status().ToString();
  EXPECT_EQ(outside->label, StepLabel::kIncorrect);
  Result<StepResult> malformed = (*env)->Step(MakeAction("<|tool_call|>guess(3<|tool_call_end|>"));
  ASSERT_TRUE(malformed.ok());
  EXPECT_EQ(malformed->observation.text.rfind("error: tool call:", 0), 0u);
  Result<Observation> bad = (*env)->Reset(1, {{"hihg", "10"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown option(s): hihg"), std::string::npos)
      << bad.status().message();
  EXPECT_TRUE((*env)->Reset(2, {}).ok());  // a fresh process after the failed reset
  (*env)->Close();
}

// The example's reset would refuse the key too, but only at the first episode: the registry
// refuses it when the environment is made, as built-ins do.
TEST_F(ExternalTest, UnknownOptionKeyIsRefusedBeforeTheFirstEpisode) {
  EnvironmentConfig config = Example();
  config.options = {{"hihg", "1000"}};
  Result<std::unique_ptr<Environment>> env = MakeEnvironment(config);
  ASSERT_FALSE(env.ok());
  EXPECT_TRUE(env.status().IsInvalidArgument()) << env.status().ToString();
  EXPECT_NE(
      env.status().message().find("guess_number: option 'hihg': unknown option (known: high)"),
      std::string::npos)
      << env.status().message();
}

// Each fault ends its episode with an error naming it, promptly; the next episode works.
TEST_F(ExternalTest, FaultsEndTheEpisodeAndTheNextEpisodeWorks) {
  Result<std::unique_ptr<Environment>> env = MakeEnvironment(Faulty(/*step_timeout_ms=*/700));
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  const std::vector<std::pair<std::string, std::string>> faults = {
      {"crash", "exited with code 3 before replying"},
      {"kill_group", "killed by signal 9"},
      {"hang", "no reply within 700 ms"},
      {"garbage", "not valid JSON: 'this is not json {'"},
      {"bad_shape", "observation.role 'narrator'"},
      {"error", "step failed in the environment: the environment could not score this turn"},
      {"bad_utf8", "\"text\": \"\\xFF\\xFE\"}}'"},
  };
  for (const auto& [fault, message] : faults) {
    ASSERT_TRUE((*env)->Reset(1, {{"fault", fault}}).ok()) << fault;
    const auto start = std::chrono::steady_clock::now();
    Result<StepResult> step = (*env)->Step(MakeAction("go"));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_FALSE(step.ok()) << fault;
    EXPECT_NE(step.status().message().find(message), std::string::npos)
        << fault << ": " << step.status().message();
    EXPECT_LT(seconds, 3.0) << fault;
    // Only the client's own time limit is a deadline: the actor reports it as env_timeout.
    EXPECT_EQ(step.status().code() == StatusCode::kDeadlineExceeded, fault == "hang") << fault;
    // The next episode on the same Environment object works.
    Result<Observation> next = (*env)->Reset(2, {});
    ASSERT_TRUE(next.ok()) << fault << ": " << next.status().ToString();
    Result<StepResult> ok = (*env)->Step(MakeAction("go"));
    ASSERT_TRUE(ok.ok()) << fault << ": " << ok.status().ToString();
    EXPECT_TRUE(ok->done);
  }
}

TEST_F(ExternalTest, ProcessKilledFromOutsideMidEpisode) {
  Result<std::unique_ptr<Environment>> env = MakeEnvironment(Faulty());
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  Result<Observation> first = (*env)->Reset(1, {});
  ASSERT_TRUE(first.ok());
  const pid_t pid = std::atoi(first->text.substr(4).c_str());
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  Result<StepResult> step = (*env)->Step(MakeAction("go"));
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(step.status().message().find("killed by signal 9"), std::string::npos)
      << step.status().message();
  Result<Observation> again = (*env)->Reset(1, {});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_NE(again->text, first->text);  // another process

  // A process that dies between episodes is replaced at the next Reset, without an error.
  Result<StepResult> done = (*env)->Step(MakeAction("go"));
  ASSERT_TRUE(done.ok() && done->done);
  const pid_t idle = std::atoi(again->text.substr(4).c_str());
  ASSERT_EQ(::kill(idle, SIGKILL), 0);
  ::usleep(100000);  // it is a zombie now, until the environment reaps it
  Result<Observation> third = (*env)->Reset(1, {});
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_NE(third->text, again->text);
}

TEST_F(ExternalTest, CommandsThatDoNotSpeakTheProtocolAreRefused) {
  // A process that exits without connecting fails at once (one that never answers would be
  // waited for up to 10 s, the start-up allowance).
  EnvironmentConfig silent;
  silent.command = "/bin/sh -c 'exit 4'";
  silent.step_timeout_ms = 200;
  Result<std::unique_ptr<Environment>> env = MakeEnvironment(silent);
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find(
                "describe: the environment process exited with code 4 before connecting"),
            std::string::npos)
      << env.status().message();

  EnvironmentConfig named = Example();
  named.name = "calculator";
  env = MakeEnvironment(named);
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("describes itself as 'guess_number'"), std::string::npos);
}

}  // namespace
}  // namespace strider::envs
