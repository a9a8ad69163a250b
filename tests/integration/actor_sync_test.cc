// Synchronous on-policy rounds (`weight_stream.sync`): a real `strider actor` process, with a
// replay server and a weight publisher in this process. The actor plays round 1 on its initial
// weights, then stores nothing while nothing is published, and plays round 2 wholly on the
// version published next; a group table with max_staleness 0 hands a learner of each version
// only that version's round.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "actors/actor.h"
#include "common/model/model.h"
#include "common/transport/weight_stream.h"
#include "replay/client.h"
#include "replay/inspect.h"
#include "replay/replay.h"
#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using std::chrono::milliseconds;
using strider::testing::ChildProcess;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;
using strider::testing::WaitEvent;

// The newest metrics line of the actor's file, or null.
nlohmann::json LastMetrics(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  nlohmann::json j = nlohmann::json::parse(last, nullptr, false);
  return j.is_object() && j.contains("round") ? j : nlohmann::json();
}

// Polls the metrics file until `done` holds for its newest line; that line, or null at `timeout`.
nlohmann::json WaitMetrics(const std::string& path, std::chrono::seconds timeout,
                           const std::function<bool(const nlohmann::json&)>& done) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    nlohmann::json m = LastMetrics(path);
    if (!m.is_null() && done(m)) return m;
    std::this_thread::sleep_for(milliseconds(100));
  }
  return nlohmann::json();
}

struct Stored {
  int64_t episode = -1;
  uint64_t min_version = 0, max_version = 0;
  uint32_t segments = 0;
};

// Every complete trajectory in the store, by episode index (metadata of its last segment).
std::map<int64_t, Stored> ReadStore(const std::string& db) {
  std::map<int64_t, Stored> out;
  auto inspector = replay::Inspector::Open(db);
  EXPECT_TRUE(inspector.ok()) << inspector.status().ToString();
  if (!inspector.ok()) return out;
  auto summaries = (*inspector)->List({});
  EXPECT_TRUE(summaries.ok());
  if (!summaries.ok()) return out;
  for (const schema::TrajectorySummary& summary : *summaries) {
    if (!summary.complete) continue;
    auto segments = (*inspector)->Trajectory(summary.trajectory_id);
    EXPECT_TRUE(segments.ok());
    if (!segments.ok() || segments->empty()) continue;
    Stored t;
    t.min_version = summary.min_policy_version;
    t.max_version = summary.max_policy_version;
    t.segments = summary.segments_stored;
    for (const auto& [key, value] : segments->back().segment.metadata) {
      if (key == "episode") t.episode = std::stoll(value);
    }
    out[t.episode] = t;
  }
  return out;
}

// The versions of every token a learner of `version` is handed from the group table.
std::set<uint64_t> VersionsSampled(replay::LearnerClient& learner, uint64_t step, uint64_t version,
                                   size_t* trajectories) {
  std::set<uint64_t> versions;
  Result<replay::SampleBatch> batch = learner.Sample(step, 8, version, milliseconds(5000));
  EXPECT_TRUE(batch.ok()) << batch.status().ToString();
  if (!batch.ok()) return versions;
  std::set<std::string> ids;
  for (const replay::SampledItem& item : batch->items) {
    ids.insert(item.segment.trajectory_id.Hex());
    for (const schema::PolicyRun& run : item.segment.policy_runs) versions.insert(run.version);
  }
  *trajectories = ids.size();
  return versions;
}

// The keys as docs/actors.md spells them, and the checks that keep a synchronous actor from
// waiting for weights that can never come.
// A replay server with `tables` (empty: the default one) and a weight publisher, in this
// process; null members when either failed to start.
struct Services {
  std::unique_ptr<replay::ReplayServer> replay;
  std::unique_ptr<transport::WeightPublisher> weights;
};

Services StartServices(const TempDir& dir, std::vector<replay::TableConfig> tables) {
  Services services;
  replay::ServerOptions options;
  options.db_path = dir.Sub("db");
  options.stats_interval_s = 0;
  options.tables = std::move(tables);
  auto server = replay::ReplayServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  if (server.ok()) services.replay = std::move(*server);
  auto publisher = transport::WeightPublisher::Start({});
  EXPECT_TRUE(publisher.ok()) << publisher.status().ToString();
  if (publisher.ok()) services.weights = std::move(*publisher);
  return services;
}

