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
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "learner/learner.h"
#include "learner/rl/rl_config.h"
#include "learner/rl/rl_step.h"
#include "learner/run_directory.h"

namespace strider {
class LearnerGroup;  // learner/distributed.h
}  // namespace strider
namespace strider::replay {
class LearnerClient;  // replay/client.h
struct SampleBatch;
}  // namespace strider::replay
namespace strider::transport {
class WeightPublisher;  // common/transport/weight_stream.h
}  // namespace strider::transport

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
  // Learner steps (from 1, sorted) whose step dump (step_dump.h) is written into dump_dir.
  std::vector<int64_t> dump_steps;
  std::string dump_dir;
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

// The learner service of one rank. Create opens the run directory, builds the Trainer and the
// reference, joins the learner group, starts publishing (republishing a resumed run's weights)
// and connects to replay, in that order; then on_ready is called. Each Step is steps 1-6 above.
//
// Threads: one; RlRunOptions::stop may be set from any thread (a signal handler).
class RlLearner {
 public:
  static Result<std::unique_ptr<RlLearner>> Create(const RlLearnerConfig& config,
                                                   const RlRunOptions& options);
  ~RlLearner();

  // Steps until train.steps (or options.max_steps of this invocation) or a stop request, then
  // writes checkpoints/final.
  Result<RlRunSummary> Run();
  // One learner step. False when a stop request came before it trained anything: no step was
  // taken (a group stops together, at the step one of its ranks was asked to stop at).
  Result<bool> Step();
  // Writes <run_dir>/checkpoints/<name>: the weights, optimiser and generator state, the step
  // and the newest version published.
  Status Checkpoint(const std::string& name);

  int64_t step() const { return step_; }
  bool done() const { return step_ >= last_step_; }

 private:
  // What a step's batch became before the update (steps 1-3), with the group's figures.
  struct PreparedStep;
  // What the update did (step 4).
  struct StepUpdate;

  RlLearner(const RlLearnerConfig& config, const RlRunOptions& options);

  Status Open();
  Status CreateTrainer();
  Status JoinGroup();
  Status ConfigureSteps();  // the step settings, the learned process reward model
  Status StartPublishing();
  Status ConnectReplay();

  bool StopRequested() const;
  Result<std::optional<replay::SampleBatch>> Sample(Clock::time_point step_started);
  Result<PreparedStep> Prepare(replay::SampleBatch batch);
  Result<StepUpdate> Update(const PreparedStep& prepared);
  // One optimiser update on `part` of the epoch's order. False when the group's mini-batch is
  // empty on every rank (nothing to update).
  Result<bool> UpdateMinibatch(std::span<const TrainingTrajectory* const> part, int64_t epoch,
                               RoutingRecord* routing, StepUpdate* update);
  Status Balance(RoutingRecord routing, StepUpdate* update);
  Status Publish();
  std::string MetricsLine(const PreparedStep& prepared, const StepUpdate& update,
                          double sample_seconds, double compute_seconds, double step_seconds,
                          double reward_mean) const;
  RlRunSummary Summary() const;

  const RlLearnerConfig config_;
  const RlRunOptions options_;
  const bool distributed_;
  const bool expert_parallel_;
  const Clock::time_point started_;
  std::optional<RunDirectory> run_;
  CheckpointState start_;  // where the run starts: a fresh one, or the checkpoint resumed
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<Model> reference_;
  std::unique_ptr<LearnerGroup> group_;
  std::unique_ptr<ChunkRounds> rounds_;
  // The parameters whose gradients the ranks sum: all but an expert-parallel rank's experts.
  std::vector<at::Tensor> reduced_;
  std::unique_ptr<reward::ProcessRewardModel> process_model_;
  std::unique_ptr<ImplicitPrm> implicit_prm_;  // with implicit rewards (UsesImplicitRewards)
  StepSettings settings_;
  uint64_t version_ = 0;  // the newest version published (or, on ranks > 0, counted)
  std::unique_ptr<transport::WeightPublisher> publisher_;
  double publish_seconds_ = 0;
  double gather_seconds_ = 0;  // expert-parallel: gathering the experts for a publish
  std::unique_ptr<replay::LearnerClient> client_;
  std::string replay_endpoint_;
  int64_t step_ = 0;
  int64_t total_tokens_ = 0;
  int64_t last_step_ = 0;
  std::vector<double> reward_means_;  // per step of this invocation
  RlRunSummary summary_;
};

// Create, then Run.
Result<RlRunSummary> RunRlLearner(const RlLearnerConfig& config, const RlRunOptions& options);

}  // namespace strider::rl
