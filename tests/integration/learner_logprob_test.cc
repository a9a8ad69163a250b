// The learner's log-probs equal the actor's behaviour log-probs, with real processes: weights
// from `strider model init`, a `strider replay serve` with a trajectory table, and `strider
// actor` runs on them (the calculator at temperature 1, and at temperature 0.7 with top-p 0.9
// and top-k 50; retrieval with short documents). The test samples every stored trajectory back
// through replay's learner endpoint, as the RL learner does, and scores each with
// rl::ScoreTrajectory on the same weights: every action token within 1e-5 of its stored
// behaviour log-prob. Scored under settings the actor did not use, the check says
// above_threshold; scored without routing replay, the learner's own routing decides, and the
// figures of both are printed as JSON lines (docs/learner.md quotes them).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "learner/learner.h"
#include "learner/rl/scoring.h"
#include "replay/client.h"
#include "tests/integration/actor_scoring_fixture.h"
#include "tests/integration/child_process.h"
#include "tests/integration/sample_trajectories.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::ChildProcess;
using strider::testing::StriderBinary;
using strider::testing::WaitEvent;

const char kCalculator[] = "env:\n  name: calculator\n  options: {difficulty: 1}\n";

// One run's scoring figures over all of its action tokens.
struct Figures {
  int64_t trajectories = 0;
  int64_t tokens = 0;
  double max = 0;  // largest |learner - behaviour| of any action token
  double p99 = 0;  // nearest rank over all action tokens of the run
};

// How many (position, sparse layer) expert sets the learner's own routing on the scoring path
// chooses differently from the actor's stored ones, and out of how many. Not counted (0 of 0) on
// trajectories with images, whose chunks the scoring pass places around them.
std::pair<int64_t, int64_t> RoutingDisagreements(const Model& model,
                                                 const std::vector<schema::SegmentData>& segments) {
  for (const schema::SegmentData& s : segments) {
    if (!s.images.empty()) return {0, 0};
  }
  std::vector<int64_t> ids;
  std::vector<uint16_t> stored;
  std::vector<bool> covered;
  for (const schema::SegmentData& s : segments) {
    ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
    std::vector<bool> has_record;
    const std::vector<uint16_t> rows = schema::ExpertsByPosition(s, &has_record);
    stored.insert(stored.end(), rows.begin(), rows.end());
    covered.insert(covered.end(), has_record.begin(), has_record.end());
  }
  ChunkedPassOptions options;
  options.chunk_tokens = 128;
  options.backward = false;
  options.record_routing = true;
  Result<ChunkedPassResult> pass =
      RunChunkedPass(model, {at::tensor(ids, at::kLong).view({1, -1}), {}}, options,
                     [](const ChunkView&) -> Result<at::Tensor> { return at::Tensor(); });
  EXPECT_TRUE(pass.ok()) << pass.status().ToString();
  if (!pass.ok()) return {0, 0};
  const int64_t layers = static_cast<int64_t>(pass->routing.layers.size());
  const int64_t k = segments.front().routing.top_k;
  int64_t differ = 0, decisions = 0;
  for (int64_t layer = 0; layer < layers; ++layer) {
    const at::Tensor own =
        std::get<0>(pass->routing.layers[layer].experts[0].sort(-1)).contiguous();
    const int64_t* o = own.data_ptr<int64_t>();
    for (size_t p = 0; p < ids.size(); ++p) {
      if (!covered[p]) continue;
      std::vector<int64_t> chosen(k);
      for (int64_t j = 0; j < k; ++j) chosen[j] = stored[(p * layers + layer) * k + j];
      std::sort(chosen.begin(), chosen.end());
      differ += std::equal(chosen.begin(), chosen.end(), o + p * k) ? 0 : 1;
      ++decisions;
    }
  }
  return {differ, decisions};
}

