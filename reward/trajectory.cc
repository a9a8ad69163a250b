#include "reward/trajectory.h"

namespace strider::reward {
namespace {

envs::StepLabel EnvironmentLabel(schema::StepLabel label) {
  switch (label) {
    case schema::StepLabel::kCorrect:
      return envs::StepLabel::kCorrect;
    case schema::StepLabel::kIncorrect:
      return envs::StepLabel::kIncorrect;
    default:
      return envs::StepLabel::kUnknown;
  }
}

}  // namespace

TrajectoryRewards StoredRewards(const schema::StoredTrajectory& trajectory) {
  TrajectoryRewards rewards;
  switch (trajectory.end_reason) {
    case schema::EndReason::kFinished:
      rewards.end = TrajectoryEnd::kFinished;
      break;
    case schema::EndReason::kTruncatedTurns:
    case schema::EndReason::kTruncatedLength:
    case schema::EndReason::kAbandoned:
      rewards.end = TrajectoryEnd::kTruncated;
      break;
    case schema::EndReason::kFailed:
      rewards.end = TrajectoryEnd::kFailed;
      break;
    default:
      rewards.end = TrajectoryEndFromStatus(trajectory.status);
  }
  if (rewards.end == TrajectoryEnd::kFinished) rewards.outcome = trajectory.outcome;
  for (const schema::StoredStep& step : trajectory.steps) {
    StepRewards shaped;
    if (step.has_reward) shaped.env_reward = step.stored_reward;
    shaped.label = EnvironmentLabel(step.label);
    shaped.key = StepKey(step.turn_text);
    rewards.steps.push_back(std::move(shaped));
  }
  return rewards;
}

}  // namespace strider::reward
