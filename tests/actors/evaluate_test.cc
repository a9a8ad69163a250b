// Evaluation's pure parts (actors/evaluate.h): the Wilson interval and pass@k against known
// values, the evaluation seed stream against the training one, and the rule that an actor has
// exactly one of a replay endpoint and an episode sink.
#include "actors/evaluate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "common/transport/curve.h"
#include "common/transport/weight_stream.h"
#include "tests/scratch_dir.h"

namespace strider::actors {
namespace {

TEST(WilsonInterval, MatchesPublishedValues) {
  // 81 of 263: the worked example of the Wilson score interval (Wikipedia, "Binomial proportion
  // confidence interval"): [0.2553, 0.3662].
  Interval i = WilsonInterval(81, 263);
  EXPECT_NEAR(i.low, 0.25529, 1e-5);
  EXPECT_NEAR(i.high, 0.36621, 1e-5);
  i = WilsonInterval(5, 10);
  EXPECT_NEAR(i.low, 0.236593, 1e-6);
  EXPECT_NEAR(i.high, 0.763407, 1e-6);
}

TEST(WilsonInterval, StaysInsideTheUnitIntervalAtTheEdges) {
  // None of 10: the normal approximation gives [0, 0]; Wilson's upper end is 0.2775.
  Interval none = WilsonInterval(0, 10);
  EXPECT_EQ(none.low, 0.0);
  EXPECT_NEAR(none.high, 0.277533, 1e-6);
  Interval all = WilsonInterval(10, 10);
  EXPECT_NEAR(all.low, 0.722467, 1e-6);
  EXPECT_EQ(all.high, 1.0);
  Interval empty = WilsonInterval(0, 0);
  EXPECT_EQ(empty.low, 0.0);
  EXPECT_EQ(empty.high, 1.0);
}

TEST(WilsonInterval, NarrowsWithMoreTrials) {
  const Interval small = WilsonInterval(3, 10);
  const Interval large = WilsonInterval(300, 1000);
  EXPECT_LT(large.high - large.low, (small.high - small.low) / 3);
  EXPECT_LT(large.low, 0.3);
  EXPECT_GT(large.high, 0.3);
}

TEST(PassAtK, MatchesTheCombinatorialFormula) {
  // 1 - C(n - c, k) / C(n, k)
  EXPECT_NEAR(*PassAtK(5, 2, 1), 0.4, 1e-12);                  // k = 1 is c / n
  EXPECT_NEAR(*PassAtK(5, 2, 2), 1.0 - 3.0 / 10.0, 1e-12);     // C(3,2) / C(5,2)
  EXPECT_NEAR(*PassAtK(10, 3, 5), 1.0 - 21.0 / 252.0, 1e-12);  // C(7,5) / C(10,5)
  EXPECT_NEAR(*PassAtK(200, 10, 100), 1.0 - 0.000771, 1e-6);   // C(190,100) / C(200,100)
  EXPECT_EQ(*PassAtK(4, 0, 4), 0.0);
  EXPECT_EQ(*PassAtK(4, 1, 4), 1.0);   // k = n: any correct sample
  EXPECT_EQ(*PassAtK(10, 8, 3), 1.0);  // fewer than k wrong ones
}

TEST(PassAtK, RefusesImpossibleCounts) {
  EXPECT_FALSE(PassAtK(4, 5, 1).ok());
  EXPECT_FALSE(PassAtK(4, -1, 1).ok());
  EXPECT_FALSE(PassAtK(4, 1, 5).ok());
  EXPECT_FALSE(PassAtK(4, 1, 0).ok());
  EXPECT_FALSE(PassAtK(0, 0, 1).ok());
}

TEST(SeedStreams, EvaluationNeverPlaysATrainingSeed) {
  std::set<uint64_t> training;
  for (uint64_t seed : {0ull, 1ull, 11ull, 777ull, ~0ull}) {
    for (int64_t g = 0; g < 2000; ++g) {
      const uint64_t t = TrainingSeed(seed, g);
      const uint64_t e = EvaluationSeed(seed, g);
      EXPECT_EQ(t >> 63, 0u);
      EXPECT_EQ(e >> 63, 1u);
      training.insert(t);
    }
  }
  for (uint64_t seed : {0ull, 1ull, 11ull, 777ull, ~0ull}) {
    for (int64_t i = 0; i < 2000; ++i) EXPECT_FALSE(training.count(EvaluationSeed(seed, i)));
  }
  // Problems of one evaluation are distinct, and another seed gives other problems.
  std::set<uint64_t> problems;
  for (int64_t i = 0; i < 1000; ++i) problems.insert(EvaluationSeed(3, i));
  EXPECT_EQ(problems.size(), 1000u);
  EXPECT_NE(EvaluationSeed(3, 0), EvaluationSeed(4, 0));
}

EpisodeSummary Ended(int64_t index, int64_t group, const std::string& status, double outcome,
                     int64_t turns) {
  EpisodeSummary e;
  e.index = index;
  e.group = group;
  e.seed = EvaluationSeed(0, group);
  e.status = status;
  e.outcome_reward = outcome;
  e.turns = turns;
  e.action_digest = static_cast<uint64_t>(index) * 977;
  return e;
}

TEST(SummariseEpisodes, CountsSuccessesPerEpisodeAndPassAtKPerProblem) {
  // Problem 0: one of four right; problem 1: none (a wrong answer, truncations, a done episode
  // paying less than 1 is not a success).
  std::vector<EpisodeSummary> ended = {
      Ended(0, 0, "done", 1.0, 2),       Ended(1, 0, "done", 0.0, 1),
      Ended(2, 0, "max_turns", 0.0, 3),  Ended(3, 0, "done", 0.0, 2),
      Ended(4, 1, "done", 0.5, 1),       Ended(5, 1, "max_turns", 0.0, 3),
      Ended(6, 1, "max_tokens", 0.0, 2), Ended(7, 1, "env_error", 0.0, 1),
  };
  EvalResult r;
  ASSERT_TRUE(SummariseEpisodes(ended, 2, 4, &r).ok());
  EXPECT_EQ(r.successes, 1);
  EXPECT_DOUBLE_EQ(r.success_rate, 1.0 / 8);
  const Interval ci = WilsonInterval(1, 8);
  EXPECT_DOUBLE_EQ(r.ci.low, ci.low);
  EXPECT_DOUBLE_EQ(r.ci.high, ci.high);
  EXPECT_DOUBLE_EQ(r.reward_mean, 1.5 / 8);
  EXPECT_DOUBLE_EQ(r.mean_turns, 15.0 / 8);
  ASSERT_TRUE(r.pass_at_k.has_value());
  EXPECT_DOUBLE_EQ(*r.pass_at_k, 0.5);  // (1 + 0) / 2 problems
  EXPECT_GE(*r.pass_at_k, r.success_rate);
  EXPECT_EQ(r.endings, (std::map<std::string, int64_t>{
                           {"done", 4}, {"max_turns", 2}, {"max_tokens", 1}, {"env_error", 1}}));

  // The order episodes ended in does not change the digest; another action does.
  EvalResult reversed;
  ASSERT_TRUE(
      SummariseEpisodes(std::vector<EpisodeSummary>(ended.rbegin(), ended.rend()), 2, 4, &reversed)
          .ok());
  EXPECT_EQ(reversed.digest, r.digest);
  ended[5].action_digest += 1;
  EvalResult changed;
  ASSERT_TRUE(SummariseEpisodes(ended, 2, 4, &changed).ok());
  EXPECT_NE(changed.digest, r.digest);

  // One sample per problem: no pass@k.
  EvalResult single;
  EXPECT_FALSE(SummariseEpisodes(ended, 8, 1, &single).ok()) << "8 problems need 8 groups";
  for (size_t i = 0; i < ended.size(); ++i) ended[i].group = static_cast<int64_t>(i);
  ASSERT_TRUE(SummariseEpisodes(ended, 8, 1, &single).ok());
  EXPECT_FALSE(single.pass_at_k.has_value());
  EXPECT_FALSE(SummariseEpisodes(ended, 4, 1, &single).ok()) << "8 episodes are not 4 x 1";
}

ActorOptions Minimal() {
  ActorOptions o;
  o.model_config = "configs/model/tiny.yaml";
  o.env.name = "calculator";
  return o;
}

TEST(ActorOptions, NeedExactlyOneOfReplayAndSink) {
  ActorOptions neither = Minimal();
  EXPECT_EQ(ValidateActorOptions(neither).code(), StatusCode::kInvalidArgument);
  ActorOptions replay = Minimal();
  replay.replay_endpoint = "tcp://127.0.0.1:5555";
  replay.spill_dir = "/tmp/spill";
  EXPECT_TRUE(ValidateActorOptions(replay).ok());
  ActorOptions sink = Minimal();
  sink.episode_sink = [](const EpisodeSummary&) {};
  EXPECT_TRUE(ValidateActorOptions(sink).ok()) << "a sink needs no spill directory";
  ActorOptions both = replay;
  both.episode_sink = [](const EpisodeSummary&) {};
  const Status refused = ValidateActorOptions(both);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("replay.endpoint"), std::string::npos) << refused.ToString();
}

// A keyed weight publisher (CURVE) serves evaluation the keys of the actor config's
// weight_stream.auth, and refuses an evaluation without them.
TEST(Evaluate, AKeyedPublisherServesTheConfigsWeightStreamKeys) {
  const testing::TempDir keys;
  const std::string& dir = keys.path();
  for (const char* name : {"learner", "actor"}) {
    auto pair = transport::GenerateCurveKeyPair();
    ASSERT_TRUE(pair.ok()) << pair.status().ToString();
    ASSERT_TRUE(transport::WriteCurveKeyFiles(dir, name, *pair, false).ok());
  }
  // ctest runs tests from the build directory and says where the sources are.
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  const std::string model_config = std::string(source ? source : ".") + "/configs/model/tiny.yaml";
  auto config = LoadModelConfig(model_config);
  ASSERT_TRUE(config.ok());
  auto model = Model::Create(*config, 0);
  ASSERT_TRUE(model.ok());
  auto bytes = (*model)->SaveToBytes();
  ASSERT_TRUE(bytes.ok());
  transport::WeightPublisherOptions publisher_options;
  publisher_options.endpoint = "tcp://127.0.0.1:0";
  publisher_options.auth.secret_key = dir + "/learner.key_secret";
  publisher_options.auth.authorized_keys = {dir + "/actor.key"};
  auto publisher = transport::WeightPublisher::Start(publisher_options);
  ASSERT_TRUE(publisher.ok()) << publisher.status().ToString();
  ASSERT_TRUE((*publisher)->Publish(3, std::move(*bytes), config->name).ok());

  EvaluateOptions o;
  o.actor = Minimal();
  o.actor.model_config = model_config;
  o.actor.max_turns = 2;
  o.episodes = 2;
  o.weights_endpoint = (*publisher)->endpoint();
  o.weights_timeout = std::chrono::milliseconds(5000);
  const Status keyless = Evaluate(o).status();
  EXPECT_EQ(keyless.code(), StatusCode::kFailedPrecondition) << keyless.ToString();
  o.actor.weights_auth.secret_key = dir + "/actor.key_secret";
  o.actor.weights_auth.server_key = dir + "/learner.key";
  auto keyed = Evaluate(o);
  ASSERT_TRUE(keyed.ok()) << keyed.status().ToString();
  EXPECT_EQ(keyed->policy_version, 3u);
  EXPECT_EQ(keyed->episodes, 2);
}

TEST(Evaluate, RefusesBadOptionsBeforeLoadingAnything) {
  EvaluateOptions o;
  o.actor = Minimal();
  o.actor.model_config = "/nonexistent/model.yaml";  // never read: the options fail first
  o.weights = "w.safetensors";
  o.weights_endpoint = "tcp://127.0.0.1:1";
  EXPECT_EQ(Evaluate(o).status().code(), StatusCode::kInvalidArgument);  // both weights
  o.weights_endpoint.clear();
  o.samples = 4;
  o.actor.sampling.temperature = 0;
  Status greedy_samples = Evaluate(o).status();
  EXPECT_EQ(greedy_samples.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(greedy_samples.message().find("temperature"), std::string::npos);
  o.samples = 1;
  o.env = "retrieval";
  Status mismatch = Evaluate(o).status();
  EXPECT_EQ(mismatch.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("does not match"), std::string::npos) << mismatch.ToString();
  o.actor.env = {};
  o.env = "no_such_env";
  EXPECT_EQ(Evaluate(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strider::actors
