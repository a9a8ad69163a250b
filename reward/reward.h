// The reward component's front header (docs/design.md#advantages-from-process-rewards): where a
// learner or an evaluation gets per-step rewards from.
//
//   shaping.h     ShapingConfig (the `reward:` config block), Shape: environment step rewards,
//                 outcome, learned and implicit process rewards -> one reward per step, each
//                 counted once, truncated trajectories marked for bootstrapping
//   implicit.h    ImplicitProcessRewards: beta x the policy/reference log-ratio per step (PRIME)
//   trajectory.h  StoredRewards: a stored trajectory (schema::JoinSegments joins its segments,
//                 common/schema/trajectory.h) as shaping's input
//   verifiers.h   Rescore, RescoreStore: replay stored episodes against their environment for
//                 step labels, step rewards and outcomes
//
// No LibTorch: log-probs and scores arrive as plain arrays. Depends only on common, envs and the
// replay store reader. Reward models that are trained (the learned process reward model) run a
// model on the learner's core, so they live under the learner (learner/prm/prm.h).
#pragma once

#include "reward/implicit.h"
#include "reward/shaping.h"
#include "reward/trajectory.h"
#include "reward/verifiers.h"
