// RL on the dataset environment end to end: `strider launch` runs a replay server, the tiny RL
// learner and one tiny actor playing configs/datasets/arithmetic.jsonl, for three learner steps;
// the learner trained on trajectories at each step and the store holds them under "dataset".
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/child_process.h"
#include "tests/integration/tiny_fleet.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::RunCommand;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<nlohmann::json> JsonLines(const std::string& text) {
  std::vector<nlohmann::json> rows;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

TEST(DatasetTraining, ThreeLearnerStepsOnTheArithmeticDataset) {
  TempDir dir;
  // One group of four one-turn episodes per step keeps a step about a second on a busy machine.
  strider::testing::WriteTinyFleetConfigs(
      dir, {.env_yaml = "env:\n  name: dataset\n  options:\n    path: " + SourceDir() +
                        "/configs/datasets/arithmetic.jsonl\n    verifier: numeric\n",
            .max_turns = 1,
            .max_episode_tokens = 256,
            .stats_interval_s = 0});
  const std::string run = dir.Sub("run");
  std::ofstream(dir.Sub("fleet.yaml"))
      << "run_dir: " << run << "\n"
      << "replay:\n  config: " << dir.Sub("replay.yaml") << "\n"
      << "learner:\n  config: " << dir.Sub("learner.yaml") << "\n"
      << "actors:\n  config: " << dir.Sub("actor.yaml") << "\n  count: 1\n"
      << "stop:\n  learner_steps: 3\n  wall_time_s: 80\n"
      << "restart:\n  max_restarts: 0\n";

  strider::testing::RunResult launch =
      RunCommand({StriderBinary(), "launch", dir.Sub("fleet.yaml")});
  ASSERT_EQ(launch.exit_code, 0) << launch.output << ReadFile(run + "/logs/learner.log")
                                 << ReadFile(run + "/logs/actor-0.log");
  EXPECT_NE(launch.output.find("\"reason\":\"learner_steps\""), std::string::npos) << launch.output;

  const std::vector<nlohmann::json> steps = JsonLines(ReadFile(run + "/learner/metrics.jsonl"));
  ASSERT_EQ(steps.size(), 3u) << ReadFile(run + "/logs/learner.log");
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i]["step"], static_cast<int64_t>(i + 1));
    EXPECT_GT(steps[i]["trajectories"].get<int64_t>(), 0) << steps[i].dump();
  }

  strider::testing::RunResult list =
      RunCommand({StriderBinary(), "replay", "inspect", run + "/replay", "list", "--json"});
  ASSERT_EQ(list.exit_code, 0) << list.output;
  const std::vector<nlohmann::json> stored = JsonLines(list.output);
  ASSERT_GE(stored.size(), 12u) << "three steps of one group of four";
  for (const nlohmann::json& trajectory : stored) EXPECT_EQ(trajectory["env"], "dataset");
}

}  // namespace
}  // namespace strider
