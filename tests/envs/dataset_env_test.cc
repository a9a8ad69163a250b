#include "envs/dataset/dataset.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "envs/registry.h"
#include "envs/tools.h"
#include "tests/envs/play.h"

namespace strider::envs {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/strider_dataset_" + name;
  std::ofstream(path) << text;
  return path;
}

const char* kArithmetic =
    R"({"prompt": "What is 17 + 25?", "answer": 42, "id": "a"})"
    "\n"
    R"({"prompt": "Name the capital of France.", "answer": "Paris", "system": "Be brief."})"
    "\n"
    "\n"
    R"({"prompt": "What is 1 / 3?", "answer": "0.333333", "metadata": {"unit": "none"}})"
    "\n";

std::unique_ptr<Environment> Make(Options options) {
  Result<std::unique_ptr<Environment>> env =
      MakeEnvironment({.name = "dataset", .options = options});
  EXPECT_TRUE(env.ok()) << env.status().ToString();
  return env.ok() ? std::move(*env) : nullptr;
}

// Plays line `seed` with one model turn; the last step.
StepResult Answer(Environment& env, uint64_t seed, const std::string& turn) {
  Result<Observation> first = env.Reset(seed, {});
  EXPECT_TRUE(first.ok()) << first.status().ToString();
  Result<StepResult> step = env.Step(MakeAction(turn));
  EXPECT_TRUE(step.ok()) << step.status().ToString();
  return step.ok() ? *step : StepResult{};
}

TEST(DatasetEnv, ExactVerifierNormalisesUnlessTurnedOff) {
  const std::string path = WriteFile("exact.jsonl", kArithmetic);
  auto env = Make({{"path", path}});
  Result<Observation> first = env->Reset(1, {});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->text, "Be brief.\n\nName the capital of France.");
  StepResult right = Answer(*env, 1, "Answer:   pARIS \n");
  EXPECT_TRUE(right.done);
  EXPECT_EQ(right.outcome_reward, 1.0);
  EXPECT_EQ(right.label, StepLabel::kCorrect);
  EXPECT_EQ(Answer(*env, 1, "the capital is  paris").outcome_reward, 0.0);
  EXPECT_EQ(Answer(*env, 4, "  Paris ").outcome_reward, 1.0);  // 4 % 3 lines = line 2
  EXPECT_EQ(Answer(*env, 0, "Answer: 42").outcome_reward, 1.0);

  auto strict = Make({{"path", path}, {"normalize", "false"}});
  EXPECT_EQ(Answer(*strict, 1, "Answer: paris").outcome_reward, 0.0);
  EXPECT_EQ(Answer(*strict, 1, "Answer: Paris").outcome_reward, 1.0);
}

