// The RL learner service (`strider learner --config F` with `mode: rl`): the loop that closes
// actor -> replay -> learner -> weights -> actor.
//
// Each step:
//   1. sample `units_per_step` groups (or trajectories) from the replay table, with the newest
//      published version as the request's version (the table's max_staleness is relative to it)
//      and the step number as the durable sample id (a resumed learner is answered again
//      exactly what it was before, replay/client.h);
//   2. reassemble whole trajectories and score them without gradient (rl_step.h PrepareBatch):
//      log-probs along the inference path with routing replay, the reference's, values; the
//      mismatch check excludes any single-version trajectory above the threshold, reported in
//      the step's metrics and the log;
//   3. shape rewards and compute advantages per group;
//   4. ppo_epochs passes over the batch, each split into `minibatches` optimiser updates: the
//      update pass chunk by chunk along the inference path with gradients, AdamW (clipping and
//      schedule from the Trainer), routing balance on the first epoch's routing;
//   5. publish the weights (Model::SaveToBytes through transport::WeightPublisher) every
//      `publish.every_steps` steps under a version above every version this run directory ever
//      published: the next version is written to <run_dir>/published_version (fsynced) before
//      it is served, and a resumed learner starts above it and republishes its weights at once,
//      so subscribers, which only fetch newer versions, follow the resumed weights;
//   6. one JSON line in <run_dir>/metrics.jsonl, and a checkpoint every `checkpoint.every_steps`
//      steps and at exit (<run_dir>/checkpoints/latest, then final).
// docs/rl_learner.md has the metrics, the checkpoint contents and the sync mode.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "learner/rl/rl_config.h"

namespace strider::rl {

struct RlRunOptions {
  std::string run_dir = "runs/rl";
  std::string resume;            // a checkpoint directory of an earlier run of this config
  int64_t max_steps = -1;        // stop after this many steps of this invocation (-1: train.steps)
  std::string replay_endpoint;   // overrides replay.endpoint
  std::string publish_endpoint;  // overrides publish.endpoint
  // Set (by a signal handler) to stop after the current step, with a checkpoint.
  const std::atomic<bool>* stop = nullptr;
  // Called once the weights are served and replay is connected, with the weight endpoint
  // (empty when nothing is published).
  std::function<void(const std::string& publish_endpoint)> on_ready;
  // Called after every step with the line it wrote to metrics.jsonl (a JSON object).
  std::function<void(const std::string& step_json)> on_step;
};

struct RlRunSummary {
  int64_t steps = 0;               // steps this invocation ran
  int64_t total_steps = 0;         // of the run, resumed ones included
  uint64_t policy_version = 0;     // the newest version published
  double first_reward_mean = 0;    // the first tenth of this invocation's steps
  double last_reward_mean = 0;     // the last tenth
  double seconds = 0;
  int64_t excluded_trajectories = 0;
  std::string publish_endpoint;    // where the weights were served (a port 0 bind resolved)
};

Result<RlRunSummary> RunRlLearner(const RlLearnerConfig& config, const RlRunOptions& options);

}  // namespace strider::rl
