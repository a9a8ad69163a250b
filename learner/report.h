// The run report (`strider report RUN_DIR`, DESIGN.md s.8): one self-contained HTML page with
// inline SVG plots drawn here, so it opens offline with nothing to download and no script.
//
// Inputs, both JSON lines in the run directory:
//   metrics.jsonl   per-step lines {stage, step, loss, max_violation?, ...} and one
//                   {"event": "stage_end", ...} line per stage (learner/progress.h, pretrain.cc)
//   eval.jsonl      one line per (stage, evaluated context): {stage, context, loss,
//                   retrieval_accuracy, ...}
// Output: RUN_DIR/report.html with
//   - loss per stage over steps (one line per stage, steps counted across the run),
//   - retrieval accuracy against context length (one line per evaluated stage, log2 x axis),
//   - the routing MaxVio per step, when the run balanced its routers,
//   - tables of the stage summaries and of every evaluation row.
// A resumed run appends to metrics.jsonl, so a (stage, step) seen twice keeps its last line.
//
// No LibTorch here.
#pragma once

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

}  // namespace strider
