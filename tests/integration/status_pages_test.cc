// `--http` on the three services of a fleet: a real replay server, RL learner and actor as
// `strider` processes on loopback, their /metrics read by Debian's Prometheus parser and their
// /status as JSON, while the fleet trains.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/integration/child_process.h"
#include "tests/integration/tiny_fleet.h"
#include "tests/transport/http_get.h"

namespace strider::testing {
namespace {

using std::chrono::milliseconds;

// Scrapes role's /metrics until `sample` (a parsed key) reaches `at_least`, or 120 s pass.
nlohmann::json ScrapeUntil(int port, const std::string& sample, double at_least,
                           const std::string& scratch) {
  nlohmann::json parsed;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    const HttpReply reply = HttpGet(port, "/metrics");
    EXPECT_EQ(reply.status, 200);
    EXPECT_NE(reply.headers.find("text/plain; version=0.0.4"), std::string::npos);
    parsed = ParsePrometheus(reply.body, scratch);
    EXPECT_FALSE(parsed.contains("error")) << parsed.dump() << "\n" << reply.body;
    if (parsed.contains("error")) return parsed;
    if (parsed.value(sample, -1.0) >= at_least) return parsed;
    std::this_thread::sleep_for(milliseconds(300));
  }
  ADD_FAILURE() << sample << " never reached " << at_least << ": " << parsed.dump();
  return parsed;
}

nlohmann::json Status(int port) {
  const HttpReply reply = HttpGet(port, "/status");
  EXPECT_EQ(reply.status, 200);
  nlohmann::json parsed = nlohmann::json::parse(reply.body, nullptr, false);
  return parsed.is_object() ? parsed : nlohmann::json::object();
}

TEST(StatusPages, ReplayLearnerAndActorServeParsableMetricsWhileTheFleetTrains) {
  TempDir dir;
  TinyFleetOptions fleet;
  fleet.env_yaml = "env:\n  name: calculator\n  options: {difficulty: 1}\n";
  WriteTinyFleetConfigs(dir, fleet);

  ChildProcess replay;
  ASSERT_TRUE(replay.Start({StriderBinary(), "replay", "serve", "--db", dir.Sub("db"), "--config",
                            dir.Sub("replay.yaml"), "--bind", "tcp://127.0.0.1:0",
                            "--sample-bind", "tcp://127.0.0.1:0", "--http", "127.0.0.1:0"},
                           dir.Sub("replay.log")));
  const nlohmann::json replay_ready = WaitEvent(replay, "ready", 30000);
  ASSERT_TRUE(replay_ready.contains("http")) << replay_ready.dump();
  const int replay_port = PortOf(replay_ready["http"].get<std::string>());

  ChildProcess learner;
  ASSERT_TRUE(learner.Start({StriderBinary(), "learner", "--config", dir.Sub("learner.yaml"),
                             "--run-dir", dir.Sub("run"), "--replay",
                             replay_ready["learner_endpoint"].get<std::string>(), "--publish",
                             "tcp://127.0.0.1:0", "--http", "127.0.0.1:0"},
                            dir.Sub("learner.log")));
  const nlohmann::json learner_ready = WaitEvent(learner, "ready", 120000);
  ASSERT_TRUE(learner_ready.contains("http")) << learner_ready.dump();
  const int learner_port = PortOf(learner_ready["http"].get<std::string>());

  ChildProcess actor;
  ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", dir.Sub("actor.yaml"), "--replay",
                           replay_ready["actor_endpoint"].get<std::string>(),
                           "--weights-endpoint", learner_ready["weights"].get<std::string>(),
                           "--spill-dir", dir.Sub("spill"), "--id", "actor-0", "--no-progress",
                           "--http", "127.0.0.1:0"},
                          dir.Sub("actor.log")));
  const nlohmann::json actor_ready = WaitEvent(actor, "ready", 60000);
  ASSERT_TRUE(actor_ready.contains("http")) << actor_ready.dump();
  const int actor_port = PortOf(actor_ready["http"].get<std::string>());

  // The learner's steps, the server's ingest and table fill, the actor's episodes, as
  // Prometheus reads them. The learner runs until it is stopped, so its pages stay up.
  const std::string run_dir = dir.Sub("run");
  const std::string learner_labels = "{\"id\": \"" + run_dir + "\", \"role\": \"learner\"}";
  const nlohmann::json learner_metrics =
      ScrapeUntil(learner_port, "strider_learner_step" + learner_labels, 1,
                  dir.Sub("learner_scrape"));
  EXPECT_TRUE(learner_metrics.contains("strider_learner_reward_mean" + learner_labels))
      << learner_metrics.dump();
  const nlohmann::json learner_status = Status(learner_port);
  EXPECT_EQ(learner_status.value("role", ""), "learner");
  EXPECT_GE(learner_status.value("metrics", nlohmann::json::object()).value("step", -1), 1)
      << learner_status.dump();

  const std::string replay_labels = "{\"id\": \"" +
                                    replay_ready["actor_endpoint"].get<std::string>() +
                                    "\", \"role\": \"replay\"}";
  const nlohmann::json replay_metrics = ScrapeUntil(
      replay_port, "strider_replay_ingest_segments" + replay_labels, 1, dir.Sub("replay_scrape"));
  const std::string table_labels = "{\"id\": \"" +
                                   replay_ready["actor_endpoint"].get<std::string>() +
                                   "\", \"name\": \"groups\", \"role\": \"replay\"}";
  EXPECT_TRUE(replay_metrics.contains("strider_replay_tables_inserts" + table_labels))
      << replay_metrics.dump();

  const std::string actor_labels = R"({"id": "actor-0", "role": "actor"})";
  const nlohmann::json actor_metrics =
      ScrapeUntil(actor_port, "strider_actor_episodes" + actor_labels, 4, dir.Sub("actor_scrape"));
  EXPECT_EQ(actor_metrics.value("strider_up" + actor_labels, 0.0), 1.0);
  EXPECT_GT(actor_metrics.value("strider_actor_prefill_tokens" + actor_labels, 0.0), 0.0);

  const nlohmann::json actor_status = Status(actor_port);
  EXPECT_EQ(actor_status.value("role", ""), "actor");
  EXPECT_GE(actor_status.value("metrics", nlohmann::json::object()).value("episodes", -1), 4)
      << actor_status.dump();
  EXPECT_EQ(Status(replay_port).value("role", ""), "replay");
  EXPECT_EQ(HttpGet(replay_port, "/nothing").status, 404);

  // A port already taken is refused (exit 1) before the actor loads its model.
  RunResult taken = RunCommand({StriderBinary(), "actor", "--config", dir.Sub("actor.yaml"),
                                "--replay", replay_ready["actor_endpoint"].get<std::string>(),
                                "--spill-dir", dir.Sub("spill2"), "--episodes", "4",
                                "--http", actor_ready["http"].get<std::string>()});
  EXPECT_EQ(taken.exit_code, 1);

  learner.Signal(SIGTERM);  // ends after its current step, with a checkpoint
  EXPECT_EQ(learner.Wait(), 0);
  actor.Signal(SIGTERM);
  EXPECT_EQ(actor.Wait(), 0);
  replay.Signal(SIGTERM);
  EXPECT_EQ(replay.Wait(), 0);
}

}  // namespace
}  // namespace strider::testing
