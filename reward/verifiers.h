// Re-scoring stored trajectories offline with their environment's verifier: the episode is
// played again against a fresh environment (the stored seed and options), each stored model turn
// handed to Step as the actor handed it, and what the environment says of each turn (label,
// step reward) and of the end (outcome) is returned beside what the actor stored. Evaluation
// scores stored runs this way, and the process reward model takes its step labels from it.
//
//   stored segments ──> JoinSegments ──> Reset(seed, options) ──> Step(turn 1) ... Step(turn K)
//                                          │ every observation rendered as the actor renders it
//                                          └ and compared with the stored context tokens
//
// The replay is checked, not trusted: the prompt and every observation must render (through
// common/transcript.h, as the actor does) to exactly the stored context tokens and roles, and
// each image to the stored pixels; otherwise the episode is not the one stored (another seed,
// other options, an environment that changed) and Rescore fails naming the first difference.
// Turns the environment never answered (a timeout, a stop) are not replayed.
//
// A trajectory is read in the transcript format it was written in: the byte format, or, given
// the model's own Format (common/tokenizer/chat_format.h, tokenizer::ModelFormat of the model
// config the actor ran), its template's turns and tokenizer; the turn handed to Step is then
// what the actor handed it (the model turn's text with its call in the environment's syntax).
//
// The environment is an envs::EnvironmentConfig as actors take it. Its name may be left empty
// (the stored environment name is used); the seed comes from the stored `seed` metadata and the
// options from the stored `env_option.<key>` metadata when the actor recorded them, else from
// the config.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/schema/messages.h"
#include "common/status.h"
#include "common/transcript.h"
#include "envs/environment.h"
#include "replay/inspect.h"
#include "reward/trajectory.h"

namespace strider::reward {

struct StepVerdict {
  uint64_t begin = 0;  // trajectory positions of the step
  uint64_t end = 0;
  envs::StepLabel label = envs::StepLabel::kUnknown;
  std::optional<double> reward;  // the environment's step reward, when it gave one
  bool done = false;
  std::string error;  // the environment's Step error; the replay stops there
  float stored_reward = 0;
  std::string action_text;  // the model turn as handed to Step
};

struct Rescored {
  schema::TrajectoryId id;
  std::string env;
  uint64_t seed = 0;
  envs::Options options;  // as the episode was reset with
  std::vector<StepVerdict> steps;
  // Set when the replayed episode ended (done) on its last step.
  std::optional<double> outcome;
  float stored_outcome = 0;
  std::string stored_status;
  uint64_t unanswered_action_tokens = 0;  // after the last step, not replayed
};

// Replays one stored trajectory (its segments in any order; all of them, the last included).
// Errors: InvalidArgument for segments that do not join (JoinSegments) or lack a `seed`;
// NotFound/InvalidArgument from making the environment; the environment's error when it fails
// to reset; FailedPrecondition when the replay diverges from what is stored (the message names
// the step and token position). A Step error is a verdict (StepVerdict::error), not a failure.
// `format`: the transcript format the trajectory was written in; null: the byte format.
Result<Rescored> Rescore(std::span<const schema::SegmentData> segments,
                         const envs::EnvironmentConfig& env,
                         std::shared_ptr<const transcript::Format> format = nullptr);
Result<Rescored> Rescore(const schema::StoredTrajectory& trajectory,
                         const envs::EnvironmentConfig& env,
                         std::shared_ptr<const transcript::Format> format = nullptr);

// The shaping input of a re-scored trajectory: the environment's rewards and labels as replayed,
// the outcome when it ended, the end from the stored status.
TrajectoryRewards RescoredRewards(const Rescored& rescored,
                                  const schema::StoredTrajectory& trajectory);

struct StoreRescore {
  schema::TrajectoryId id;
  Status status;  // why this trajectory could not be re-scored; OK otherwise
  Rescored rescored;
};

// Re-scores every complete trajectory of a replay store directory that `filter` selects (read
// only, safe while a server runs: replay/inspect.h). One entry per trajectory, in the store's
// listing order; a trajectory that fails to replay is an entry with its status, not an error.
// Errors: the store cannot be opened or read.
Result<std::vector<StoreRescore>> RescoreStore(const std::string& store_path,
                                               const envs::EnvironmentConfig& env,
                                               const replay::ListFilter& filter = {},
                                               std::shared_ptr<const transcript::Format> format =
                                                   nullptr);

}  // namespace strider::reward
