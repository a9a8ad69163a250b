// One RL learner step on a sampled batch, in the order the learner runs it:
//
//   SplitBatch        the sampled units' segments as groups of whole trajectories
//   PrepareBatch      per trajectory: join and check (PrepareTrajectory), score without gradient
//                     along the inference path (current policy with routing replay, reference,
//                     values), the mismatch check (above threshold: excluded, with the reason);
//                     with implicit rewards, the implicit PRM's update on the kept trajectories'
//                     outcomes and then its per-token rewards (learner/rl/implicit_prm.h);
//                     rewards shaped per step (reward/shaping), then advantages per group
//                     (learner/rl/advantages) over the members kept
//   AccumulateGradients
//                     the update pass of a mini-batch: per trajectory one RunChunkedPass with
//                     backward, each chunk's policy, KL, entropy and value losses (PolicyLoss)
//                     weighted so the mini-batch's chunks add up to its aggregated loss
//
// The learner service (rl_learner.h) adds sampling, PPO epochs and mini-batches, the optimiser
// step, routing balance, publishing and checkpoints; bench/learner_bench times the pieces.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "common/schema/messages.h"
#include "common/status.h"
#include "learner/rl/implicit_prm.h"
#include "learner/rl/losses.h"
#include "learner/rl/objective_config.h"
#include "learner/rl/scoring.h"
#include "reward/shaping.h"

namespace strider::reward {
class ProcessRewardModel;
}

namespace strider::rl {

class StepRecorder;  // learner/rl/step_dump.h

// A group's trajectories, each as all of its segments in order.
struct SampledGroup {
  schema::TrajectoryId group_id;  // the trajectory's own id for an ungrouped one
  std::vector<std::vector<schema::SegmentData>> members;
};

// Splits a batch's segments (a trajectory or group table's units: every segment of each
// trajectory, in order) into groups of trajectories, in the order they first appear.
std::vector<SampledGroup> SplitBatch(std::vector<schema::SegmentData> segments);

// Puts a step's groups in an order that does not depend on their random trajectory ids: members
// by their index in the group, groups by where their first member came from (the last segment's
// `actor` and `episode` metadata), ids only to break ties or where that metadata is missing. The
// replay server returns a step's units in key order and the ids are drawn fresh each launch, so
// without this the same round reached the update in another order every time, and the
// mini-batch split and every floating-point sum with it: runs from the same seeds diverged.
void OrderByProvenance(std::vector<SampledGroup>& groups);

struct StepSettings {
  // The scoring passes' options; its chunk_tokens is the update pass's chunk length too.
  ScoringOptions scoring;
  ObjectiveConfig objective;
  reward::ShapingConfig reward;
  bool truncated_backprop = true;  // backward per chunk, the state detached between chunks
  // The policy version the model's weights are (the last one published, when no update came
  // after it); absent when they are no published version. The mismatch check compares two
  // evaluations of one policy, so it runs only on trajectories sampled entirely under this
  // version; older ones are corrected by the loss's truncated importance weights instead.
  std::optional<uint64_t> weights_version;
  // The learned process reward model (learner/prm/process_model.h) when reward.process_model_weight
  // is not 0: step k's learned reward is 2 P(step k correct) - 1, so a step it judges wrong
  // costs what a step it judges right earns. Borrowed.
  const reward::ProcessRewardModel* process_model = nullptr;
  // PRIME's implicit PRM when the estimator is implicit_process or reward.implicit_weight is not
  // 0: PrepareBatch updates it on the batch's outcomes, then takes its per-token log-ratio to
  // the reference as the implicit rewards. Borrowed; the step changes its weights.
  ImplicitPrm* implicit_prm = nullptr;
  // On a step that is dumped (step_dump.h): the update pass hands it what each chunk's loss saw.
  // Borrowed.
  StepRecorder* recorder = nullptr;
};

// A trajectory of the batch as the update sees it.
struct TrainingTrajectory {
  schema::TrajectoryId group_id;  // its SampledGroup's
  PreparedTrajectory prepared;
  TrajectoryScores scores;
  // Per action token (in prepared.positions order).
  std::vector<float> advantages;
  std::vector<float> returns;
  double outcome = 0;  // the stored outcome reward
  bool finished = false;
  bool truncated = false;
  uint64_t min_version = 0;
  uint64_t max_version = 0;
  // Not trained on: the mismatch check failed, its rewards could not be shaped, or its group
  // was filtered (all outcomes equal under filter_constant_groups).
  bool excluded = false;
  std::string excluded_reason;
};

struct PreparedBatch {
  std::vector<TrainingTrajectory> trajectories;
  int64_t groups = 0;
  int64_t filtered_groups = 0;
  int64_t tokens = 0;         // all tokens of all trajectories
  int64_t action_tokens = 0;  // of the trajectories kept
  // Mismatch over single-version trajectories (measured ones): the largest max and p99.
  double mismatch_max = 0;
  double mismatch_p99 = 0;
  int64_t mismatch_measured = 0;
  int64_t mismatch_excluded = 0;
  double score_seconds = 0;  // scoring passes (policy, reference, values)
  // The implicit PRM's update on this batch and its scoring after it (seconds: both).
  ImplicitPrmUpdate implicit_prm;
};

// Scores and computes advantages for every group. Errors are those of a malformed trajectory
// the learner cannot read at all (segments that do not join) or of the model; a trajectory that
// only fails the mismatch check or shaping is excluded and reported, not an error.
Result<PreparedBatch> PrepareBatch(const Model& model, const Model* reference,
                                   const std::vector<SampledGroup>& groups,
                                   const StepSettings& settings);

struct UpdateMetrics {
  double loss = 0;  // the aggregated loss of the mini-batch
  double policy_loss = 0;
  double kl_loss = 0;
  double entropy_loss = 0;
  double value_loss = 0;
  PolicyLossMetrics metrics;
  int64_t tokens = 0;  // all positions passed
  // The largest chunk_activation_bytes of the trajectories' passes (learner.h ChunkedPassResult).
  int64_t chunk_activation_bytes = 0;
};

// Runs the update pass over `trajectories` (kept ones of a PreparedBatch), accumulating
// gradients into the model's parameters; the caller zeroes them before and steps after.
// A loss that is not finite is never applied, whatever made it (an estimator's infinite value
// can come with a finite gradient): the gradients are poisoned (PoisonGradients), so the
// optimiser step sees a non-finite norm and leaves the parameters as they were.
// The loss is aggregated over the given trajectories as objective.loss.aggregation says.
// With `routing` not null, the router's choices and scores of a strided sample of each
// trajectory's positions (at most 16,384 of them) are appended to
// it (one row, positions concatenated), for routing balance.
// Data-parallel ranks aggregate over the whole group's mini-batch: `all_counts` holds the
// action-token counts of every trajectory of it (rank order), this rank's at `offset`;
// `before_last_backward` runs just before the mini-batch's last backward pass (the gradient
// all-reduce then overlaps it, LearnerGroup::OverlapNextBackward).
Result<UpdateMetrics> AccumulateGradients(const Model& model,
                                          std::span<const TrainingTrajectory* const> trajectories,
                                          const StepSettings& settings,
                                          RoutingRecord* routing = nullptr,
                                          const std::vector<int64_t>* all_counts = nullptr,
                                          size_t offset = 0,
                                          const std::function<void(const at::Tensor&)>& before_last_backward = {});

// Makes the accumulated gradient's norm non-finite (one NaN), so the next optimiser step is
// skipped: for an update that must not be applied.
void PoisonGradients(const Model& model);

}  // namespace strider::rl
