#include "learner/rl/implicit_prm.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "common/clock.h"
#include "common/model/model.h"
#include "common/model/torch_status.h"
#include "learner/learner.h"

namespace strider::rl {
namespace {

double Sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

// log(1 + e^x) without overflow.
double Softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

Status CheckReference(const PreparedTrajectory& trajectory, std::span<const float> reference) {
  if (reference.size() != trajectory.positions.size()) {
    return Status::InvalidArgument(
        "implicit PRM: trajectory " + trajectory.joined.id.Hex() + " has " +
        std::to_string(trajectory.positions.size()) + " action tokens and " +
        std::to_string(reference.size()) + " reference log-probs");
  }
  return Status::Ok();
}

// s = sum of log pi_phi - log pi_ref over the action tokens.
double LogRatioSum(const std::vector<float>& own, std::span<const float> reference) {
  double sum = 0;
  for (size_t i = 0; i < own.size(); ++i) {
    sum += static_cast<double>(own[i]) - static_cast<double>(reference[i]);
  }
  return sum;
}

}  // namespace

double ImplicitPrmLoss(double log_ratio_sum, double label, double beta) {
  // -(y log sigma(z) + (1 - y) log(1 - sigma(z))) = softplus(z) - y z.
  const double z = beta * log_ratio_sum;
  return Softplus(z) - label * z;
}

double ImplicitPrmLossSlope(double log_ratio_sum, double label, double beta) {
  return beta * (Sigmoid(beta * log_ratio_sum) - label);
}

void NormalizeByLargestReturn(std::vector<std::vector<double>>& token_rewards) {
  double largest = 0;
  for (const std::vector<double>& rewards : token_rewards) {
    double to_end = 0;
    for (size_t i = rewards.size(); i-- > 0;) {
      to_end += rewards[i];
      largest = std::max(largest, std::abs(to_end));
    }
  }
  const double scale = 1.0 / (largest + 1e-6);
  for (std::vector<double>& rewards : token_rewards) {
    for (double& r : rewards) r *= scale;
  }
}

ImplicitPrm::ImplicitPrm(const ImplicitPrmOptions& options) : options_(options) {}
ImplicitPrm::~ImplicitPrm() = default;

Result<std::unique_ptr<ImplicitPrm>> ImplicitPrm::Create(const ModelConfig& model,
                                                         const ImplicitPrmOptions& options,
                                                         const std::string& checkpoint) {
  std::unique_ptr<ImplicitPrm> prm(new ImplicitPrm(options));
  TrainerConfig config;
  config.seed = options.seed;
  config.optimizer = options.config.optimizer;
  config.router_learning_rate_scale = options.router_learning_rate_scale;
  // A scorer: its router biases stay where the starting weights put them.
  config.balance = false;
  TrainerStart start;
  start.initial_weights =
      options.config.init.empty() ? options.policy_init : options.config.init;
  start.init_seed = options.policy_init_seed;
  // Constant, as PRIME's (warmup_style: constant).
  const LearningRateSchedule schedule = {.peak = options.config.optimizer.learning_rate,
                                         .warmup_steps = 0,
                                         .total_steps = 1,
                                         .min_ratio = 1.0};
  Result<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(model, MakeTrainerOptions(config, schedule, start), checkpoint);
  if (!trainer.ok()) return trainer.status().WithContext("implicit PRM");
  prm->trainer_ = std::move(*trainer);
  return prm;
}

Model& ImplicitPrm::model() { return trainer_->model(); }
const Model& ImplicitPrm::model() const { return trainer_->model(); }

int64_t ImplicitPrm::parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, tensor] : trainer_->optimizer().parameters()) {
    bytes += 3 * static_cast<int64_t>(tensor.nbytes());  // weights, two moments
  }
  return bytes;
}

Result<std::vector<float>> ImplicitPrm::Pass(const PreparedTrajectory& trajectory,
                                             const double* slope) const {
  std::vector<float> logprobs(trajectory.positions.size(), 0.0f);
  if (trajectory.positions.empty()) return logprobs;
  ChunkedPassOptions pass;
  pass.path = TrainingPath::kInference;
  pass.chunk_tokens = options_.chunk_tokens;
  pass.backward = slope != nullptr;
  pass.truncated = options_.truncated_backprop;
  const std::vector<int64_t>& actions = trajectory.positions;
  if (pass.backward && std::is_sorted(actions.begin(), actions.end())) {
    pass.chunk_has_loss = [&actions](int64_t begin, int64_t count) {
      auto first = std::lower_bound(actions.begin(), actions.end(), begin + 1);
      return first != actions.end() && *first <= begin + count;
    };
  }
  auto objective = [&](const ChunkView& chunk) -> Result<at::Tensor> {
    std::vector<int64_t> slots;
    const at::Tensor lp = ChunkActionLogProbs(chunk.logits, chunk.begin, trajectory, &slots,
                                              /*entropy=*/nullptr, /*full_distribution=*/true);
    if (slots.empty()) return at::Tensor();
    const at::Tensor values = lp.detach().to(at::kCPU, at::kFloat).contiguous();
    const float* p = values.data_ptr<float>();
    for (size_t i = 0; i < slots.size(); ++i) logprobs[slots[i]] = p[i];
    if (slope == nullptr) return at::Tensor();
    return (lp.sum() * *slope).to(at::kFloat);
  };
  STRIDER_RETURN_IF_ERROR(model::Guarded("implicit PRM pass", [&]() -> Status {
    return RunChunkedPass(trainer_->model(), trajectory.input, pass, objective).status();
  }));
  return logprobs;
}

