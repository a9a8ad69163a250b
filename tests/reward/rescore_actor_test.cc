// The verifier on what a real `strider actor` stored in a real replay server: every trajectory
// of the calculator (groups sharing a prompt), retrieval (segments many times shorter than the
// episode) and vision_count (image observations) replays against a fresh environment from the
// store's own seed and options metadata, and the re-scored step rewards and outcomes equal what
// the actor stored. A trajectory given another seed does not replay.
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "replay/inspect.h"
#include "reward/verifiers.h"
#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider::reward {
namespace {

using std::chrono::milliseconds;
using strider::testing::ChildProcess;
using strider::testing::SourceDir;
using strider::testing::WaitEvent;
using strider::testing::StriderBinary;
using strider::testing::TempDir;

// Runs `episodes` episodes of `env_block` into the server at `endpoint`.
void RunActor(const TempDir& dir, const std::string& endpoint, const std::string& name,
              int episodes, int group, const std::string& env_block) {
  const std::string path = dir.Sub(name + ".yaml");
  {
    std::ofstream out(path);
    out << "actor:\n"
        << "  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
        << "  model_seed: 0\n  threads: 2\n"
        << "  episodes: " << episodes << "\n  episodes_in_flight: 4\n  group_size: " << group
        << "\n  max_turns: 3\n  max_episode_tokens: 4096\n  seed: 5\n  segment_tokens: 96\n"
        << "  sampling: {temperature: 1.0, max_new_tokens: 40}\n"
        << "  engine: {cache_budget_mb: 64}\n"
        << "  replay: {endpoint: tcp://127.0.0.1:1, spill_after_ms: 1000}\n"
        << "  metrics: {interval_s: 0.5, progress: false}\n"
        << env_block;
  }
  ChildProcess actor;
  ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", path, "--replay", endpoint,
                           "--spill-dir", dir.Sub("spill-" + name)}));
  const nlohmann::json finished = WaitEvent(actor, "finished", 120000);
  ASSERT_EQ(actor.Wait(), 0);
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(finished["metrics"]["episodes"], episodes);
}

// What the actor stored of one trajectory, read straight from its segments.
struct Stored {
  std::vector<float> step_rewards;
  float outcome = 0;
  std::string status;
  std::string env;
};

std::map<schema::TrajectoryId, Stored> ReadStored(const std::string& db) {
  std::map<schema::TrajectoryId, Stored> out;
  auto inspector = replay::Inspector::Open(db);
  EXPECT_TRUE(inspector.ok()) << inspector.status().ToString();
  if (!inspector.ok()) return out;
  auto summaries = (*inspector)->List({});
  EXPECT_TRUE(summaries.ok());
  for (const schema::TrajectorySummary& summary : *summaries) {
    auto segments = (*inspector)->Trajectory(summary.trajectory_id);
    EXPECT_TRUE(segments.ok());
    Stored& stored = out[summary.trajectory_id];
    stored.env = summary.env;
    for (const replay::StoredSegment& s : *segments) {
      for (const schema::Step& step : s.segment.steps)
        stored.step_rewards.push_back(step.process_reward);
      if (!s.segment.is_last) continue;
      stored.outcome = s.segment.outcome_reward;
      for (const auto& [key, value] : s.segment.metadata) {
        if (key == "status") stored.status = value;
      }
    }
  }
  return out;
}

