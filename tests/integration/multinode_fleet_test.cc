// configs/fleet/multinode.yaml run for real on one machine: a copy with every host 127.0.0.1 and
// free ports, keys made by `strider keys generate` as the fleet's header says, and every command
// `strider launch --print-commands --json` prints started as it is printed (replay server, two
// data-parallel learner ranks, four actors), from one directory standing in for each host's
// repository root. The services keep binding 0.0.0.0 as shipped, so they start only because
// the shipped configs' `auth:` blocks hold; the learner and actors run the tiny model with small
// batches (the shipped learner and actor configs with a few keys changed, their `auth:` blocks
// as they are), and the replay config is the shipped one. A stranger's key is refused by the
// replay server's two endpoints and by rank 0's weight stream while the fleet trains.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/transport/curve.h"
#include "common/transport/weight_stream.h"
#include "replay/client.h"
#include "tests/free_port.h"
#include "tests/integration/child_process.h"
#include "tests/integration/rl_fixture.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using testing::ChildProcess;
using testing::ReadFile;
using testing::ReadMetrics;
using testing::SourceDir;
using testing::StriderBinary;
using testing::TempDir;
using testing::WaitEvent;

constexpr int kSteps = 3;

// `count` distinct ports nobody listens on now.
std::vector<int> FreePorts(size_t count) {
  std::set<int> ports;
  while (ports.size() < count) {
    const uint16_t port = testing::FreeLoopbackPort();
    EXPECT_NE(port, 0) << "no loopback port to be had";
    if (port == 0) break;
    ports.insert(port);
  }
  return {ports.begin(), ports.end()};
}

void WriteYaml(const std::string& path, const YAML::Node& node) {
  YAML::Emitter out;
  out << node;
  std::ofstream(path) << out.c_str() << "\n";
}

// The shipped learner config with the tiny model and a batch of two groups; `auth:` untouched.
void WriteLearnerConfig(const std::string& path) {
  YAML::Node config = YAML::LoadFile(SourceDir() + "/configs/rl/multinode.yaml");
  ASSERT_TRUE(config["replay"]["auth"] && config["publish"]["auth"]);
  config["model_config"] = SourceDir() + "/configs/model/tiny.yaml";
  config["replay"]["units_per_step"] = 2;
  config["train"]["minibatches"] = 1;
  config["train"]["chunk_tokens"] = 128;
  WriteYaml(path, config);
}

// The shipped actor config with the tiny model, short episodes, and weights polled often enough
// to see a version during a three-step run; `auth:` untouched.
void WriteActorConfig(const std::string& path) {
  YAML::Node config = YAML::LoadFile(SourceDir() + "/configs/actor/multinode.yaml");
  YAML::Node actor = config["actor"];
  ASSERT_TRUE(actor["replay"]["auth"] && actor["weight_stream"]["auth"]);
  actor["model"] = SourceDir() + "/configs/model/tiny.yaml";
  actor["episodes_in_flight"] = 4;
  actor["group_size"] = 4;
  actor["max_turns"] = 2;
  actor["max_episode_tokens"] = 512;
  actor["segment_tokens"] = 128;
  actor["sampling"]["max_new_tokens"] = 16;
  actor["engine"]["cache_budget_mb"] = 32;
  actor["weight_stream"]["poll_ms"] = 100;
  actor["metrics"]["interval_s"] = 1;
  WriteYaml(path, config);
}

struct Ports {
  int replay = 0, sample = 0, publish = 0, rendezvous = 0;
};

// configs/fleet/multinode.yaml with every host 127.0.0.1, these ports, the configs above, this
// binary, no warm start (learner and actors start from the same seed) and kSteps steps.
void WriteFleet(const std::string& path, const Ports& ports) {
  YAML::Node fleet = YAML::LoadFile(SourceDir() + "/configs/fleet/multinode.yaml");
  ASSERT_EQ(fleet["learner"]["world_size"].as<int>(), 2);
  fleet["binary"] = StriderBinary();
  fleet["run_dir"] = "run";
  fleet.remove("weights");
  YAML::Node replay = fleet["replay"];
  replay["config"] = SourceDir() + "/configs/replay/multinode.yaml";
  replay["host"] = "127.0.0.1";
  replay["port"] = ports.replay;
  replay["sample_port"] = ports.sample;
  YAML::Node learner = fleet["learner"];
  learner["config"] = "learner.yaml";
  for (size_t i = 0; i < learner["hosts"].size(); ++i) learner["hosts"][i] = "127.0.0.1";
  learner["rendezvous"] = "127.0.0.1:" + std::to_string(ports.rendezvous);
  learner["publish_port"] = ports.publish;
  YAML::Node actors = fleet["actors"];
  actors["config"] = "actor.yaml";
  for (size_t i = 0; i < actors["hosts"].size(); ++i) actors["hosts"][i]["host"] = "127.0.0.1";
  fleet["stop"]["learner_steps"] = kSteps;
  WriteYaml(path, fleet);
}

