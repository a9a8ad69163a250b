// The run report: plots drawn from a small run directory's JSON lines, checked in the SVG.
#include "report/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace strider {
namespace {

namespace fs = std::filesystem;

std::string TempRun(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("strider_report_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The polyline of the series named `name` in `html` ("" when there is none).
std::string SeriesPoints(const std::string& html, const std::string& name) {
  const std::string open = "<g class=\"series\" data-name=\"" + name + "\">";
  const size_t at = html.find(open);
  if (at == std::string::npos) return "";
  const size_t end = html.find("</g>", at);
  std::smatch match;
  const std::string group = html.substr(at, end - at);
  if (!std::regex_search(group, match, std::regex("points=\"([^\"]*)\""))) return "";
  return match[1];
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
        "\"answer_token_accuracy\":1.0,\"queries\":64}\n");
  Result<std::string> path = WriteRunReport(run);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  EXPECT_EQ(*path, run + "/report.html");
  const std::string html = Read(*path);

  // Self-contained: three inline SVG plots, nothing fetched, no script.
  size_t svgs = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) ++svgs;
  EXPECT_EQ(svgs, 3u);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);

  // Loss: the plot spans steps 1..5 (s1k continues after s256's 3 steps) over losses 1..4,
  // x from 64 to 560 px and y from 312 (loss 1) to 34 (loss 4). The repeated step 3 is drawn
  // once with the later value.
  EXPECT_EQ(SeriesPoints(html, "s256"), "64,34 188,126.667 312,219.333");
  EXPECT_EQ(SeriesPoints(html, "s1k"), "436,173 560,312");
  // Accuracy: log2 context from 256 (x 64) to 1024 (x 560), accuracy 0 (y 312) to 1 (y 34).
  EXPECT_EQ(SeriesPoints(html, "after s256"), "64,242.5");
  EXPECT_EQ(SeriesPoints(html, "after s1k"), "64,173 560,34");
  EXPECT_NE(html.find(">1K</text>"), std::string::npos);
  EXPECT_NE(html.find("target 0.9"), std::string::npos);
  EXPECT_NE(html.find("limit 0.3"), std::string::npos);
  // Tables: the stage summary and every evaluation row.
  EXPECT_NE(html.find("<td>s256</td><td>3</td><td>768</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>s1k</td><td>1024</td><td>1.2</td><td>1</td>"), std::string::npos);
  fs::remove_all(run);
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
  fs::remove_all(run);
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
  fs::remove_all(run);
}

}  // namespace
}  // namespace strider