TEST(DatasetEnv, NumericVerifierUsesTolerance) {
  const std::string path = WriteFile("numeric.jsonl", kArithmetic);
  auto env = Make({{"path", path}, {"verifier", "numeric"}});
  EXPECT_EQ(Answer(*env, 0, "Answer: 42.0000000001").outcome_reward, 1.0);
  EXPECT_EQ(Answer(*env, 0, "Answer: 42 apples").outcome_reward, 1.0);
  EXPECT_EQ(Answer(*env, 0, "Answer: 42.01").outcome_reward, 0.0);
  EXPECT_EQ(Answer(*env, 2, "Answer: 0.3334").outcome_reward, 0.0);
  auto loose = Make({{"path", path}, {"verifier", "numeric"}, {"tolerance", "0.001"}});
  EXPECT_EQ(Answer(*loose, 2, "Answer: 0.3334").outcome_reward, 1.0);
  EXPECT_EQ(Answer(*loose, 0, "Answer: 42.03").outcome_reward, 1.0);  // relative: 0.042
  EXPECT_EQ(Answer(*loose, 0, "Answer: 42.05").outcome_reward, 0.0);
  // A text reference under `numeric` is the file's mistake: an error result, not a zero.
  Result<Observation> first = env->Reset(1, {});
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(env->Step(MakeAction("Answer: 3")).ok());
  Result<std::unique_ptr<Environment>> bad =
      MakeEnvironment({.name = "dataset", .options = {{"path", path}, {"tolerance", "x"}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("option 'tolerance'"), std::string::npos);
}

TEST(DatasetEnv, RegexVerifierMatchesTheWholeAnswer) {
  const std::string path = WriteFile(
      "regex.jsonl", R"j({"prompt": "Name a primary colour.", "answer": "(?:red|blue|yellow)"})j"
                     "\n");
  auto env = Make({{"path", path}, {"verifier", "regex"}});
  EXPECT_EQ(Answer(*env, 0, "Answer: blue").outcome_reward, 1.0);
  EXPECT_EQ(Answer(*env, 0, "Answer: green").outcome_reward, 0.0);
  EXPECT_EQ(Answer(*env, 0, "Answer: blueish").outcome_reward, 0.0);
  const std::string broken = WriteFile("broken_regex.jsonl", R"({"prompt": "p", "answer": "(a"})"
                                                             "\n");
  Result<std::unique_ptr<Environment>> bad =
      MakeEnvironment({.name = "dataset", .options = {{"path", broken}, {"verifier", "regex"}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not a regex"), std::string::npos);
}

// A verifier script that scores by the length of the common prefix and counts its requests,
// so the test sees it is one process kept across episodes.
const char* kVerifierScript = R"(import json, sys
count = 0
for line in sys.stdin:
    request = json.loads(line)
    count += 1
    if request["answer"] == "die":
        sys.exit(3)
    if request["answer"] == "hang":
        import time; time.sleep(30)
    if request["answer"] == "garbage":
        print("not json", flush=True); continue
    right = request["answer"] == request["reference"]
    reward = 1.0 if right else 0.25
    print(json.dumps({"reward": reward, "correct": right,
                      "reason": "request %d unit %s" % (count, request["metadata"].get("unit"))}),
          flush=True)
)";

TEST(DatasetEnv, CommandVerifierIsOneKeptProcessAndFaultsAreErrorResults) {
  const std::string path = WriteFile("command.jsonl", kArithmetic);
  const std::string script = WriteFile("verifier.py", kVerifierScript);
  Options options = {{"path", path},
                     {"verifier", "command"},
                     {"command", "python3 " + script},
                     {"verifier_timeout_ms", "1500"}};
  auto env = Make(options);
  StepResult right = Answer(*env, 2, "Answer: 0.333333");
  EXPECT_EQ(right.outcome_reward, 1.0);
  EXPECT_EQ(right.label, StepLabel::kCorrect);
  EXPECT_EQ(right.info["verifier_reason"], "request 1 unit none");
  StepResult partial = Answer(*env, 0, "Answer: 41");
  EXPECT_EQ(partial.outcome_reward, 0.25);
  EXPECT_EQ(partial.label, StepLabel::kIncorrect);
  EXPECT_EQ(partial.info["verifier_reason"], "request 2 unit None") << "the process was kept";

  ASSERT_TRUE(env->Reset(0, {}).ok());
  Result<StepResult> died = env->Step(MakeAction("Answer: die"));
  ASSERT_FALSE(died.ok());
  EXPECT_NE(died.status().message().find("exited"), std::string::npos) << died.status().ToString();
  // The next episode gets a fresh process.
  EXPECT_EQ(Answer(*env, 0, "Answer: 42").info["verifier_reason"], "request 1 unit None");

  ASSERT_TRUE(env->Reset(0, {}).ok());
  Result<StepResult> garbage = env->Step(MakeAction("Answer: garbage"));
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("not a JSON object"), std::string::npos);

  ASSERT_TRUE(env->Reset(0, {}).ok());
  const auto start = std::chrono::steady_clock::now();
  Result<StepResult> hung = env->Step(MakeAction("Answer: hang"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(hung.ok());
  EXPECT_NE(hung.status().message().find("no reply within 1500 ms"), std::string::npos);
  EXPECT_LT(seconds, 5.0);
  env->Close();

  // A verifier that stops reading its input after one reply: the next write fails with EPIPE,
  // which must be an error result, not a SIGPIPE that ends this test process.
  const std::string closer = WriteFile("closer.py",
                                       "import json, os, sys, time\n"
                                       "sys.stdin.readline()\n"
                                       "os.close(0)\n"
                                       "print(json.dumps({'reward': 1.0}), flush=True)\n"
                                       "time.sleep(30)\n");
  options["command"] = "exec python3 " + closer;  // no shell left holding the pipe
  auto closing = Make(options);
  EXPECT_EQ(Answer(*closing, 0, "Answer: 42").outcome_reward, 1.0);
  ASSERT_TRUE(closing->Reset(0, {}).ok());
  Result<StepResult> unread = closing->Step(MakeAction("Answer: 42"));
  ASSERT_FALSE(unread.ok());
  EXPECT_NE(unread.status().message().find("stopped reading its input"), std::string::npos)
      << unread.status().ToString();
  closing->Close();

  // A command that is not there: the shell exits 127, an error result again.
  options["command"] = "/nonexistent/verifier";
  auto missing = Make(options);
  ASSERT_TRUE(missing->Reset(0, {}).ok());
  EXPECT_FALSE(missing->Step(MakeAction("Answer: 42")).ok());
}

TEST(DatasetEnv, MalformedLinesNameFileAndLine) {
  struct Case {
    std::string text;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"{\"prompt\": \"a\", \"answer\": 1}\n{\"prompt\": \"b\", \"answer\": \n",
       ":2: not valid JSON"},
      {"{\"prompt\": \"a\", \"answer\": 1}\n\n{\"answer\": 2}\n", ":3: `prompt` is required"},
      {"{\"prompt\": \"a\"}\n", ":1: `answer` is required"},
      {"{\"prompt\": \"a\", \"answer\": [1]}\n", ":1: `answer` must be a string or a number"},
      {"{\"prompt\": \"a\", \"answer\": 1, \"answr\": 1}\n", ":1: unknown key `answr`"},
      {"[1, 2]\n", ":1: expected a JSON object"},
      {"\n\n", "has no records"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = WriteFile("malformed" + std::to_string(i) + ".jsonl", cases[i].text);
    Result<std::unique_ptr<Environment>> env =
        MakeEnvironment({.name = "dataset", .options = {{"path", path}}});
    ASSERT_FALSE(env.ok()) << cases[i].text;
    EXPECT_NE(env.status().message().find(cases[i].expected), std::string::npos)
        << env.status().ToString();
    if (cases[i].expected[0] == ':') {
      EXPECT_NE(env.status().message().find(path + cases[i].expected), std::string::npos);
    }
  }
  Result<std::unique_ptr<Environment>> unknown =
      MakeEnvironment({.name = "dataset", .options = {{"path", "x"}, {"verfier", "exact"}}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("option 'verfier': unknown option"), std::string::npos);
  Result<std::unique_ptr<Environment>> no_command =
      MakeEnvironment({.name = "dataset", .options = {{"path", "x"}, {"verifier", "command"}}});
  ASSERT_FALSE(no_command.ok());
  EXPECT_NE(no_command.status().message().find("option 'command'"), std::string::npos);
  // Without `path` the environment can be described (the config reader asks for its keys) but
  // not played.
  auto bare = Make({});
  Result<Observation> reset = bare->Reset(0, {});
  ASSERT_FALSE(reset.ok());
  EXPECT_NE(reset.status().message().find("option 'path'"), std::string::npos);
}

TEST(DatasetEnv, EnvironmentsShareOneReadUntilTheFileChanges) {
  const std::string path = WriteFile("shared.jsonl", R"({"prompt": "first", "answer": 1})"
                                                     "\n");
  auto one = Make({{"path", path}});
  auto two = Make({{"path", path}});
  EXPECT_EQ(one->Reset(0, {})->text, "first");
  EXPECT_EQ(two->Reset(0, {})->text, "first");
  WriteFile("shared.jsonl", R"({"prompt": "second, longer", "answer": 2})"
                            "\n");
  auto three = Make({{"path", path}});
  EXPECT_EQ(three->Reset(0, {})->text, "second, longer");
  EXPECT_EQ(one->Reset(0, {})->text, "first") << "a made environment keeps its read";
}

TEST(DatasetEnv, CalcToolRunsUntilTheAnswer) {
  const std::string path = WriteFile("tools.jsonl", kArithmetic);
  auto env = Make({{"path", path}, {"tools", "calc"}, {"verifier", "numeric"}});
  const EnvironmentSpec spec = env->Describe();
  ASSERT_EQ(spec.tools.size(), 1u);
  EXPECT_EQ(spec.tools[0].name, "calc");
  EXPECT_EQ(spec.max_turns, 4);
  ASSERT_TRUE(env->Reset(0, {}).ok());
  Result<StepResult> tool = env->Step(MakeAction("Add." + FormatToolCall("calc", "17+25")));
  ASSERT_TRUE(tool.ok());
  EXPECT_FALSE(tool->done);
  EXPECT_EQ(tool->observation.role, ObservationRole::kToolResult);
  EXPECT_EQ(tool->observation.text, "42");
  Result<StepResult> bad = env->Step(MakeAction(FormatToolCall("calc", "17+")));
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->observation.text.rfind("error: ", 0), 0u) << bad->observation.text;
  Result<StepResult> answer = env->Step(MakeAction("Answer: " + tool->observation.text));
  ASSERT_TRUE(answer.ok());
  EXPECT_TRUE(answer->done);
  EXPECT_EQ(answer->outcome_reward, 1.0);

  // Turns that neither call a tool nor answer run into the turn limit.
  ASSERT_TRUE(env->Reset(0, {}).ok());
  StepResult last;
  for (int turn = 0; turn < 4; ++turn) {
    Result<StepResult> step = env->Step(MakeAction("thinking"));
    ASSERT_TRUE(step.ok());
    last = *step;
  }
  EXPECT_TRUE(last.done);
  EXPECT_EQ(last.outcome_reward, 0.0);
}

TEST(DatasetEnv, ScriptedPolicyScoresOneOnTheShippedDataset) {
  // The shipped sample, through the same path `strider env run` takes (relative to the root).
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  const std::string path =
      std::string(source != nullptr ? source : ".") + "/configs/datasets/arithmetic.jsonl";
  Result<std::vector<DatasetRecord>> records = LoadDataset(path);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  EXPECT_GE(records->size(), 40u);
  for (const char* tools : {"", "calc"}) {
    const Options options = {{"path", path}, {"verifier", "numeric"}, {"tools", tools}};
    auto env = Make(options);
    Result<std::unique_ptr<ScriptedPolicy>> policy =
        MakeScriptedPolicy({.name = "dataset", .options = options});
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    for (uint64_t seed = 0; seed < records->size(); ++seed) {
      const std::vector<StepResult> steps = testing::Play(*env, **policy, seed).steps;
      ASSERT_EQ(steps.size(), 1u);
      EXPECT_EQ(steps.back().outcome_reward, 1.0) << "seed " << seed;
    }
  }
  // Shuffled order visits other lines than seed % N but stays a pure function of the seed.
  auto plain = Make({{"path", path}});
  auto shuffled = Make({{"path", path}, {"shuffle", "true"}});
  int differ = 0;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const std::string a = plain->Reset(seed, {})->text;
    const std::string b = shuffled->Reset(seed, {})->text;
    EXPECT_EQ(b, shuffled->Reset(seed, {})->text);
    differ += a != b;
  }
  EXPECT_GT(differ, 5);
}

}  // namespace
}  // namespace strider::envs