TEST(ActorSync, ConfigKeysAreReadAndNeedAWeightEndpoint) {
  TempDir dir;
  const std::string path = dir.Sub("sync.yaml");
  {
    std::ofstream out(path);
    out << "actor:\n  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
        << "  episodes_in_flight: 8\n  group_size: 2\n"
        << "  replay: {endpoint: tcp://127.0.0.1:1, spill_dir: " << dir.Sub("spill") << "}\n"
        << "  weight_stream: {sync: true, round_groups: 3}\n"
        << "env:\n  name: calculator\n";
  }
  Result<actors::ActorOptions> options = actors::LoadActorConfig(path);
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_TRUE(options->weights_sync);
  EXPECT_EQ(options->round_groups, 3);
  Status no_endpoint = actors::ValidateActorOptions(*options);
  EXPECT_TRUE(no_endpoint.IsInvalidArgument());
  EXPECT_NE(no_endpoint.message().find("weight_stream.sync"), std::string::npos);
  options->weights_endpoint = "tcp://127.0.0.1:2";
  EXPECT_TRUE(actors::ValidateActorOptions(*options).ok());
  options->weights_sync = false;  // rounds without sync mean nothing
  EXPECT_TRUE(actors::ValidateActorOptions(*options).IsInvalidArgument());
  options->round_groups = 0;
  EXPECT_TRUE(actors::ValidateActorOptions(*options).ok());
  options->weights_sync = true;
  options->round_groups = -1;
  EXPECT_TRUE(actors::ValidateActorOptions(*options).IsInvalidArgument());
}

TEST(ActorSync, RoundsWaitForNewWeightsAndNeverMixVersions) {
  TempDir dir;
  replay::TableConfig table;  // what a synchronous learner samples
  table.name = "rl";
  table.unit = replay::SampleUnit::kGroup;
  table.max_staleness = 0;
  table.sampler.kind = replay::SamplerKind::kUniform;
  Services services = StartServices(dir, {table});
  ASSERT_TRUE(services.replay && services.weights);
  replay::ReplayServer& server = *services.replay;

  // Rounds of 2 groups of 2; 8 episodes are two rounds, then the actor stops by itself.
  const std::string config = dir.Sub("actor.yaml");
  {
    std::ofstream out(config);
    out << "actor:\n"
        << "  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
        << "  model_seed: 0\n  threads: 2\n  episodes: 8\n  episodes_in_flight: 4\n"
        << "  group_size: 2\n  max_turns: 2\n  max_episode_tokens: 1024\n  seed: 5\n"
        << "  segment_tokens: 64\n  sampling: {temperature: 1.0, max_new_tokens: 24}\n"
        << "  engine: {cache_budget_mb: 64}\n"
        << "  replay: {endpoint: " << server.actor_endpoint() << ", table: rl}\n"
        << "  weight_stream: {endpoint: " << services.weights->endpoint()
        << ", poll_ms: 50, sync: true, round_groups: 2}\n"
        << "  metrics: {interval_s: 0.2, progress: false}\n"
        << "env:\n  name: calculator\n  options: {difficulty: 1}\n";
  }
  const std::string metrics = dir.Sub("m.jsonl");
  ChildProcess actor;
  ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", config, "--spill-dir",
                           dir.Sub("spill"), "--metrics", metrics}));
  ASSERT_TRUE(WaitEvent(actor, "ready", 30000).is_object());

  // Round 1 ends and is stored; the actor then waits.
  nlohmann::json waiting =
      WaitMetrics(metrics, std::chrono::seconds(40), [](const nlohmann::json& m) {
        return m["waiting_for_weights"].get<bool>() && m["acked_segments"] == m["segments"];
      });
  ASSERT_FALSE(waiting.is_null()) << "round 1 did not end: " << LastMetrics(metrics).dump();
  EXPECT_EQ(waiting["round"], 1);
  EXPECT_EQ(waiting["episodes"], 4);
  EXPECT_EQ(waiting["policy_version"], 0);
  std::map<int64_t, Stored> round1 = ReadStore(dir.Sub("db"));
  ASSERT_EQ(round1.size(), 4u);
  int64_t round1_segments = 0;
  for (const auto& [episode, t] : round1) {
    EXPECT_LT(episode, 4);
    EXPECT_EQ(t.min_version, 0u);
    EXPECT_EQ(t.max_version, 0u);
    round1_segments += t.segments;
  }
  EXPECT_EQ(waiting["segments"].get<int64_t>(), round1_segments);

  // Nothing published: nothing more is started or stored, however long it waits.
  std::this_thread::sleep_for(milliseconds(2500));
  nlohmann::json still = LastMetrics(metrics);
  EXPECT_EQ(still["episodes_started"], 4);
  EXPECT_EQ(still["segments"], waiting["segments"]);
  EXPECT_TRUE(still["waiting_for_weights"].get<bool>());
  EXPECT_GE(still["weights_wait_s"].get<double>(), 2.0);
  EXPECT_EQ(ReadStore(dir.Sub("db")).size(), 4u);

  // A learner of version 0 gets round 1, all of version 0.
  replay::LearnerClientOptions learner_options;
  learner_options.endpoint = server.learner_endpoint();
  learner_options.learner_id = "learner";
  learner_options.table = "rl";
  auto learner = replay::LearnerClient::Connect(learner_options);
  ASSERT_TRUE(learner.ok()) << learner.status().ToString();
  size_t sampled = 0;
  EXPECT_EQ(VersionsSampled(**learner, 1, 0, &sampled), (std::set<uint64_t>{0}));
  EXPECT_EQ(sampled, 4u);

  // Version 1 published: round 2 plays it, start to end.
  auto model_config = LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
  ASSERT_TRUE(model_config.ok());
  auto model = Model::Create(*model_config, 7);
  ASSERT_TRUE(model.ok());
  Result<std::string> bytes = (*model)->SaveToBytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  ASSERT_TRUE(services.weights->Publish(1, *bytes, "tiny").ok());
  nlohmann::json finished = WaitEvent(actor, "finished", 40000);
  ASSERT_EQ(actor.Wait(), 0);
  ASSERT_TRUE(finished.is_object());
  const nlohmann::json& m = finished["metrics"];
  EXPECT_EQ(m["episodes"], 8);
  EXPECT_EQ(m["round"], 2);
  EXPECT_EQ(m["policy_version"], 1);
  EXPECT_EQ(m["weight_updates"], 1);
  EXPECT_FALSE(m["waiting_for_weights"].get<bool>());
  EXPECT_GE(m["weights_wait_s"].get<double>(), still["weights_wait_s"].get<double>());
  EXPECT_EQ(m["acked_segments"], m["segments"]);

  std::map<int64_t, Stored> all = ReadStore(dir.Sub("db"));
  ASSERT_EQ(all.size(), 8u);
  for (const auto& [episode, t] : all) {
    SCOPED_TRACE("episode " + std::to_string(episode));
    const uint64_t round_version = episode < 4 ? 0 : 1;
    EXPECT_EQ(t.min_version, round_version) << "every token of a round, prompt included";
    EXPECT_EQ(t.max_version, round_version);
  }
  // A learner of version 1 gets round 2 only; round 1 is too stale for it now.
  EXPECT_EQ(VersionsSampled(**learner, 2, 1, &sampled), (std::set<uint64_t>{1}));
  EXPECT_EQ(sampled, 4u);
  server.Stop();
}

