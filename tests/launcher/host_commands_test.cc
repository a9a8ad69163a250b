// Fleets with hosts: the keys that place each role, the errors a bad placement gives, and the
// commands HostCommands builds for each host (what `strider launch --print-commands` prints).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/launcher.h"
#include "tests/launcher/fleet_files.h"
#include "tests/scratch_dir.h"

namespace strider::launcher {
namespace {

using strider::testing::TempDir;
using Argv = std::vector<std::string>;

const char* kReplayHosts = "host: replay-0";
const char* kLearnerHosts = "hosts: [learner-0, learner-1]";
const char* kActorHosts = "hosts:\n  - {host: actor-0, count: 2}\n  - {host: actor-1}";
const char* kStop = "stop: {learner_steps: 5}\n";

// The message of loading a fleet with these sections' extra keys (OK when it loads).
std::string Problem(const std::string& replay, const std::string& learner,
                    const std::string& actors, const std::string& extra = kStop) {
  TempDir dir;
  Result<FleetConfig> fleet = LoadFleetConfig(WriteFleet(dir, extra, replay, learner, actors));
  return fleet.ok() ? "OK" : fleet.status().ToString();
}

TEST(FleetHosts, TheHostKeysPlaceEachRole) {
  TempDir dir;
  Result<FleetConfig> fleet = LoadFleetConfig(
      WriteFleet(dir, kStop, "host: replay-0\nport: 6000\nsample_port: 6001",
                 "hosts: [learner-0, learner-1]\nworld_size: 4\npublish_port: 6002", kActorHosts));
  ASSERT_TRUE(fleet.ok()) << fleet.status().ToString();
  ASSERT_TRUE(fleet->hosts.has_value());
  EXPECT_EQ(fleet->hosts->replay.host, "replay-0");
  EXPECT_EQ(fleet->hosts->replay.bind, "0.0.0.0");
  EXPECT_EQ(fleet->hosts->replay.port, 6000);
  EXPECT_EQ(fleet->hosts->replay.sample_port, 6001);
  EXPECT_EQ(fleet->hosts->learner.world_size, 4);
  EXPECT_EQ(fleet->hosts->learner.rendezvous_host, "learner-0") << "rank 0's host by default";
  EXPECT_EQ(fleet->hosts->learner.rendezvous_port, 29500);
  EXPECT_EQ(fleet->hosts->learner.publish_port, 6002);
  ASSERT_EQ(fleet->hosts->actors.size(), 2u);
  EXPECT_EQ(fleet->hosts->actors[1].count, 1);
  EXPECT_EQ(fleet->actor_count, 3) << "the hosts' counts summed";

  Result<FleetConfig> hostless = LoadFleetConfig(WriteFleet(dir, kStop));
  ASSERT_TRUE(hostless.ok()) << hostless.status().ToString();
  EXPECT_FALSE(hostless->hosts.has_value());
}

TEST(FleetHosts, EachBadPlacementIsNamedWithItsFileLineAndKey) {
  const struct {
    std::string replay, learner, actors, expected;
  } cases[] = {
      {"host: tcp://replay-0", kLearnerHosts, kActorHosts,
       "fleet.yaml:3: replay.host: 'tcp://replay-0' is a host name or address, without a scheme"},
      {"host: replay-0:5555", kLearnerHosts, kActorHosts,
       "replay.host: 'replay-0:5555' is no host name or IPv6 address (a port goes in its own key)"},
      {"host: 'replay 0'", kLearnerHosts, kActorHosts,
       "replay.host: 'replay 0' is no host name or address"},
      {kReplayHosts, "", "",
       "learner.hosts: is required: the fleet names hosts for replay.host, and every role needs "
       "them"},
      {"", kLearnerHosts, kActorHosts,
       "replay.host: is required: the fleet names hosts for learner.hosts and actors.hosts, and "
       "every role needs them"},
      {"port: 6000", "", "",
       "fleet.yaml:3: replay.port: is for a fleet with hosts (replay.host, learner.hosts, "
       "actors.hosts)"},
      {"", "rendezvous: a:1", "", "learner.rendezvous: is for a fleet with hosts"},
      {"host: replay-0\nport: 0", kLearnerHosts, kActorHosts,
       "fleet.yaml:4: replay.port: must be a port between 1 and 65535"},
      {kReplayHosts, "hosts: [learner-0, learner-1]\nworld_size: 3", kActorHosts,
       "fleet.yaml:7: learner.world_size: 3 ranks do not spread evenly over 2 hosts"},
      {kReplayHosts, "hosts: []", kActorHosts, "learner.hosts: must name at least one host"},
      {kReplayHosts, "hosts: [learner-0, 'learner 1']", kActorHosts,
       "learner.hosts: element 1: 'learner 1' is no host name"},
      {kReplayHosts, "hosts: [learner-0]\nrendezvous: learner-0", kActorHosts,
       "learner.rendezvous: 'learner-0' must be HOST:PORT ([ADDRESS]:PORT for IPv6)"},
      {kReplayHosts, "hosts: [learner-0]\nrendezvous: learner-0:70000", kActorHosts,
       "learner.rendezvous: must be a port between 1 and 65535"},
      {kReplayHosts, "hosts: [replay-0]\npublish_port: 5556", kActorHosts,
       "learner.publish_port: port 5556 on replay-0 is replay.sample_port's too"},
      {"host: replay-0\nsample_port: 5555", kLearnerHosts, kActorHosts,
       "replay.sample_port: port 5555 on replay-0 is replay.port's too"},
      {kReplayHosts, kLearnerHosts, "hosts:\n  - {host: actor-0}\n  - {host: actor-1, count: 0}",
       "actors.hosts[1].count: must be at least 1"},
      {kReplayHosts, kLearnerHosts, "hosts:\n  - {count: 2}",
       "actors.hosts[0].host: is required but missing"},
      {kReplayHosts, kLearnerHosts, "hosts:\n  - {host: actor-0, cout: 2}",
       "actors.hosts[0].cout: unknown key (did you mean count?)"},
      {kReplayHosts, kLearnerHosts, "count: 5\nhosts:\n  - {host: actor-0, count: 2}",
       "actors.count: 5 differs from the 2 actors actors.hosts places; leave count out with "
       "hosts"},
      {kReplayHosts, kLearnerHosts, "hosts: []", "actors.hosts: must name at least one host"},
  };
  for (const auto& c : cases) {
    const std::string problem = Problem(c.replay, c.learner, c.actors);
    EXPECT_NE(problem.find(c.expected), std::string::npos)
        << "replay {" << c.replay << "} learner {" << c.learner << "} actors {" << c.actors
        << "}\n  gave: " << problem << "\n  want: " << c.expected;
  }
  // Pages on known ports take http_port upwards on each host, so they may meet another port.
  EXPECT_NE(Problem("host: replay-0\nport: 9101", "hosts: [replay-0]", kActorHosts,
                    "http: true\nhttp_port: 9100\n" + std::string(kStop))
                .find("http_port: port 9101 on replay-0 is replay.port's too"),
            std::string::npos);
  EXPECT_EQ(Problem(kReplayHosts, kLearnerHosts, kActorHosts), "OK");
}

TEST(HostCommands, AHostlessFleetPrintsLoopbackCommands) {
  TempDir dir;
  Result<FleetConfig> fleet =
      LoadFleetConfig(WriteFleet(dir, "stop: {learner_steps: 5}\n", "", "", "count: 2"));
  ASSERT_TRUE(fleet.ok()) << fleet.status().ToString();
  const std::vector<HostCommand> commands = HostCommands(*fleet, /*actor_base_seed=*/7);
  ASSERT_EQ(commands.size(), 4u);
  for (const HostCommand& command : commands) EXPECT_EQ(command.host, "127.0.0.1");
  EXPECT_EQ(commands[0].argv,
            (Argv{"strider", "replay", "serve", "--db", "runs/fleet/replay", "--config",
                  dir.Sub("replay.yaml"), "--bind", "tcp://127.0.0.1:5555", "--sample-bind",
                  "tcp://127.0.0.1:5556"}));
  EXPECT_EQ(commands[1].name, "learner");
  EXPECT_EQ(commands[1].argv,
            (Argv{"strider", "learner", "--config", dir.Sub("learner.yaml"), "--run-dir",
                  "runs/fleet/learner", "--replay", "tcp://127.0.0.1:5556", "--publish",
                  "tcp://127.0.0.1:5557", "--max-steps", "5"}))
      << "one learner: no rank flags";
  for (int i = 0; i < 2; ++i) {
    const std::string id = "actor-" + std::to_string(i);
    EXPECT_EQ(commands[2 + i].name, id);
    EXPECT_EQ(commands[2 + i].argv,
              (Argv{"strider", "actor", "--config", dir.Sub("actor.yaml"), "--id", id, "--seed",
                    std::to_string(7 + i), "--episodes", "0", "--replay", "tcp://127.0.0.1:5555",
                    "--weights-endpoint", "tcp://127.0.0.1:5557", "--spill-dir",
                    "runs/fleet/actors/" + id + "/spill", "--metrics",
                    "runs/fleet/actors/" + id + "/metrics.jsonl", "--no-progress"}));
  }
}

// A fleet with hosts whose paths are written relative to the fleet file's directory.
std::string WriteHostsFleet(const TempDir& dir, const std::string& extra) {
  for (const char* name : {"replay.yaml", "learner.yaml", "actor.yaml"}) {
    std::ofstream(dir.Sub(name)) << "# placeholder\n";
  }
  std::ofstream(dir.Sub("fleet.yaml"))
      << "run_dir: /shared/run\n"
      << "weights: /shared/warm.safetensors\n"  // on the hosts, not here
      << "replay: {config: replay.yaml, host: replay-0, port: 7000, sample_port: 7001}\n"
      << "learner:\n"
      << "  config: learner.yaml\n"
      << "  hosts: [learner-0, learner-1]\n"
      << "  world_size: 4\n"
      << "  rendezvous: '[fd00::1]:29400'\n"
      << "  publish_port: 7002\n"
      << "actors:\n"
      << "  config: actor.yaml\n"
      << "  hosts: [{host: actor-0, count: 2}, {host: replay-0}]\n"
      << "stop: {learner_steps: 9, wall_time_s: 60}\n"
      << extra;
  return dir.Sub("fleet.yaml");
}

TEST(HostCommands, EachHostGetsItsCommandsWithTheFleetFilesPaths) {
  TempDir dir;
  Result<FleetConfig> fleet = LoadFleetConfig(WriteHostsFleet(dir, ""));
  ASSERT_TRUE(fleet.ok()) << fleet.status().ToString();
  EXPECT_EQ(fleet->replay_config, dir.Sub("replay.yaml")) << "resolved here, to be checked";
  const std::vector<HostCommand> commands = HostCommands(*fleet, 100);
  std::vector<std::string> placed;
  for (const HostCommand& command : commands) placed.push_back(command.host + " " + command.name);
  EXPECT_EQ(placed,
            (std::vector<std::string>{"replay-0 replay", "replay-0 actor-2", "learner-0 learner-0",
                                      "learner-0 learner-1", "learner-1 learner-2",
                                      "learner-1 learner-3", "actor-0 actor-0", "actor-0 actor-1"}))
      << "grouped by host, hosts in order of first appearance, start order within one";
  EXPECT_EQ(commands[0].argv, (Argv{"strider", "replay", "serve", "--db", "/shared/run/replay",
                                    "--config", "replay.yaml", "--bind", "tcp://0.0.0.0:7000",
                                    "--sample-bind", "tcp://0.0.0.0:7001"}));
  for (int rank = 0; rank < 4; ++rank) {
    const HostCommand& learner = commands[2 + rank];
    EXPECT_EQ(learner.role, "learner");
    EXPECT_EQ(learner.argv, (Argv{"strider",      "learner",
                                  "--config",     "learner.yaml",
                                  "--run-dir",    "/shared/run/learner",
                                  "--replay",     "tcp://replay-0:7001",
                                  "--publish",    "tcp://0.0.0.0:7002",
                                  "--init",       "/shared/warm.safetensors",
                                  "--max-steps",  "9",
                                  "--rank",       std::to_string(rank),
                                  "--world-size", "4",
                                  "--rendezvous", "[fd00::1]:29400"}));
  }
  EXPECT_EQ(commands[1].argv, (Argv{"strider",
                                    "actor",
                                    "--config",
                                    "actor.yaml",
                                    "--id",
                                    "actor-2",
                                    "--seed",
                                    "102",
                                    "--episodes",
                                    "0",
                                    "--replay",
                                    "tcp://replay-0:7000",
                                    "--weights-endpoint",
                                    "tcp://learner-0:7002",
                                    "--spill-dir",
                                    "/shared/run/actors/actor-2/spill",
                                    "--metrics",
                                    "/shared/run/actors/actor-2/metrics.jsonl",
                                    "--no-progress",
                                    "--weights",
                                    "/shared/warm.safetensors"}))
      << "actors subscribe to rank 0's weight stream on its host";
}

TEST(HostCommands, PagesTakeKnownPortsUpwardsOnEachHost) {
  TempDir dir;
  Result<FleetConfig> fleet = LoadFleetConfig(WriteHostsFleet(dir, "http: true\nbinary: /opt/s\n"));
  ASSERT_TRUE(fleet.ok()) << fleet.status().ToString();
  std::vector<std::string> pages;
  for (const HostCommand& command : HostCommands(*fleet, 0)) {
    EXPECT_EQ(command.argv.front(), "/opt/s");
    const auto flag = std::find(command.argv.begin(), command.argv.end(), "--http");
    ASSERT_NE(flag, command.argv.end()) << command.name;
    pages.push_back(command.host + " " + *(flag + 1));
  }
  EXPECT_EQ(pages, (std::vector<std::string>{"replay-0 0.0.0.0:9100", "replay-0 0.0.0.0:9101",
                                             "learner-0 0.0.0.0:9100", "learner-0 0.0.0.0:9101",
                                             "learner-1 0.0.0.0:9100", "learner-1 0.0.0.0:9101",
                                             "actor-0 0.0.0.0:9100", "actor-0 0.0.0.0:9101"}));
}

TEST(HostCommands, TextQuotesForTheShellAndJsonCarriesEachCommand) {
  TempDir dir;
  Result<FleetConfig> fleet = LoadFleetConfig(WriteHostsFleet(dir, ""));
  ASSERT_TRUE(fleet.ok()) << fleet.status().ToString();
  fleet->run_dir = "/shared/it's a run";
  const std::vector<HostCommand> commands = HostCommands(*fleet, 0);
  const std::string text = HostCommandsText(commands);
  EXPECT_EQ(text.rfind("# replay-0\nstrider replay serve --db '/shared/it'\\''s a run/replay' ", 0),
            0u)
      << text;
  EXPECT_NE(text.find("\n\n# learner-0\nstrider learner "), std::string::npos) << text;
  EXPECT_NE(text.find("--rendezvous '[fd00::1]:29400'"), std::string::npos) << text;

  const std::string lines = HostCommandsJsonLines(commands);
  size_t start = 0;
  size_t index = 0;
  for (size_t end; (end = lines.find('\n', start)) != std::string::npos; start = end + 1) {
    ASSERT_LT(index, commands.size());
    const nlohmann::json line = nlohmann::json::parse(lines.substr(start, end - start));
    EXPECT_EQ(line["host"], commands[index].host);
    EXPECT_EQ(line["role"], commands[index].role);
    EXPECT_EQ(line["name"], commands[index].name);
    EXPECT_EQ(line["argv"].get<Argv>(), commands[index].argv);
    ++index;
  }
  EXPECT_EQ(index, commands.size());
}

TEST(HostCommands, TheLauncherRefusesAFleetWithHosts) {
  TempDir dir;
  Result<FleetConfig> fleet = LoadFleetConfig(WriteHostsFleet(dir, ""));
  ASSERT_TRUE(fleet.ok()) << fleet.status().ToString();
  fleet->run_dir = dir.Sub("run");
  Result<LaunchSummary> launched = Launch(*fleet, LaunchOptions{});
  ASSERT_TRUE(launched.status().IsInvalidArgument()) << launched.status().ToString();
  EXPECT_NE(launched.status().message().find("--print-commands"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("run"))) << "nothing prepared, nothing started";
}

}  // namespace
}  // namespace strider::launcher