TEST(RescoreActorTrajectories, ReplayedLabelsAndOutcomesEqualWhatTheActorStored) {
  TempDir dir;
  ChildProcess server;
  ASSERT_TRUE(server.Start({StriderBinary(), "replay", "serve", "--db", dir.Sub("db"), "--bind",
                            "tcp://127.0.0.1:0", "--sample-bind", "tcp://127.0.0.1:0"}));
  const nlohmann::json ready = WaitEvent(server, "ready", 30000);
  ASSERT_TRUE(ready.is_object()) << "no ready line from the replay server";
  const std::string endpoint = ready["actor_endpoint"].get<std::string>();
  RunActor(dir, endpoint, "calculator", 8, 2,
           "env:\n  name: calculator\n  options: {difficulty: 1}\n");
  RunActor(dir, endpoint, "retrieval", 2, 1,
           "env:\n  name: retrieval\n  options: {total_tokens: 1024, parts: 2}\n");
  RunActor(dir, endpoint, "vision", 2, 1, "env:\n  name: vision_count\n  options: {grid: 3}\n");

  const std::map<schema::TrajectoryId, Stored> stored = ReadStored(dir.Sub("db"));
  ASSERT_EQ(stored.size(), 12u);
  // No environment named: each trajectory's own name, seed and options from the store.
  Result<std::vector<StoreRescore>> rescored = RescoreStore(dir.Sub("db"), {});
  ASSERT_TRUE(rescored.ok()) << rescored.status().ToString();
  ASSERT_EQ(rescored->size(), 12u);
  std::map<std::string, int> by_env, labels;
  for (const StoreRescore& entry : *rescored) {
    ASSERT_TRUE(entry.status.ok()) << entry.id.Hex() << ": " << entry.status.ToString();
    const Rescored& r = entry.rescored;
    const Stored& s = stored.at(entry.id);
    ++by_env[r.env];
    EXPECT_EQ(r.env, s.env);
    EXPECT_FALSE(r.options.empty()) << "the actor stored its environment's options";
    EXPECT_EQ(r.stored_status, s.status);
    ASSERT_EQ(r.steps.size(), s.step_rewards.size()) << entry.id.Hex();
    for (size_t k = 0; k < r.steps.size(); ++k) {
      const StepVerdict& v = r.steps[k];
      EXPECT_TRUE(v.error.empty()) << v.error;
      // The actor stores a missing step reward as 0 (schema 1.1).
      EXPECT_EQ(static_cast<float>(v.reward.value_or(0.0)), s.step_rewards[k])
          << entry.id.Hex() << " step " << k;
      EXPECT_EQ(v.label == envs::StepLabel::kCorrect, v.reward.value_or(0.0) > 0);
      ++labels[std::string(envs::StepLabelName(v.label))];
    }
    if (s.status == "done") {
      ASSERT_TRUE(r.outcome.has_value());
      EXPECT_EQ(static_cast<float>(*r.outcome), s.outcome);
    } else {
      EXPECT_FALSE(r.outcome.has_value()) << "cut episodes have no outcome to re-score";
      EXPECT_EQ(s.outcome, 0.0f);
    }
  }
  EXPECT_EQ(by_env,
            (std::map<std::string, int>{{"calculator", 8}, {"retrieval", 2}, {"vision_count", 2}}));
  int steps = 0;
  for (const auto& [label, count] : labels) steps += count;
  EXPECT_GT(steps, 12) << "episodes of up to three turns";
  // A random model's malformed calls and tool errors are labelled incorrect, its plain text
  // unknown: the re-scored labels tell them apart.
  EXPECT_GT(labels["incorrect"], 0);
  EXPECT_GT(labels["unknown"], 0);
  std::cout << "re-scored step labels:";
  for (const auto& [label, count] : labels) std::cout << " " << label << " " << count;
  std::cout << "\n";

  // The same trajectory under another seed is another episode: the prompt differs.
  auto inspector = replay::Inspector::Open(dir.Sub("db"));
  ASSERT_TRUE(inspector.ok());
  auto segments = (*inspector)->Trajectory(rescored->front().id);
  ASSERT_TRUE(segments.ok());
  std::vector<schema::SegmentData> changed;
  for (replay::StoredSegment& s : *segments) changed.push_back(std::move(s.segment));
  for (auto& [key, value] : changed.back().metadata) {
    if (key == "seed") value = std::to_string(std::stoull(value) + 1);
  }
  EXPECT_EQ(Rescore(changed, {}).status().code(), StatusCode::kFailedPrecondition);
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0);
}

}  // namespace
}  // namespace strider::reward