class LearnerLogProbs : public strider::testing::ActorScoringTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(InitWeights("tiny", 7));
    ASSERT_NO_FATAL_FAILURE(LoadModel(2));
    ASSERT_NO_FATAL_FAILURE(StartReplay("logprob-test"));
  }

  // Runs `strider actor` to completion on the shared weights: configs/actor/calculator_tiny.yaml
  // with fewer, shorter episodes (segments of 96 tokens so trajectories span several), the
  // sampling block and environment given.
  void RunActor(const std::string& name, int64_t episodes, const std::string& sampling,
                const std::string& env_block) {
    const std::string path = dir_.Sub(name + ".yaml");
    std::ofstream(path) << "actor:\n"
                        << "  id: " << name << "\n"
                        << "  model: " << model_config_path_ << "\n"
                        << "  threads: 2\n  episodes: " << episodes
                        << "\n  episodes_in_flight: 8\n  group_size: 4\n"
                        << "  max_turns: 3\n  max_episode_tokens: 2048\n  seed: 5\n"
                        << "  segment_tokens: 96\n"
                        << "  sampling: {" << sampling << ", max_new_tokens: 40}\n"
                        << "  engine: {cache_budget_mb: 64}\n"
                        << "  replay: {endpoint: tcp://127.0.0.1:1, spill_after_ms: 1000}\n"
                        << "  metrics: {interval_s: 5, progress: false}\n"
                        << env_block;
    ChildProcess actor;
    ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", path, "--replay",
                             actor_endpoint_, "--weights", weights_, "--spill-dir",
                             dir_.Sub(name + "-spill")}));
    const nlohmann::json finished = WaitEvent(actor, "finished", 60000);
    ASSERT_EQ(actor.Wait(), 0);
    ASSERT_TRUE(finished.is_object());
    EXPECT_EQ(finished["metrics"]["episodes"], episodes);
    EXPECT_EQ(finished["metrics"]["acked_segments"], finished["metrics"]["segments"]);
  }

  // `count` whole trajectories from the learner endpoint, each as its segments in order.
  std::vector<std::vector<schema::SegmentData>> SampleTrajectories(size_t count) {
    return testing::SampleTrajectories(*learner_, step_, count, 20);
  }

  // Scores every trajectory with routing replay; returns the run's figures, and those of the
  // same trajectories scored with the learner's own routing in `own_routing`.
  Figures Score(const std::vector<std::vector<schema::SegmentData>>& trajectories,
                Figures* own_routing) {
    Figures figures;
    routing_differ_ = routing_decisions_ = 0;
    std::vector<float> learner, behaviour, learner_own;
    rl::ScoringOptions options;
    options.chunk_tokens = 128;  // several chunks per trajectory, cut apart from the segments
    rl::ScoringOptions unreplayed = options;
    unreplayed.replay_routing = false;
    for (const std::vector<schema::SegmentData>& segments : trajectories) {
      SCOPED_TRACE(segments.front().trajectory_id.Hex());
      EXPECT_GE(segments.size(), 2u) << "a trajectory spans several segments";
      Result<rl::TrajectoryScores> scores = rl::ScoreTrajectory(*model_, segments, options);
      EXPECT_TRUE(scores.ok()) << scores.status().ToString();
      if (!scores.ok()) continue;
      EXPECT_EQ(scores->mismatch.verdict, rl::MismatchVerdict::kWithinThreshold);
      EXPECT_GT(scores->mismatch.tokens, 0);
      for (size_t i = 0; i < scores->logprobs.size(); ++i) {
        EXPECT_LE(std::abs(scores->logprobs[i] - scores->behaviour_logprobs[i]), 1e-5)
            << "action token at position " << scores->positions[i];
      }
      learner.insert(learner.end(), scores->logprobs.begin(), scores->logprobs.end());
      behaviour.insert(behaviour.end(), scores->behaviour_logprobs.begin(),
                       scores->behaviour_logprobs.end());
      Result<rl::TrajectoryScores> own = rl::ScoreTrajectory(*model_, segments, unreplayed);
      EXPECT_TRUE(own.ok()) << own.status().ToString();
      if (own.ok()) learner_own.insert(learner_own.end(), own->logprobs.begin(), own->logprobs.end());
      const auto [differ, decisions] = RoutingDisagreements(*model_, segments);
      routing_differ_ += differ;
      routing_decisions_ += decisions;
      ++figures.trajectories;
    }
    const rl::MismatchStats all = rl::MeasureMismatch(learner, behaviour, 1e-4);
    figures.tokens = all.tokens;
    figures.max = all.max;
    figures.p99 = all.p99;
    if (own_routing != nullptr && learner_own.size() == behaviour.size()) {
      const rl::MismatchStats own = rl::MeasureMismatch(learner_own, behaviour, 1e-4);
      *own_routing = {figures.trajectories, own.tokens, own.max, own.p99};
    }
    return figures;
  }

  void Print(const std::string& setting, const Figures& replayed, const Figures& own) const {
    nlohmann::json line = {{"setting", setting},
                                 {"trajectories", replayed.trajectories},
                                 {"action_tokens", replayed.tokens},
                                 {"max", replayed.max},
                                 {"p99", replayed.p99},
                                 {"own_routing_max", own.max},
                                 {"own_routing_p99", own.p99}};
    if (routing_decisions_ > 0) {
      line["routing_decisions"] = routing_decisions_;
      line["routing_disagreements"] = routing_differ_;
    }
    std::printf("%s\n", line.dump().c_str());
  }

  int64_t routing_differ_ = 0;  // of the last Score call
  int64_t routing_decisions_ = 0;
};

