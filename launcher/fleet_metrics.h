// The launcher's view of its fleet's metrics: it follows the files the children write (the
// learner's metrics.jsonl, each actor's, the replay server's stats lines in its log) and merges
// them into one line a tick, RUN_DIR/metrics.jsonl, with the evaluations in RUN_DIR/eval.jsonl.
// On the launcher's loop only; not thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace strider::launcher {

// Lines appended to a JSON-lines file since the last call; a line still being written (no
// newline yet) waits for the next call.
class FileTail {
 public:
  FileTail() = default;
  explicit FileTail(std::string path) : path_(std::move(path)) {}
  std::vector<std::string> NewLines();

 private:
  std::string path_;
  std::streamoff offset_ = 0;
  std::string partial_;
};

// Each table's fill from the replay server's stats (its "replay stats:" log lines and the
// metrics of its /status): {"table": fill}, or null when `stats` holds no table list.
nlohmann::json ReplayFill(const nlohmann::json& stats);

class FleetMetrics {
 public:
  // Follows RUN_DIR/learner/metrics.jsonl from its start (a resumed run's rows count) and the
  // replay server's log and each actor's metrics from their end (an earlier launch's lines
  // describe processes that are gone). Opens RUN_DIR/metrics.jsonl, and with `evaluation`
  // RUN_DIR/eval.jsonl, for appending.
  Status Open(const std::filesystem::path& run_dir, const std::vector<std::string>& actors,
              bool evaluation);

  // Reads what the children wrote since the last call; returns the learner's new rows.
  std::vector<nlohmann::json> Read();
  // The merged line: the learner's latest row, the actors' summed rate, the replay fill, the
  // evaluations' success rate and `restarts` ({child: restarts}).
  nlohmann::json MergedLine(double elapsed_s, nlohmann::json restarts) const;
  void AppendMerged(const nlohmann::json& line);
  // An evaluation's row to eval.jsonl; its success_rate is the latest.
  void AppendEval(const nlohmann::json& row);

  const std::optional<nlohmann::json>& learner_row() const { return learner_row_; }
  // The learner's latest row's `key`, or `otherwise` without one.
  int64_t LearnerValue(const char* key, int64_t otherwise) const;
  int64_t samples() const { return samples_; }
  std::optional<double> eval_success_rate() const { return eval_success_rate_; }

 private:
  FileTail learner_;
  std::vector<FileTail> actors_;
  FileTail replay_log_;  // its "replay stats: {...}" lines carry each table's fill
  std::optional<nlohmann::json> learner_row_;
  std::vector<std::optional<nlohmann::json>> actor_rows_;
  nlohmann::json replay_fill_;  // {"table": fill}, null until the server's first stats line
  std::map<int64_t, int64_t> sampled_by_step_;  // a resumed learner repeats steps: one entry each
  int64_t samples_ = 0;
  std::optional<double> eval_success_rate_;
  std::ofstream merged_;
  std::ofstream eval_rows_;
};

// The progress line on stderr: rewritten in place on a terminal, else a line every 10 s.
class ProgressLine {
 public:
  ProgressLine();
  // `merged` is a FleetMetrics::MergedLine. `final_line` always shows and ends the line.
  void Show(const nlohmann::json& merged, double elapsed_s, bool final_line);
  // A message for stderr: the line being rewritten in place ends first, or it would be
  // overwritten half-way.
  void Log(const std::string& message);

 private:
  static constexpr double kPlainPeriodS = 10;  // progress lines when stderr is no terminal
  double last_plain_ = -kPlainPeriodS;
  const bool on_terminal_;
  bool open_ = false;  // a \r line on the terminal awaits its end
};

}  // namespace strider::launcher
