// Where an actor's metrics go: the snapshot metrics() returns to other threads, a JSON line every
// metrics_interval_s (the metrics file, else the log), and a one-line progress display when
// stderr is a terminal. The decode loop fills ActorMetrics; this publishes it.
#pragma once

#include <fstream>
#include <string>

#include "actors/actor.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"

namespace strider::actors {

class ActorReporter {
 public:
  explicit ActorReporter(const ActorOptions& options);

  // The run starts now: the first line is due metrics_interval_s later. IoError when the
  // metrics file cannot be opened for appending.
  Status Start(Clock::time_point started);
  // Copies `metrics` for metrics(); any thread may read it meanwhile.
  void Publish(const ActorMetrics& metrics) EXCLUDES(mutex_);
  ActorMetrics snapshot() const EXCLUDES(mutex_);
  // The progress line (at most every 0.5 s) and the JSON line when due; `final_report` writes
  // both now and ends the progress line. Decode loop only.
  void Report(const ActorMetrics& metrics, bool final_report);

 private:
  void Progress(const ActorMetrics& metrics, bool final_report);

  const std::string actor_id_;
  const int64_t episodes_;
  const double interval_s_;
  const std::string metrics_path_;
  const bool progress_;
  // Decode loop only.
  Clock::time_point next_report_;
  Clock::time_point next_progress_;
  std::ofstream metrics_file_;
  bool terminal_ = false;

  mutable Mutex mutex_;
  ActorMetrics snapshot_ GUARDED_BY(mutex_);
};

}  // namespace strider::actors
