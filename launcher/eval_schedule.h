// When the launcher runs its evaluations (fleet `evaluation:`, docs/launcher.md): the start
// weights once, then every `every_versions`-th version the learner publishes, one evaluation at
// a time, with a pause after a failure. On the launcher's loop only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/clock.h"

namespace strider::launcher {

class EvaluationSchedule {
 public:
  // `start_weights`: the file the start evaluation reads (as version 0); "" to evaluate what the
  // learner publishes instead, which a fresh learner does only after its first step. `resume`:
  // the learner continues from a checkpoint, whose weights it serves at once.
  EvaluationSchedule(int64_t every_versions, bool resume, std::string start_weights);

  // False once an evaluation failed in a way that trying again cannot help.
  bool enabled() const { return enabled_; }
  void Disable() { enabled_ = false; }

  // What an evaluation due now reads: a weights file and the version it holds, or (empty) the
  // learner's weight stream.
  struct Run {
    std::string weights;
    std::optional<int64_t> version;
  };
  // The evaluation due now, if any; `learner_version` is the learner's latest published
  // version, absent before its first metrics row. The caller starts the one returned.
  std::optional<Run> Due(std::optional<int64_t> learner_version, Clock::time_point now);
  // An evaluation finished with a row for `version` (absent: unknown, the one that was due).
  void Done(std::optional<int64_t> version);
  // An evaluation failed: it is tried again at the next version due, and not before a pause, so
  // that a failure that lasts (no weights served yet, no memory) does not start one every tick.
  void Failed(std::optional<int64_t> learner_version, Clock::time_point now);

 private:
  const int64_t every_versions_;
  const bool resume_;
  const std::string start_weights_;
  bool enabled_ = true;
  bool start_evaluated_ = false;
  int64_t next_version_ = 0;
  Clock::time_point retry_after_{};
};

}  // namespace strider::launcher
