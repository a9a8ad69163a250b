// Reward models trained beside the policy (library strider_reward_model): models whose scores
// become rewards (reward::StepRewards::learned) and which train on the learner's core, the
// chunked pass (learner/learner.h) and AdamW (learner/optimizer.h).
//
//   process_model.h  TrainProcessModel, ProcessRewardModel (Load, ScoreSteps): the learned
//                    process reward model, a head on a frozen policy model's hidden states,
//                    trained offline from a replay store's labelled steps; ReadLabelledStore,
//                    ReplayedLabels, HeldOut: its data
//
// Why here and not in reward/: training needs the learner core and LibTorch, and reward/ depends
// only on common, envs and the replay store reader, so the learner and the evaluation can link
// reward shaping without either. What they share with reward/ is the stored trajectory
// (common/schema/trajectory.h) and the per-step scores they hand to reward::Shape.
//
// A second trained model sits beside this one the same way: a header of its own here, a
// checkpoint directory with a JSON description whose "format" names it, training on the same
// core, and scores the RL step reads through a borrowed const pointer (rl::StepSettings).
// Names are in strider::reward, the namespace of the rewards they produce.
#pragma once

#include "learner/prm/process_model.h"
