// The Trainer: model, optimiser, schedule, routing balance and checkpoints of one training run,
// taken out of the pretraining loop so every mode steps a model the same way.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <utility>
#include <vector>

#include "common/kernels/routing.h"
#include "common/model/torch_status.h"
#include "common/tokenizer.h"
#include "learner/learner.h"

namespace strider {
namespace {

// The model's trainable tensors with their names, the keys of the optimiser's saved state.
std::vector<std::pair<std::string, at::Tensor>> NamedTrainable(const Model& model) {
  std::vector<at::Tensor> trainable = model.TrainableParameters();
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& [name, tensor] : model.tensors()) {
    for (const at::Tensor& t : trainable) {
      if (t.unsafeGetTensorImpl() == tensor.unsafeGetTensorImpl()) {
        named.emplace_back(name, tensor);
        break;
      }
    }
  }
  return named;
}

bool IsRouter(const std::string& name) {
  return name.size() > 7 && name.compare(name.size() - 7, 7, ".router") == 0;
}

std::string GeneratorState(at::Generator& generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  at::Tensor state = generator.get_state().contiguous();
  return std::string(static_cast<const char*>(state.data_ptr()), state.nbytes());
}

}  // namespace

double LearningRateSchedule::At(int64_t step) const {
  if (step < warmup_steps) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  const double progress = total_steps > warmup_steps
                              ? static_cast<double>(step - warmup_steps) /
                                    static_cast<double>(total_steps - warmup_steps)
                              : 1;
  return peak *
         (min_ratio + (1 - min_ratio) * 0.5 * (1 + std::cos(M_PI * std::min(1.0, progress))));
}

TrainerOptions MakeTrainerOptions(const TrainerConfig& config,
                                  const LearningRateSchedule& schedule,
                                  const TrainerStart& start) {
  TrainerOptions options;
  static_cast<TrainerConfig&>(options) = config;
  static_cast<TrainerStart&>(options) = start;
  options.schedule = schedule;
  return options;
}

Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::Create(const ModelConfig& config,
                                                 const TrainerOptions& options,
                                                 const std::string& checkpoint) {
  std::unique_ptr<Trainer> trainer(new Trainer());
  trainer->options_ = options;
  // Before the first pass; the model's weights stay fp32 (the masters) in either precision.
  ConfigurePrecision(options.precision);
  CheckpointState state;
  if (checkpoint.empty() && !options.initial_weights.empty()) {
    STRIDER_ASSIGN_OR_RETURN(trainer->model_, Model::Load(config, options.initial_weights));
  } else if (checkpoint.empty()) {
    const uint64_t seed =
        options.init_seed >= 0 ? static_cast<uint64_t>(options.init_seed) : options.seed;
    STRIDER_ASSIGN_OR_RETURN(trainer->model_, Model::Create(config, seed));
  } else {
    STRIDER_ASSIGN_OR_RETURN(state, ReadCheckpointState(checkpoint));
    if (state.model != config.name) {
      return Status::InvalidArgument("checkpoint " + checkpoint + " holds model '" + state.model +
                                     "', the config trains '" + config.name + "'");
    }
    STRIDER_ASSIGN_OR_RETURN(trainer->model_, Model::Load(config, CheckpointModelPath(checkpoint)));
  }
  Model& model = *trainer->model_;
  if (options.expert_world_size > 1) {
    const ExpertShard want = ExpertShardOf(config.feed_forward.routed_experts,
                                           options.expert_rank, options.expert_world_size);
    if (!model.sharded()) {
      STRIDER_RETURN_IF_ERROR(model.ShardExperts(options.expert_rank, options.expert_world_size));
    } else if (model.expert_shard().first != want.first ||
               model.expert_shard().count != want.count) {
      return Status::InvalidArgument(
          "checkpoint " + checkpoint + " holds routed experts [" +
          std::to_string(model.expert_shard().first) + ", " +
          std::to_string(model.expert_shard().first + model.expert_shard().count) +
          "), expert-parallel rank " + std::to_string(options.expert_rank) + " of " +
          std::to_string(options.expert_world_size) + " trains [" + std::to_string(want.first) +
          ", " + std::to_string(want.first + want.count) + ")");
    }
  } else if (model.sharded()) {
    return Status::InvalidArgument("checkpoint " + checkpoint +
                                   " holds one rank's shard of the experts; resume it with the "
                                   "expert-parallel group that wrote it");
  }
  STRIDER_RETURN_IF_ERROR(model::Guarded("trainer", [&]() -> Status {
    trainer->model_->SetRequiresGrad(true);
    trainer->optimizer_ =
        std::make_unique<AdamW>(NamedTrainable(*trainer->model_), options.optimizer);
    if (options.router_learning_rate_scale != 1.0) {
      for (const auto& [name, tensor] : NamedTrainable(*trainer->model_)) {
        if (!IsRouter(name)) continue;
        STRIDER_RETURN_IF_ERROR(
            trainer->optimizer_->SetLearningRateScale(name, options.router_learning_rate_scale));
      }
    }
    if (!checkpoint.empty() && std::filesystem::exists(CheckpointOptimizerPath(checkpoint))) {
      STRIDER_RETURN_IF_ERROR(trainer->optimizer_->Load(CheckpointOptimizerPath(checkpoint)));
    }
    trainer->generator_ = at::detail::createCPUGenerator(options.seed);
    if (!state.rng_state.empty()) {
      std::lock_guard<std::mutex> lock(trainer->generator_.mutex());
      at::Tensor saved = at::empty({static_cast<int64_t>(state.rng_state.size())}, at::kByte);
      std::memcpy(saved.data_ptr(), state.rng_state.data(), state.rng_state.size());
      trainer->generator_.set_state(saved);
    }
    return Status::Ok();
  }));
  if (options.precision == Precision::kBFloat16) {
    STRIDER_RETURN_IF_ERROR(trainer->MakeComputeModel());
  }
  trainer->started_ = Clock::now();
  return trainer;
}