// Waiting for weights that do not come, the actor still stops when asked, at once and cleanly.
TEST(ActorSync, AStopEndsTheWaitPromptly) {
  TempDir dir;
  Services services = StartServices(dir, {});
  ASSERT_TRUE(services.replay && services.weights);
  const std::string config = dir.Sub("actor.yaml");
  {
    std::ofstream out(config);
    out << "actor:\n  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
        << "  threads: 2\n  episodes: 0\n  episodes_in_flight: 1\n  max_turns: 1\n"
        << "  sampling: {max_new_tokens: 8}\n  engine: {cache_budget_mb: 64}\n"
        << "  replay: {endpoint: " << services.replay->actor_endpoint() << "}\n"
        << "  weight_stream: {endpoint: " << services.weights->endpoint() << ", sync: true}\n"
        << "  metrics: {interval_s: 0.2, progress: false}\n"
        << "env:\n  name: calculator\n";
  }
  const std::string metrics = dir.Sub("m.jsonl");
  ChildProcess actor;
  ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", config, "--spill-dir",
                           dir.Sub("spill"), "--metrics", metrics}));
  ASSERT_TRUE(WaitEvent(actor, "ready", 30000).is_object());
  ASSERT_FALSE(WaitMetrics(metrics, std::chrono::seconds(40), [](const nlohmann::json& m) {
                 return m["waiting_for_weights"].get<bool>() &&
                        m["acked_segments"] == m["segments"];
               }).is_null());
  const auto stopped = std::chrono::steady_clock::now();
  actor.Signal(SIGTERM);
  nlohmann::json finished = WaitEvent(actor, "finished", 20000);
  EXPECT_EQ(actor.Wait(), 0);
  ASSERT_TRUE(finished.is_object());
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, std::chrono::seconds(5));
  EXPECT_EQ(finished["metrics"]["episodes"], 1);
  EXPECT_EQ(finished["metrics"]["round"], 1);
  EXPECT_EQ(finished["metrics"]["acked_segments"], finished["metrics"]["segments"]);
}

}  // namespace
}  // namespace strider
