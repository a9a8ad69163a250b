// A learned process reward model (PRM): P(step correct) for every step of a stored trajectory,
// the process-reward source for environments without step verifiers (reward::StepRewards::
// learned, weighted by ShapingConfig::process_model_weight).
//
// Design: a frozen policy model reads the trajectory, and a small trained head reads its final
// hidden states (the normed states the output and value heads read, ForwardOptions::
// return_hidden). Per step k, over positions [begin_k, end_k):
//
//   h_last = hidden at end_k - 1                   (the turn's closing token: all it saw)
//   h_mean = mean of hidden over the step's action tokens (what the turn wrote)
//   x      = ((h_last ; h_mean) - mu) / sigma       mu, sigma: per feature, over training steps
//   P(correct) = sigmoid(w2 . relu(W1 x + b1) + b2)  (hidden_units 0: sigmoid(w . x + b))
//
// Only the head is trained (binary cross-entropy, AdamW), so features are computed once per
// step and training costs seconds; the policy model is never changed, and the same model
// config and weights must be given when scoring (the checkpoint names them). Why a head on a
// policy rather than a model of its own: the policy's states already encode the task and the
// turn, a head trains in seconds on the few thousand labelled steps a run stores, and the
// learner can score with the model it already has. With random policy weights the features are
// only a mix of the tokens around the step, so a head learns surface mistakes (malformed or
// unknown tool calls, guesses without a tool) and not arithmetic; with a trained policy it
// reads what the policy understood.
//
// The hidden states come from the inference path chunk by chunk (RunChunkedPass), so memory is
// bounded by the chunk, not by the trajectory's length; a trajectory with images goes through
// the training path in one Forward instead (an image may not straddle a chunk; the two paths
// agree by the model's contract).
//
// Data: labelled steps are read from a replay store directory offline (replay/inspect.h,
// read-only, safe while the server runs), not through the learner endpoint: training is a
// command run beside a fleet, it needs every complete trajectory rather than a sample, must not
// count as sampling (the rate limiter, times sampled) and must work on stores whose tables are
// not trajectory tables. Labels are those the actor stored (schema 1.2 step labels, the
// environment's verdict), or, with `relabel`, the verdicts of replaying each trajectory against
// its environment (reward/verifiers.h: stores written before schema 1.2, or a check of the
// stored labels); `unknown` steps are not training data and are only counted.
//
// Split: by trajectory, so no held-out step shares a trajectory with a training step; a
// trajectory is held out when a hash of its id and `split_seed` falls below `heldout_fraction`,
// which does not depend on the order the store lists trajectories in.
//
// Checkpoint directory:
//   head.safetensors     F32 tensors: feature_mean (2D), feature_scale (2D), and layer0.weight
//                        (H, 2D), layer0.bias (H), layer1.weight (1, H), layer1.bias (1); or
//                        layer0.weight (1, 2D), layer0.bias (1) without a hidden layer
//   process_model.json   {"format": "strider-prm/1", "model_config", "model_weights" (absolute
//                        paths), "chunk_tokens", "hidden_units", "features": "last_and_mean",
//                        and the training report}
//
// Errors: Status/Result; LibTorch exceptions are caught here and returned with context.
// Threads: a loaded ProcessRewardModel only reads its model and head: ScoreSteps may run from
// several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/schema/messages.h"
#include "common/schema/trajectory.h"
#include "common/status.h"
#include "common/transcript.h"
#include "envs/environment.h"
#include "replay/inspect.h"

namespace strider {
class Model;
}

namespace strider::reward {

struct ProcessModelHead;  // process_model.cc

// ---------------------------------------------------------------------------------------------
// Labelled steps from the store
// ---------------------------------------------------------------------------------------------

struct LabelledTrajectory {
  schema::StoredTrajectory trajectory;
  std::vector<schema::StepLabel> labels;  // one per trajectory.steps entry
};

struct LabelCounts {
  int64_t correct = 0;
  int64_t incorrect = 0;
  int64_t unknown = 0;
  int64_t labelled() const { return correct + incorrect; }
};

// The stored labels of a trajectory's steps, in trajectory order, from all of its segments
// (any order). Segments of schema 1.1 read as unknown. Errors as JoinSegments.
Result<LabelledTrajectory> ReadLabelledTrajectory(std::span<const schema::SegmentData> segments);

// The labels of replaying a trajectory against `env` (reward::Rescore): the environment's label
// of each step it answered; unknown for a step whose Step failed and for steps after it.
// Errors: those of Rescore (a trajectory that does not replay is FailedPrecondition).
// `format`: the transcript format the trajectory was written in (Rescore); null: the byte one.
Result<std::vector<schema::StepLabel>> ReplayedLabels(
    const schema::StoredTrajectory& trajectory, const envs::EnvironmentConfig& env,
    std::shared_ptr<const transcript::Format> format = nullptr);

struct LabelledStore {
  std::vector<LabelledTrajectory> trajectories;  // complete ones, in the store's listing order
  int64_t incomplete = 0;  // listed but not complete (still written, or abandoned): skipped
  int64_t unreplayed = 0;  // with `relabel`: trajectories that did not replay, skipped
};

// Whether the split of TrainProcessModel holds `id` out: a hash of the id and `split_seed`
// below `fraction`, a fixed function of the id (the split does not move when the store lists
// trajectories in another order or grows). For evaluating on the held-out trajectories only.
bool HeldOut(const schema::TrajectoryId& id, uint64_t split_seed, double fraction);

// Every complete trajectory `filter` selects in the store directory `store_path`, with its
// labels (the stored ones, or ReplayedLabels against `relabel`, in `format`, when it is not
// null); at most
// `max_trajectories` (0: all). Errors: the store cannot be opened or read, a trajectory's
// segments do not join, the environment cannot be made.
Result<LabelledStore> ReadLabelledStore(const std::string& store_path,
                                        const replay::ListFilter& filter = {},
                                        int64_t max_trajectories = 0,
                                        const envs::EnvironmentConfig* relabel = nullptr,
                                        std::shared_ptr<const transcript::Format> format =
                                            nullptr);

// ---------------------------------------------------------------------------------------------
// Training
// ---------------------------------------------------------------------------------------------

struct ProcessModelOptions {
  // --- Data ---
  std::string store_path;  // a replay store directory
  replay::ListFilter filter;
  int64_t max_trajectories = 0;  // 0: every complete trajectory
  // Labels from replaying each trajectory against this environment instead of the stored ones
  // (ReplayedLabels, in the policy model's transcript format); an empty name takes the stored
  // environment's. Unset: the stored labels.
  std::optional<envs::EnvironmentConfig> relabel;
  double heldout_fraction = 0.2;  // of trajectories, in (0, 1)
  uint64_t split_seed = 0;
  // A control, not a way to train: training labels permuted among the training steps (the
  // held-out labels stay true). A head that still beats the baseline would be reading
  // something other than the labels.
  bool shuffle_labels = false;

