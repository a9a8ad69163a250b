// Pieces the RL learner's integration tests share: trajectories a real actor plays into a
// replay server, a learner config on the tiny model, and reading what the learner wrote.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider::testing {

// `episodes` calculator episodes in groups of 4 from the tiny model's seed-0 weights.
inline void PlayEpisodes(const TempDir& dir, const std::string& endpoint, int episodes) {
  const std::string config = dir.Sub("actor.yaml");
  std::ofstream(config) << "actor:\n  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
                        << "  model_seed: 0\n  threads: 1\n  episodes: " << episodes
                        << "\n  episodes_in_flight: 8\n  group_size: 4\n  max_turns: 2\n"
                        << "  max_episode_tokens: 1024\n  seed: 3\n  segment_tokens: 128\n"
                        << "  sampling: {temperature: 1.0, max_new_tokens: 32}\n"
                        << "  engine: {cache_budget_mb: 64}\n"
                        << "  replay: {endpoint: tcp://127.0.0.1:1}\n"
                        << "  metrics: {interval_s: 5, progress: false}\n"
                        << "env:\n  name: calculator\n  options: {difficulty: 1}\n";
  ChildProcess actor;
  ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", config, "--replay", endpoint,
                           "--spill-dir", dir.Sub("spill")}));
  nlohmann::json finished = WaitEvent(actor, "finished", 120000);
  ASSERT_EQ(actor.Wait(), 0);
  ASSERT_TRUE(finished.is_object());
  ASSERT_EQ(finished["metrics"]["episodes"], episodes);
}

// A learner on the tiny model's seed-`init_seed` weights; `extra` adds top-level keys.
struct LearnerConfigText {
  std::string extra;
  int init_seed = 0;
  std::string replay = "{table: groups, learner_id: l0, units_per_step: 2, sample_timeout_s: 60}";
  std::string train = "{steps: 4, ppo_epochs: 2, minibatches: 2, chunk_tokens: 64}";
  std::string checkpoint = "{every_steps: 2}";
  std::string advantages = "{estimator: outcome_group}";  // objective.advantages
  std::string policy = "{entropy_coef: 0.001}";          // objective.policy
};

inline std::string WriteLearnerConfig(const TempDir& dir, const std::string& name,
                                      const LearnerConfigText& text) {
  const std::string path = dir.Sub(name);
  std::ofstream(path) << "mode: rl\nmodel_config: " << SourceDir()
                      << "/configs/model/tiny.yaml\ninit_seed: " << text.init_seed
                      << "\nseed: 7\nthreads: 1\n"
                      << "replay: " << text.replay << "\n"
                      << "publish: {every_steps: 1}\n"
                      << "optimizer: {learning_rate: 0.001, weight_decay: 0.0}\n"
                      << "train: " << text.train << "\n"
                      << "objective:\n  advantages: " << text.advantages << "\n"
                      << "  policy: " << text.policy << "\n"
                      << "checkpoint: " << text.checkpoint << "\n"
                      << text.extra;
  return path;
}

inline std::string WriteLearnerConfig(const TempDir& dir, const std::string& name,
                                      const std::string& extra = "", int init_seed = 0) {
  LearnerConfigText text;
  text.extra = extra;
  text.init_seed = init_seed;
  return WriteLearnerConfig(dir, name, text);
}

inline std::vector<nlohmann::json> ReadMetrics(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace strider::testing
