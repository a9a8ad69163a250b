// Plays one episode of an environment with a scripted policy, for the envs tests: the shared
// loop (envs/episode.h), with every step kept and any episode error a test failure.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "envs/environment.h"
#include "envs/episode.h"

namespace strider::envs::testing {

struct Episode {
  std::vector<Observation> observations;  // the first observation, then one per step
  std::vector<StepResult> steps;
};

inline Episode Play(Environment& env, ScriptedPolicy& policy, uint64_t seed,
                    const Options& episode_options = {}) {
  Episode episode;
  EpisodeReport report =
      PlayEpisode(env, policy, seed, env.Describe().max_turns, episode_options,
                  [&episode](const StepResult& step) { episode.steps.push_back(step); });
  EXPECT_FALSE(report.error) << report.end;
  episode.observations = std::move(report.observations);
  return episode;
}

}  // namespace strider::envs::testing
