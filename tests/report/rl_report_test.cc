// The RL report: run directories laid out as `strider launch` writes them, reported together,
// and the plotted coordinates checked in the SVG.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "report/report.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  return testing::ScratchDir("strider_rl_report_test_" + name);
}

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A run directory `root/name` whose fleet file names a learner config with `estimator` (no
// learner config at all when `estimator` is empty: the fleet names a file that is not there).
std::string MakeRun(const std::string& root, const std::string& name,
                    const std::string& estimator) {
  const std::string run = root + "/" + name;
  const std::string learner_config = root + "/" + name + "_learner.yaml";
  if (!estimator.empty()) {
    Write(learner_config, "mode: rl\nobjective:\n  advantages:\n    estimator: " + estimator +
                              "\n    divide_by_std: true\n  aggregation: token_mean\n");
  }
  Write(run + "/fleet.yaml", "run_dir: " + run + "\nreplay:\n  config: configs/replay/rl.yaml\n" +
                                 "learner:\n  config: " + learner_config + "\n" +
                                 "actors:\n  config: configs/actor/calculator_tiny.yaml\n"
                                 "stop:\n  learner_steps: 3\n");
  return run;
}

// The <svg> element whose <title> is `title` ("" when there is none).
std::string Svg(const std::string& html, const std::string& title) {
  const size_t at = html.find("<title>" + title + "</title>");
  if (at == std::string::npos) return "";
  const size_t start = html.rfind("<svg", at);
  return html.substr(start, html.find("</svg>", at) - start);
}

// The polyline of the series `name` in `svg` ("" when there is none).
std::string Line(const std::string& svg, const std::string& name) {
  const std::string open = "<g class=\"series\" data-name=\"" + name + "\">";
  const size_t at = svg.find(open);
  if (at == std::string::npos) return "";
  const std::string group = svg.substr(at, svg.find("</g>", at) - at);
  std::smatch match;
  if (!std::regex_search(group, match, std::regex("<polyline[^>]* points=\"([^\"]*)\""))) {
    return "";
  }
  return match[1];
}

// The band polygon of the series `name` in `svg` ("" when there is none).
std::string Band(const std::string& svg, const std::string& name) {
  const std::string open = "<g class=\"series\" data-name=\"" + name + "\">";
  const size_t at = svg.find(open);
  if (at == std::string::npos) return "";
  const std::string group = svg.substr(at, svg.find("</g>", at) - at);
  std::smatch match;
  if (!std::regex_search(group, match,
                         std::regex("<polygon class=\"band\"[^>]* points=\"([^\"]*)\""))) {
    return "";
  }
  return match[1];
}

std::string DataPoints(const std::string& svg) {
  std::smatch match;
  if (!std::regex_search(svg, match, std::regex("^<svg[^>]* data-points=\"([0-9]+)\""))) return "";
  return match[1];
}

// Plot geometry (SvgLinePlot's defaults): x from 64 to 560 px, y from 312 (low) to 34 (high).

TEST(RlReport, OverlaysTwoRunsLabelledByTheirEstimators) {
  const std::string root = TempDir("overlay");
  const std::string a = MakeRun(root, "run_a", "outcome_group");
  const std::string b = MakeRun(root, "run_b", "process_gae");
  Write(a + "/eval.jsonl",
        "{\"event\":\"eval\",\"env\":\"calculator\",\"policy_version\":0,\"episodes\":100,"
        "\"samples\":1,\"success_rate\":0.0,\"ci_low\":0.0,\"ci_high\":0.25,\"reward_mean\":0,"
        "\"seconds\":1.0,\"seed\":1,\"learner_step\":0,\"samples_seen\":0,\"elapsed_s\":0}\n"
        "{\"event\":\"eval\",\"env\":\"calculator\",\"policy_version\":1,\"episodes\":100,"
        "\"samples\":1,\"success_rate\":0.5,\"ci_low\":0.25,\"ci_high\":0.75,\"reward_mean\":0.5,"
        "\"seconds\":1.0,\"seed\":1,\"learner_step\":1,\"samples_seen\":8,\"elapsed_s\":10}\n"
        "{\"event\":\"eval\",\"env\":\"calculator\",\"policy_version\":3,\"episodes\":100,"
        "\"samples\":1,\"success_rate\":1.0,\"ci_low\":0.75,\"ci_high\":1.0,\"reward_mean\":1,"
        "\"seconds\":1.0,\"seed\":1,\"learner_step\":3,\"samples_seen\":16,\"elapsed_s\":20}\n");
  Write(b + "/eval.jsonl",
        "{\"event\":\"eval\",\"policy_version\":0,\"episodes\":100,\"samples\":1,"
        "\"success_rate\":0.25,\"ci_low\":0.0,\"ci_high\":0.5,\"samples_seen\":0,"
        "\"elapsed_s\":0}\n"
        "{\"event\":\"eval\",\"policy_version\":2,\"episodes\":100,\"samples\":1,"
        "\"success_rate\":0.75,\"ci_low\":0.5,\"ci_high\":1.0,\"samples_seen\":16,"
        "\"elapsed_s\":40}\n");
  // Run a's learner: steps 1-3, a resumed learner repeating step 3 (its later line wins). The
  // samples axis is the running sum of "trajectories": 4, 8, 16.
  Write(a + "/learner/metrics.jsonl",
        "{\"time\":100,\"role\":\"learner\",\"step\":1,\"policy_version\":1,\"reward_mean\":0.0,"
        "\"success_rate\":0.0,\"trajectories\":4,\"kl\":0.0,\"clip_fraction\":0.1,"
        "\"logprob_mismatch_max\":null,\"staleness_mean\":0,\"max_violation\":null,"
        "\"tokens_per_second\":100}\n"
        "{\"time\":101,\"role\":\"learner\",\"step\":2,\"policy_version\":2,\"reward_mean\":0.5,"
        "\"success_rate\":0.25,\"trajectories\":4,\"kl\":0.01,\"clip_fraction\":0.2,"
        "\"logprob_mismatch_max\":0.001,\"staleness_mean\":1,\"max_violation\":null}\n"
        "{\"time\":102,\"role\":\"learner\",\"step\":3,\"policy_version\":3,\"reward_mean\":9,"
        "\"success_rate\":9,\"trajectories\":99,\"kl\":9}\n"
        "{\"time\":103,\"role\":\"learner\",\"step\":3,\"policy_version\":3,\"reward_mean\":1.0,"
        "\"success_rate\":1.0,\"trajectories\":8,\"kl\":0.02,\"clip_fraction\":0.0,"
        "\"logprob_mismatch_max\":0.002,\"staleness_mean\":0.5,\"max_violation\":null}\n");
  Write(b + "/learner/metrics.jsonl",
        "{\"time\":100,\"step\":1,\"policy_version\":1,\"reward_mean\":0.25,\"success_rate\":0.5,"
        "\"trajectories\":16,\"kl\":0.04,\"clip_fraction\":0.3}\n");
  Write(a + "/metrics.jsonl",
        "{\"elapsed_s\":2,\"learner_step\":1,\"samples\":4,\"learner_tokens_per_s\":100,"
        "\"actor_tokens_per_s\":null,\"restarts\":{\"replay\":0,\"learner\":0,\"actor-0\":0}}\n"
        "{\"elapsed_s\":4,\"learner_step\":3,\"samples\":16,\"learner_tokens_per_s\":300,"
        "\"actor_tokens_per_s\":500,\"restarts\":{\"replay\":0,\"learner\":1,\"actor-0\":0}}\n");
  Write(b + "/metrics.jsonl",
        "{\"elapsed_s\":2,\"learner_step\":1,\"samples\":16,\"learner_tokens_per_s\":200,"
        "\"actor_tokens_per_s\":400,\"restarts\":{\"learner\":0}}\n");
  // Run a's actors ran in sync mode (weights_wait_s); run b's did not.
  Write(a + "/actors/actor-0/metrics.jsonl",
        "{\"event\":\"metrics\",\"elapsed_s\":1,\"episodes\":4,\"generated_tokens_per_s\":250,"
        "\"weights_wait_s\":0.5,\"policy_version\":0}\n"
        "{\"event\":\"metrics\",\"elapsed_s\":3,\"episodes\":8,\"generated_tokens_per_s\":250,"
        "\"weights_wait_s\":1.5,\"policy_version\":1}\n");
  Write(a + "/actors/actor-1/metrics.jsonl",
        "{\"event\":\"metrics\",\"elapsed_s\":2,\"weights_wait_s\":1.0}\n");
  Write(b + "/actors/actor-0/metrics.jsonl",
        "{\"event\":\"metrics\",\"elapsed_s\":1,\"generated_tokens_per_s\":400}\n");

  EXPECT_EQ(DetectRunKind(a), RunKind::kRl);
  const std::string out = root + "/both.html";
  Result<std::string> path = WriteRlReport({a, b}, out);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  EXPECT_EQ(*path, out);
  const std::string html = Read(out);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  // Two eval plots, two training, four learner plots (no MaxVio recorded), throughput, waits.
  size_t svgs = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1))
    ++svgs;
  EXPECT_EQ(svgs, 10u);
  EXPECT_EQ(html.find("Routing MaxVio"), std::string::npos);

  // Evaluation against samples: x 0..16, y 0..1; the interval is the band, lows then highs back.
  const std::string by_samples = Svg(html, "Evaluation success (band: 95% interval)");
  ASSERT_FALSE(by_samples.empty());
  EXPECT_EQ(DataPoints(by_samples), "5");
  EXPECT_EQ(Line(by_samples, "outcome_group"), "64,312 312,173 560,34");
  EXPECT_EQ(Line(by_samples, "process_gae"), "64,242.5 560,103.5");
  EXPECT_EQ(Band(by_samples, "outcome_group"),
            "64,312 312,242.5 560,103.5 560,34 312,103.5 64,242.5");
  // Against wall time: x 0..40.
  const std::string by_time = Svg(html, "Evaluation success against wall time");
  EXPECT_EQ(Line(by_time, "outcome_group"), "64,312 188,173 312,34");
  EXPECT_EQ(Line(by_time, "process_gae"), "64,242.5 560,103.5");

  // Training reward against samples 4, 8, 16 (run a) and 16 (run b): x from 4 to 16, reward 0..1.
  const std::string reward = Svg(html, "Training reward (batch mean)");
  EXPECT_EQ(DataPoints(reward), "4");
  EXPECT_EQ(Line(reward, "outcome_group"), "64,312 229.333,173 560,34");
  EXPECT_EQ(Line(reward, "process_gae"), "560,242.5");
  // KL against the step (1..3) over 0..0.04: the repeated step 3 is drawn once, with 0.02.
  const std::string kl = Svg(html, "KL to the reference policy");
  EXPECT_EQ(Line(kl, "outcome_group"), "64,312 312,242.5 560,173");
  EXPECT_EQ(Line(kl, "process_gae"), "64,34");
  // A metric with nulls draws only its values: the mismatch at steps 2 and 3 of run a.
  const std::string mismatch = Svg(html, "Log-prob mismatch, learner against actor (max)");
  EXPECT_EQ(DataPoints(mismatch), "2");

  // Throughput per role from the launcher's ticks; a null tick value is left out.
  const std::string throughput =
      Svg(html, "Tokens per second by role (learner: trained; actors: generated, summed)");
  EXPECT_EQ(DataPoints(throughput), "5");
  EXPECT_EQ(Line(throughput, "outcome_group: actors"), "560,34");
  EXPECT_NE(Line(throughput, "process_gae: learner"), "");
  // Weight waits: one series per sync actor, none for run b's.
  const std::string waits = Svg(html, "Actor time waiting for weights (cumulative)");
  EXPECT_EQ(DataPoints(waits), "3");
  EXPECT_NE(Line(waits, "outcome_group: actor-0"), "");
  EXPECT_NE(Line(waits, "outcome_group: actor-1"), "");
  EXPECT_EQ(waits.find("process_gae"), std::string::npos);

  // The table: final evaluation with its interval, samples, wall time, steps, restarts, waits.
  EXPECT_NE(html.find("<tr><td>outcome_group</td><td><code>" + a +
                      "</code></td><td>outcome_group</td><td>1</td><td>[0.75, 1]</td><td>100</td>"
                      "<td>3</td><td>16</td><td>4</td><td>3</td><td>3</td><td>1 (learner 1)</td>"
                      "<td>2.5</td></tr>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<tr><td>process_gae</td><td><code>" + b +
                      "</code></td><td>process_gae</td><td>0.75</td><td>[0.5, 1]</td><td>100</td>"
                      "<td>2</td><td>16</td><td>2</td><td>1</td><td>1</td><td>0</td><td>-</td>"
                      "</tr>"),
            std::string::npos);
}

