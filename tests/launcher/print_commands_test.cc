// `strider launch FLEET --print-commands` on a fleet without hosts, whose commands run on this
// machine: printing them reads the fleet file and the children's configs, not the files the
// commands will read when they run (the weights a warm start has not written yet), while a
// launch of the same fleet still refuses it before starting anything.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider::launcher {
namespace {

using strider::testing::RunCommand;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;

// configs/quickstart.yaml in `dir`, its children's configs named by absolute path and its
// weights at `weights`.
std::string WriteQuickstart(const TempDir& dir, const std::string& weights) {
  std::ifstream in(SourceDir() + "/configs/quickstart.yaml");
  std::ostringstream fleet;
  for (std::string line; std::getline(in, line);) {
    const size_t config = line.find("config: configs/");
    if (line.rfind("weights:", 0) == 0) {
      line = "weights: " + weights;
    } else if (config != std::string::npos) {
      line.insert(config + std::string("config: ").size(), SourceDir() + "/");
    } else if (line.rfind("run_dir:", 0) == 0) {
      line = "run_dir: " + dir.Sub("run");
    }
    fleet << line << "\n";
  }
  const std::string path = dir.Sub("quickstart.yaml");
  std::ofstream(path) << fleet.str();
  return path;
}

TEST(PrintCommands, ALocalFleetPrintsWithoutItsWeightsFile) {
  TempDir dir;
  const std::string weights = dir.Sub("warm/final/model.safetensors");  // not written
  const std::string fleet = WriteQuickstart(dir, weights);

  const strider::testing::RunResult printed =
      RunCommand({StriderBinary(), "launch", fleet, "--print-commands", "--json"});
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  // The learner starts from the weights (--init) and the actor plays them (--weights).
  const auto passes = [&](const nlohmann::json& command, const std::string& flag) {
    const std::vector<std::string> argv = command["argv"].get<std::vector<std::string>>();
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (argv[i] == flag && argv[i + 1] == weights) return true;
    }
    return false;
  };
  std::istringstream lines(printed.output);
  int learner = 0;
  int actor = 0;
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json command = nlohmann::json::parse(line);
    if (command["role"] == "learner" && passes(command, "--init")) ++learner;
    if (command["role"] == "actor" && passes(command, "--weights")) ++actor;
  }
  EXPECT_EQ(learner, 1) << printed.output;
  EXPECT_EQ(actor, 1) << printed.output;
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("run"))) << "printing created the run directory";
}

TEST(PrintCommands, ALaunchStillRefusesAMissingWeightsFile) {
  TempDir dir;
  const std::string fleet = WriteQuickstart(dir, dir.Sub("warm/final/model.safetensors"));
  // Refused while the fleet file is read: nothing starts, and the run directory stays unmade.
  const strider::testing::RunResult launched = RunCommand({StriderBinary(), "launch", fleet});
  EXPECT_NE(launched.exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("run")));
}

}  // namespace
}  // namespace strider::launcher
