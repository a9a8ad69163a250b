#include "learner/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace strider {

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else if (s >= 60) {
    std::snprintf(text, sizeof(text), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(text, sizeof(text), "%llds", static_cast<long long>(s));
  }
  return text;
}

Result<Progress> Progress::Open(const std::string& metrics_path, int display) {
  Progress progress;
  if (!metrics_path.empty()) {
    progress.metrics_ = std::fopen(metrics_path.c_str(), "a");
    if (progress.metrics_ == nullptr) {
      return Status::IoError("cannot open metrics file " + metrics_path);
    }
  }
  if (display < kAuto || display > kLines) {
    return Status::InvalidArgument("progress display " + std::to_string(display) +
                                   " is none of -1 (auto), 0, 1 (bar), 2 (lines)");
  }
  progress.display_ = display == kAuto ? (::isatty(STDERR_FILENO) != 0 ? kBar : kLines)
                                       : static_cast<Display>(display);
  progress.opened_ = std::chrono::steady_clock::now();
  return progress;
}

Progress::Progress(Progress&& other) noexcept { *this = std::move(other); }

Progress& Progress::operator=(Progress&& other) noexcept {
  std::swap(metrics_, other.metrics_);
  display_ = other.display_;
  bar_open_ = other.bar_open_;
  opened_ = other.opened_;
  last_draw_ = other.last_draw_;
  last_ = other.last_;
  last_left_ = other.last_left_;
  last_printed_ = other.last_printed_;
  line_printed_ = other.line_printed_;
  printed_stage_ = other.printed_stage_;
  // The moved-from object must not end a bar or print a line on destruction.
  other.bar_open_ = false;
  other.last_printed_ = true;
  return *this;
}

Progress::~Progress() {
  Finish();
  if (metrics_ != nullptr) std::fclose(metrics_);
}

void Progress::WriteLine(const std::string& json) {
  if (metrics_ == nullptr) return;
  std::fputs(json.c_str(), metrics_);
  std::fputc('\n', metrics_);
  std::fflush(metrics_);
}

void Progress::Report(const ProgressFields& f) {
  const double left =
      f.tokens_per_second > 0
          ? static_cast<double>(f.tokens_total - f.tokens_done) / f.tokens_per_second
          : NAN;
  nlohmann::json json = {{"stage", f.stage},
                         {"step", f.step},
                         {"tokens", f.tokens_done},
                         {"tokens_total", f.tokens_total},
                         {"tokens_per_second", f.tokens_per_second},
                         {"loss", f.loss},
                         {"learning_rate", f.learning_rate},
                         {"gradient_norm", f.gradient_norm},
                         {"seconds_left", std::isfinite(left) ? left : -1.0}};
  if (f.max_violation >= 0) json["max_violation"] = f.max_violation;
  WriteLine(json.dump());
  const auto now = std::chrono::steady_clock::now();
  if (display_ == kLines) {
    last_ = f;
    last_left_ = std::isfinite(left) ? left : -1.0;
    last_printed_ = false;
    // A new stage's first step prints at once, so every stage's start shows.
    if (line_printed_ && f.stage == printed_stage_ &&
        now - last_draw_ < std::chrono::duration<double>(kLinePeriodS)) {
      return;
    }
    last_draw_ = now;
    PrintLine(f, last_left_);
    return;
  }
  if (display_ != kBar) return;
  if (bar_open_ && f.tokens_done < f.tokens_total &&
      now - last_draw_ < std::chrono::milliseconds(200)) {
    return;
  }
  last_draw_ = now;
  const double fraction =
      f.tokens_total > 0 ? std::min(1.0, static_cast<double>(f.tokens_done) / f.tokens_total) : 0;
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%-10s [%s] %5.1f%% %lld/%lld tok  %.0f tok/s  loss %.4f  left %s   ",
               f.stage.c_str(), bar.c_str(), 100 * fraction, static_cast<long long>(f.tokens_done),
               static_cast<long long>(f.tokens_total), f.tokens_per_second, f.loss,
               FormatDuration(left).c_str());
  std::fflush(stderr);
  bar_open_ = true;
}

void Progress::PrintLine(const ProgressFields& f, double seconds_left) {
  // One self-contained line a log reader can follow without the metrics file: where the stage
  // is, how fast, whether the loss falls, and how long it has run and has left.
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - opened_).count();
  std::string steps = std::to_string(f.step);
  if (f.steps_total > 0) steps += "/" + std::to_string(f.steps_total);
  const double percent =
      f.tokens_total > 0 ? 100.0 * static_cast<double>(f.tokens_done) / f.tokens_total : 0;
  std::fprintf(
      stderr,
      "pretrain: stage %s | step %s | tokens %lld/%lld (%.0f%%) | %.0f tok/s | loss %.4f | "
      "elapsed %s | stage left %s\n",
      f.stage.c_str(), steps.c_str(), static_cast<long long>(f.tokens_done),
      static_cast<long long>(f.tokens_total), percent, f.tokens_per_second, f.loss,
      FormatDuration(elapsed).c_str(), FormatDuration(seconds_left).c_str());
  std::fflush(stderr);
  line_printed_ = true;
  last_printed_ = true;
  printed_stage_ = f.stage;
}

void Progress::Finish() {
  if (bar_open_) {
    std::fputc('\n', stderr);
    bar_open_ = false;
  }
  if (display_ == kLines && !last_printed_) {
    last_draw_ = std::chrono::steady_clock::now();
    PrintLine(last_, last_left_);
  }
}

}  // namespace strider
