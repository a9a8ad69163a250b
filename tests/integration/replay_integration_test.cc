// The replay server as a real process (`strider replay serve`), real clients, real crashes.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/schema/messages.h"
#include "replay/client.h"
#include "replay/inspect.h"
#include "replay/storage.h"
#include "tests/integration/child_process.h"
#include "tests/replay/test_segments.h"
#include "tests/scratch_dir.h"

namespace strider::replay {
namespace {

using std::chrono::milliseconds;
using strider::testing::ChildProcess;
using strider::testing::MakeSegment;
using strider::testing::RunCommand;
using strider::testing::StriderBinary;
using strider::testing::TempDir;

struct Endpoints {
  std::string actor;
  std::string learner;
};

// Starts `strider replay serve` and returns the endpoints from its "ready" line.
Endpoints StartServer(ChildProcess& server, const std::string& db, const std::string& bind,
                      const std::string& sample_bind, const std::string& config = "") {
  std::vector<std::string> argv = {StriderBinary(), "replay", "serve", "--db", db, "--bind",
                                   bind, "--sample-bind", sample_bind};
  if (!config.empty()) argv.insert(argv.end(), {"--config", config});
  EXPECT_TRUE(server.Start(argv));
  Endpoints endpoints;
  nlohmann::json ready;
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(30000);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string line = server.ReadLine(milliseconds(30000));
    if (line.empty()) break;
    ready = nlohmann::json::parse(line, nullptr, false);
    if (ready.is_object() && ready.value("event", "") == "ready") break;
  }
  EXPECT_TRUE(ready.is_object()) << "no ready line from the server";
  if (!ready.is_object()) return endpoints;
  endpoints.actor = ready["actor_endpoint"];
  endpoints.learner = ready["learner_endpoint"];
  return endpoints;
}

std::unique_ptr<ActorClient> Actor(const std::string& endpoint, const std::string& id) {
  ActorClientOptions options;
  options.endpoint = endpoint;
  options.client_id = id;
  options.ack_timeout = milliseconds(1000);
  options.give_up_after = milliseconds(30000);
  Result<std::unique_ptr<ActorClient>> client = ActorClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

TEST(ReplayProcess, ConcurrentClientsRoundTripThroughInspectAndExport) {
  TempDir dir;
  const std::string db = dir.Sub("db");
  ChildProcess server;
  Endpoints endpoints = StartServer(server, db, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0");
  ASSERT_FALSE(endpoints.actor.empty());

  constexpr int kActors = 4;
  constexpr int kPerActor = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int a = 0; a < kActors; ++a) {
    threads.emplace_back([&, a] {
      auto actor = Actor(endpoints.actor, "actor-" + std::to_string(a));
      if (!actor) return void(failures++);
      for (int i = 0; i < kPerActor; ++i) {
        auto segment = MakeSegment(100 * a + i, 0, 400, /*policy_version=*/a, /*is_last=*/true,
                                   a % 2 == 0 ? "calculator" : "search");
        if (i == 3) strider::testing::AddImage(segment, 50, 8, 8);
        if (!actor->Send(segment).ok()) failures++;
      }
      if (!actor->Flush(milliseconds(30000)).ok()) failures++;
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures, 0);

  // Inspection works while the server runs.
  auto stats = RunCommand({StriderBinary(), "replay", "inspect", db, "stats", "--json"});
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  auto stats_json = nlohmann::json::parse(stats.output);
  EXPECT_EQ(stats_json["segments"], kActors * kPerActor);
  EXPECT_EQ(stats_json["trajectories_by_env"]["search"], 2 * kPerActor);
  auto table = RunCommand({StriderBinary(), "replay", "inspect", db, "stats"});
  EXPECT_EQ(table.exit_code, 0);
  EXPECT_NE(table.output.find("main"), std::string::npos);

  auto verify = RunCommand({StriderBinary(), "replay", "inspect", db, "verify", "--json"});
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_EQ(nlohmann::json::parse(verify.output)["ok"], true);

  auto list = RunCommand({StriderBinary(), "replay", "inspect", db, "list", "--env", "search",
                   "--policy-version", "3", "--json"});
  ASSERT_EQ(list.exit_code, 0);
  std::istringstream lines(list.output);
  std::string line;
  int listed = 0;
  while (std::getline(lines, line)) {
    auto summary = nlohmann::json::parse(line);
    EXPECT_EQ(summary["env"], "search");
    EXPECT_EQ(summary["min_policy_version"], 3);
    EXPECT_EQ(summary["status"], "complete");
    EXPECT_EQ(summary["end_reason"], "finished");
    ++listed;
  }
  EXPECT_EQ(listed, kPerActor);

  const auto sent = MakeSegment(100 * 1 + 3, 0, 400, 1, true, "search");
  auto show = RunCommand({StriderBinary(), "replay", "inspect", db, "show", sent.trajectory_id.Hex()});
  ASSERT_EQ(show.exit_code, 0) << show.output;
  EXPECT_NE(show.output.find("[user] what is 17 * 23? trajectory 103"), std::string::npos)
      << show.output;
  EXPECT_NE(show.output.find("[tool_call] "), std::string::npos);
  EXPECT_NE(show.output.find("group " + sent.group_id.Hex() + " member 3 of 4"), std::string::npos)
      << show.output;
  EXPECT_NE(show.output.find("ended finished"), std::string::npos);
  EXPECT_NE(show.output.find("step 1 [129, 384) correct reward"), std::string::npos);
  auto missing = RunCommand({StriderBinary(), "replay", "inspect", db, "show", std::string(32, 'a')});
  EXPECT_NE(missing.exit_code, 0);

  const std::string out = dir.Sub("export.jsonl");
  auto exported =
      RunCommand({StriderBinary(), "replay", "inspect", db, "export", "--format", "jsonl", "--out", out});
  ASSERT_EQ(exported.exit_code, 0);
  std::ifstream file(out);
  std::set<std::string> keys;
  int with_image = 0;
  while (std::getline(file, line)) {
    auto j = nlohmann::json::parse(line);
    keys.insert(j["trajectory_id"].get<std::string>() + "/" + std::to_string(j["segment_index"].get<int>()));
    if (j["trajectory_id"] == sent.trajectory_id.Hex()) {
      EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), sent.tokens);
      EXPECT_EQ(j["roles"].size(), sent.roles.size());
      EXPECT_EQ(j["behaviour_logprobs"].get<std::vector<float>>(), sent.behaviour_logprobs);
      EXPECT_EQ(j["routing"]["experts"].get<std::vector<uint16_t>>(), sent.routing.experts);
      EXPECT_EQ(j["outcome_reward"], sent.outcome_reward);
      EXPECT_EQ(j["env"], "search");
      EXPECT_EQ(j["schema"], "1." + std::to_string(schema::kSchemaMinor));  // the writer's
      EXPECT_EQ(j["end_reason"], "finished");
      EXPECT_EQ(j["group"]["id"], sent.group_id.Hex());
      EXPECT_EQ(j["group"]["index"], sent.group_index);
      EXPECT_EQ(j["group"]["size"], 4);
      EXPECT_EQ(j["sampling"]["temperature"].get<float>(), 0.7f);
      EXPECT_EQ(j["sampling"]["top_p"].get<float>(), 0.9f);
      EXPECT_EQ(j["sampling"]["top_k"], 50);
      EXPECT_EQ(j["routing"]["coverage"], "actions");
      ASSERT_EQ(j["steps"].size(), sent.steps.size());
      EXPECT_EQ(j["steps"][1]["index"], sent.steps[1].index);
      EXPECT_EQ(j["steps"][1]["begin"], sent.steps[1].begin);
      EXPECT_EQ(j["steps"][1]["label"], "correct");
      EXPECT_EQ(j["steps"][1]["has_reward"], true);
      ASSERT_EQ(j["images"].size(), 1u);
      EXPECT_EQ(j["images"][0]["width"], 8);
      EXPECT_EQ(j["images"][0]["pixels_base64"].get<std::string>().size(), 256u);
      ++with_image;
    }
  }
  EXPECT_EQ(keys.size(), static_cast<size_t>(kActors * kPerActor));
  EXPECT_EQ(with_image, 1);

  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0);
}

TEST(ReplayProcess, Sigkill_LosesNoAcknowledgedSegment) {
  TempDir dir;
  const std::string db = dir.Sub("db");
  auto server = std::make_unique<ChildProcess>();
  Endpoints endpoints = StartServer(*server, db, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0");
  ASSERT_FALSE(endpoints.actor.empty());

  constexpr int kActors = 3;
  constexpr int kPerActor = 150;
  std::mutex acked_mutex;
  std::set<std::string> acked;
  std::atomic<int> failures{0};
  std::atomic<int> sent_total{0};
  std::vector<std::thread> threads;
  for (int a = 0; a < kActors; ++a) {
    threads.emplace_back([&, a] {
      auto actor = Actor(endpoints.actor, "actor-" + std::to_string(a));
      if (!actor) return void(failures++);
      auto collect = [&] {
        std::lock_guard<std::mutex> lock(acked_mutex);
        for (const auto& key : actor->TakeAcked()) acked.insert(key.ToString());
      };
      for (int i = 0; i < kPerActor; ++i) {
        if (!actor->Send(MakeSegment(1000 * a + i / 3, i % 3, 2000, 1, i % 3 == 2)).ok()) {
          failures++;
        }
        sent_total++;
        collect();
        // Paced, so the kill below lands in the middle of the stream.
        std::this_thread::sleep_for(milliseconds(3));
      }
      if (!actor->Flush(milliseconds(45000)).ok()) failures++;
      collect();
    });
  }
  // Kill the server in the middle of the stream, then bring it back on the same endpoints.
  size_t acked_before_kill = 0;
  const auto wait_until = std::chrono::steady_clock::now() + milliseconds(20000);
  while (std::chrono::steady_clock::now() < wait_until &&
         (sent_total < kActors * kPerActor / 3 || acked_before_kill < 60)) {
    std::this_thread::sleep_for(milliseconds(5));
    std::lock_guard<std::mutex> lock(acked_mutex);
    acked_before_kill = acked.size();
  }
  EXPECT_LT(sent_total, kActors * kPerActor) << "the stream ended before the kill";
  server->Signal(SIGKILL);
  EXPECT_EQ(server->Wait(), 128 + SIGKILL);
  server = std::make_unique<ChildProcess>();
  Endpoints again = StartServer(*server, db, endpoints.actor, endpoints.learner);
  EXPECT_EQ(again.actor, endpoints.actor);
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures, 0);
  EXPECT_GT(acked_before_kill, 0u);
  EXPECT_EQ(acked.size(), static_cast<size_t>(kActors * kPerActor));

  // Every acknowledged segment is stored, and indexed exactly once.
  server->Signal(SIGKILL);
  server->Wait();
  auto verify = RunCommand({StriderBinary(), "replay", "inspect", db, "verify", "--json"});
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  Result<std::unique_ptr<Inspector>> inspector = Inspector::Open(db);
  ASSERT_TRUE(inspector.ok()) << inspector.status().ToString();
  std::stringstream jsonl;
  ASSERT_TRUE((*inspector)->ExportJsonl(jsonl).ok());
  std::map<std::string, int> indexed;
  std::string line;
  while (std::getline(jsonl, line)) {
    auto j = nlohmann::json::parse(line);
    indexed[j["trajectory_id"].get<std::string>() + "/" +
            std::to_string(j["segment_index"].get<int>())]++;
  }
  for (const std::string& key : acked) EXPECT_EQ(indexed[key], 1) << key;
  EXPECT_EQ(indexed.size(), acked.size());
}

TEST(ReplayProcess, BadConfigIsAUsageErrorNamingTheKey) {
  TempDir dir;
  const std::string config = dir.Sub("bad.yaml");
  std::ofstream(config) << "tables:\n  - name: main\n    sampler: fifo\n    retention:\n"
                           "      max_segmnets: 10\n";
  ChildProcess server;
  ASSERT_TRUE(server.Start({StriderBinary(), "replay", "serve", "--db", dir.Sub("db"), "--bind",
                            "tcp://127.0.0.1:0", "--config", config}));
  EXPECT_EQ(server.Wait(), 2);
}

TEST(ReplayProcess, BadBindIsAUsageErrorAndCreatesNoStore) {
  TempDir dir;
  ChildProcess server;
  ASSERT_TRUE(server.Start({StriderBinary(), "replay", "serve", "--db", dir.Sub("db"), "--bind",
                            "garbage://"}));
  EXPECT_EQ(server.Wait(), 2);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("db")));
}

