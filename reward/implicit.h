// Implicit process rewards (PRIME: "Process Reinforcement through Implicit Rewards"): a model
// trained only on outcomes still scores every token by how much more likely it makes it than a
// reference model does, and that log-ratio, summed over a step, is the step's process reward:
//
//   r_k = beta * sum over action tokens t of step k of (log pi(y_t) - log pi_ref(y_t))
//
// Context tokens (observations, turn markers) are not the policy's choices and add nothing.
// The log-probs come from the learner (scoring pass, no LibTorch here): plain arrays, one entry
// per token of the trajectory, in trajectory order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/schema/messages.h"
#include "common/status.h"

namespace strider::reward {

// One reward per step. `step_ends` holds each step's end (one past its last token) as a
// position in the trajectory, increasing; step k covers [step_ends[k-1], step_ends[k]), the
// first from 0. Tokens after the last end (a final observation) belong to no step.
// Errors (InvalidArgument): arrays of different lengths, ends not increasing or past the end,
// a non-finite log-prob on an action token, a non-finite beta.
Result<std::vector<double>> ImplicitProcessRewards(std::span<const float> policy_logprobs,
                                                   std::span<const float> reference_logprobs,
                                                   std::span<const schema::Role> roles,
                                                   std::span<const uint64_t> step_ends,
                                                   double beta);

}  // namespace strider::reward