Status Trainer::MakeComputeModel() {
  // Once, at the start, the way an actor makes its weights from a published version: through
  // host memory, loaded (in fp32) and then rounded to bf16, so for that moment the device holds
  // the masters twice; from then on the masters and the bf16 copy.
  STRIDER_ASSIGN_OR_RETURN(std::string bytes, model_->SaveToBytes());
  STRIDER_ASSIGN_OR_RETURN(compute_, Model::LoadFromBytes(model_->config(), bytes, "masters"));
  bytes.clear();
  STRIDER_RETURN_IF_ERROR(ApplyWeightPrecision(compute_.get(), Precision::kBFloat16));
  return model::Guarded("bf16 compute weights", [&]() -> Status {
    compute_->SetRequiresGrad(true);
    const std::vector<std::pair<std::string, at::Tensor>> masters = NamedTrainable(*model_);
    for (const auto& [name, weight] : NamedTrainable(*compute_)) {
      const std::string& key = name;  // a structured binding cannot be captured in C++20
      auto master = std::find_if(masters.begin(), masters.end(),
                                 [&key](const auto& entry) { return entry.first == key; });
      if (master == masters.end()) {
        return Status::Internal("bf16 compute weight " + name + " has no master");
      }
      // The gradient of each bf16 product lands in the master's fp32 .grad as backward makes
      // it: accumulation over chunks and mini-batches never rounds to bf16.
      weight.register_hook([master = master->second](const at::Tensor& grad) {
        at::Tensor& sum = master.mutable_grad();
        if (sum.defined()) {
          sum.add_(grad);
        } else {
          sum = grad.to(at::kFloat);
        }
      });
    }
    return Status::Ok();
  });
}

Status Trainer::SyncComputeWeights() {
  if (!compute_) return Status::Ok();
  return model::Guarded("bf16 compute weights", [&] {
    at::NoGradGuard no_grad;
    const auto& masters = model_->tensors();
    const auto& copies = compute_->tensors();
    for (size_t i = 0; i < masters.size(); ++i) copies[i].second.copy_(masters[i].second);
  });
}

void Trainer::ZeroGrad() {
  optimizer_->ZeroGrad();
  if (compute_) {
    // The bf16 weights' own .grad is never read (the hooks feed the masters); dropped here so
    // it does not hold memory between steps.
    for (const auto& [name, tensor] : compute_->tensors()) {
      if (tensor.grad().defined()) tensor.mutable_grad() = at::Tensor();
    }
  }
}

