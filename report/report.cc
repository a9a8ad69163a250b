#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/durable_file.h"
#include "report/report_html.h"

namespace strider {
namespace fs = std::filesystem;
using report_html::Escape;
using report_html::Number;
using report_html::NumberField;
using report_html::PageHead;
using report_html::ReadJsonLines;
using report_html::StringField;
using report_html::WriteAtomically;

namespace {

// Colour-blind-safe palette (Okabe and Ito); series beyond it reuse it.
constexpr const char* kColors[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                   "#E69F00", "#56B4E9", "#000000", "#F0E442"};

// About `count` round tick values covering [low, high] (1, 2 or 5 times a power of ten).
std::vector<double> Ticks(double low, double high, int count) {
  std::vector<double> ticks;
  const double span = high - low;
  if (!(span > 0)) return {low};
  const double raw = span / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= raw) break;
  }
  for (double t = std::ceil(low / step) * step; t <= high + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

std::string ContextLabel(double tokens) {
  const double k = tokens / 1024;
  if (tokens >= 1024 * 1024) return Number(tokens / (1024 * 1024), 3) + "M";
  if (tokens >= 1024) return Number(k, 3) + "K";
  return Number(tokens, 6);
}

}  // namespace

std::string SvgLinePlot(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  // The legend sits right of the plot in 160 px; longer names widen the picture rather than
  // narrow the plot (about 6.5 px a character at this font size), so every plot of a page keeps
  // the same plot area.
  size_t longest = 0;
  for (const PlotSeries& s : series) longest = std::max(longest, s.name.size());
  const double left = 64, top = 34, bottom = 48;
  const double right = std::max(160.0, 44 + 6.5 * static_cast<double>(longest));
  const double w = options.width + (right - 160), h = options.height;
  const double plot_w = w - left - right, plot_h = h - top - bottom;
  auto x_of = [&](double x) { return options.log2_x ? std::log2(x) : x; };

  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (const PlotSeries& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (options.log2_x && x <= 0)) continue;
      x_lo = std::min(x_lo, x_of(x));
      x_hi = std::max(x_hi, x_of(x));
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
    for (const auto& [x, low, high] : s.band) {
      if (!std::isfinite(x) || !std::isfinite(low) || !std::isfinite(high)) continue;
      y_lo = std::min(y_lo, low);
      y_hi = std::max(y_hi, high);
    }
  }
  if (std::isfinite(options.reference_y)) {
    y_lo = std::min(y_lo, options.reference_y);
    y_hi = std::max(y_hi, options.reference_y);
  }
  if (std::isfinite(options.y_min)) y_lo = options.y_min;
  if (std::isfinite(options.y_max)) y_hi = options.y_max;
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1;
  if (!std::isfinite(y_lo) || !std::isfinite(y_hi)) y_lo = 0, y_hi = 1;
  if (x_hi <= x_lo) x_lo -= 0.5, x_hi += 0.5;
  if (y_hi <= y_lo) y_lo -= 0.5, y_hi += 0.5;
  auto px = [&](double x) { return left + (x_of(x) - x_lo) / (x_hi - x_lo) * plot_w; };
  auto py = [&](double y) { return top + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h; };

