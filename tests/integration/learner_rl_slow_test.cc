// Reward rises: a real replay server, a real RL learner and a real actor in synchronous rounds
// on the `letter` environment (tests/learner/letter_env.cc: a reply earns the fraction of its
// characters that are "a"). From the tiny model's random weights the policy gradient must raise
// the mean reward measurably within 40 learner steps, with every step trained on its own
// version's trajectories only.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::ChildProcess;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;
using strider::testing::WaitEvent;

double MeanOf(const std::vector<nlohmann::json>& lines, size_t begin, size_t end,
              const char* key) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += lines[i][key].get<double>();
  return sum / static_cast<double>(end - begin);
}

TEST(RlRun, RewardRisesOnAnEasyEnvironmentInSyncRounds) {
  TempDir dir;
  ChildProcess server;
  const strider::testing::ReplayEndpoints replay = strider::testing::StartReplayServer(
      server, dir.Sub("db"), dir.Sub("replay.yaml"),
      "server: {stats_interval_s: 0}\n"
      "tables:\n  - name: groups\n    unit: group\n"
      "    sampler: fifo\n    max_staleness: 0\n    capacity: 1000\n"
      "    rate_limiter: {min_fill: 1, max_times_sampled: 1}\n");
  ASSERT_FALSE(replay.learner.empty());

  const std::string learner_config = dir.Sub("learner.yaml");
  std::ofstream(learner_config)
      << "mode: rl\nmodel_config: " << SourceDir() << "/configs/model/tiny.yaml\n"
      << "init_seed: 0\nseed: 1\nthreads: 1\n"
      << "replay: {table: groups, units_per_step: 4, sample_timeout_s: 120}\n"
      << "publish: {every_steps: 1}\n"
      << "optimizer: {learning_rate: 0.01, weight_decay: 0.0, clip_norm: 1.0}\n"
      << "train: {steps: 40, sync: true, chunk_tokens: 256}\n"
      << "objective:\n  advantages: {estimator: outcome_group}\n"
      << "  policy: {eps_low: 0.2, eps_high: 0.28}\n  value: {coef: 0.0}\n";
  ChildProcess learner;
  ASSERT_TRUE(learner.Start({StriderBinary(), "learner", "--config", learner_config, "--run-dir",
                             dir.Sub("run"), "--replay", replay.learner, "--publish",
                             "tcp://127.0.0.1:0"}));
  nlohmann::json ready = WaitEvent(learner, "ready", 60000);
  ASSERT_TRUE(ready.is_object());

  const std::string actor_config = dir.Sub("actor.yaml");
  std::ofstream(actor_config)
      << "actor:\n  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
      << "  model_seed: 0\n  threads: 1\n  episodes: 0\n  episodes_in_flight: 16\n"
      << "  group_size: 4\n  max_turns: 1\n  max_episode_tokens: 512\n  seed: 1\n"
      << "  segment_tokens: 256\n  sampling: {temperature: 1.0, max_new_tokens: 24}\n"
      << "  engine: {cache_budget_mb: 64}\n  replay: {endpoint: tcp://127.0.0.1:1}\n"
      << "  weight_stream: {endpoint: " << ready["weights"].get<std::string>()
      << ", poll_ms: 50, sync: true, round_groups: 4}\n"
      << "  metrics: {interval_s: 5, progress: false}\n"
      << "env:\n  library: " << STRIDER_LETTER_ENV_PATH << "\n";
  ChildProcess actor;
  ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", actor_config, "--replay",
                           replay.actor, "--spill-dir", dir.Sub("spill")}));

  nlohmann::json finished = WaitEvent(learner, "finished", 600000);
  EXPECT_EQ(learner.Wait(), 0);
  actor.Signal(SIGTERM);
  EXPECT_EQ(actor.Wait(), 0);
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0);
  ASSERT_TRUE(finished.is_object());

  std::vector<nlohmann::json> lines;
  std::ifstream in(dir.Sub("run/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 40u);
  for (const nlohmann::json& m : lines) {
    EXPECT_EQ(m["staleness_mean"], 0) << "sync mode trained on another version's trajectories";
    EXPECT_EQ(m["excluded_trajectories"], 0);
    EXPECT_GT(m["trained_trajectories"].get<int64_t>(), 0);
  }
  // Random weights put about 1 / vocabulary of their mass on "a": the first steps earn ~0.005.
  const double first = MeanOf(lines, 0, 10, "reward_mean");
  const double last = MeanOf(lines, 30, 40, "reward_mean");
  std::cout << "reward_mean: first 10 steps " << first << ", last 10 steps " << last
            << "; entropy " << lines.front()["entropy"] << " -> " << lines.back()["entropy"]
            << std::endl;
  EXPECT_GT(last, 3 * first);
  EXPECT_GT(last - first, 0.02);
  EXPECT_LT(lines.back()["entropy"].get<double>(), lines.front()["entropy"].get<double>());
}

}  // namespace
}  // namespace strider
