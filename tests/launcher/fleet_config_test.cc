// The fleet file reader: what a minimal file runs, what each rule requires, paths, and the
// recorded copy that --resume reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "launcher/launcher.h"
#include "tests/launcher/fleet_files.h"
#include "tests/scratch_dir.h"

namespace strider::launcher {
namespace {

using strider::testing::TempDir;

// The argument after `flag` in `argv` ("" when the flag is absent or last).
std::string After(const std::vector<std::string>& argv, const std::string& flag) {
  const auto at = std::find(argv.begin(), argv.end(), flag);
  return at == argv.end() || at + 1 == argv.end() ? "" : *(at + 1);
}

bool Has(const std::vector<std::string>& argv, const std::string& flag) {
  return std::find(argv.begin(), argv.end(), flag) != argv.end();
}

// What a fleet file that names only its three configs and a stop rule runs: one replay server,
// one learner and one actor on this machine, their files under runs/fleet, each child with the
// config the file names and nothing the file did not ask for.
TEST(FleetConfig, AMinimalFileRunsOneOfEachRoleUnderRunsFleet) {
  TempDir dir;
  Result<FleetConfig> fleet = LoadFleetConfig(WriteFleet(dir, "stop: {wall_time_s: 60}\n"));
  ASSERT_TRUE(fleet.ok()) << fleet.status().ToString();
  const std::vector<HostCommand> commands = HostCommands(*fleet, /*actor_base_seed=*/7);
  ASSERT_EQ(commands.size(), 3u) << HostCommandsText(commands);
  for (const HostCommand& command : commands) {
    EXPECT_EQ(command.host, "127.0.0.1") << command.name;
    EXPECT_FALSE(Has(command.argv, "--http")) << command.name << ": pages only with http: true";
  }

  const HostCommand& replay = commands[0];
  EXPECT_EQ(replay.name, "replay");
  EXPECT_EQ(After(replay.argv, "--db"), "runs/fleet/replay");
  EXPECT_EQ(After(replay.argv, "--config"), dir.Sub("replay.yaml"));

  const HostCommand& learner = commands[1];
  EXPECT_EQ(learner.name, "learner");
  EXPECT_EQ(After(learner.argv, "--run-dir"), "runs/fleet/learner");
  EXPECT_EQ(After(learner.argv, "--config"), dir.Sub("learner.yaml"));
  EXPECT_EQ(After(learner.argv, "--replay"), After(replay.argv, "--sample-bind"));
  // A wall-time rule is the launcher's to enforce; the learner itself runs until stopped, one
  // rank, from its own config's weights.
  EXPECT_FALSE(Has(learner.argv, "--max-steps"));
  EXPECT_FALSE(Has(learner.argv, "--rank"));
  EXPECT_FALSE(Has(learner.argv, "--init"));

  const HostCommand& actor = commands[2];
  EXPECT_EQ(actor.name, "actor-0");
  EXPECT_EQ(After(actor.argv, "--config"), dir.Sub("actor.yaml"));
  EXPECT_EQ(After(actor.argv, "--seed"), "7");
  EXPECT_EQ(After(actor.argv, "--spill-dir"), "runs/fleet/actors/actor-0/spill");
  EXPECT_EQ(After(actor.argv, "--replay"), After(replay.argv, "--bind"));
  EXPECT_EQ(After(actor.argv, "--weights-endpoint"), After(learner.argv, "--publish"));
  EXPECT_FALSE(Has(actor.argv, "--weights"));

  // A learner_steps rule, by contrast, reaches the learner as its own step limit.
  Result<FleetConfig> stepped = LoadFleetConfig(WriteFleet(dir, "stop: {learner_steps: 3}\n"));
  ASSERT_TRUE(stepped.ok()) << stepped.status().ToString();
  EXPECT_EQ(After(HostCommands(*stepped, 0)[1].argv, "--max-steps"), "3");
}

TEST(FleetConfig, AnEvaluationSectionGetsItsDefaults) {
  TempDir dir;
  Result<FleetConfig> fleet = LoadFleetConfig(WriteFleet(
      dir, "evaluation: {config: " + dir.Sub("actor.yaml") + "}\nstop: {success_rate: 0.5}\n"));
  ASSERT_TRUE(fleet.ok()) << fleet.status().ToString();
  ASSERT_TRUE(fleet->evaluation.has_value());
  EXPECT_EQ(fleet->evaluation->episodes, 100);
  EXPECT_EQ(fleet->evaluation->every_versions, 10);
  EXPECT_TRUE(fleet->evaluation->final);
  EXPECT_EQ(fleet->stop.success_rate, 0.5);
}

// The message of loading `extra` on top of the three configs (OK when it loads).
std::string Problem(const std::string& extra) {
  TempDir dir;
  Result<FleetConfig> fleet = LoadFleetConfig(WriteFleet(dir, extra));
  return fleet.ok() ? "OK" : fleet.status().ToString();
}

TEST(FleetConfig, EachMistakeIsNamedWithItsKey) {
  EXPECT_NE(Problem("").find("stop: is required"), std::string::npos) << Problem("");
  EXPECT_NE(Problem("stop: {samples: 0}\n").find("stop: needs at least one rule"),
            std::string::npos);
  EXPECT_NE(Problem("stop: {success_rate: 0.9}\n").find("stop.success_rate: needs an evaluation"),
            std::string::npos);
  EXPECT_NE(Problem("stop: {learner_steps: -1}\n").find("stop.learner_steps: must not be"),
            std::string::npos);
  EXPECT_NE(Problem("stop: {wall_time_s: 1, grace_s: 0}\n").find("stop.grace_s: must be positive"),
            std::string::npos);
  EXPECT_NE(Problem("stop: {wall_time_s: 1}\nrestart: {backoff_s: []}\n")
                .find("restart.backoff_s: must not be empty"),
            std::string::npos);
  EXPECT_NE(Problem("stop: {wall_time_s: 1}\nrestart: {backoff_s: [1, -2]}\n")
                .find("restart.backoff_s: must not hold a negative"),
            std::string::npos);
  EXPECT_NE(Problem("stop: {wall_time_s: 1}\nweights: /nonexistent.safetensors\n")
                .find("weights: no such file"),
            std::string::npos);
  const std::string typo = Problem("stop: {wall_time_s: 1, learner_stpes: 3}\n");
  EXPECT_NE(
      typo.find("fleet.yaml:7: stop.learner_stpes: unknown key (did you mean learner_steps?)"),
      std::string::npos)
      << typo;
}

// A GPU the actors share with the learner: every actor's command caps its page pool, and a
// budget that cannot fit the device's stated memory is refused with the figures.
TEST(FleetConfig, AGpuBudgetCapsEveryActorsCacheAndMustFitTheDevice) {
  TempDir dir;
  Result<FleetConfig> fleet = LoadFleetConfig(
      WriteFleet(dir,
                 "gpu_budget: {actor_cache_mb: 8192, device_mb: 81559, reserved_mb: 40960}\n"
                 "stop: {wall_time_s: 60}\n",
                 "", "", "count: 4"));
  ASSERT_TRUE(fleet.ok()) << fleet.status().ToString();
  ASSERT_TRUE(fleet->gpu_budget.has_value());
  const std::vector<HostCommand> commands = HostCommands(*fleet, 0);
  int actors = 0;
  for (const HostCommand& command : commands) {
    if (command.role == "actor") {
      ++actors;
      EXPECT_EQ(After(command.argv, "--cache-budget-mb"), "8192") << command.name;
    } else {
      EXPECT_FALSE(Has(command.argv, "--cache-budget-mb")) << command.name;
    }
  }
  EXPECT_EQ(actors, 4);

  // Without the section the actors keep their own engine.cache_budget_mb.
  Result<FleetConfig> plain = LoadFleetConfig(WriteFleet(dir, "stop: {wall_time_s: 60}\n"));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(Has(HostCommands(*plain, 0)[2].argv, "--cache-budget-mb"));

  // 4 x 16384 + 40960 = 106496 MiB does not fit an 80 GB H100.
  Result<FleetConfig> too_big = LoadFleetConfig(
      WriteFleet(dir,
                 "gpu_budget: {actor_cache_mb: 16384, device_mb: 81559, reserved_mb: 40960}\n"
                 "stop: {wall_time_s: 60}\n",
                 "", "", "count: 4"));
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().ToString().find(
                "gpu_budget.actor_cache_mb: 4 actors x 16384 MiB + reserved_mb 40960 MiB = "
                "106496 MiB exceeds device_mb 81559 MiB"),
            std::string::npos)
      << too_big.status().ToString();
  // Unstated device memory is not checked; a cap is required in the section.
  EXPECT_EQ(Problem("gpu_budget: {actor_cache_mb: 1000000}\nstop: {wall_time_s: 60}\n"), "OK");
  EXPECT_NE(Problem("gpu_budget: {device_mb: 81559}\nstop: {wall_time_s: 60}\n")
                .find("gpu_budget.actor_cache_mb"),
            std::string::npos);
  EXPECT_NE(Problem("gpu_budget: {actor_cache_mb: 0}\nstop: {wall_time_s: 60}\n")
                .find("gpu_budget.actor_cache_mb: must be at least 1"),
            std::string::npos);
}

TEST(FleetConfig, TheStatusPageNeedsHttpAndANumericAddress) {
  TempDir dir;
  Result<FleetConfig> fleet =
      LoadFleetConfig(WriteFleet(dir, "stop: {wall_time_s: 1}\nhttp: true\n"));
  ASSERT_TRUE(fleet.ok()) << fleet.status().ToString();
  EXPECT_EQ(fleet->status_page, "127.0.0.1:0");
  EXPECT_EQ(Problem("stop: {wall_time_s: 1}\nhttp: true\nstatus_page: '[::1]:8080'\n"), "OK");
  EXPECT_NE(Problem("stop: {wall_time_s: 1}\nstatus_page: 127.0.0.1:8080\n")
                .find("status_page: needs http: true"),
            std::string::npos);
  for (const char* bad : {"localhost:8080", "127.0.0.1", "127.0.0.1:70000", "::1:8080"}) {
    EXPECT_NE(
        Problem(std::string("stop: {wall_time_s: 1}\nhttp: true\nstatus_page: '") + bad + "'\n")
            .find("status_page: '" + std::string(bad) + "' is no numeric HOST:PORT"),
        std::string::npos)
        << bad;
  }
}

TEST(FleetConfig, ResumeReadsTheCopyInTheRunDirectory) {
  TempDir dir;
  const std::string named =
      WriteFleet(dir, "run_dir: " + dir.Sub("run") + "\nstop: {learner_steps: 2}\n");
  EXPECT_TRUE(LoadFleetForLaunch(named, "", /*resume=*/true).status().IsNotFound())
      << "nothing recorded yet";
  std::filesystem::create_directories(dir.Sub("run"));
  std::string text;
  {
    std::ifstream in(named);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  text.replace(text.find("learner_steps: 2"), 16, "learner_steps: 7");
  std::ofstream(dir.Sub("run/fleet.yaml")) << text;
  for (const auto& [fleet_path, run_dir] :
       {std::pair<std::string, std::string>{named, ""}, {"", dir.Sub("run")}}) {
    Result<FleetConfig> fleet = LoadFleetForLaunch(fleet_path, run_dir, /*resume=*/true);
    ASSERT_TRUE(fleet.ok()) << fleet.status().ToString();
    EXPECT_EQ(fleet->stop.learner_steps, 7) << "the recorded copy wins over the named file";
    EXPECT_EQ(fleet->run_dir, dir.Sub("run"));
    EXPECT_EQ(fleet->origin, dir.Sub("run") + "/fleet.yaml");
  }
  Result<FleetConfig> fresh = LoadFleetForLaunch(named, dir.Sub("elsewhere"), /*resume=*/false);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->run_dir, dir.Sub("elsewhere")) << "--run-dir wins over run_dir";
  EXPECT_FALSE(LoadFleetForLaunch("", "", /*resume=*/true).ok());
}

}  // namespace
}  // namespace strider::launcher