  // --- The frozen policy model the features come from ---
  std::string model_config;    // YAML (configs/model/*.yaml)
  std::string model_weights;   // safetensors written by Model::Save
  int64_t chunk_tokens = 512;  // positions per Model::Append; memory grows with it
  // cpu, cuda or cuda:N for the policy model; empty: its config's device:. The head trains on
  // the host from the features the policy's hidden states give.
  std::string device;

  // --- The head ---
  int64_t hidden_units = 64;  // 0: a linear head (logistic regression)
  int64_t steps = 400;        // AdamW steps
  int64_t batch_size = 128;   // labelled steps per step, drawn with replacement; 0: all
  double learning_rate = 3e-3;
  double weight_decay = 0.01;
  uint64_t seed = 0;  // head initialisation and batches

  // --- Output ---
  std::string output_dir;  // the checkpoint; empty: none written
};

struct ProcessModelReport {
  int64_t trajectories = 0;  // complete trajectories read
  int64_t train_trajectories = 0;
  int64_t heldout_trajectories = 0;
  int64_t incomplete_trajectories = 0;  // skipped
  int64_t unreplayed_trajectories = 0;  // with relabel: did not replay, skipped
  LabelCounts train_labels;
  LabelCounts heldout_labels;
  // On held-out labelled steps: the head thresholded at 0.5, and always answering the
  // training steps' majority label.
  double heldout_accuracy = 0;
  double majority_baseline = 0;
  double heldout_loss = 0;  // mean binary cross-entropy
  double train_accuracy = 0;
  double initial_train_loss = 0;  // before the first step, on all training steps
  double final_train_loss = 0;    // after the last
  int64_t steps = 0;
  int64_t feature_dim = 0;     // 2 x the model's width
  double feature_seconds = 0;  // reading the store and running the policy model
  double train_seconds = 0;
  std::string checkpoint_dir;  // empty when none was written
};

// Reads the store, computes every labelled step's features, trains the head and evaluates it
// on the held-out trajectories; writes the checkpoint when output_dir is set. Errors
// (InvalidArgument): options out of range, no labelled training step or no labelled held-out
// step (too few trajectories for the split), training labels of one class only; errors of
// reading the store and loading the model, which name their file.
Result<ProcessModelReport> TrainProcessModel(const ProcessModelOptions& options);

// The report as one JSON object (what `strider reward train-prm` prints).
std::string ProcessModelReportJson(const ProcessModelReport& report);

// ---------------------------------------------------------------------------------------------
// Scoring
// ---------------------------------------------------------------------------------------------

class ProcessRewardModel {
 public:
  // A checkpoint directory written by TrainProcessModel; loads the policy model it names.
  // Errors: missing or malformed files, a model that does not match the head's feature width.
  // `device` places the policy model (empty: its config's device:).
  static Result<std::unique_ptr<ProcessRewardModel>> Load(const std::string& dir,
                                                         const std::string& device = "");
  ~ProcessRewardModel();

  // One score per step of `trajectory`, P(step correct) in [0, 1], in step order (empty for a
  // trajectory without steps). The model and head are only read.
  Result<std::vector<double>> ScoreSteps(const schema::StoredTrajectory& trajectory) const;

  const std::string& model_config() const { return model_config_; }
  const std::string& model_weights() const { return model_weights_; }

 private:
  ProcessRewardModel();
  std::unique_ptr<Model> model_;
  std::unique_ptr<ProcessModelHead> head_;
  int64_t chunk_tokens_ = 512;
  std::string model_config_;
  std::string model_weights_;
};

}  // namespace strider::reward
