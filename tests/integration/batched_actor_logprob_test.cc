// The live figure of the quickstart fleet (configs/quickstart.yaml): a `strider actor` with the
// quickstart's batching (configs/actor/calculator_quickstart.yaml: the calc model, one thread,
// 64 episodes in flight in groups of 4, decode batches of up to 64 rows, one-step calculator
// problems at temperature 1) writes its trajectories to a real `strider replay serve`; each is
// sampled back through the learner endpoint and scored with rl::ScoreTrajectory as the
// quickstart's learner does it (configs/rl/calculator_sync.yaml: chunks of 512 tokens, routing
// replay). Every action token within 1e-5 of its stored behaviour log-prob, the fleet's
// `logprob_mismatch_max`. The figures (and those at learner_logprob_test's 128-token chunks) are
// printed as JSON lines.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
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

struct Figures {
  int64_t tokens = 0;
  double max = 0;
  double median_of_maxima = 0;  // over trajectories, as the fleet's per-step maxima
};

class BatchedActorLogProbs : public strider::testing::ActorScoringTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(InitWeights("calc", 3));
    Result<ModelConfig> config = LoadModelConfig(model_config_path_);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    // A trained policy's confident logits: the output rows of the random initialisation made
    // 100 times larger. Rounding in the hidden states moves a log-prob in proportion to the
    // logits' scale; at init's (nearly uniform next tokens) every path agrees within 5e-7,
    // as learner_logprob_test reads, and nothing here could fail.
    {
      Result<std::unique_ptr<Model>> initial = Model::Load(*config, weights_);
      ASSERT_TRUE(initial.ok()) << initial.status().ToString();
      at::NoGradGuard no_grad;
      for (const auto& [name, tensor] : (*initial)->tensors()) {
        if (name == "output") tensor.mul_(100.0);
      }
      ASSERT_TRUE((*initial)->Save(weights_).ok());
    }
    // The quickstart learner's one thread.
    ASSERT_NO_FATAL_FAILURE(LoadModel(1));
    ASSERT_NO_FATAL_FAILURE(StartReplay("batched-logprob-test"));
  }

  // configs/actor/calculator_quickstart.yaml with a finite episode count and no weight stream.
  void RunActor(int64_t episodes) {
    const std::string path = dir_.Sub("actor.yaml");
    std::ofstream(path) << "actor:\n"
                        << "  id: actor-0\n"
                        << "  model: " << model_config_path_ << "\n"
                        << "  threads: 1\n  episodes: " << episodes
                        << "\n  episodes_in_flight: 64\n  group_size: 4\n"
                        << "  max_turns: 5\n  max_episode_tokens: 2048\n  seed: 1\n"
                        << "  segment_tokens: 1024\n"
                        << "  sampling: {temperature: 1.0, top_k: 0, top_p: 1.0, "
                           "max_new_tokens: 48}\n"
                        << "  engine: {cache_budget_mb: 256, max_batch: 64}\n"
                        << "  replay: {endpoint: tcp://127.0.0.1:1, spill_after_ms: 3000}\n"
                        << "  metrics: {interval_s: 5, progress: false}\n"
                        << "env:\n  name: calculator\n  options: {difficulty: 1, steps: 1}\n";
    ChildProcess actor;
    ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", path, "--replay",
                             actor_endpoint_, "--weights", weights_, "--spill-dir",
                             dir_.Sub("spill")}));
    const nlohmann::json finished = WaitEvent(actor, "finished", 240000);
    ASSERT_EQ(actor.Wait(), 0);
    ASSERT_TRUE(finished.is_object());
    EXPECT_EQ(finished["metrics"]["episodes"], episodes);
    EXPECT_EQ(finished["metrics"]["acked_segments"], finished["metrics"]["segments"]);
  }

  std::vector<std::vector<schema::SegmentData>> SampleTrajectories(size_t count) {
    return testing::SampleTrajectories(*learner_, step_, count, 40);
  }

  Figures Score(const std::vector<std::vector<schema::SegmentData>>& trajectories,
                int64_t chunk_tokens) {
    rl::ScoringOptions options;
    options.chunk_tokens = chunk_tokens;
    options.mismatch_threshold = 1e-4;
    Figures figures;
    std::vector<double> maxima;
    for (const std::vector<schema::SegmentData>& segments : trajectories) {
      Result<rl::TrajectoryScores> scores = rl::ScoreTrajectory(*model_, segments, options);
      EXPECT_TRUE(scores.ok()) << scores.status().ToString();
      if (!scores.ok()) continue;
      EXPECT_NE(scores->mismatch.verdict, rl::MismatchVerdict::kNotMeasured);
      figures.tokens += scores->mismatch.tokens;
      figures.max = std::max(figures.max, scores->mismatch.max);
      maxima.push_back(scores->mismatch.max);
    }
    if (!maxima.empty()) {
      std::sort(maxima.begin(), maxima.end());
      figures.median_of_maxima = maxima[maxima.size() / 2];
    }
    std::printf("%s\n", nlohmann::json({{"chunk_tokens", chunk_tokens},
                                        {"trajectories", maxima.size()},
                                        {"action_tokens", figures.tokens},
                                        {"max", figures.max},
                                        {"median_trajectory_max", figures.median_of_maxima}})
                            .dump()
                            .c_str());
    return figures;
  }

};

TEST_F(BatchedActorLogProbs, QuickstartBatchingEqualsTheLearnersScoring) {
  constexpr int64_t kEpisodes = 64;  // one round: 16 groups of 4 decoded together
  RunActor(kEpisodes);
  const auto trajectories = SampleTrajectories(kEpisodes);
  const Figures live = Score(trajectories, 512);
  EXPECT_GT(live.tokens, 1000);
  EXPECT_LE(live.max, 1e-5);
  // Chunks shorter than the actor's prefill calls cut its prompts elsewhere: the chunked
  // forms then round the prompt's states differently (printed, not held).
  Score(trajectories, 128);
}

}  // namespace
}  // namespace strider
