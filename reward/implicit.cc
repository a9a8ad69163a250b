#include "reward/implicit.h"

#include <cmath>
#include <string>

namespace strider::reward {

Result<std::vector<double>> ImplicitProcessRewards(std::span<const float> policy_logprobs,
                                                   std::span<const float> reference_logprobs,
                                                   std::span<const schema::Role> roles,
                                                   std::span<const uint64_t> step_ends,
                                                   double beta) {
  const size_t tokens = roles.size();
  if (policy_logprobs.size() != tokens || reference_logprobs.size() != tokens) {
    return Status::InvalidArgument("implicit rewards: " + std::to_string(policy_logprobs.size()) +
                                   " policy and " + std::to_string(reference_logprobs.size()) +
                                   " reference log-probs for " + std::to_string(tokens) +
                                   " tokens");
  }
  if (!std::isfinite(beta)) return Status::InvalidArgument("implicit rewards: beta is not finite");
  std::vector<double> rewards;
  rewards.reserve(step_ends.size());
  uint64_t begin = 0;
  for (size_t k = 0; k < step_ends.size(); ++k) {
    const uint64_t end = step_ends[k];
    if (end <= begin || end > tokens) {
      return Status::InvalidArgument("implicit rewards: step " + std::to_string(k) + " ends at " +
                                     std::to_string(end) + ", after " + std::to_string(begin) +
                                     " and within " + std::to_string(tokens) + " tokens");
    }
    // Summed in double: a step of thousands of tokens would lose the small ratios in float.
    double sum = 0;
    for (uint64_t t = begin; t < end; ++t) {
      if (!schema::IsAction(roles[t])) continue;
      const double ratio = static_cast<double>(policy_logprobs[t]) - reference_logprobs[t];
      if (!std::isfinite(ratio)) {
        return Status::InvalidArgument("implicit rewards: token " + std::to_string(t) +
                                       " has a non-finite log-prob");
      }
      sum += ratio;
    }
    rewards.push_back(beta * sum);
    begin = end;
  }
  return rewards;
}

}  // namespace strider::reward