TEST_F(LearnerLogProbs, CalculatorAtBothSettingsEqualsTheBehaviourLogProbs) {
  RunActor("t1", 16, "temperature: 1.0, top_k: 0, top_p: 1.0", kCalculator);
  const auto plain = SampleTrajectories(16);
  for (const auto& segments : plain) {
    for (const schema::SegmentData& s : segments) {
      EXPECT_EQ(s.temperature, 1.0f);
      EXPECT_EQ(s.routing.coverage, schema::RoutingCoverage::kAll) << s.key().ToString();
    }
  }
  Figures own_plain;
  const Figures replayed_plain = Score(plain, &own_plain);
  Print("calculator temperature 1", replayed_plain, own_plain);
  EXPECT_EQ(replayed_plain.trajectories, 16);
  EXPECT_LE(replayed_plain.max, 1e-5);

  RunActor("t07", 16, "temperature: 0.7, top_k: 50, top_p: 0.9", kCalculator);
  auto truncated = SampleTrajectories(16);
  for (const auto& segments : truncated) {
    for (const schema::SegmentData& s : segments) {
      EXPECT_EQ(s.temperature, 0.7f);
      EXPECT_EQ(s.top_k, 50u);
      EXPECT_EQ(s.top_p, 0.9f);
    }
  }
  Figures own_truncated;
  const Figures replayed_truncated = Score(truncated, &own_truncated);
  Print("calculator temperature 0.7 top-p 0.9 top-k 50", replayed_truncated, own_truncated);
  EXPECT_EQ(replayed_truncated.trajectories, 16);
  EXPECT_LE(replayed_truncated.max, 1e-5);

  // The same trajectories scored as if sampled at temperature 1 without cuts: the learner's
  // distribution is not the actor's, and every trajectory is refused.
  int64_t refused = 0;
  double smallest_max = std::numeric_limits<double>::infinity();
  for (auto& segments : truncated) {
    for (schema::SegmentData& s : segments) {
      s.temperature = 1.0f;
      s.top_k = 0;
      s.top_p = 1.0f;
    }
    Result<rl::TrajectoryScores> wrong = rl::ScoreTrajectory(*model_, segments, {});
    ASSERT_TRUE(wrong.ok()) << wrong.status().ToString();
    refused += wrong->mismatch.verdict == rl::MismatchVerdict::kAboveThreshold ? 1 : 0;
    smallest_max = std::min(smallest_max, wrong->mismatch.max);
  }
  std::printf("%s\n", nlohmann::json({{"setting", "temperature 0.7 scored at temperature 1"},
                                      {"refused", refused},
                                      {"smallest_max", smallest_max}})
                          .dump()
                          .c_str());
  EXPECT_EQ(refused, 16);
  EXPECT_GT(smallest_max, 1e-4);
}

TEST_F(LearnerLogProbs, RetrievalTrajectoriesEqualTheBehaviourLogProbs) {
  RunActor("retrieval", 4, "temperature: 1.0, top_k: 0, top_p: 1.0",
           "env:\n  name: retrieval\n  options: {total_tokens: 1024, parts: 2}\n");
  const auto trajectories = SampleTrajectories(4);
  Figures own;
  const Figures replayed = Score(trajectories, &own);
  Print("retrieval temperature 1", replayed, own);
  EXPECT_EQ(replayed.trajectories, 4);
  EXPECT_LE(replayed.max, 1e-5);
}

// Image observations: 32x32 pictures fill 64 patch placeholders each, which the scoring chunks
// of 128 tokens cut through unless the pass moves its chunk boundaries around them.
TEST_F(LearnerLogProbs, VisionTrajectoriesEqualTheBehaviourLogProbs) {
  RunActor("vision", 4, "temperature: 1.0, top_k: 0, top_p: 1.0", "env:\n  name: vision_count\n");
  const auto trajectories = SampleTrajectories(4);
  int64_t images = 0;
  for (const auto& segments : trajectories) {
    for (const schema::SegmentData& s : segments) images += static_cast<int64_t>(s.images.size());
  }
  EXPECT_GE(images, 4);
  Figures own;
  const Figures replayed = Score(trajectories, &own);
  Print("vision_count temperature 1", replayed, own);
  EXPECT_EQ(replayed.trajectories, 4);
  EXPECT_LE(replayed.max, 1e-5);
}

}  // namespace
}  // namespace strider