TEST(RlReport, RunsSharingAnEstimatorAreToldApartByDirectory) {
  const std::string root = TempDir("labels");
  const std::string a = MakeRun(root, "seed1", "implicit_process");
  const std::string b = MakeRun(root, "seed2", "implicit_process");
  for (const std::string& run : {a, b}) {
    Write(run + "/learner/metrics.jsonl", "{\"step\":1,\"kl\":0.1}\n");
  }
  Result<std::string> path = WriteRlReport({a, b}, root + "/r.html");
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  const std::string kl = Svg(Read(*path), "KL to the reference policy");
  EXPECT_NE(Line(kl, "implicit_process (seed1)"), "");
  EXPECT_NE(Line(kl, "implicit_process (seed2)"), "");

  // No estimator and the same directory name under two parents: the paths as given.
  fs::create_directories(root + "/x");
  fs::create_directories(root + "/y");
  const std::string x = MakeRun(root + "/x", "run", "");
  const std::string y = MakeRun(root + "/y", "run", "");
  for (const std::string& run : {x, y}) {
    Write(run + "/learner/metrics.jsonl", "{\"step\":1,\"kl\":0.1}\n");
  }
  Result<std::string> same = WriteRlReport({x, y}, root + "/s.html");
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  const std::string same_kl = Svg(Read(*same), "KL to the reference policy");
  EXPECT_NE(Line(same_kl, "run [" + x + "]"), "") << same_kl;
  EXPECT_NE(Line(same_kl, "run [" + y + "]"), "");
}

