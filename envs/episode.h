// Playing whole episodes outside an actor: `strider env run`, the environment tests and
// envs_bench all drive environments through this one loop, so what they measure and check is
// what an environment author sees.
//
// The loop is the actor's in miniature, without tokens: Reset, then the policy's turn, Step,
// until `done` or `max_turns`. An environment or policy error ends the episode and is reported
// in the result, never returned as a failure, so a caller can go on to the next episode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "envs/environment.h"

namespace strider::envs {

struct EpisodeReport {
  uint64_t seed = 0;
  int turns = 0;  // policy turns given to Step, including one whose Step failed
  int correct = 0, incorrect = 0, unknown = 0;  // step labels
  std::optional<double> outcome;  // the last step's outcome reward, when the episode finished
  // "done" (or the environment's info `reason`, such as "turn limit") when it finished;
  // "turn limit" when `max_turns` ran out first; the error, prefixed with "reset: ",
  // "policy: " or "step: ", when it failed.
  std::string end;
  bool error = false;
  double seconds = 0;            // wall time of the whole episode, policy included
  size_t observation_bytes = 0;  // text of every observation, the first included
  size_t images = 0;
  // The first observation, then one per successful step (the last one included): what the
  // policy was shown.
  std::vector<Observation> observations;
};

// Called with each successful step before its observation moves to `observations`.
using StepCallback = std::function<void(const StepResult&)>;

// Plays one episode of `env` from Reset(seed, episode_options), at most `max_turns` Steps.
EpisodeReport PlayEpisode(Environment& env, ScriptedPolicy& policy, uint64_t seed, int max_turns,
                          const Options& episode_options = {},
                          const StepCallback& on_step = nullptr);

// A policy of random turns to exercise error paths: a few words, then often a call to one of
// `tools` or to an unknown tool with random arguments (malformed about half the time: no
// closing marker, no parentheses), sometimes "Answer: N". The same seed gives the same turns.
std::unique_ptr<ScriptedPolicy> MakeRandomPolicy(uint64_t seed, std::vector<ToolSpec> tools);

}  // namespace strider::envs
