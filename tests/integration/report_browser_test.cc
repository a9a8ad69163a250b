// `strider report` on RL run directories, and the page it writes opened in a real browser:
// headless Chromium's DOM holds the plots' polylines, and its screenshot shows them drawn in the
// runs' colours. The browser half skips where /usr/bin/chromium is not installed
// (scripts/setup.sh installs it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/child_process.h"
#include "tests/integration/png.h"

namespace strider {
namespace {

namespace fs = std::filesystem;
using testing::CountColor;
using testing::DecodePng;
using testing::Image;
using testing::RunCommand;
using testing::StriderBinary;

constexpr const char* kChromium = "/usr/bin/chromium";

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class ReportBrowserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::temp_directory_path() / ("strider_report_browser_" + std::to_string(::getpid())))
                .string();
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // An RL run as `strider launch` lays it out, 8 learner steps and 5 evaluations whose success
  // rises at `pace` per evaluation; labelled `estimator` (nothing but the fleet file when
  // `steps` is 0: a run that has not started yet).
  std::string MakeRun(const std::string& name, const std::string& estimator, double pace,
                      int steps) {
    const std::string run = root_ + "/" + name;
    const std::string learner_config = root_ + "/" + name + ".yaml";
    Write(learner_config,
          "mode: rl\nobjective:\n  advantages:\n    estimator: " + estimator + "\n");
    Write(run + "/fleet.yaml", "learner:\n  config: " + learner_config + "\n");
    std::ostringstream learner, ticks, evals, actor;
    for (int step = 1; step <= steps; ++step) {
      learner << nlohmann::json({{"time", 1000.0 + step},
                                 {"role", "learner"},
                                 {"step", step},
                                 {"policy_version", step},
                                 {"reward_mean", pace * step},
                                 {"success_rate", pace * step},
                                 {"trajectories", 4},
                                 {"kl", 0.001 * step},
                                 {"clip_fraction", 0.05},
                                 {"logprob_mismatch_max", 1e-5 * step},
                                 {"staleness_mean", 0.5},
                                 {"max_violation", nullptr},
                                 {"tokens_per_second", 900 + 10 * step}})
                     .dump()
              << "\n";
      ticks << nlohmann::json({{"elapsed_s", 2.0 * step},
                               {"learner_step", step},
                               {"samples", 4 * step},
                               {"learner_tokens_per_s", 900 + 10 * step},
                               {"actor_tokens_per_s", 400 + 5 * step},
                               {"restarts", {{"replay", 0}, {"learner", 0}, {"actor-0", 0}}}})
                   .dump()
            << "\n";
      actor << nlohmann::json({{"event", "metrics"},
                               {"elapsed_s", 2.0 * step},
                               {"generated_tokens_per_s", 400 + 5 * step},
                               {"weights_wait_s", 0.1 * step}})
                   .dump()
            << "\n";
    }
    for (int e = 0; steps > 0 && e < 5; ++e) {
      const double p = std::min(1.0, pace * 2 * e);
      evals << nlohmann::json({{"event", "eval"},
                               {"env", "calculator"},
                               {"policy_version", 2 * e},
                               {"episodes", 100},
                               {"samples", 1},
                               {"success_rate", p},
                               {"ci_low", std::max(0.0, p - 0.1)},
                               {"ci_high", std::min(1.0, p + 0.1)},
                               {"samples_seen", 8 * e},
                               {"elapsed_s", 4.0 * e}})
                   .dump()
            << "\n";
    }
    if (steps > 0) {
      Write(run + "/learner/metrics.jsonl", learner.str());
      Write(run + "/metrics.jsonl", ticks.str());
      Write(run + "/eval.jsonl", evals.str());
      Write(run + "/actors/actor-0/metrics.jsonl", actor.str());
    }
    return run;
  }

  std::string root_;
};

TEST_F(ReportBrowserTest, TheCommandOverlaysRunsAndNeedsOutForSeveral) {
  const std::string a = MakeRun("a", "outcome_group", 0.1, 8);
  const std::string b = MakeRun("b", "process_gae", 0.05, 8);
  const std::string out = root_ + "/both.html";
  testing::RunResult both = RunCommand({StriderBinary(), "report", a, b, "--out", out});
  ASSERT_EQ(both.exit_code, 0) << both.output;
  EXPECT_EQ(nlohmann::json::parse(both.output, nullptr, false), nlohmann::json({{"report", out}}));
  EXPECT_NE(Read(out).find("data-name=\"process_gae\""), std::string::npos);

  // One run: the report goes into its directory.
  testing::RunResult one = RunCommand({StriderBinary(), "report", a});
  ASSERT_EQ(one.exit_code, 0);
  EXPECT_TRUE(fs::exists(a + "/report.html"));
  // Several without --out, and a pretraining run among RL runs, are usage errors.
  EXPECT_EQ(RunCommand({StriderBinary(), "report", a, b}).exit_code, 2);
  const std::string pretraining = root_ + "/pretraining";
  Write(pretraining + "/metrics.jsonl", "{\"stage\":\"s256\",\"step\":1,\"loss\":1.0}\n");
  EXPECT_EQ(RunCommand({StriderBinary(), "report", a, pretraining, "--out", out}).exit_code, 2);
  // A pretraining run alone keeps its own report.
  testing::RunResult pretrain = RunCommand({StriderBinary(), "report", pretraining});
  ASSERT_EQ(pretrain.exit_code, 0);
  EXPECT_NE(Read(pretraining + "/report.html").find("Training loss per stage"), std::string::npos);
  // A malformed line fails the command, naming the file and line.
  Write(b + "/eval.jsonl", "{\"event\":\"eval\",\"success_rate\":0.5}\n{oops\n");
  EXPECT_EQ(RunCommand({StriderBinary(), "report", a, b, "--out", out}).exit_code, 2);
}