TEST(RlReport, AResumedRunContinuesItsWallTime) {
  const std::string root = TempDir("resumed");
  const std::string run = MakeRun(root, "run", "outcome_group");
  // Each launch counts elapsed_s from 0: the second launch's ticks continue after 4 s, so they
  // are at 6 and 8 s, and its evaluation at 1 s is at 5 s.
  Write(
      run + "/metrics.jsonl",
      "{\"elapsed_s\":2,\"learner_tokens_per_s\":1}\n{\"elapsed_s\":4,\"learner_tokens_per_s\":2}\n"
      "{\"elapsed_s\":2,\"learner_tokens_per_s\":3}\n{\"elapsed_s\":4,\"learner_tokens_per_s\":4}"
      "\n");
  Write(run + "/eval.jsonl",
        "{\"event\":\"eval\",\"success_rate\":0.0,\"samples_seen\":0,\"elapsed_s\":0}\n"
        "{\"event\":\"eval\",\"success_rate\":0.5,\"samples_seen\":4,\"elapsed_s\":3}\n"
        "{\"event\":\"eval\",\"success_rate\":1.0,\"samples_seen\":8,\"elapsed_s\":1}\n");
  Result<std::string> path = WriteRlReport({run}, root + "/r.html");
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  const std::string html = Read(*path);
  // Ticks at 2, 4, 6, 8 s over tokens/s 1..4: a straight line corner to corner.
  EXPECT_EQ(Line(Svg(html,
                     "Tokens per second by role (learner: trained; actors: generated, "
                     "summed)"),
                 "outcome_group: learner"),
            "64,312 229.333,219.333 394.667,126.667 560,34");
  // Evaluations at 0, 3 and 5 s.
  EXPECT_EQ(Line(Svg(html, "Evaluation success against wall time"), "outcome_group"),
            "64,312 361.6,173 560,34");
  // The table's wall time is the whole run's.
  EXPECT_NE(html.find("<td>8</td>"), std::string::npos);
}

