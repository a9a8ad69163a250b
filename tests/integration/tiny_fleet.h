// The child configs of a tiny RL fleet for tests that run `strider launch`: a replay table of
// groups, the tiny learner and one tiny actor on `env_yaml` (the actor config's `env:` section).
// Small enough that a learner step takes about a second on a loaded 2-core machine: one group
// of four short episodes per step. Writes replay.yaml, learner.yaml and actor.yaml into `dir`.
#pragma once

#include <fstream>
#include <string>

#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider::testing {

struct TinyFleetOptions {
  std::string env_yaml;  // "env:\n  name: ...\n"
  int max_turns = 2;
  int max_episode_tokens = 512;
  int stats_interval_s = 1;  // the replay server's stats lines (the launcher's replay_fill)
};

inline void WriteTinyFleetConfigs(const TempDir& dir, const TinyFleetOptions& options) {
  std::ofstream(dir.Sub("replay.yaml"))
      << "server: {stats_interval_s: " << options.stats_interval_s << "}\n"
      << "tables:\n  - name: groups\n    unit: group\n    sampler: fifo\n"
      << "    capacity: 1000\n    rate_limiter: {min_fill: 1, max_times_sampled: 1}\n";
  std::ofstream(dir.Sub("learner.yaml"))
      << "mode: rl\nmodel_config: " << SourceDir() << "/configs/model/tiny.yaml\n"
      << "init_seed: 0\nseed: 7\nthreads: 1\n"
      << "replay: {table: groups, learner_id: l0, units_per_step: 1, sample_timeout_s: 120}\n"
      << "publish: {every_steps: 1}\n"
      << "optimizer: {learning_rate: 0.001, weight_decay: 0.0}\n"
      << "train: {steps: 100, ppo_epochs: 1, minibatches: 1, chunk_tokens: 128}\n"
      << "objective:\n  advantages: {estimator: outcome_group}\n"
      << "checkpoint: {every_steps: 1}\n";
  std::ofstream(dir.Sub("actor.yaml"))
      << "actor:\n  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
      << "  model_seed: 0\n  threads: 1\n  episodes: 0\n  episodes_in_flight: 4\n"
      << "  group_size: 4\n  max_turns: " << options.max_turns
      << "\n  max_episode_tokens: " << options.max_episode_tokens << "\n  seed: 3\n"
      << "  segment_tokens: 128\n  sampling: {temperature: 1.0, max_new_tokens: 16}\n"
      << "  engine: {cache_budget_mb: 32}\n  replay: {endpoint: tcp://127.0.0.1:1}\n"
      << "  metrics: {interval_s: 1, progress: false}\n"
      << options.env_yaml;
}

}  // namespace strider::testing
