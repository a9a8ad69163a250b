// Training progress: a one-line bar on stderr when it is a terminal, a plain line every few
// seconds when it is not (a file, a pipe, a CI log, where a bar redrawn with \r would be one
// unreadable line or nothing until the end), and a JSON-lines metrics file always (one object
// per reported step), so runs are readable live and plottable after.
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
  int64_t steps_total = 0;   // the stage's steps; 0 when not known
  int64_t tokens_done = 0;   // in this stage
  int64_t tokens_total = 0;  // the stage's budget
  double tokens_per_second = 0;
  double loss = 0;
  double learning_rate = 0;
  double gradient_norm = 0;
  double max_violation = -1;  // routing MaxVio of the step; negative when not measured
};

class Progress {
 public:
  // What goes to stderr: kAuto is the bar on a terminal and lines otherwise.
  enum Display : int { kAuto = -1, kNone = 0, kBar = 1, kLines = 2 };
  // A plain line's period: the launcher's (launcher/launcher.cc).
  static constexpr double kLinePeriodS = 10;

  // Opens (appends to) `metrics_path`; an empty path writes no file. `display` is a Display.
  static Result<Progress> Open(const std::string& metrics_path, int display = kAuto);
  Progress(Progress&& other) noexcept;
  Progress& operator=(Progress&& other) noexcept;
  ~Progress();

  // Writes the metrics line and redraws the bar (at most every 0.2 s), or prints a line: at a
  // stage's first report, then every kLinePeriodS.
  void Report(const ProgressFields& fields);
  // Ends the bar's line so later output starts on a fresh line; in lines mode prints the last
  // report if it has not been, so a stage's last step always shows.
  void Finish();
  // Writes a free-form JSON object line (already serialised) to the metrics file.
  void WriteLine(const std::string& json);

 private:
  Progress() = default;
  void PrintLine(const ProgressFields& fields, double seconds_left);

  std::FILE* metrics_ = nullptr;
  Display display_ = kNone;
  bool bar_open_ = false;
  std::chrono::steady_clock::time_point opened_{};
  std::chrono::steady_clock::time_point last_draw_{};
  // Lines mode: the last report and whether its line was printed.
  ProgressFields last_{};
  double last_left_ = -1;
  bool last_printed_ = true;
  bool line_printed_ = false;  // any line yet: the first report prints at once
  std::string printed_stage_;  // the stage of the last line printed
};

// "1h02m", "3m05s", "12s".
std::string FormatDuration(double seconds);

}  // namespace strider