TEST(RlReport, WithoutEvaluationOrLearnerConfigThePageSaysSo) {
  const std::string root = TempDir("missing");
  // The fleet names a learner config that does not exist: the run is labelled by its directory.
  const std::string run = MakeRun(root, "fresh_run", "");
  Write(run + "/learner/metrics.jsonl", "{\"step\":1,\"trajectories\":4,\"reward_mean\":0.5}\n");
  Result<std::string> path = WriteRlReport({run}, run + "/report.html");
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  const std::string html = Read(*path);
  EXPECT_NE(html.find("No evaluation yet"), std::string::npos);
  EXPECT_NE(html.find("<b>fresh_run</b>"), std::string::npos);
  EXPECT_NE(html.find("has no <code>metrics.jsonl</code>, <code>eval.jsonl</code>, "
                      "<code>actors/*/metrics.jsonl</code> yet"),
            std::string::npos);
  EXPECT_NE(Line(Svg(html, "Training reward (batch mean)"), "fresh_run"), "");
  // Plots of metrics nobody recorded are drawn empty, not dropped: their absence shows.
  EXPECT_EQ(DataPoints(Svg(html, "KL to the reference policy")), "0");
}

TEST(RlReport, MalformedLinesAreErrorsNamingFileAndLine) {
  const std::string root = TempDir("bad");
  const std::string run = MakeRun(root, "run", "outcome_group");
  Write(run + "/learner/metrics.jsonl", "{\"step\":1}\n{\"step\":2\n");
  Result<std::string> broken = WriteRlReport({run}, run + "/report.html");
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().ToString().find("learner/metrics.jsonl:2: not a JSON object"),
            std::string::npos)
      << broken.status().ToString();

  Write(run + "/learner/metrics.jsonl", "{\"step\":1}\n{\"kl\":0.1}\n");
  Result<std::string> no_step = WriteRlReport({run}, run + "/report.html");
  ASSERT_FALSE(no_step.ok());
  EXPECT_NE(no_step.status().ToString().find("learner/metrics.jsonl:2: no numeric \"step\""),
            std::string::npos)
      << no_step.status().ToString();

  Write(run + "/learner/metrics.jsonl", "{\"step\":1}\n");
  Write(run + "/eval.jsonl", "\n{\"event\":\"eval\",\"success_rate\":null}\n");
  Result<std::string> no_success = WriteRlReport({run}, run + "/report.html");
  ASSERT_FALSE(no_success.ok());
  EXPECT_NE(no_success.status().ToString().find("eval.jsonl:2: no numeric \"success_rate\""),
            std::string::npos)
      << no_success.status().ToString();

  fs::remove(run + "/eval.jsonl");
  Write(run + "/actors/actor-0/metrics.jsonl", "[1, 2]\n");
  Result<std::string> actor = WriteRlReport({run}, run + "/report.html");
  ASSERT_FALSE(actor.ok());
  EXPECT_NE(actor.status().ToString().find("actors/actor-0/metrics.jsonl:1: not a JSON object"),
            std::string::npos)
      << actor.status().ToString();
  EXPECT_FALSE(fs::exists(run + "/report.html"));
}

TEST(RlReport, APretrainingRunIsNotAnRlRun) {
  const std::string root = TempDir("kind");
  Write(root + "/metrics.jsonl", "{\"stage\":\"s256\",\"step\":1,\"loss\":1.0}\n");
  EXPECT_EQ(DetectRunKind(root), RunKind::kPretraining);
  Write(root + "/learner/metrics.jsonl", "{\"step\":1}\n");
  EXPECT_EQ(DetectRunKind(root), RunKind::kRl);
}

}  // namespace
}  // namespace strider
