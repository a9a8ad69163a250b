// Plays one episode of an environment with a scripted policy, for the envs tests.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "envs/environment.h"
#include "envs/tools.h"

namespace strider::envs::testing {

struct Episode {
  std::vector<Observation> observations;  // the first observation, then one per step
  std::vector<StepResult> steps;
};

inline Episode Play(Environment& env, ScriptedPolicy& policy, uint64_t seed,
                    const Options& episode_options = {}) {
  Episode episode;
  Result<Observation> first = env.Reset(seed, episode_options);
  EXPECT_TRUE(first.ok()) << first.status().ToString();
  if (!first.ok()) return episode;
  episode.observations.push_back(*first);
  const int max_turns = env.Describe().max_turns;
  for (int turn = 0; turn < max_turns; ++turn) {
    Result<std::string> text = policy.NextTurn(episode.observations);
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    if (!text.ok()) break;
    Result<StepResult> step = env.Step(MakeAction(*text));
    EXPECT_TRUE(step.ok()) << step.status().ToString();
    if (!step.ok()) break;
    episode.steps.push_back(*step);
    episode.observations.push_back(step->observation);
    if (step->done) break;
  }
  return episode;
}

}  // namespace strider::envs::testing
