#include "learner/optimizer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <cstring>

#include "common/config.h"
#include "common/model/torch_status.h"
#include "common/safetensors.h"

namespace strider {

void ReadAdamWOptions(ConfigReader& section, AdamWOptions* options) {
  section.Optional("learning_rate", &options->learning_rate);
  section.Optional("beta1", &options->beta1);
  section.Optional("beta2", &options->beta2);
  section.Optional("epsilon", &options->epsilon);
  section.Optional("weight_decay", &options->weight_decay);
  section.Optional("clip_norm", &options->clip_norm);
  section.Check(options->learning_rate > 0, "learning_rate", "must be positive");
  section.Check(options->beta1 >= 0 && options->beta1 < 1, "beta1", "must be in [0, 1)");
  section.Check(options->beta2 >= 0 && options->beta2 < 1, "beta2", "must be in [0, 1)");
  section.Check(options->epsilon > 0, "epsilon", "must be positive");
  section.Check(options->weight_decay >= 0, "weight_decay", "must not be negative");
  section.Check(options->clip_norm >= 0, "clip_norm", "must not be negative");
}

AdamW::AdamW(std::vector<std::pair<std::string, at::Tensor>> parameters, AdamWOptions options)
    : parameters_(std::move(parameters)), options_(options) {
  for (const auto& [name, tensor] : parameters_) {
    exp_avg_.push_back(at::zeros_like(tensor, at::MemoryFormat::Contiguous));
    exp_avg_sq_.push_back(at::zeros_like(tensor, at::MemoryFormat::Contiguous));
    scales_.push_back(1.0);
  }
}

Status AdamW::SetLearningRateScale(const std::string& name, double scale) {
  if (!(scale >= 0) || !std::isfinite(scale)) {
    return Status::InvalidArgument("learning-rate scale of " + name + " must be finite and >= 0");
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (parameters_[i].first == name) {
      scales_[i] = scale;
      return Status::Ok();
    }
  }
  return Status::NotFound("optimizer has no parameter " + name);
}

void AdamW::ShardNorm(const std::function<bool(const std::string&)>& sharded,
                      std::function<Result<double>(double)> sum_across_ranks) {
  sharded_.assign(parameters_.size(), false);
  for (size_t i = 0; i < parameters_.size(); ++i) sharded_[i] = sharded(parameters_[i].first);
  sum_across_ranks_ = std::move(sum_across_ranks);
}

std::vector<at::Tensor> AdamW::MomentTensors() const {
  std::vector<at::Tensor> out = exp_avg_;
  out.insert(out.end(), exp_avg_sq_.begin(), exp_avg_sq_.end());
  return out;
}

void AdamW::ZeroGrad() {
  for (auto& [name, tensor] : parameters_) {
    if (tensor.grad().defined()) tensor.mutable_grad() = at::Tensor();
  }
}

Result<double> AdamW::Step(double learning_rate) {
  return model::Guarded("optimizer step", [&]() -> Result<double> {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> norms, sharded_norms;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const at::Tensor& tensor = parameters_[i].second;
      if (!tensor.grad().defined()) continue;
      const bool own = sum_across_ranks_ && sharded_[i];
      (own ? sharded_norms : norms).push_back(tensor.grad().pow(2).sum().to(at::kDouble));
    }
    double squared = norms.empty() ? 0.0 : at::stack(norms).sum().item<double>();
    if (sum_across_ranks_) {
      // Every rank takes part, with or without gradients of its own.
      STRIDER_ASSIGN_OR_RETURN(
          const double shards,
          sum_across_ranks_(sharded_norms.empty() ? 0.0
                                                  : at::stack(sharded_norms).sum().item<double>()));
      squared += shards;
    } else if (norms.empty()) {
      return 0.0;
    }
    const double norm = std::sqrt(squared);
    if (!std::isfinite(norm)) {
      return Status::FailedPrecondition("gradient norm is not finite; step skipped");
    }
    const double clip =
        (options_.clip_norm > 0 && norm > options_.clip_norm) ? options_.clip_norm / norm : 1.0;
    ++step_;
    const double correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_));
    const double correction2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_));
    for (size_t i = 0; i < parameters_.size(); ++i) {
      at::Tensor& parameter = parameters_[i].second;
      if (!parameter.grad().defined()) continue;
      const double rate = learning_rate * scales_[i];
      at::Tensor grad = parameter.grad();
      if (clip != 1.0) grad = grad * clip;
      exp_avg_[i].mul_(options_.beta1).add_(grad, 1.0 - options_.beta1);
      exp_avg_sq_[i].mul_(options_.beta2).addcmul_(grad, grad, 1.0 - options_.beta2);
      if (options_.weight_decay > 0 && parameter.dim() >= 2) {
        parameter.mul_(1.0 - rate * options_.weight_decay);
      }
      at::Tensor denominator =
          (exp_avg_sq_[i] / correction2).sqrt_().add_(options_.epsilon);
      parameter.addcdiv_(exp_avg_[i], denominator, -rate / correction1);
    }
    return norm;
  });
}

Status AdamW::Save(const std::string& path) const {
  std::vector<TensorView> views;
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    for (int which = 0; which < 2; ++which) {
      // Moments keep their precision: fp64 for an fp64 model, fp32 otherwise. Written from host
      // memory, one moment copied off a GPU at a time.
      at::Tensor tensor = (which == 0 ? exp_avg_[i] : exp_avg_sq_[i]).cpu().contiguous();
      const bool wide = tensor.scalar_type() == at::kDouble;
      if (!wide) tensor = tensor.to(at::kFloat);
      keep.push_back(tensor);
      TensorView view;
      view.name = parameters_[i].first + (which == 0 ? ".exp_avg" : ".exp_avg_sq");
      view.dtype = wide ? DType::kF64 : DType::kF32;
      view.shape = tensor.sizes().vec();
      view.data = tensor.data_ptr();
      view.byte_size = tensor.nbytes();
      views.push_back(std::move(view));
    }
  }
  return WriteSafetensors(path, views,
                          {{"format", "strider-adamw"}, {"step", std::to_string(step_)}});
}

Status AdamW::Load(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(SafetensorsContents contents, ReadSafetensors(path));
  auto step = contents.metadata.find("step");
  if (step == contents.metadata.end()) {
    return Status::Corruption(path + ": optimizer state has no 'step' metadata");
  }
  std::vector<at::Tensor> averages, squares;
  for (const auto& [name, parameter] : parameters_) {
    for (int which = 0; which < 2; ++which) {
      const std::string key = name + (which == 0 ? ".exp_avg" : ".exp_avg_sq");
      auto it = contents.tensors.find(key);
      if (it == contents.tensors.end()) {
        return Status::InvalidArgument(path + ": missing optimizer tensor '" + key + "'");
      }
      const DType dtype = it->second.dtype;
      if ((dtype != DType::kF32 && dtype != DType::kF64) ||
          it->second.shape != parameter.sizes().vec()) {
        return Status::InvalidArgument(path + ": optimizer tensor '" + key +
                                       "' does not match the parameter's shape (F32 or F64)");
      }
      at::Tensor tensor =
          at::empty(parameter.sizes(), dtype == DType::kF64 ? at::kDouble : at::kFloat);
      std::memcpy(tensor.data_ptr(), it->second.bytes.data(), it->second.bytes.size());
      (which == 0 ? averages : squares)
          .push_back(tensor.to(parameter.device(), parameter.scalar_type()));
    }
  }
  exp_avg_ = std::move(averages);
  exp_avg_sq_ = std::move(squares);
  step_ = std::stoll(step->second);
  return Status::Ok();
}

}  // namespace strider