  auto drawable = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && !(options.log2_x && x <= 0);
  };
  // The drawn point count on the element lets a reader (or a test) tell an empty plot from a
  // full one without parsing the polylines.
  int64_t total_points = 0;
  for (const PlotSeries& s : series) {
    for (const auto& [x, y] : s.points) total_points += drawable(x, y);
  }

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" data-points=\"" << total_points
      << "\" data-series=\"" << series.size() << "\" width=\"" << w << "\" height=\"" << h
      << "\" viewBox=\"0 0 " << w << " " << h
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<title>" << Escape(options.title) << "</title>\n";
  svg << "<rect x=\"0\" y=\"0\" width=\"" << w << "\" height=\"" << h << "\" fill=\"white\"/>\n";
  svg << "<text x=\"" << left << "\" y=\"20\" font-size=\"14\" font-weight=\"bold\">"
      << Escape(options.title) << "</text>\n";
  // Axes, grid and ticks.
  svg << "<g class=\"axes\" stroke=\"#888\" fill=\"none\">\n";
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\""
      << plot_h << "\"/>\n</g>\n<g class=\"ticks\" fill=\"#333\">\n";
  for (double t : Ticks(y_lo, y_hi, 5)) {
    const double y = py(t);
    svg << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + plot_w << "\" y2=\""
        << y << "\" stroke=\"#eee\"/>";
    svg << "<text x=\"" << left - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << Number(t)
        << "</text>\n";
  }
  std::vector<double> x_ticks;
  if (options.log2_x) {
    for (double e = std::ceil(x_lo); e <= x_hi + 1e-9; ++e) x_ticks.push_back(std::exp2(e));
  } else {
    x_ticks = Ticks(x_lo, x_hi, 6);
  }
  for (double t : x_ticks) {
    const double x = px(t);
    svg << "<line x1=\"" << x << "\" y1=\"" << top + plot_h << "\" x2=\"" << x << "\" y2=\""
        << top + plot_h + 4 << "\" stroke=\"#888\"/>";
    svg << "<text x=\"" << x << "\" y=\"" << top + plot_h + 17 << "\" text-anchor=\"middle\">"
        << (options.log2_x ? ContextLabel(t) : Number(t, 6)) << "</text>\n";
  }
  svg << "</g>\n";
  svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << h - 10 << "\" text-anchor=\"middle\">"
      << Escape(options.x_label) << "</text>\n";
  svg << "<text transform=\"translate(16 " << top + plot_h / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << Escape(options.y_label) << "</text>\n";
  if (std::isfinite(options.reference_y)) {
    const double y = py(options.reference_y);
    svg << "<line class=\"reference\" x1=\"" << left << "\" y1=\"" << y << "\" x2=\""
        << left + plot_w << "\" y2=\"" << y
        << "\" stroke=\"#c00\" stroke-dasharray=\"6 4\"/><text x=\"" << left + plot_w - 4
        << "\" y=\"" << y - 4 << "\" text-anchor=\"end\" fill=\"#c00\">"
        << Escape(options.reference_label) << "</text>\n";
  }
  // Series, then the legend on the right.
  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
    std::ostringstream path;
    int drawn = 0;
    for (const auto& [x, y] : series[i].points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (options.log2_x && x <= 0)) continue;
      path << (drawn++ ? " " : "") << px(x) << "," << py(std::clamp(y, y_lo, y_hi));
    }
    svg << "<g class=\"series\" data-name=\"" << Escape(series[i].name) << "\">";
    // The band first, so the line stays on top: lows left to right, then highs back.
    std::ostringstream lows, highs;
    int banded = 0;
    for (const auto& [x, low, high] : series[i].band) {
      if (!drawable(x, low) || !drawable(x, high)) continue;
      lows << (banded++ ? " " : "") << px(x) << "," << py(std::clamp(low, y_lo, y_hi));
    }
    for (auto it = series[i].band.rbegin(); it != series[i].band.rend(); ++it) {
      const auto& [x, low, high] = *it;
      if (!drawable(x, low) || !drawable(x, high)) continue;
      highs << " " << px(x) << "," << py(std::clamp(high, y_lo, y_hi));
    }
    if (banded > 0) {
      svg << "<polygon class=\"band\" fill=\"" << color << "\" fill-opacity=\"0.15\" stroke=\""
          << color << "\" stroke-opacity=\"0.4\" stroke-width=\"0.5\" points=\"" << lows.str()
          << highs.str() << "\"/>";
    }
    if (drawn > 0) {
      svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\""
          << path.str() << "\"/>";
      // Markers only where they stay readable.
      if (drawn <= 64) {
        for (const auto& [x, y] : series[i].points) {
          if (!std::isfinite(x) || !std::isfinite(y) || (options.log2_x && x <= 0)) continue;
          svg << "<circle cx=\"" << px(x) << "\" cy=\"" << py(std::clamp(y, y_lo, y_hi))
              << "\" r=\"3\" fill=\"" << color << "\"/>";
        }
      }
    }
    svg << "</g>\n";
    const double ly = top + 10 + 18 * static_cast<double>(i);
    svg << "<line x1=\"" << left + plot_w + 12 << "\" y1=\"" << ly << "\" x2=\""
        << left + plot_w + 32 << "\" y2=\"" << ly << "\" stroke=\"" << color
        << "\" stroke-width=\"2\"/><text x=\"" << left + plot_w + 38 << "\" y=\"" << ly + 4 << "\">"
        << Escape(series[i].name) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

namespace report_html {

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Number(double value, int digits) {
  if (!std::isfinite(value)) return "-";
  char text[64];
  std::snprintf(text, sizeof(text), "%.*g", digits, value);
  return text;
}

Result<std::vector<nlohmann::json>> ReadJsonLines(const std::string& path,
                                                  std::vector<int64_t>* line_numbers) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot read " + path);
  std::vector<nlohmann::json> lines;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!json.is_object()) {
      return Status::InvalidArgument(path + ":" + std::to_string(number) + ": not a JSON object");
    }
    lines.push_back(std::move(json));
    if (line_numbers) line_numbers->push_back(number);
  }
  return lines;
}