// Runs headless Chromium on `url` with `flags`; its stdout.
std::string Chromium(const std::string& profile, const std::vector<std::string>& flags,
                     const std::string& url) {
  std::vector<std::string> argv = {kChromium,       "--headless=new", "--no-sandbox",
                                   "--disable-gpu", "--no-first-run", "--user-data-dir=" + profile};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(url);
  testing::RunResult result = RunCommand(argv);
  EXPECT_EQ(result.exit_code, 0) << "chromium " << flags[0];
  return result.output;
}

TEST_F(ReportBrowserTest, ChromiumRendersThePlots) {
  if (!fs::exists(kChromium)) {
    GTEST_SKIP() << kChromium << " is not installed (apt-get install chromium, or "
                 << "scripts/setup.sh): the report is not checked in a browser";
  }
  const std::string a = MakeRun("a", "outcome_group", 0.1, 8);
  const std::string b = MakeRun("b", "process_gae", 0.05, 8);
  const std::string full = root_ + "/full.html";
  ASSERT_EQ(RunCommand({StriderBinary(), "report", a, b, "--out", full}).exit_code, 0);
  // The same page with nothing recorded yet: every plot is drawn, but with no lines in it.
  const std::string empty_a = MakeRun("empty_a", "outcome_group", 0, 0);
  const std::string empty_b = MakeRun("empty_b", "process_gae", 0, 0);
  const std::string empty = root_ + "/empty.html";
  ASSERT_EQ(RunCommand({StriderBinary(), "report", empty_a, empty_b, "--out", empty}).exit_code, 0);

  // The DOM after parsing: the browser re-serialises every polyline with a closing tag, so
  // these are elements it built, not the file's text; their points add up to each plot's
  // data-points.
  const std::string dom =
      Chromium(root_ + "/profile", {"--dump-dom"}, "file://" + fs::absolute(full).string());
  const std::regex polyline_re("<polyline[^>]* points=\"([^\"]*)\"[^>]*></polyline>");
  size_t plots = 0, lines = 0;
  for (size_t at = dom.find("<svg"); at != std::string::npos; at = dom.find("<svg", at + 1)) {
    ++plots;
    const std::string open = dom.substr(at, dom.find('>', at) - at);
    std::smatch declared;
    ASSERT_TRUE(std::regex_search(open, declared, std::regex("data-points=\"([0-9]+)\""))) << open;
    const std::string body = dom.substr(at, dom.find("</svg>", at) - at);
    size_t points = 0;
    for (auto p = std::sregex_iterator(body.begin(), body.end(), polyline_re);
         p != std::sregex_iterator(); ++p) {
      ++lines;
      std::istringstream pairs((*p)[1].str());
      std::string pair;
      while (pairs >> pair) {
        EXPECT_TRUE(std::regex_match(pair, std::regex("-?[0-9.]+,-?[0-9.]+"))) << pair;
        ++points;
      }
    }
    EXPECT_EQ(std::to_string(points), declared[1].str()) << "plot " << plots;
  }
  // Eval x2, training x2, KL, clip fraction, mismatch, staleness, throughput, weight waits; one
  // line per run in each (two per run in the throughput plot).
  EXPECT_EQ(plots, 10u) << dom.substr(0, 2000);
  EXPECT_EQ(lines, 22u);
  EXPECT_NE(dom.find("<polygon class=\"band\""), std::string::npos);

  // Screenshots: the first run's blue (#0072B2) and the second's vermilion (#D55E00) fill the
  // lines and markers of the full page; the empty page has them in its legends only.
  Image full_image, empty_image;
  Chromium(root_ + "/profile", {"--screenshot=" + root_ + "/full.png", "--window-size=1200,2400"},
           "file://" + fs::absolute(full).string());
  Chromium(root_ + "/profile", {"--screenshot=" + root_ + "/empty.png", "--window-size=1200,2400"},
           "file://" + fs::absolute(empty).string());
  ASSERT_EQ(DecodePng(Read(root_ + "/full.png"), &full_image), "");
  ASSERT_EQ(DecodePng(Read(root_ + "/empty.png"), &empty_image), "");
  EXPECT_EQ(full_image.width, 1200u);
  EXPECT_EQ(full_image.height, 2400u);
  std::map<std::array<uint8_t, 3>, size_t> colors;
  for (const auto& p : full_image.pixels) ++colors[p];
  EXPECT_GT(colors.size(), 50u) << "not a page of plots";
  const size_t blue = CountColor(full_image, {0x00, 0x72, 0xB2});
  const size_t vermilion = CountColor(full_image, {0xD5, 0x5E, 0x00});
  const size_t empty_blue = CountColor(empty_image, {0x00, 0x72, 0xB2});
  const size_t empty_vermilion = CountColor(empty_image, {0xD5, 0x5E, 0x00});
  std::cout << "pixels of the first run's colour " << blue << " (empty page " << empty_blue
            << "), of the second's " << vermilion << " (empty page " << empty_vermilion << "); "
            << colors.size() << " colours\n";
  // Measured: about 1180 and 1750 against 200 each (markers and lines of the plots in view).
  EXPECT_GT(blue, 4 * empty_blue + 300) << blue << " vs " << empty_blue;
  EXPECT_GT(vermilion, 4 * empty_vermilion + 300) << vermilion << " vs " << empty_vermilion;
}

}  // namespace
}  // namespace strider
