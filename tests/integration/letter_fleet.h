// The fleet whose reward must rise: a real replay server, a real RL learner and a real actor in
// synchronous rounds on the `letter` environment (tests/learner/letter_env.cc), 40 learner
// steps from the tiny model's random weights. learner_rl_slow_test runs it on the CPU and
// gpu_fleet_test with the learner and the actor sharing one GPU; only the knobs below differ.
#pragma once

#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider::testing {

struct LetterFleetOptions {
  std::string letter_env_path;  // the built strider_letter_env library
  int threads = 1;              // the learner's and the actor's
  int cache_budget_mb = 64;     // the actor engine's
  int ready_timeout_ms = 60000;
  std::string device;  // `--device` of the learner and the actor; empty leaves their default
};

// Runs the fleet to the learner's `finished` and stops it; *lines gets the learner's
// run/metrics.jsonl, one object a step. Fatal failures return early: callers wrap the call in
// ASSERT_NO_FATAL_FAILURE.
inline void RunLetterFleet(const TempDir& dir, const LetterFleetOptions& options,
                           std::vector<nlohmann::json>* lines) {
  std::vector<std::string> device_flag;
  if (!options.device.empty()) device_flag = {"--device", options.device};

  ChildProcess server;
  const ReplayEndpoints replay = StartReplayServer(
      server, dir.Sub("db"), dir.Sub("replay.yaml"),
      "server: {stats_interval_s: 0}\n"
      "tables:\n  - name: groups\n    unit: group\n"
      "    sampler: fifo\n    max_staleness: 0\n    capacity: 1000\n"
      "    rate_limiter: {min_fill: 1, max_times_sampled: 1}\n");
  ASSERT_FALSE(replay.learner.empty());

  const std::string learner_config = dir.Sub("learner.yaml");
  std::ofstream(learner_config)
      << "mode: rl\nmodel_config: " << SourceDir() << "/configs/model/tiny.yaml\n"
      << "init_seed: 0\nseed: 1\nthreads: " << options.threads << "\n"
      << "replay: {table: groups, units_per_step: 4, sample_timeout_s: 120}\n"
      << "publish: {every_steps: 1}\n"
      << "optimizer: {learning_rate: 0.01, weight_decay: 0.0, clip_norm: 1.0}\n"
      << "train: {steps: 40, sync: true, chunk_tokens: 256}\n"
      << "objective:\n  advantages: {estimator: outcome_group}\n"
      << "  policy: {eps_low: 0.2, eps_high: 0.28}\n  value: {coef: 0.0}\n";
  std::vector<std::string> learner_args = {
      StriderBinary(), "learner",         "--config",  learner_config,       "--run-dir",
      dir.Sub("run"),  "--replay",        replay.learner, "--publish", "tcp://127.0.0.1:0"};
  learner_args.insert(learner_args.end(), device_flag.begin(), device_flag.end());
  ChildProcess learner;
  ASSERT_TRUE(learner.Start(learner_args));
  nlohmann::json ready = WaitEvent(learner, "ready", options.ready_timeout_ms);
  ASSERT_TRUE(ready.is_object());

  const std::string actor_config = dir.Sub("actor.yaml");
  std::ofstream(actor_config)
      << "actor:\n  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
      << "  model_seed: 0\n  threads: " << options.threads
      << "\n  episodes: 0\n  episodes_in_flight: 16\n"
      << "  group_size: 4\n  max_turns: 1\n  max_episode_tokens: 512\n  seed: 1\n"
      << "  segment_tokens: 256\n  sampling: {temperature: 1.0, max_new_tokens: 24}\n"
      << "  engine: {cache_budget_mb: " << options.cache_budget_mb
      << "}\n  replay: {endpoint: tcp://127.0.0.1:1}\n"
      << "  weight_stream: {endpoint: " << ready["weights"].get<std::string>()
      << ", poll_ms: 50, sync: true, round_groups: 4}\n"
      << "  metrics: {interval_s: 5, progress: false}\n"
      << "env:\n  library: " << options.letter_env_path << "\n";
  std::vector<std::string> actor_args = {StriderBinary(), "actor",        "--config",
                                         actor_config,    "--replay",     replay.actor,
                                         "--spill-dir",   dir.Sub("spill")};
  actor_args.insert(actor_args.end(), device_flag.begin(), device_flag.end());
  ChildProcess actor;
  ASSERT_TRUE(actor.Start(actor_args));

  nlohmann::json finished = WaitEvent(learner, "finished", 600000);
  EXPECT_EQ(learner.Wait(), 0);
  actor.Signal(SIGTERM);
  EXPECT_EQ(actor.Wait(), 0);
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0);
  ASSERT_TRUE(finished.is_object());

  std::ifstream in(dir.Sub("run/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) lines->push_back(nlohmann::json::parse(line));
}

// The mean of `key` over lines [begin, end).
inline double MeanOf(const std::vector<nlohmann::json>& lines, size_t begin, size_t end,
                     const char* key) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += lines[i][key].get<double>();
  return sum / static_cast<double>(end - begin);
}

}  // namespace strider::testing
