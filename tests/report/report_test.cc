// The run report: plots drawn from a small run directory's JSON lines, read back from the SVG in
// data units as a reader would, and the tables beside them.
#include "report/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/scratch_dir.h"

namespace strider {
namespace {

namespace fs = std::filesystem;

std::string TempRun(const std::string& name) {
  return testing::ScratchDir("strider_report_test_" + name);
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A plot as a reader sees it: its series with their points and the reference line in data
// units, read back from the SVG through the mapping its tick labels define (whatever the plot's
// size and margins), and the data range its frame spans.
struct Axis {
  bool log2 = false;  // the tick labels double at equal steps
  double a = 0, b = 0;  // value (or its log2) = a + b * pixel
  double Value(double pixel) const {
    const double v = a + b * pixel;
    return log2 ? std::exp2(v) : v;
  }
};

struct ReadPlot {
  std::string title;
  Axis x, y;
  std::vector<std::string> x_labels, y_labels;  // tick labels, in drawing order
  double x_min = NAN, x_max = NAN, y_min = NAN, y_max = NAN;  // the frame, in data units
  std::map<std::string, std::vector<std::pair<double, double>>> series;  // by data-name
  std::vector<std::string> legend;  // text beside the plot frame
  std::vector<std::pair<double, std::string>> references;  // y value, label
};

std::string Attr(const std::string& element, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(element, match, std::regex("\\s" + name + "=\"([^\"]*)\""))) return "";
  return match[1];
}

double Num(const std::string& element, const std::string& name) {
  const std::string text = Attr(element, name);
  return text.empty() ? NAN : std::stod(text);
}

// A tick label as a number: "1K" is 1024 tokens, "1M" 1024 * 1024.
double LabelValue(const std::string& label) {
  if (!label.empty() && label.back() == 'K') return std::stod(label) * 1024;
  if (!label.empty() && label.back() == 'M') return std::stod(label) * 1024 * 1024;
  return std::stod(label);
}

// The axis through the ticks' (pixel, labelled value) pairs: linear when they lie on a line,
// log2 when their logarithms do. Fails the test when neither holds.
Axis FitAxis(const std::vector<std::pair<double, double>>& ticks, const std::string& what) {
  Axis axis;
  EXPECT_GE(ticks.size(), 2u) << what << ": too few ticks to read values off";
  if (ticks.size() < 2) return axis;
  for (bool log2 : {false, true}) {
    const auto value = [&](double v) { return log2 ? std::log2(v) : v; };
    const auto& [p0, v0] = ticks.front();
    const auto& [p1, v1] = ticks.back();
    axis.log2 = log2;
    axis.b = (value(v1) - value(v0)) / (p1 - p0);
    axis.a = value(v0) - axis.b * p0;
    bool fits = true;
    for (const auto& [p, v] : ticks) {
      fits = fits && std::abs(axis.a + axis.b * p - value(v)) <=
                         1e-4 * std::abs(value(v1) - value(v0));
    }
    if (fits) return axis;
  }
  ADD_FAILURE() << what << ": tick labels on neither a linear nor a log2 scale";
  return axis;
}

// Every plot of `html`, in order.
std::vector<ReadPlot> ReadPlots(const std::string& html) {
  std::vector<ReadPlot> plots;
  const std::regex element("<(/?)(line|text|rect|polyline|g|title)\\b([^>]*)>([^<]*)");
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) {
    const std::string svg = html.substr(at, html.find("</svg>", at) - at);
    ReadPlot plot;
    std::vector<std::pair<double, double>> x_ticks, y_ticks;
    std::string group, series, last_line;
    std::vector<std::string> polylines;
    double frame_x = NAN, frame_y = NAN, frame_w = NAN, frame_h = NAN;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), element);
         it != std::sregex_iterator(); ++it) {
      const std::string tag = (*it)[2], attrs = (*it)[3], text = (*it)[4];
      if ((*it)[1] == "/") {
        if (tag == "g") {
          group.clear();
          series.clear();
        }
      } else if (tag == "title") {
        plot.title = text;
      } else if (tag == "g") {
        group = Attr(attrs, "class");
        series = group == "series" ? Attr(attrs, "data-name") : "";
      } else if (tag == "rect" && group == "axes") {
        frame_x = Num(attrs, "x");
        frame_y = Num(attrs, "y");
        frame_w = Num(attrs, "width");
        frame_h = Num(attrs, "height");
      } else if (tag == "line") {
        last_line = attrs;
      } else if (tag == "text" && group == "ticks" && !last_line.empty()) {
        // A tick's label follows its mark: a grid line across the plot (y) or a stub below it (x).
        if (Num(last_line, "y1") == Num(last_line, "y2")) {
          y_ticks.emplace_back(Num(last_line, "y1"), LabelValue(text));
          plot.y_labels.push_back(text);
        } else {
          x_ticks.emplace_back(Num(last_line, "x1"), LabelValue(text));
          plot.x_labels.push_back(text);
        }
        last_line.clear();
      } else if (tag == "text" && Attr(last_line, "class") == "reference") {
        plot.references.emplace_back(Num(last_line, "y1"), text);
        last_line.clear();
      } else if (tag == "text" && !last_line.empty() && !std::isnan(frame_x) &&
                 Num(last_line, "x1") > frame_x + frame_w) {
        plot.legend.push_back(text);
        last_line.clear();
      } else if (tag == "polyline" && !series.empty()) {
        std::vector<std::pair<double, double>>& points = plot.series[series];
        std::istringstream pairs(Attr(attrs, "points"));
        for (std::string pair; pairs >> pair;) {
          const size_t comma = pair.find(',');
          points.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
        }
      }
    }
    plot.x = FitAxis(x_ticks, plot.title + " x axis");
    plot.y = FitAxis(y_ticks, plot.title + " y axis");
    for (auto& [name, points] : plot.series) {
      for (auto& [x, y] : points) {
        x = plot.x.Value(x);
        y = plot.y.Value(y);
      }
    }
    for (auto& [y, label] : plot.references) y = plot.y.Value(y);
    plot.x_min = plot.x.Value(frame_x);
    plot.x_max = plot.x.Value(frame_x + frame_w);
    plot.y_min = plot.y.Value(frame_y + frame_h);
    plot.y_max = plot.y.Value(frame_y);
    plots.push_back(std::move(plot));
  }
  return plots;
}

