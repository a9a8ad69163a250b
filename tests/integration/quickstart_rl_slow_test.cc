// Success rises from the warm start: the README's main job as its commands run it. `strider
// pretrain` of the shipped quickstart warm start with its stderr in a file (progress lines every
// few seconds, as in a CI log), then `strider launch` of configs/quickstart.yaml as shipped (a
// replay server, the RL learner and an actor on the calculator for a fixed number of learner
// steps, evaluated greedily on held-out problems as versions are published). The final
// evaluation must be at least the README's 20 points above the warm start's own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/child_process.h"
#include "tests/integration/rl_fixture.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using std::chrono::milliseconds;
using strider::testing::ChildProcess;
using strider::testing::ReadFile;
using strider::testing::ReadMetrics;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;
using strider::testing::WaitEvent;

constexpr double kMargin = 0.20;    // the README's promise: 20 points above the start
constexpr int kRlTimeoutS = 900;    // the RL part ends by learner steps; this only bounds a hang
constexpr int kEvalEpisodes = 100;  // configs/quickstart.yaml's evaluation.episodes

// Seconds in FormatDuration's forms ("1h02m", "3m05s", "12s"); -1 for anything else.
double ParseDuration(const std::string& text) {
  std::smatch m;
  if (std::regex_match(text, m, std::regex(R"((\d+)h(\d+)m)"))) {
    return 3600.0 * std::stoi(m[1]) + 60.0 * std::stoi(m[2]);
  }
  if (std::regex_match(text, m, std::regex(R"((\d+)m(\d+)s)"))) {
    return 60.0 * std::stoi(m[1]) + std::stoi(m[2]);
  }
  if (std::regex_match(text, m, std::regex(R"((\d+)s)"))) return std::stoi(m[1]);
  return -1;
}

TEST(QuickstartRun, EvaluatedSuccessRisesByAFixedMarginFromTheWarmStart) {
  // The shipped configs name their files relative to the repository root, where the README's
  // commands run.
  ASSERT_EQ(::chdir(SourceDir().c_str()), 0) << SourceDir();
  TempDir dir;
  const std::string warm_dir = dir.Sub("warm");
  {
    ChildProcess pretrain;
    ASSERT_TRUE(pretrain.Start(
        {StriderBinary(), "pretrain", "--config",
         SourceDir() + "/configs/pretrain/calculator_quickstart.yaml", "--run-dir", warm_dir},
        dir.Sub("pretrain.log")));
    pretrain.ReadAll(milliseconds(1500 * 1000));
    ASSERT_EQ(pretrain.Wait(), 0) << ReadFile(dir.Sub("pretrain.log"));
  }
  {
    // Minutes of warm start in a file: a progress line every few seconds, never a long silence.
    const std::string log = ReadFile(dir.Sub("pretrain.log"));
    const std::regex progress_line(
        R"(pretrain: stage \w+ \| step \d+/\d+ \| .* \| elapsed (\S+) \| .*)");
    std::vector<double> elapsed;
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (std::regex_match(line, m, progress_line)) elapsed.push_back(ParseDuration(m[1]));
    }
    ASSERT_GE(elapsed.size(), 10u) << log;
    double longest_gap = 0;
    for (size_t i = 1; i < elapsed.size(); ++i) {
      longest_gap = std::max(longest_gap, elapsed[i] - elapsed[i - 1]);
    }
    EXPECT_LE(longest_gap, 30) << log;
  }
  const std::string weights = warm_dir + "/checkpoints/guess/final/model.safetensors";

  // The start, as the launcher's first evaluation will see it (the same config, seed and
  // problems).
  const strider::testing::RunResult start = strider::testing::RunCommand(
      {StriderBinary(), "eval", "--config",
       SourceDir() + "/configs/actor/calculator_quickstart.yaml", "--weights", weights,
       "--episodes", std::to_string(kEvalEpisodes), "--json"});
  ASSERT_EQ(start.exit_code, 0) << start.output;
  // `--json`: the one line on stdout is the result.
  const nlohmann::json start_eval = nlohmann::json::parse(start.output, nullptr, false);
  ASSERT_TRUE(start_eval.is_object() && start_eval.value("event", "") == "eval") << start.output;
  const double start_rate = start_eval["success_rate"].get<double>();
  std::cout << "warm start: " << start_rate << " of " << kEvalEpisodes << " held-out problems"
            << std::endl;
  ASSERT_LE(start_rate + kMargin, 1.0) << "the warm start leaves no room for the margin";

  // configs/quickstart.yaml with this test's run directory and weights.
  const std::string fleet = ReadFile(SourceDir() + "/configs/quickstart.yaml");
  const std::string fleet_path = dir.Sub("fleet.yaml");
  {
    std::ostringstream out;
    std::istringstream lines(fleet);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("weights:", 0) == 0) line = "weights: " + weights;
      if (line.rfind("  episodes:", 0) == 0) {
        EXPECT_EQ(line, "  episodes: " + std::to_string(kEvalEpisodes))
            << "configs/quickstart.yaml";
      }
      out << line << "\n";
    }
    std::ofstream(fleet_path) << out.str();
  }
  ChildProcess launcher;
  ASSERT_TRUE(launcher.Start({StriderBinary(), "launch", fleet_path, "--run-dir", dir.Sub("rl")},
                             dir.Sub("launch.log")));
  const nlohmann::json finished = WaitEvent(launcher, "finished", kRlTimeoutS * 1000);
  EXPECT_EQ(launcher.Wait(), 0) << ReadFile(dir.Sub("launch.log"));
  ASSERT_TRUE(finished.is_object()) << ReadFile(dir.Sub("launch.log"));

  const std::vector<nlohmann::json> evals = ReadMetrics(dir.Sub("rl/eval.jsonl"));
  ASSERT_FALSE(evals.empty());
  std::ostringstream curve;
  for (const nlohmann::json& e : evals) {
    curve << " v" << e["policy_version"] << " " << e["success_rate"];
  }
  std::cout << "evaluations:" << curve.str() << "; finished: " << finished.dump() << std::endl;
  EXPECT_EQ(evals.front()["policy_version"], 0);
  EXPECT_DOUBLE_EQ(evals.front()["success_rate"].get<double>(), start_rate)
      << "the launcher's start evaluation is not the one the warm start was measured with";
  EXPECT_EQ(finished["reason"], "learner_steps") << curve.str();
  const nlohmann::json& last = evals.back();
  ASSERT_TRUE(last.value("final", false)) << "no final evaluation:" << curve.str();
  EXPECT_GT(last["policy_version"].get<int64_t>(), 0);
  EXPECT_GE(last["success_rate"].get<double>(), start_rate + kMargin - 1e-9) << curve.str();
}

}  // namespace
}  // namespace strider
