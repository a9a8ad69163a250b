// Training progress: a one-line bar on stderr when it is a terminal, and a JSON-lines metrics
// file always (one object per reported step), so runs are readable live and plottable after.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/status.h"

namespace strider {

struct ProgressFields {
  std::string stage;
  int64_t step = 0;
  int64_t tokens_done = 0;    // in this stage
  int64_t tokens_total = 0;   // the stage's budget
  double tokens_per_second = 0;
  double loss = 0;
  double learning_rate = 0;
  double gradient_norm = 0;
  double max_violation = -1;  // routing MaxVio of the step; negative when not measured
};

class Progress {
 public:
  // Opens (appends to) `metrics_path`; an empty path writes no file. `bar` forces the terminal
  // bar on or off; by default it is on when stderr is a TTY.
  static Result<Progress> Open(const std::string& metrics_path, int bar = -1);
  Progress(Progress&& other) noexcept;
  Progress& operator=(Progress&& other) noexcept;
  ~Progress();

  // Writes the metrics line and redraws the bar (at most every 0.2 s).
  void Report(const ProgressFields& fields);
  // Ends the bar's line so later output starts on a fresh line.
  void Finish();
  // Writes a free-form JSON object line (already serialised) to the metrics file.
  void WriteLine(const std::string& json);

 private:
  Progress() = default;
  std::FILE* metrics_ = nullptr;
  bool bar_ = false;
  bool bar_open_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

// "1h02m", "3m05s", "12s".
std::string FormatDuration(double seconds);

}  // namespace strider
