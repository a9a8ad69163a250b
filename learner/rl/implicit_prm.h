// PRIME's implicit process reward model ("Process Reinforcement through Implicit Rewards"): a
// language model pi_phi of its own, beside the policy, trained online on the outcomes alone, whose
// per-token log-ratio to the reference policy is the process reward.
//
//   label     y = the stored outcome clamped to [0, 1] (1: solved)
//   score     s = sum over the trajectory's action tokens t of log pi_phi(y_t) - log pi_ref(y_t)
//   loss      CE(sigma(beta s), y) = -(y log sigma(beta s) + (1 - y) log(1 - sigma(beta s))),
//             the mean over a mini-batch's trajectories; AdamW at a constant rate
//   reward    r_t = beta (log pi_phi(y_t) - log pi_ref(y_t)) on each action token
//
// Each learner step, before the policy's update, updates pi_phi on the step's trajectories (in
// train.minibatches mini-batches, in batch order), then scores them with the updated model: the
// order of PRIME's recipe (reward_model.model.update: before). Both pi_phi and pi_ref are scored
// on the full temperature-scaled distribution (no top-k or top-p: a sampled token outside the
// reference's nucleus would have no finite log-ratio), with their own routing: neither is the
// policy that sampled, so the actor's experts are not forced on them.
//
// pi_phi starts from the policy's own starting weights (the same as the reference, so every
// reward is 0 until the first update) or from a configured file. The loss is a function of the
// whole trajectory's sum, so each step runs two passes per trajectory: one without gradient for
// s, then one backpropagating beta (sigma(beta s) - y) / n times each token's log-prob, whose
// gradient is the loss's (exact with train.backprop full or a trajectory within one chunk;
// truncated at chunk boundaries otherwise, as the policy's update is).
//
// It is trained by a Trainer of its own (learner.h: AdamW, clipping, its generator), and
// checkpointed with the learner: <checkpoint>/implicit_prm/ holds its model.safetensors,
// optimizer.safetensors and state.json, written inside the learner's checkpoint so the two swap
// in together.
//
// Threads: one, the learner's.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/status.h"
#include "learner/rl/rl_config.h"
#include "learner/rl/scoring.h"

namespace strider {
class Trainer;
class Model;
}  // namespace strider

namespace strider::rl {

// The cross-entropy loss of one trajectory, CE(sigma(beta s), label), computed stably from the
// logit beta s.
double ImplicitPrmLoss(double log_ratio_sum, double label, double beta);
// Its derivative with respect to each action token's log pi_phi: beta (sigma(beta s) - label).
double ImplicitPrmLossSlope(double log_ratio_sum, double label, double beta);

// PRIME's batch normalisation (prime_norm: batch_norm): every token reward divided by the largest
// |sum of the rewards from a token to the end of its trajectory| over all trajectories, plus
// 1e-6, so the largest implicit return in the batch is 1. In place.
void NormalizeByLargestReturn(std::vector<std::vector<double>>& token_rewards);

// One trajectory as the reward model trains on it.
struct ImplicitPrmSample {
  const PreparedTrajectory* trajectory = nullptr;
  // Per action token (trajectory->positions order): the reference's log-probs on the full
  // distribution (TrajectoryScores::reference_logprobs).
  std::span<const float> reference_logprobs;
  double label = 0;  // in [0, 1]
};

struct ImplicitPrmUpdate {
  int64_t trajectories = 0;
  int64_t updates = 0;         // optimiser steps taken
  int64_t skipped = 0;         // of them, not applied (a non-finite loss or gradient)
  double loss = 0;             // mean CE over the trajectories, each before its mini-batch's update
  double accuracy = 0;         // sigma(beta s) on the same side of 0.5 as the label, same moment
  double gradient_norm = 0;    // the last update's, before clipping
  double seconds = 0;          // the update's passes and steps
};

struct ImplicitPrmOptions {
  ImplicitPrmConfig config;
  int64_t chunk_tokens = 512;
  bool truncated_backprop = true;
  // Optimiser steps per learner step, over the batch in order (PRIME: the policy's mini-batch
  // size, so as many as the policy takes per epoch).
  int64_t minibatches = 1;
  uint64_t seed = 1;
  // Where pi_phi starts without a checkpoint: config.init when set, else these (the policy's).
  std::string policy_init;
  int64_t policy_init_seed = 0;
  double router_learning_rate_scale = 1.0;
};

class ImplicitPrm {
 public:
  // A fresh reward model, or, with `checkpoint` (a directory ImplicitPrm::WriteCheckpoint wrote),
  // the one saved there with its optimiser state. Errors: weights that do not load, a checkpoint
  // of another model.
  static Result<std::unique_ptr<ImplicitPrm>> Create(const ModelConfig& model,
                                                     const ImplicitPrmOptions& options,
                                                     const std::string& checkpoint = "");
  ~ImplicitPrm();

  // The CE update on `samples`, split into options.minibatches optimiser steps in order.
  Result<ImplicitPrmUpdate> Update(std::span<const ImplicitPrmSample> samples);
  // The mean CE loss of `samples` under the current weights, without gradient.
  Result<double> Loss(std::span<const ImplicitPrmSample> samples) const;
  // Accumulates the gradient of the mean CE loss of `samples` into the parameters' .grad (no
  // step) and returns the loss; Update is ZeroGrad, this, and an optimiser step per mini-batch.
  Result<double> AccumulateGradients(std::span<const ImplicitPrmSample> samples);
  // log pi_phi of every action token on the full distribution, in positions order.
  Result<std::vector<float>> LogProbs(const PreparedTrajectory& trajectory) const;
  // r_t = beta (log pi_phi - log pi_ref) per action token, in positions order. Errors: a
  // reference of another length, a non-finite log-prob.
  Result<std::vector<double>> TokenRewards(const PreparedTrajectory& trajectory,
                                           std::span<const float> reference_logprobs) const;

  // Its model, optimiser and generator state into `directory` (learner/checkpoint.h).
  Status WriteCheckpoint(const std::string& directory) const;

  double beta() const { return options_.config.beta; }
  // Whether the step divides the batch's token rewards by its largest return (normalize: batch).
  bool normalizes() const { return options_.config.normalize == "batch"; }
  Model& model();
  const Model& model() const;
  int64_t parameter_bytes() const;  // the weights and the optimiser's two moments

 private:
  explicit ImplicitPrm(const ImplicitPrmOptions& options);
  // AccumulateGradients, counting in `correct` (when not null) the trajectories whose
  // sigma(beta s) was on their label's side of 0.5.
  Result<double> Accumulate(std::span<const ImplicitPrmSample> samples, int64_t* correct);
  // One pass of pi_phi over `trajectory`: the action tokens' log-probs; with `slope` set,
  // backpropagates slope times their sum.
  Result<std::vector<float>> Pass(const PreparedTrajectory& trajectory,
                                  const double* slope) const;

  ImplicitPrmOptions options_;
  std::unique_ptr<Trainer> trainer_;
};

// The name of the reward model's directory inside a learner checkpoint.
inline constexpr const char* kImplicitPrmCheckpoint = "implicit_prm";

}  // namespace strider::rl