struct Printed {
  std::string role, name;
  std::vector<std::string> argv;
};

// The last metrics line of an actor's file; null while it has none.
nlohmann::json LastLine(const std::string& path) {
  const std::vector<nlohmann::json> lines = ReadMetrics(path);
  return lines.empty() ? nlohmann::json() : lines.back();
}

class MultinodeFleet : public ::testing::Test {
 protected:
  // Every host's commands run from one directory, as from the repository root of each host:
  // the configs' relative key paths (keys/...) resolve there.
  void SetUp() override {
    previous_ = fs::current_path();
    fs::current_path(dir_.path());
  }
  void TearDown() override { fs::current_path(previous_); }

  TempDir dir_;
  fs::path previous_;
};

TEST_F(MultinodeFleet, PrintedCommandsTrainWithTheShippedKeysAndRefuseAStranger) {
  const auto start = std::chrono::steady_clock::now();
  // The command the fleet file's header gives, run where the services will look for keys/.
  auto keys = testing::RunCommand({StriderBinary(), "keys", "generate", "--out", "keys", "--name",
                                   "replay", "--name", "learner", "--name", "actor"});
  ASSERT_EQ(keys.exit_code, 0) << keys.output;
  // Made apart from the fleet's: nobody lists it.
  ASSERT_EQ(testing::RunCommand(
                {StriderBinary(), "keys", "generate", "--out", "stranger", "--name", "stranger"})
                .exit_code,
            0);
  const transport::ClientAuth stranger_to_replay{"stranger/stranger.key_secret", "keys/replay.key"};
  const transport::ClientAuth stranger_to_learner{"stranger/stranger.key_secret",
                                                  "keys/learner.key"};
  const std::string stranger_key = transport::LoadCurvePublicKey("stranger/stranger.key").value();

  ASSERT_NO_FATAL_FAILURE(WriteLearnerConfig("learner.yaml"));
  ASSERT_NO_FATAL_FAILURE(WriteActorConfig("actor.yaml"));
  const std::vector<int> free = FreePorts(4);
  const Ports ports{free[0], free[1], free[2], free[3]};
  ASSERT_NO_FATAL_FAILURE(WriteFleet("fleet.yaml", ports));

  std::vector<Printed> printed;
  {
    ChildProcess print;
    ASSERT_TRUE(print.Start({StriderBinary(), "launch", "fleet.yaml", "--print-commands", "--json"},
                            "print.err"));
    const std::string out = print.ReadAll(milliseconds(60000));
    ASSERT_EQ(print.Wait(), 0) << ReadFile("print.err");
    // Keyed configs: no service is named as one that would refuse to start.
    EXPECT_EQ(ReadFile("print.err").find("has no keys"), std::string::npos)
        << ReadFile("print.err");
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      const nlohmann::json command = nlohmann::json::parse(line);
      printed.push_back(
          {command["role"], command["name"], command["argv"].get<std::vector<std::string>>()});
    }
  }
  std::map<std::string, int> per_role;
  for (const Printed& command : printed) ++per_role[command.role];
  ASSERT_EQ(per_role, (std::map<std::string, int>{{"replay", 1}, {"learner", 2}, {"actor", 4}}));
  ASSERT_EQ(printed.front().role, "replay");
  const std::vector<std::string>& serve = printed.front().argv;
  ASSERT_NE(std::find(serve.begin(), serve.end(), "tcp://0.0.0.0:" + std::to_string(ports.replay)),
            serve.end())
      << "the replay server binds what other hosts reach, as shipped";

  // Every printed command, as printed, in the printed order.
  std::map<std::string, std::unique_ptr<ChildProcess>> children;
  for (const Printed& command : printed) {
    auto child = std::make_unique<ChildProcess>();
    ASSERT_TRUE(child->Start(command.argv, command.name + ".err")) << command.name;
    children[command.name] = std::move(child);
  }
  ChildProcess& replay = *children["replay"];
  ASSERT_TRUE(WaitEvent(replay, "ready", 30000).is_object()) << ReadFile("replay.err");

  // A stranger can neither write segments nor sample.
  replay::ActorClientOptions writer;
  writer.endpoint = "tcp://127.0.0.1:" + std::to_string(ports.replay);
  writer.give_up_after = milliseconds(3000);
  writer.auth = stranger_to_replay;
  auto refused_writer = replay::ActorClient::Connect(writer);
  EXPECT_EQ(refused_writer.status().code(), StatusCode::kFailedPrecondition)
      << refused_writer.status().ToString();
  replay::LearnerClientOptions sampler;
  sampler.endpoint = "tcp://127.0.0.1:" + std::to_string(ports.sample);
  sampler.request_timeout = milliseconds(2000);
  sampler.auth = stranger_to_replay;
  sampler.learner_id = "stranger";
  auto connected = replay::LearnerClient::Connect(sampler);
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  auto refused_sample = (*connected)->Sample(1, 1, 1, milliseconds(3000));
  EXPECT_EQ(refused_sample.status().code(), StatusCode::kFailedPrecondition)
      << refused_sample.status().ToString();

  // Nor receive weights from rank 0, which serves them once it is ready.
  ASSERT_TRUE(WaitEvent(*children["learner-0"], "ready", 60000).is_object())
      << ReadFile("learner-0.err");
  transport::WeightSubscriberOptions subscriber;
  subscriber.endpoint = "tcp://127.0.0.1:" + std::to_string(ports.publish);
  subscriber.reply_timeout = milliseconds(3000);
  subscriber.auth = stranger_to_learner;
  auto subscribed = transport::WeightSubscriber::Connect(subscriber);
  ASSERT_TRUE(subscribed.ok()) << subscribed.status().ToString();
  auto refused_weights = (*subscribed)->FetchNewer(0);
  EXPECT_EQ(refused_weights.status().code(), StatusCode::kFailedPrecondition)
      << refused_weights.status().ToString();

  // The ranks train their steps together and stop at --max-steps.
  for (const char* rank : {"learner-0", "learner-1"}) {
    const nlohmann::json finished = WaitEvent(*children[rank], "finished", 90000);
    EXPECT_EQ(children[rank]->Wait(), 0) << rank << ": " << ReadFile(std::string(rank) + ".err");
    ASSERT_TRUE(finished.is_object()) << rank;
    EXPECT_EQ(finished["total_steps"], kSteps) << rank;
  }
  for (const char* metrics : {"run/learner/metrics.jsonl", "run/learner/rank-1/metrics.jsonl"}) {
    const std::vector<nlohmann::json> lines = ReadMetrics(metrics);
    ASSERT_EQ(lines.size(), static_cast<size_t>(kSteps)) << metrics;
    for (const nlohmann::json& line : lines) EXPECT_EQ(line["world_size"], 2) << metrics;
  }

  // Each actor wrote segments the server acknowledged and took a version from rank 0. Its
  // metrics line comes every second, so the last one may predate the fetch by that much.
  for (int i = 0; i < 4; ++i) {
    const std::string name = "actor-" + std::to_string(i);
    const std::string path = "run/actors/" + name + "/metrics.jsonl";
    nlohmann::json last;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      last = LastLine(path);
      if (last.is_object() && last.value("weight_updates", 0) > 0 &&
          last.value("acked_segments", 0) > 0) {
        break;
      }
      std::this_thread::sleep_for(milliseconds(200));
    }
    ASSERT_TRUE(last.is_object()) << name << ": no metrics line; " << ReadFile(name + ".err");
    EXPECT_GT(last.value("weight_updates", 0), 0) << name << ": " << last.dump();
    EXPECT_GT(last.value("policy_version", 0), 0) << name << ": " << last.dump();
    EXPECT_GT(last.value("acked_segments", 0), 0) << name << ": " << last.dump();
  }

  // Stopped in the launcher's order: actors first, then the replay server.
  for (int i = 0; i < 4; ++i) children["actor-" + std::to_string(i)]->Signal(SIGTERM);
  for (int i = 0; i < 4; ++i) {
    const std::string name = "actor-" + std::to_string(i);
    EXPECT_EQ(children[name]->Wait(), 0) << name << ": " << ReadFile(name + ".err");
  }
  replay.Signal(SIGTERM);
  EXPECT_EQ(replay.Wait(), 0) << ReadFile("replay.err");
  // Refused in the handshake and logged with the key, as docs/fleet.md says.
  EXPECT_NE(ReadFile("replay.err").find(stranger_key), std::string::npos) << ReadFile("replay.err");
  std::printf("multinode fleet: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace
}  // namespace strider