// `actual` points equal `expected` ones in data units (to a thousandth of a unit).
void ExpectPoints(const std::vector<std::pair<double, double>>& actual,
                  const std::vector<std::pair<double, double>>& expected,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i].first, expected[i].first, 1e-3) << what << " point " << i << " x";
    EXPECT_NEAR(actual[i].second, expected[i].second, 1e-3) << what << " point " << i << " y";
  }
}

TEST(RunReport, PlotsLossPerStageAndAccuracyAgainstContext) {
  const std::string run = TempRun("plots");
  // Stage s256: steps 1-3 and a resumed run repeating step 3 (its line wins); stage s1k: 1-2.
  Write(run + "/metrics.jsonl",
        "{\"stage\":\"s256\",\"step\":1,\"loss\":4.0,\"max_violation\":0.9}\n"
        "{\"stage\":\"s256\",\"step\":2,\"loss\":3.0,\"max_violation\":0.2}\n"
        "{\"stage\":\"s256\",\"step\":3,\"loss\":9.0,\"max_violation\":0.1}\n"
        "{\"stage\":\"s256\",\"step\":3,\"loss\":2.0,\"max_violation\":0.1}\n"
        "{\"event\":\"stage_end\",\"stage\":\"s256\",\"steps\":3,\"tokens\":768,\"seconds\":1.5,"
        "\"first_loss\":4.0,\"last_loss\":2.0,\"max_violation_after_warmup\":0.2}\n"
        "{\"stage\":\"s1k\",\"step\":1,\"loss\":2.5,\"max_violation\":0.25}\n"
        "{\"stage\":\"s1k\",\"step\":2,\"loss\":1.0,\"max_violation\":0.15}\n");
  Write(run + "/eval.jsonl",
        "{\"stage\":\"s256\",\"context\":256,\"loss\":2.1,\"retrieval_accuracy\":0.25,"
        "\"answer_token_accuracy\":0.5,\"queries\":64}\n"
        "{\"stage\":\"s1k\",\"context\":256,\"loss\":1.9,\"retrieval_accuracy\":0.5,"
        "\"answer_token_accuracy\":0.7,\"queries\":64}\n"
        "{\"stage\":\"s1k\",\"context\":1024,\"loss\":1.2,\"retrieval_accuracy\":1.0,"
        "\"ci_low\":0.94,\"ci_high\":1.0,\"answer_token_accuracy\":1.0,\"queries\":64}\n");
  Result<std::string> path = WriteRunReport(run);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  EXPECT_EQ(*path, run + "/report.html");
  const std::string html = Read(*path);

  // Self-contained: three inline SVG plots, nothing fetched, no script.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  const std::vector<ReadPlot> plots = ReadPlots(html);
  ASSERT_EQ(plots.size(), 3u);
  using Points = std::vector<std::pair<double, double>>;

  // Loss: one series per stage, steps counted across the run (s1k continues after s256's 3
  // steps), the repeated step 3 drawn once with the later value; the axes span the data.
  const ReadPlot& loss = plots[0];
  EXPECT_EQ(loss.title, "Training loss per stage");
  EXPECT_EQ(loss.legend, (std::vector<std::string>{"s256", "s1k"}));
  ASSERT_EQ(loss.series.size(), 2u);
  ExpectPoints(loss.series.at("s256"), Points{{1, 4}, {2, 3}, {3, 2}}, "loss s256");
  ExpectPoints(loss.series.at("s1k"), Points{{4, 2.5}, {5, 1}}, "loss s1k");
  EXPECT_FALSE(loss.x.log2);
  EXPECT_NEAR(loss.x_min, 1, 1e-3);
  EXPECT_NEAR(loss.x_max, 5, 1e-3);
  EXPECT_NEAR(loss.y_min, 1, 1e-3);
  EXPECT_NEAR(loss.y_max, 4, 1e-3);
  EXPECT_EQ(loss.x_labels, (std::vector<std::string>{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(loss.y_labels, (std::vector<std::string>{"1", "2", "3", "4"}));

  // Accuracy: one series per evaluated stage against context on a log2 axis from 256 to 1K,
  // accuracy from 0 to 1, the 0.9 target drawn at 0.9.
  const ReadPlot& accuracy = plots[1];
  EXPECT_EQ(accuracy.title, "Retrieval accuracy (held-out documents)");
  EXPECT_EQ(accuracy.legend, (std::vector<std::string>{"after s256", "after s1k"}));
  ExpectPoints(accuracy.series.at("after s256"), Points{{256, 0.25}}, "accuracy after s256");
  ExpectPoints(accuracy.series.at("after s1k"), Points{{256, 0.5}, {1024, 1}},
               "accuracy after s1k");
  EXPECT_TRUE(accuracy.x.log2);
  EXPECT_EQ(accuracy.x_labels, (std::vector<std::string>{"256", "512", "1K"}));
  EXPECT_NEAR(accuracy.x_min, 256, 1e-3);
  EXPECT_NEAR(accuracy.x_max, 1024, 1e-3);
  EXPECT_NEAR(accuracy.y_min, 0, 1e-3);
  EXPECT_NEAR(accuracy.y_max, 1, 1e-3);
  ASSERT_EQ(accuracy.references.size(), 1u);
  EXPECT_NEAR(accuracy.references[0].first, 0.9, 1e-3);
  EXPECT_EQ(accuracy.references[0].second, "target 0.9");

  // Routing balance: MaxVio per step from 0, the 0.3 limit drawn at 0.3.
  const ReadPlot& violation = plots[2];
  ExpectPoints(violation.series.at("s256"), Points{{1, 0.9}, {2, 0.2}, {3, 0.1}},
               "MaxVio s256");
  ExpectPoints(violation.series.at("s1k"), Points{{4, 0.25}, {5, 0.15}}, "MaxVio s1k");
  EXPECT_NEAR(violation.y_min, 0, 1e-3);
  ASSERT_EQ(violation.references.size(), 1u);
  EXPECT_NEAR(violation.references[0].first, 0.3, 1e-3);
  EXPECT_EQ(violation.references[0].second, "limit 0.3");

  // Tables: the stage summary and every evaluation row.
  EXPECT_NE(html.find("<td>s256</td><td>3</td><td>768</td>"), std::string::npos);
  // The 95% interval where the row has one, an empty cell in rows written before it was kept.
  EXPECT_NE(html.find("<td>s1k</td><td>1024</td><td>1.2</td><td>1</td><td>[0.94, 1]</td>"
                      "<td>1</td>"),
            std::string::npos);
  EXPECT_NE(html.find("<td>s256</td><td>256</td><td>2.1</td><td>0.25</td><td></td><td>0.5</td>"),
            std::string::npos);
}

TEST(RunReport, EscapesNamesAndSaysWhenThereIsNoEvaluation) {
  const std::string run = TempRun("escape");
  Write(run + "/metrics.jsonl", "{\"stage\":\"<b>&x\",\"step\":1,\"loss\":1.0}\n");
  Result<std::string> path = WriteRunReport(run);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  const std::string html = Read(*path);
  EXPECT_EQ(html.find("<b>&x"), std::string::npos);
  EXPECT_NE(html.find("&lt;b&gt;&amp;x"), std::string::npos);
  EXPECT_NE(html.find("No evaluation yet"), std::string::npos);
  EXPECT_EQ(html.find("Routing balance"), std::string::npos);  // no MaxVio recorded
}

TEST(RunReport, BadInputIsAnErrorNamingFileAndLine) {
  const std::string run = TempRun("bad");
  Result<std::string> missing = WriteRunReport(run);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().ToString().find("metrics.jsonl"), std::string::npos);

  Write(run + "/metrics.jsonl", "{\"stage\":\"s\",\"step\":1,\"loss\":1.0}\nnot json\n");
  Result<std::string> broken = WriteRunReport(run);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().ToString().find("metrics.jsonl:2: not a JSON object"),
            std::string::npos)
      << broken.status().ToString();

  Write(run + "/metrics.jsonl", "{\"stage\":\"s\",\"step\":1,\"loss\":1.0}\n");
  Write(run + "/eval.jsonl", "{\"stage\":\"s\",\"loss\":1.0,\"retrieval_accuracy\":0.5}\n");
  Result<std::string> no_context = WriteRunReport(run);
  ASSERT_FALSE(no_context.ok());
  EXPECT_NE(no_context.status().ToString().find("eval.jsonl:1: no positive \"context\""),
            std::string::npos)
      << no_context.status().ToString();
  EXPECT_FALSE(fs::exists(run + "/report.html"));
}

}  // namespace
}  // namespace strider