// A learner keeps getting answers while a real actor floods a group table with short episodes
// as fast as it can play them (fifo, a staleness bound the learner's rising version crosses,
// each group sampled once): sampling is never starved by ingest.
TEST(ReplayProcess, LearnerIsAnsweredPromptlyWhileAnActorFloods) {
  TempDir dir;
  const std::string config = dir.Sub("replay.yaml");
  std::ofstream(config) << "server: {stats_interval_s: 0}\n"
                           "tables:\n"
                           "  - name: groups\n"
                           "    unit: group\n"
                           "    sampler: fifo\n"
                           "    max_staleness: 2\n"
                           "    capacity: 1000\n"
                           "    rate_limiter: {min_fill: 1, max_times_sampled: 1}\n";
  ChildProcess server;
  Endpoints endpoints =
      StartServer(server, dir.Sub("db"), "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", config);
  ASSERT_FALSE(endpoints.learner.empty());

  const std::string actor_config = dir.Sub("actor.yaml");
  std::ofstream(actor_config)
      << "actor:\n"
      << "  model: " << strider::testing::SourceDir() << "/configs/model/tiny.yaml\n"
      << "  model_seed: 0\n  threads: 2\n  episodes: 0\n  episodes_in_flight: 4\n"
      << "  group_size: 4\n  max_turns: 1\n  max_episode_tokens: 512\n  seed: 3\n"
      << "  segment_tokens: 256\n"
      << "  sampling: {temperature: 1.0, max_new_tokens: 24}\n"
      << "  replay: {endpoint: " << endpoints.actor << ", spill_after_ms: 10000}\n"
      << "  metrics: {interval_s: 1000, progress: false}\n"
      << "env:\n  name: calculator\n  options: {difficulty: 1}\n";
  ChildProcess actor;
  ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", actor_config, "--replay",
                           endpoints.actor, "--spill-dir", dir.Sub("spill")}));
  ASSERT_TRUE(strider::testing::WaitEvent(actor, "ready", 30000).is_object());

  LearnerClientOptions options;
  options.endpoint = endpoints.learner;
  options.table = "groups";
  auto learner = LearnerClient::Connect(options);
  ASSERT_TRUE(learner.ok()) << learner.status().ToString();
  // The learner's version rises every second, as if it trained on what it got; the actor's
  // never does, so after two seconds everything it stores is too stale and the table answers
  // "not ready" to requests that wait 10 ms for data each. Every request is still answered,
  // promptly, or the server has stopped serving learners.
  std::vector<double> latencies_ms;
  int sampled = 0;
  int not_ready = 0;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t step = 1; std::chrono::steady_clock::now() < start + milliseconds(20000); ++step) {
    const auto begin = std::chrono::steady_clock::now();
    const uint64_t version =
        1 + std::chrono::duration_cast<std::chrono::seconds>(begin - start).count();
    Result<SampleBatch> batch = (*learner)->Sample(step, 4, version, milliseconds(10));
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin)
            .count();
    latencies_ms.push_back(ms);
    ASSERT_TRUE(batch.ok() || batch.status().code() == StatusCode::kResourceExhausted)
        << "step " << step << " (version " << version << ") after " << ms
        << " ms: " << batch.status().ToString();
    batch.ok() ? ++sampled : ++not_ready;
  }
  auto stats = (*learner)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  const nlohmann::json j = nlohmann::json::parse(*stats);
  EXPECT_GT(j["ingest"]["segments"].get<uint64_t>(), 50u) << "the actor did not flood: " << *stats;
  EXPECT_GT(sampled, 0) << *stats;
  EXPECT_GT(not_ready, 0) << *stats;
  std::sort(latencies_ms.begin(), latencies_ms.end());
  std::cout << "sample latency ms: p50 " << latencies_ms[latencies_ms.size() / 2] << " p99 "
            << latencies_ms[latencies_ms.size() * 99 / 100] << " max " << latencies_ms.back()
            << " over " << latencies_ms.size() << " requests (" << sampled << " sampled)\n";
  // 10 ms of waiting for data at most, plus a generous allowance for a loaded machine.
  EXPECT_LT(latencies_ms.back(), 1500.0) << latencies_ms.size() << " requests, " << *stats;
  actor.Signal(SIGTERM);
  EXPECT_EQ(actor.Wait(), 0);
}

}  // namespace
}  // namespace strider::replay
