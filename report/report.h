// The run report (`strider report RUN_DIR [RUN_DIR...]`, docs/design.md#command-line): one
// self-contained HTML page with inline SVG plots drawn here, so it opens offline with nothing to
// download and no script. Two kinds of run directory (DetectRunKind): a pretraining run
// (WriteRunReport, below) and RL runs written by `strider launch` (WriteRlReport, at the end),
// several of which can be overlaid on one page.
//
// Pretraining inputs, both JSON lines in the run directory:
//   metrics.jsonl   per-step lines {stage, step, loss, max_violation?, ...} and one
//                   {"event": "stage_end", ...} line per stage (learner/progress.h, pretrain.cc)
//   eval.jsonl      one line per (stage, evaluated context): {stage, context, loss,
//                   retrieval_accuracy, ci_low?, ci_high?, ...}
// Output: RUN_DIR/report.html with
//   - loss per stage over steps (one line per stage, steps counted across the run),
//   - retrieval accuracy against context length (one line per evaluated stage, log2 x axis),
//   - the routing MaxVio per step, when the run balanced its routers,
//   - tables of the stage summaries and of every evaluation row.
// A resumed run appends to metrics.jsonl, so a (stage, step) seen twice keeps its last line.
//
// No LibTorch here.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace strider {

// One plotted series: points in drawing order.
struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y)
  // Optional interval around the line (a confidence interval), drawn as a translucent band in
  // the series' colour: (x, low, high) in drawing order; points with a non-finite value skipped.
  std::vector<std::array<double, 3>> band;
};

struct PlotOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log2_x = false;          // x values must be > 0
  double y_min = NAN;           // NAN: from the data
  double y_max = NAN;
  double reference_y = NAN;     // a dashed horizontal line (a target), when finite
  std::string reference_label;
  int width = 720;
  int height = 360;
};

// An <svg> element (no XML prolog) drawing the series as polylines with markers, axes with
// ticks, a legend and the reference line. Text is escaped. Series without points are listed in
// the legend only.
std::string SvgLinePlot(const std::vector<PlotSeries>& series, const PlotOptions& options);

// Reads the run directory's metrics.jsonl and eval.jsonl (eval.jsonl may be missing: the page
// says so) and writes report.html beside them. Returns its path. A line that is not a JSON
// object is an error naming the file and the line number.
Result<std::string> WriteRunReport(const std::string& run_dir);

// An RL run directory has fleet.yaml or learner/metrics.jsonl (what `strider launch` writes);
// anything else is read as a pretraining run.
enum class RunKind { kPretraining, kRl };
RunKind DetectRunKind(const std::string& run_dir);

// One page overlaying the RL runs in `run_dirs` (at least one), written to `out_path`; returns
// that path. Per run, every file is optional (a run just started has few) and the page says
// which are missing:
//   fleet.yaml                 its learner.config's objective.advantages.estimator labels the
//                              run; the directory's name when it cannot be read, and both when
//                              two runs would share a label
//   metrics.jsonl              the launcher's ticks {elapsed_s, samples, learner_tokens_per_s,
//                              actor_tokens_per_s, restarts, ...}
//   eval.jsonl                 {"event":"eval", success_rate, ci_low, ci_high, samples_seen,
//                              elapsed_s, ...} per evaluation
//   learner/metrics.jsonl      one line per learner step {step, trajectories, reward_mean,
//                              success_rate, kl, clip_fraction, logprob_mismatch_max,
//                              staleness_mean, max_violation, ...}; a repeated step (a resumed
//                              learner) keeps its last line
//   actors/*/metrics.jsonl     actor metrics {elapsed_s, weights_wait_s (sync actors), ...}
// Plots: evaluation success (95% interval as a band) against samples trained on and against
// wall time; training reward and success against samples; KL, clip fraction, log-prob mismatch,
// staleness and MaxVio against the learner step; learner and actor tokens/s against wall time;
// the actors' time waiting for weights when recorded. A table gives each run's final evaluation,
// samples, wall time and steps. A line that is not a JSON object, or lacks the field its file
// is indexed by, is an error naming the file and the line.
Result<std::string> WriteRlReport(const std::vector<std::string>& run_dirs,
                                  const std::string& out_path);

}  // namespace strider