Result<TrainerStep> Trainer::Step(int64_t step) {
  TrainerStep result;
  result.learning_rate = options_.schedule.At(step);
  Result<double> norm = optimizer_->Step(result.learning_rate);
  if (norm.ok()) {
    result.gradient_norm = *norm;
  } else if (norm.status().code() == StatusCode::kFailedPrecondition) {
    // A non-finite norm: the optimiser left the parameters as they were.
    result.gradient_norm = NAN;
    result.applied = false;
  } else {
    return norm.status();
  }
  if (result.applied) STRIDER_RETURN_IF_ERROR(SyncComputeWeights());
  last_step_ = result;
  return result;
}

Status Trainer::FitRoutingBalance(const RoutingRecord& record, int64_t sweeps) {
  for (int64_t sweep = 0; sweep < sweeps; ++sweep) {
    STRIDER_RETURN_IF_ERROR(model_->UpdateRoutingBalance(record).status());
  }
  return SyncComputeWeights();
}

Result<double> Trainer::BalanceRouting(RoutingRecord record) {
  double violation = 0;
  STRIDER_RETURN_IF_ERROR(model::Guarded("routing balance", [&] {
    for (const RoutingRecord::Layer& layer : record.layers) {
      violation = std::max(
          violation, kernels::MaxViolation(layer.experts.reshape({-1, layer.experts.size(-1)}),
                                           model_->config().feed_forward.routed_experts));
    }
  }));
  last_violation_ = violation;
  if (!options_.balance || options_.balance_prepass) return violation;
  balance_window_.push_back(std::move(record));
  while (static_cast<int64_t>(balance_window_.size()) > options_.balance_window_steps) {
    balance_window_.pop_front();
  }
  STRIDER_RETURN_IF_ERROR(
      model_
          ->UpdateRoutingBalance(RoutingRecord::Concatenate(
              std::vector<RoutingRecord>(balance_window_.begin(), balance_window_.end())))
          .status());
  STRIDER_RETURN_IF_ERROR(SyncComputeWeights());
  return violation;
}

Status Trainer::WriteCheckpoint(const std::string& directory, CheckpointState state,
                                const CheckpointExtra& extra) {
  STRIDER_RETURN_IF_ERROR(model::Guarded("trainer: generator state",
                                         [&] { state.rng_state = GeneratorState(generator_); }));
  if (state.model.empty()) state.model = model_->config().name;
  return strider::WriteCheckpoint(directory, *model_, optimizer_.get(), state, extra);
}

void Trainer::Report(Progress* progress, ProgressFields fields, int64_t tokens) {
  tokens_ += tokens;
  const double seconds = std::chrono::duration<double>(Clock::now() - started_).count();
  fields.tokens_per_second = tokens_ / std::max(seconds, 1e-9);
  fields.learning_rate = last_step_.learning_rate;
  fields.gradient_norm = last_step_.gradient_norm;
  fields.max_violation = last_violation_;
  progress->Report(fields);
}

Result<RoutingRecord> RealTokenRouting(const RoutingRecord& record, const at::Tensor& tokens) {
  at::Tensor real;
  STRIDER_RETURN_IF_ERROR(model::Guarded("routing balance", [&] { real = tokens != token::kPad; }));
  return RoutingAtPositions(record, real);
}

Result<RoutingRecord> RoutingAtPositions(const RoutingRecord& record, const at::Tensor& real) {
  RoutingRecord kept;
  STRIDER_RETURN_IF_ERROR(model::Guarded("routing balance", [&] {
    at::Tensor keep = real.reshape({-1}).nonzero().reshape({-1});
    for (const RoutingRecord::Layer& layer : record.layers) {
      // The mask is the host's; the record is where the model ran.
      keep = keep.to(layer.experts.device());
      RoutingRecord::Layer entry;
      entry.experts =
          layer.experts.reshape({-1, layer.experts.size(-1)}).index({keep}).unsqueeze(0);
      if (layer.scores.defined()) {
        entry.scores = layer.scores.reshape({-1, layer.scores.size(-1)}).index({keep}).unsqueeze(0);
      }
      kept.layers.push_back(std::move(entry));
    }
  }));
  return kept;
}

}  // namespace strider
