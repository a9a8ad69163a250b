#include "launcher/eval_schedule.h"

#include <chrono>
#include <cstdint>
#include <utility>

namespace strider::launcher {
namespace {

constexpr auto kRetryPause = std::chrono::seconds(30);  // after a failed evaluation

}  // namespace

EvaluationSchedule::EvaluationSchedule(int64_t every_versions, bool resume,
                                       std::string start_weights)
    : every_versions_(every_versions), resume_(resume), start_weights_(std::move(start_weights)) {}

std::optional<EvaluationSchedule::Run> EvaluationSchedule::Due(
    std::optional<int64_t> learner_version, Clock::time_point now) {
  if (!enabled_) return std::nullopt;
  Run run;
  if (!start_evaluated_) {
    if (!start_weights_.empty()) {
      run.weights = start_weights_;
      run.version = 0;
    } else if (!resume_ && !learner_version) {
      return std::nullopt;  // nothing published before the learner's first step: wait for it
    }
  } else if (learner_version.value_or(0) < next_version_ || now < retry_after_) {
    return std::nullopt;
  }
  start_evaluated_ = true;
  return run;
}

void EvaluationSchedule::Done(std::optional<int64_t> version) {
  const int64_t evaluated = version.value_or(next_version_);
  next_version_ =
      every_versions_ > 0 ? (evaluated / every_versions_ + 1) * every_versions_ : INT64_MAX;
}

void EvaluationSchedule::Failed(std::optional<int64_t> learner_version, Clock::time_point now) {
  if (learner_version && every_versions_ > 0) next_version_ = *learner_version + every_versions_;
  retry_after_ = now + kRetryPause;
}

}  // namespace strider::launcher
