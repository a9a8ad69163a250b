#include "envs/retrieval/retrieval.h"

#include <gtest/gtest.h>

#include <regex>

#include "envs/registry.h"
#include "envs/tools.h"
#include "tests/envs/play.h"

namespace strider::envs {
namespace {

std::unique_ptr<Environment> Make(const Options& options = {}) {
  Result<std::unique_ptr<Environment>> env =
      MakeEnvironment({.name = "retrieval", .options = options});
  EXPECT_TRUE(env.ok()) << env.status().ToString();
  return env.ok() ? std::move(*env) : nullptr;
}

std::unique_ptr<ScriptedPolicy> Policy() {
  Result<std::unique_ptr<ScriptedPolicy>> policy = MakeScriptedPolicy({.name = "retrieval"});
  EXPECT_TRUE(policy.ok());
  return std::move(*policy);
}

TEST(Retrieval, ScriptedPolicyFindsFactsFromTheFirstAndLastParts) {
  auto env = Make();
  auto policy = Policy();
  for (uint64_t seed = 0; seed < 10; ++seed) {
    testing::Episode episode = testing::Play(*env, *policy, seed);
    ASSERT_EQ(episode.steps.size(), 3u + 3u)
        << "seed " << seed;  // 3 more parts, 2 searches, answer
    EXPECT_EQ(episode.steps.back().outcome_reward, 1.0);
    // The agent's record is in part 1 (the first observation), the vault's in part 4.
    const std::string& agent_result = episode.steps[3].observation.text;
    const std::string& vault_result = episode.steps[4].observation.text;
    EXPECT_EQ(episode.steps[3].label, StepLabel::kCorrect);
    EXPECT_EQ(episode.steps[4].label, StepLabel::kCorrect);
    const std::string agent_line = agent_result.substr(0, kRetrievalRecordBytes);
    const std::string vault_line = vault_result.substr(0, kRetrievalRecordBytes);
    EXPECT_NE(episode.observations[0].text.find(agent_line), std::string::npos);
    EXPECT_NE(episode.observations[3].text.find(vault_line), std::string::npos);
    EXPECT_EQ(episode.observations[3].text.rfind("Part 4/4:\n", 0), 0u);
  }
}

TEST(Retrieval, RecordsAreFixedWidthAndTheLengthIsAsConfigured) {
  auto env = Make({{"total_tokens", "65536"}, {"parts", "2"}});
  Result<Observation> first = env->Reset(3, {});
  ASSERT_TRUE(first.ok());
  const std::string& text = first->text;
  const size_t part = text.find("Part 1/2:\n") + 10;
  EXPECT_EQ(text.size() - part, 32768u);  // half of 65536 bytes, one token per byte
  for (size_t at = part; at < text.size(); at += kRetrievalRecordBytes) {
    ASSERT_EQ(text[at], '[');
    ASSERT_EQ(text[at + kRetrievalRecordBytes - 1], '\n');
  }
}

// The shortest documents, for warm-start curricula: two records, the agent's in the first part
// and the vault's in the second.
TEST(Retrieval, TwoRecordEpisodesAreSolved) {
  auto env = Make({{"total_tokens", "128"}, {"parts", "2"}});
  auto policy = Policy();
  for (uint64_t seed = 0; seed < 10; ++seed) {
    testing::Episode episode = testing::Play(*env, *policy, seed);
    ASSERT_EQ(episode.steps.size(), 1u + 3u) << "seed " << seed;  // 1 more part, 2 searches, answer
    EXPECT_EQ(episode.steps.back().outcome_reward, 1.0);
    EXPECT_EQ(episode.steps[1].label, StepLabel::kCorrect);
    EXPECT_EQ(episode.steps[2].label, StepLabel::kCorrect);
  }
  Result<std::unique_ptr<Environment>> three =
      MakeEnvironment({.name = "retrieval", .options = {{"total_tokens", "128"}, {"parts", "3"}}});
  EXPECT_FALSE(three.ok());
}

// restate_question: the last part ends with the question again, naming the agent as the
// records and a search write it; nothing else about the episode changes.
TEST(Retrieval, RestatedQuestionFollowsTheLastPartOnly) {
  auto plain = Make({{"total_tokens", "1024"}, {"parts", "4"}});
  auto restated = Make({{"total_tokens", "1024"}, {"parts", "4"}, {"restate_question", "true"}});
  auto policy = Policy();
  for (uint64_t seed = 0; seed < 5; ++seed) {
    testing::Episode a = testing::Play(*plain, *policy, seed);
    testing::Episode b = testing::Play(*restated, *policy, seed);
    ASSERT_EQ(a.steps.size(), b.steps.size()) << "seed " << seed;
    EXPECT_EQ(b.steps.back().outcome_reward, 1.0);
    const std::string& first = a.observations[0].text;
    const size_t at = first.find("agent ") + 6;
    const std::string agent = first.substr(at, first.find(" open?") - at);
    for (size_t i = 0; i < a.observations.size(); ++i) {
      if (i == 3) {  // Part 4/4
        EXPECT_EQ(b.observations[i].text,
                  a.observations[i].text + "All 4 parts are shown. Which vault does the badge of Agent " +
                      agent + " open?\n");
      } else {
        EXPECT_EQ(b.observations[i].text, a.observations[i].text) << "observation " << i;
      }
    }
  }
  EXPECT_FALSE(MakeEnvironment({.name = "retrieval", .options = {{"restate_question", "yes"}}}).ok());
}

TEST(Retrieval, NumericNamesAreNumbersAndStillSolved) {
  auto env = Make({{"total_tokens", "4096"}, {"parts", "4"}, {"numeric_names", "true"}});
  auto policy = Policy();
  const std::regex agent_record(R"(Agent (\d{5}) carries badge (\d{6})\.)");
  for (uint64_t seed = 0; seed < 10; ++seed) {
    testing::Episode episode = testing::Play(*env, *policy, seed);
    ASSERT_EQ(episode.steps.size(), 3u + 3u) << "seed " << seed;
    EXPECT_EQ(episode.steps.back().outcome_reward, 1.0);
    const std::string& first = episode.observations[0].text;
    std::smatch question;
    ASSERT_TRUE(std::regex_search(first, question, std::regex(R"(agent (\d{5}) open\?)")));
    std::smatch found;
    ASSERT_TRUE(std::regex_search(episode.steps[3].observation.text, found, agent_record))
        << episode.steps[3].observation.text;
    EXPECT_EQ(found[1].str(), question[1].str());
    // The agent's record is the only one naming it: a filler drawing the same number is renamed.
    EXPECT_EQ(first.find("Agent " + question[1].str() + " "),
              first.find("Agent " + found[1].str() + " carries badge " + found[2].str()));
  }
}

TEST(Retrieval, MillionTokenEpisodeIsSolvedPartByPart) {
  auto env = Make({{"total_tokens", "1048576"}, {"parts", "16"}});
  auto policy = Policy();
  testing::Episode episode = testing::Play(*env, *policy, 11);
  ASSERT_FALSE(episode.steps.empty());
  EXPECT_EQ(episode.steps.back().outcome_reward, 1.0);
  size_t total = 0, largest = 0;
  for (const Observation& observation : episode.observations) {
    total += observation.text.size();
    largest = std::max(largest, observation.text.size());
  }
  EXPECT_GE(total, 1048576u);
  EXPECT_LT(largest, 1048576u / 16 + 512);  // no observation holds more than its part
}

TEST(Retrieval, SearchOnlySeesRevealedPartsAndBadCallsAreErrors) {
  auto env = Make();
  Result<Observation> first = env->Reset(5, {});
  ASSERT_TRUE(first.ok());
  // The agent's record is in part 1; the vault's is in the last part, which search cannot see
  // before it is shown.
  const std::string agent = first->text.substr(
      first->text.find("agent ") + 6, first->text.find(" open?") - first->text.find("agent ") - 6);
  Result<StepResult> found =
      env->Step(MakeAction(FormatToolCall("search", "Agent " + agent + " ")));
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->label, StepLabel::kCorrect) << found->observation.text;
  const size_t at = found->observation.text.find("badge ") + 6;
  const std::string badge =
      found->observation.text.substr(at, found->observation.text.find('.', at) - at);
  Result<StepResult> early =
      env->Step(MakeAction(FormatToolCall("search", "Badge " + badge + " ")));
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(early->observation.text, "no records match 'Badge " + badge + "'");
  EXPECT_EQ(early->label, StepLabel::kIncorrect);
  for (int part = 2; part <= 4; ++part) ASSERT_TRUE(env->Step(MakeAction("next")).ok());
  Result<StepResult> late = env->Step(MakeAction(FormatToolCall("search", "Badge " + badge + " ")));
  EXPECT_EQ(late->label, StepLabel::kCorrect) << late->observation.text;
  Result<StepResult> nothing = env->Step(MakeAction(FormatToolCall("search", "zzzz")));
  ASSERT_TRUE(nothing.ok());
  EXPECT_EQ(nothing->observation.text, "no records match 'zzzz'");
  EXPECT_EQ(nothing->label, StepLabel::kIncorrect);
  Result<StepResult> short_query = env->Step(MakeAction(FormatToolCall("search", "a")));
  EXPECT_NE(short_query->observation.text.find("at least 3 characters"), std::string::npos);
  Result<StepResult> malformed = env->Step(MakeAction("<|tool_call|>search<|tool_call_end|>"));
  EXPECT_EQ(malformed->observation.text.rfind("error: tool call:", 0), 0u);
  Result<StepResult> wrong = env->Step(MakeAction("Answer: 1"));
  EXPECT_TRUE(wrong->done);
  EXPECT_EQ(wrong->outcome_reward, 0.0);

  EXPECT_FALSE(
      MakeEnvironment({.name = "retrieval", .options = {{"total_tokens", "2000000"}}}).ok());
  EXPECT_FALSE(MakeEnvironment({.name = "retrieval", .options = {{"total_tokens", "64"}}}).ok());
  EXPECT_FALSE(
      MakeEnvironment({.name = "retrieval", .options = {{"parts", "64"}, {"total_tokens", "1024"}}})
          .ok());
}

}  // namespace
}  // namespace strider::envs