Result<std::vector<float>> ImplicitPrm::LogProbs(const PreparedTrajectory& trajectory) const {
  return Pass(trajectory, nullptr);
}

Result<std::vector<double>> ImplicitPrm::TokenRewards(
    const PreparedTrajectory& trajectory, std::span<const float> reference_logprobs) const {
  STRIDER_RETURN_IF_ERROR(CheckReference(trajectory, reference_logprobs));
  STRIDER_ASSIGN_OR_RETURN(std::vector<float> own, LogProbs(trajectory));
  std::vector<double> rewards(own.size());
  for (size_t i = 0; i < own.size(); ++i) {
    const double ratio =
        static_cast<double>(own[i]) - static_cast<double>(reference_logprobs[i]);
    if (!std::isfinite(ratio)) {
      return Status::InvalidArgument("implicit PRM: trajectory " + trajectory.joined.id.Hex() +
                                     ": token " + std::to_string(trajectory.positions[i]) +
                                     " has a non-finite log-ratio to the reference");
    }
    rewards[i] = beta() * ratio;
  }
  return rewards;
}

Result<double> ImplicitPrm::Loss(std::span<const ImplicitPrmSample> samples) const {
  if (samples.empty()) return 0.0;
  double total = 0;
  for (const ImplicitPrmSample& sample : samples) {
    STRIDER_RETURN_IF_ERROR(CheckReference(*sample.trajectory, sample.reference_logprobs));
    STRIDER_ASSIGN_OR_RETURN(std::vector<float> own, LogProbs(*sample.trajectory));
    total += ImplicitPrmLoss(LogRatioSum(own, sample.reference_logprobs), sample.label, beta());
  }
  return total / static_cast<double>(samples.size());
}

Result<double> ImplicitPrm::AccumulateGradients(std::span<const ImplicitPrmSample> samples) {
  return Accumulate(samples, nullptr);
}

Result<double> ImplicitPrm::Accumulate(std::span<const ImplicitPrmSample> samples,
                                       int64_t* correct) {
  if (samples.empty()) return 0.0;
  const double n = static_cast<double>(samples.size());
  double total = 0;
  for (const ImplicitPrmSample& sample : samples) {
    STRIDER_RETURN_IF_ERROR(CheckReference(*sample.trajectory, sample.reference_logprobs));
    STRIDER_ASSIGN_OR_RETURN(std::vector<float> own, LogProbs(*sample.trajectory));
    const double s = LogRatioSum(own, sample.reference_logprobs);
    total += ImplicitPrmLoss(s, sample.label, beta());
    if (correct != nullptr) *correct += (Sigmoid(beta() * s) > 0.5) == (sample.label > 0.5);
    // d loss / d log pi_phi(y_t) is the same for every action token of the trajectory.
    const double slope = ImplicitPrmLossSlope(s, sample.label, beta()) / n;
    STRIDER_RETURN_IF_ERROR(Pass(*sample.trajectory, &slope).status());
  }
  return total / n;
}

Result<ImplicitPrmUpdate> ImplicitPrm::Update(std::span<const ImplicitPrmSample> samples) {
  const auto started = Clock::now();
  ImplicitPrmUpdate update;
  update.trajectories = static_cast<int64_t>(samples.size());
  if (samples.empty()) return update;
  const int64_t parts =
      std::clamp<int64_t>(options_.minibatches, 1, static_cast<int64_t>(samples.size()));
  int64_t correct = 0;
  for (int64_t m = 0; m < parts; ++m) {
    const size_t begin = samples.size() * m / parts;
    const size_t end = samples.size() * (m + 1) / parts;
    const std::span<const ImplicitPrmSample> part = samples.subspan(begin, end - begin);
    trainer_->ZeroGrad();
    STRIDER_ASSIGN_OR_RETURN(const double loss, Accumulate(part, &correct));
    update.loss += loss * static_cast<double>(part.size());
    STRIDER_ASSIGN_OR_RETURN(const TrainerStep step,
                             trainer_->Step(trainer_->optimizer().step()));
    ++update.updates;
    if (!step.applied) ++update.skipped;
    update.gradient_norm = step.gradient_norm;
  }
  update.loss /= static_cast<double>(samples.size());
  update.accuracy = static_cast<double>(correct) / static_cast<double>(samples.size());
  update.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return update;
}

Status ImplicitPrm::WriteCheckpoint(const std::string& directory) const {
  CheckpointState state;
  state.mode = "implicit_prm";
  state.model = trainer_->model().config().name;
  state.seed = options_.seed;
  state.step = trainer_->optimizer().step();
  return trainer_->WriteCheckpoint(directory, std::move(state));
}

}  // namespace strider::rl
