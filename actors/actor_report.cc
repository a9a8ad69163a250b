#include "actors/actor_report.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace strider::actors {

using std::chrono::milliseconds;

ActorReporter::ActorReporter(const ActorOptions& options)
    : actor_id_(options.actor_id),
      episodes_(options.episodes),
      interval_s_(options.metrics_interval_s),
      metrics_path_(options.metrics_path),
      progress_(options.progress) {}

Status ActorReporter::Start(Clock::time_point started) {
  next_report_ = started + milliseconds(static_cast<int64_t>(interval_s_ * 1000));
  terminal_ = progress_ && ::isatty(STDERR_FILENO);
  if (!metrics_path_.empty()) {
    metrics_file_.open(metrics_path_, std::ios::app);
    if (!metrics_file_) {
      return Status::IoError("actor: cannot open the metrics file " + metrics_path_);
    }
  }
  return Status::Ok();
}

void ActorReporter::Publish(const ActorMetrics& metrics) {
  MutexLock lock(&mutex_);
  snapshot_ = metrics;
}

ActorMetrics ActorReporter::snapshot() const {
  MutexLock lock(&mutex_);
  return snapshot_;
}

void ActorReporter::Progress(const ActorMetrics& metrics, bool final_report) {
  int64_t errors = 0;
  for (const auto& [kind, n] : metrics.errors) errors += n;
  const double elapsed = std::max(1e-9, metrics.elapsed_s);
  char round[96] = "";
  if (metrics.sync) {
    std::snprintf(round, sizeof(round), "  round %lld%s (waited %.1f s)",
                  static_cast<long long>(metrics.round),
                  metrics.waiting_for_weights ? " waiting for weights" : "",
                  metrics.weights_wait_s);
  }
  std::fprintf(stderr,
               "\r[%s] episodes %lld%s  tokens/s %.0f  tool calls %lld  errors %lld  "
               "segments %lld (acked %llu, spilled %llu)  v%llu%s   %s",
               actor_id_.c_str(), static_cast<long long>(metrics.episodes_finished),
               episodes_ > 0 ? ("/" + std::to_string(episodes_)).c_str() : "",
               (metrics.generated_tokens + metrics.context_tokens) / elapsed,
               static_cast<long long>(metrics.tool_calls), static_cast<long long>(errors),
               static_cast<long long>(metrics.segments),
               static_cast<unsigned long long>(metrics.acked_segments),
               static_cast<unsigned long long>(metrics.spill_files),
               static_cast<unsigned long long>(metrics.policy_version), round,
               final_report ? "\n" : "");
  std::fflush(stderr);
}

void ActorReporter::Report(const ActorMetrics& metrics, bool final_report) {
  const auto now = Clock::now();
  if (terminal_ && (now >= next_progress_ || final_report)) {
    next_progress_ = now + milliseconds(500);
    Progress(metrics, final_report);
  }
  if (now < next_report_ && !final_report) return;
  next_report_ = now + milliseconds(static_cast<int64_t>(interval_s_ * 1000));
  const std::string line = metrics.ToJson();
  if (metrics_file_.is_open()) {
    metrics_file_ << line << "\n";
    metrics_file_.flush();
  }
  if (!terminal_) spdlog::info("metrics {}", line);
}

}  // namespace strider::actors
