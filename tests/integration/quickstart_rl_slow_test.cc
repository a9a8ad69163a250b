// Success rises from the warm start: the README's main job as its commands run it. `strider
// pretrain` of the shipped quickstart warm start, then `strider launch` of configs/quickstart.yaml
// (a replay server, the RL learner and an actor on the calculator, evaluated greedily on held-out
// problems as versions are published) with the launcher's stop rule set to the warm start's own
// evaluated success plus a fixed margin. The run must reach it within the time the README gives
// the RL part, and the evaluation that stopped it must be a later policy version's.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
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

constexpr double kMargin = 0.10;       // of 200 held-out problems: 20 more solved
constexpr int kRlSeconds = 180;        // the quickstart's RL budget (configs/quickstart.yaml)
constexpr int kEvalEpisodes = 200;

TEST(QuickstartRun, EvaluatedSuccessRisesByAFixedMarginFromTheWarmStart) {
  // The shipped configs name their files relative to the repository root, where the README's
  // commands run.
  ASSERT_EQ(::chdir(SourceDir().c_str()), 0) << SourceDir();
  TempDir dir;
  const std::string warm_dir = dir.Sub("warm");
  {
    ChildProcess pretrain;
    ASSERT_TRUE(pretrain.Start({StriderBinary(), "pretrain", "--config",
                                SourceDir() + "/configs/pretrain/calculator_quickstart.yaml",
                                "--run-dir", warm_dir},
                               dir.Sub("pretrain.log")));
    pretrain.ReadAll(milliseconds(1500 * 1000));
    ASSERT_EQ(pretrain.Wait(), 0) << ReadFile(dir.Sub("pretrain.log"));
  }
  const std::string weights = warm_dir + "/checkpoints/calc/final/model.safetensors";

  // The start, as the launcher's first evaluation will see it (the same config, seed and
  // problems): the stop rule is set above it.
  const strider::testing::RunResult start = strider::testing::RunCommand(
      {StriderBinary(), "eval", "--config", SourceDir() + "/configs/actor/calculator_quickstart.yaml",
       "--weights", weights, "--episodes", std::to_string(kEvalEpisodes), "--json"});
  ASSERT_EQ(start.exit_code, 0) << start.output;
  // `--json`: the one line on stdout is the result.
  const nlohmann::json start_eval = nlohmann::json::parse(start.output, nullptr, false);
  ASSERT_TRUE(start_eval.is_object() && start_eval.value("event", "") == "eval") << start.output;
  const double start_rate = start_eval["success_rate"].get<double>();
  const double target = start_rate + kMargin;
  std::cout << "warm start: " << start_rate << " of " << kEvalEpisodes
            << " held-out problems; stop rule at " << target << std::endl;
  ASSERT_LE(target, 0.95) << "the warm start leaves no room for the margin";

  // configs/quickstart.yaml with this test's run directory, weights and stop rule.
  const std::string fleet = ReadFile(SourceDir() + "/configs/quickstart.yaml");
  const std::string fleet_path = dir.Sub("fleet.yaml");
  {
    std::ostringstream out;
    std::istringstream lines(fleet);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("weights:", 0) == 0) line = "weights: " + weights;
      if (line.rfind("  episodes:", 0) == 0) line = "  episodes: " + std::to_string(kEvalEpisodes);
      if (line.rfind("  wall_time_s:", 0) == 0) line = "  wall_time_s: " + std::to_string(kRlSeconds);
      if (line.rfind("  success_rate:", 0) == 0) line = "  success_rate: " + std::to_string(target);
      out << line << "\n";
    }
    std::ofstream(fleet_path) << out.str();
  }
  ChildProcess launcher;
  ASSERT_TRUE(launcher.Start({StriderBinary(), "launch", fleet_path, "--run-dir", dir.Sub("rl")},
                             dir.Sub("launch.log")));
  const nlohmann::json finished = WaitEvent(launcher, "finished", (kRlSeconds + 300) * 1000);
  EXPECT_EQ(launcher.Wait(), 0) << ReadFile(dir.Sub("launch.log"));
  ASSERT_TRUE(finished.is_object()) << ReadFile(dir.Sub("launch.log"));

  const std::vector<nlohmann::json> evals = ReadMetrics(dir.Sub("rl/eval.jsonl"));
  ASSERT_FALSE(evals.empty());
  std::ostringstream curve;
  double best = 0;
  int64_t best_version = 0;
  for (const nlohmann::json& e : evals) {
    curve << " v" << e["policy_version"] << " " << e["success_rate"];
    if (e["success_rate"].get<double>() > best) {
      best = e["success_rate"].get<double>();
      best_version = e["policy_version"].get<int64_t>();
    }
  }
  std::cout << "evaluations:" << curve.str() << "; finished: " << finished.dump() << std::endl;
  EXPECT_EQ(evals.front()["policy_version"], 0);
  EXPECT_DOUBLE_EQ(evals.front()["success_rate"].get<double>(), start_rate)
      << "the launcher's start evaluation is not the one the stop rule was set from";
  EXPECT_EQ(finished["reason"], "success_rate") << curve.str();
  EXPECT_GE(best, target - 1e-9) << curve.str();
  EXPECT_GT(best_version, 0);
}

}  // namespace
}  // namespace strider
