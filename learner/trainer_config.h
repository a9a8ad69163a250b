// The settings of a run's config that its Trainer applies (learner.h), in one struct so a mode's
// config holds them as they are used: the run's seed, the `optimizer:` section and the router
// keys of the `balance:` section. The defaults here are the only ones; a mode states its own in
// its config reader where it wants others. No LibTorch objects, so config readers include it.
#pragma once

#include <cstdint>

#include "common/model/precision.h"
#include "learner/optimizer.h"

namespace strider {

struct TrainerConfig {
  // The generator's seed (mini-batch order, sampling) and a fresh model's initialisation.
  uint64_t seed = 1;
  AdamWOptions optimizer;  // clip_norm is the gradient clipping
  // Learning-rate multiplier of every sparse layer's router weights (1: none).
  double router_learning_rate_scale = 1.0;

  // Routing balance (docs/model_math.md#quantile-balancing).
  bool balance = true;  // update the router biases from the routing each step records
  // Steps whose routing records the quantile update pools (this one and those before).
  int64_t balance_window_steps = 1;
  // The biases are fitted before each step's training pass (FitRoutingBalance) instead of
  // after it: BalanceRouting then only measures.
  bool balance_prepass = false;

  // The passes' compute precision (common/model/precision.h). In bfloat16 the model's weights,
  // their gradients and the AdamW moments stay fp32 (the masters); the scoring and update
  // passes run their matrix products in bf16.
  Precision precision = Precision::kFloat32;
};

}  // namespace strider