double NumberField(const nlohmann::json& json, const char* key) {
  auto it = json.find(key);
  return it != json.end() && it->is_number() ? it->get<double>() : NAN;
}

std::string StringField(const nlohmann::json& json, const char* key) {
  auto it = json.find(key);
  return it != json.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string PageHead(const std::string& title, const std::string& style) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
         Escape(title) +
         "</title>\n"
         "<style>body{font-family:sans-serif;margin:24px;color:#222}"
         "table{border-collapse:collapse;margin:8px 0 24px}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
         "th{background:#f4f4f4}td:first-child{text-align:left}" +
         style +
         "</style>\n"
         "</head>\n<body>\n";
}

Status WriteAtomically(const std::string& path, const std::string& text) {
  return WriteFileDurably(path, text);
}

}  // namespace report_html

namespace {

Status FieldError(const std::string& path, int64_t line, const char* what) {
  return Status::InvalidArgument(path + ":" + std::to_string(line) + ": " + what);
}

}  // namespace

Result<std::string> WriteRunReport(const std::string& run_dir) {
  const std::string metrics_path = run_dir + "/metrics.jsonl";
  const std::string eval_path = run_dir + "/eval.jsonl";
  std::vector<int64_t> metrics_lines, eval_lines;
  STRIDER_ASSIGN_OR_RETURN(std::vector<nlohmann::json> metrics,
                           ReadJsonLines(metrics_path, &metrics_lines));

  // Per stage in order of first appearance: step -> (loss, max_violation). Later lines of a
  // (stage, step) win: they are a resumed run's.
  std::vector<std::string> stages;
  std::map<std::string, std::map<int64_t, std::pair<double, double>>> steps;
  std::vector<nlohmann::json> stage_ends;
  for (size_t i = 0; i < metrics.size(); ++i) {
    const nlohmann::json& line = metrics[i];
    if (StringField(line, "event") == "stage_end") {
      stage_ends.push_back(line);
      continue;
    }
    const std::string stage = StringField(line, "stage");
    const double step = NumberField(line, "step");
    const double loss = NumberField(line, "loss");
    if (stage.empty()) return FieldError(metrics_path, metrics_lines[i], "no \"stage\" string");
    if (!std::isfinite(step)) {
      return FieldError(metrics_path, metrics_lines[i], "no numeric \"step\"");
    }
    if (!steps.count(stage)) stages.push_back(stage);
    steps[stage][static_cast<int64_t>(step)] = {loss, NumberField(line, "max_violation")};
  }

  // Loss and MaxVio over the run's steps: each stage continues where the previous ended.
  std::vector<PlotSeries> loss_series, violation_series;
  bool any_violation = false;
  int64_t offset = 0;
  for (const std::string& stage : stages) {
    PlotSeries loss{stage, {}}, violation{stage, {}};
    int64_t last = 0;
    for (const auto& [step, values] : steps[stage]) {
      loss.points.emplace_back(offset + step, values.first);
      if (std::isfinite(values.second)) {
        violation.points.emplace_back(offset + step, values.second);
        any_violation = true;
      }
      last = std::max(last, step);
    }
    offset += last;
    loss_series.push_back(std::move(loss));
    violation_series.push_back(std::move(violation));
  }

  // Accuracy against context, one series per evaluated stage.
  std::vector<nlohmann::json> evals;
  bool have_eval = fs::exists(eval_path);
  std::vector<PlotSeries> accuracy_series;
  if (have_eval) {
    STRIDER_ASSIGN_OR_RETURN(evals, ReadJsonLines(eval_path, &eval_lines));
    std::map<std::string, size_t> index;
    std::vector<std::map<int64_t, double>> by_context;
    for (size_t i = 0; i < evals.size(); ++i) {
      const std::string stage = StringField(evals[i], "stage");
      const double context = NumberField(evals[i], "context");
      const double accuracy = NumberField(evals[i], "retrieval_accuracy");
      if (stage.empty()) return FieldError(eval_path, eval_lines[i], "no \"stage\" string");
      if (!(context > 0)) return FieldError(eval_path, eval_lines[i], "no positive \"context\"");
      if (!std::isfinite(accuracy)) {
        return FieldError(eval_path, eval_lines[i], "no numeric \"retrieval_accuracy\"");
      }
      if (!index.count(stage)) {
        index[stage] = accuracy_series.size();
        accuracy_series.push_back({"after " + stage, {}});
        by_context.emplace_back();
      }
      by_context[index[stage]][static_cast<int64_t>(context)] = accuracy;
    }
    for (size_t s = 0; s < accuracy_series.size(); ++s) {
      for (const auto& [context, accuracy] : by_context[s]) {
        accuracy_series[s].points.emplace_back(static_cast<double>(context), accuracy);
      }
    }
  }

  std::ostringstream html;
  html << PageHead("Run report: " + run_dir) << "<h1>Run report</h1>\n<p>Run directory: <code>"
       << Escape(run_dir) << "</code>; " << stages.size() << " stage(s), " << metrics.size()
       << " metrics lines.</p>\n";
  html << "<h2>Loss per stage</h2>\n";
  PlotOptions loss_plot;
  loss_plot.title = "Training loss per stage";
  loss_plot.x_label = "step (counted across the run)";
  loss_plot.y_label = "loss (nats per token)";
  html << SvgLinePlot(loss_series, loss_plot);
  html << "<h2>Retrieval accuracy against context length</h2>\n";
  if (have_eval && !accuracy_series.empty()) {
    PlotOptions accuracy_plot;
    accuracy_plot.title = "Retrieval accuracy (held-out documents)";
    accuracy_plot.x_label = "context length (tokens)";
    accuracy_plot.y_label = "queries answered exactly";
    accuracy_plot.log2_x = true;
    accuracy_plot.y_min = 0;
    accuracy_plot.y_max = 1;
    accuracy_plot.reference_y = 0.9;
    accuracy_plot.reference_label = "target 0.9";
    html << SvgLinePlot(accuracy_series, accuracy_plot);
  } else {
    html << "<p>No evaluation yet (<code>eval.jsonl</code> is missing or empty).</p>\n";
  }
  if (any_violation) {
    html << "<h2>Routing balance</h2>\n";
    PlotOptions violation_plot;
    violation_plot.title = "Maximum expert load violation (MaxVio) per step";
    violation_plot.x_label = "step (counted across the run)";
    violation_plot.y_label = "MaxVio";
    violation_plot.y_min = 0;
    violation_plot.reference_y = 0.3;
    violation_plot.reference_label = "limit 0.3";
    html << SvgLinePlot(violation_series, violation_plot);
  }
  if (!stage_ends.empty()) {
    html << "<h2>Stages</h2>\n<table>\n<tr><th>stage</th><th>steps</th><th>tokens</th>"
            "<th>seconds</th><th>first loss</th><th>last loss</th><th>MaxVio after warm-up</th>"
            "</tr>\n";
    for (const nlohmann::json& s : stage_ends) {
      html << "<tr><td>" << Escape(StringField(s, "stage")) << "</td><td>"
           << Number(NumberField(s, "steps"), 10) << "</td><td>"
           << Number(NumberField(s, "tokens"), 12) << "</td><td>"
           << Number(NumberField(s, "seconds")) << "</td><td>"
           << Number(NumberField(s, "first_loss")) << "</td><td>"
           << Number(NumberField(s, "last_loss")) << "</td><td>"
           << Number(NumberField(s, "max_violation_after_warmup")) << "</td></tr>\n";
    }
    html << "</table>\n";
  }
  if (!evals.empty()) {
    html << "<h2>Evaluations</h2>\n<table>\n<tr><th>after stage</th><th>context</th>"
            "<th>loss</th><th>retrieval accuracy</th><th>95% interval</th>"
            "<th>answer token accuracy</th><th>queries</th></tr>\n";
    for (const nlohmann::json& e : evals) {
      // Rows written before the interval was recorded leave its cell empty.
      const double low = NumberField(e, "ci_low"), high = NumberField(e, "ci_high");
      const std::string interval = std::isfinite(low) && std::isfinite(high)
                                       ? "[" + Number(low) + ", " + Number(high) + "]"
                                       : std::string();
      html << "<tr><td>" << Escape(StringField(e, "stage")) << "</td><td>"
           << Number(NumberField(e, "context"), 10) << "</td><td>" << Number(NumberField(e, "loss"))
           << "</td><td>" << Number(NumberField(e, "retrieval_accuracy")) << "</td><td>" << interval
           << "</td><td>" << Number(NumberField(e, "answer_token_accuracy")) << "</td><td>"
           << Number(NumberField(e, "queries"), 10) << "</td></tr>\n";
    }
    html << "</table>\n";
  }
  html << "</body>\n</html>\n";

  const std::string path = run_dir + "/report.html";
  STRIDER_RETURN_IF_ERROR(WriteAtomically(path, html.str()));
  return path;
}

}  // namespace strider
