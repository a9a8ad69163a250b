// AdamW with decoupled weight decay and global gradient-norm clipping, shared by pretraining and
// the RL learner. Its state is saved as safetensors ("<param>.exp_avg", "<param>.exp_avg_sq",
// metadata "step") so it opens in any safetensors reader.
//
// Weight decay applies to matrices only (two or more dimensions): norms' gains, biases and the
// per-head decay scalars are not pulled towards zero, as is usual for transformers.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace strider {

class ConfigReader;

struct AdamWOptions {
  double learning_rate = 1e-3;  // peak; schedules pass the current rate to Step
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-8;
  double weight_decay = 0.01;
  double clip_norm = 1.0;       // global L2 norm of all gradients; 0 disables clipping
};

// Reads an `optimizer:` section's AdamW fields (all optional) into `options`.
void ReadAdamWOptions(ConfigReader& section, AdamWOptions* options);

class AdamW {
 public:
  // The tensors are updated in place (they share storage with the model); names key the saved
  // state and must be unique.
  AdamW(std::vector<std::pair<std::string, at::Tensor>> parameters, AdamWOptions options);

  // Clips the gradients, then one AdamW update at `learning_rate`. Parameters without a gradient
  // are skipped. Returns the gradient norm before clipping; a non-finite norm is an error and
  // leaves the parameters unchanged (the caller decides whether to skip the batch).
  Result<double> Step(double learning_rate);
  void ZeroGrad();

  // Multiplies the learning rate of the parameter `name` (default 1; 0 freezes it). Not saved:
  // it comes from the configuration, like the rate itself. An unknown name is an error.
  Status SetLearningRateScale(const std::string& name, double scale);

  // Expert parallelism: the parameters `sharded` (by name) hold a different part of the model
  // on every rank, so the global norm adds their squared norms over all ranks:
  // `sum_across_ranks` sums a value over the group (every rank calls Step together).
  void ShardNorm(const std::function<bool(const std::string&)>& sharded,
                 std::function<Result<double>(double)> sum_across_ranks);
  const std::vector<std::pair<std::string, at::Tensor>>& parameters() const {
    return parameters_;
  }

  int64_t step() const { return step_; }
  // The moments (first, then second, in parameter order), in place: data-parallel ranks take
  // rank 0's when they resume together.
  std::vector<at::Tensor> MomentTensors() const;
  void set_step(int64_t step) { step_ = step; }
  const AdamWOptions& options() const { return options_; }

  Status Save(const std::string& path) const;
  // Restores moments and step count; every parameter must have its moments with matching shape.
  Status Load(const std::string& path);

 private:
  std::vector<std::pair<std::string, at::Tensor>> parameters_;
  std::vector<at::Tensor> exp_avg_;
  std::vector<at::Tensor> exp_avg_sq_;
  std::vector<double> scales_;  // per parameter, multiplies the learning rate
  std::vector<bool> sharded_;   // per parameter (ShardNorm)
  std::function<Result<double>(double)> sum_across_ranks_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

}  // namespace strider
