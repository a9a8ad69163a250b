// The RL learner as a real process (`strider learner` with mode: rl) against a real replay server
// process holding trajectories a real actor process played: it trains, publishes versions a
// subscriber can load, writes the metrics it documents, resumes from a checkpoint to exactly the
// weights of an uninterrupted run while publishing above every version it published before, and
// never trains on trajectories whose log-probs its weights do not reproduce.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/model/model.h"
#include "common/transport/weight_stream.h"
#include "tests/integration/child_process.h"
#include "tests/integration/rl_fixture.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using std::chrono::milliseconds;
using strider::testing::ChildProcess;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;
using strider::testing::PlayEpisodes;
using strider::testing::ReadFile;
using strider::testing::ReadMetrics;
using strider::testing::WaitEvent;
using strider::testing::WriteLearnerConfig;

// A group table that keeps everything sampleable (no staleness bound): these tests replay a
// fixed set of version-0 trajectories.
constexpr char kReplayConfig[] =
    "server: {stats_interval_s: 0}\n"
    "tables:\n  - name: groups\n    unit: group\n    sampler: fifo\n"
    "    capacity: 1000\n    rate_limiter: {min_fill: 1, max_times_sampled: 1}\n";

struct LearnerRun {
  int exit_code = -1;
  nlohmann::json finished;
  std::vector<uint64_t> fetched_versions;  // what a subscriber got while it ran
};

LearnerRun RunLearner(const std::vector<std::string>& args, bool subscribe) {
  LearnerRun run;
  ChildProcess learner;
  std::vector<std::string> argv = {StriderBinary(), "learner"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--publish", "tcp://127.0.0.1:0"});
  EXPECT_TRUE(learner.Start(argv));
  nlohmann::json ready = WaitEvent(learner, "ready", 60000);
  EXPECT_TRUE(ready.is_object()) << "no ready line from the learner";
  if (!ready.is_object()) return run;
  std::atomic<bool> done{false};
  std::thread subscriber;
  if (subscribe) {
    subscriber = std::thread([&] {
      auto model_config = LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
      transport::WeightSubscriberOptions options;
      options.endpoint = ready["weights"];
      options.reply_timeout = milliseconds(500);
      auto client = transport::WeightSubscriber::Connect(options);
      if (!client.ok() || !model_config.ok()) return;
      uint64_t have = 0;
      while (!done.load()) {
        auto update = (*client)->FetchNewer(have);
        if (update.ok() && update->has_value()) {
          have = (*update)->version;
          // What an actor does with it: the bytes load as the model.
          if (Model::LoadFromBytes(*model_config, (*update)->bytes).ok()) {
            run.fetched_versions.push_back(have);
          }
        }
        std::this_thread::sleep_for(milliseconds(20));
      }
    });
  }
  run.finished = WaitEvent(learner, "finished", 240000);
  run.exit_code = learner.Wait();
  done.store(true);
  if (subscriber.joinable()) subscriber.join();
  return run;
}

class LearnerProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    endpoints_ =
        strider::testing::StartReplayServer(server_, dir_.Sub("db"), dir_.Sub("replay.yaml"),
                                            kReplayConfig);
    ASSERT_FALSE(endpoints_.actor.empty());
    ASSERT_NO_FATAL_FAILURE(PlayEpisodes(dir_, endpoints_.actor, 48));
  }
  void TearDown() override {
    server_.Signal(SIGTERM);
    EXPECT_EQ(server_.Wait(), 0);
  }

  TempDir dir_;
  ChildProcess server_;
  strider::testing::ReplayEndpoints endpoints_;
};

TEST_F(LearnerProcess, TrainsPublishesAndResumesToTheSameWeights) {
  const std::string config = WriteLearnerConfig(dir_, "learner.yaml");
  const std::string run_dir = dir_.Sub("run");
  LearnerRun first = RunLearner(
      {"--config", config, "--run-dir", run_dir, "--replay", endpoints_.learner}, true);
  ASSERT_EQ(first.exit_code, 0);
  ASSERT_TRUE(first.finished.is_object());
  EXPECT_EQ(first.finished["total_steps"], 4);
  EXPECT_EQ(first.finished["policy_version"], 4);
  EXPECT_FALSE(first.fetched_versions.empty()) << "no published version reached a subscriber";
  for (size_t i = 1; i < first.fetched_versions.size(); ++i) {
    EXPECT_GT(first.fetched_versions[i], first.fetched_versions[i - 1]);
  }

  std::vector<nlohmann::json> metrics = ReadMetrics(run_dir + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 4u);
  for (size_t i = 0; i < metrics.size(); ++i) {
    const nlohmann::json& m = metrics[i];
    for (const char* key :
         {"time", "role", "step", "policy_version", "reward_mean", "success_rate",
          "logprob_mismatch_max", "kl", "clip_fraction", "entropy", "value_loss",
          "staleness_mean", "max_violation", "tokens_per_second", "publish_seconds"}) {
      EXPECT_TRUE(m.contains(key)) << "metrics line " << i << " lacks " << key;
    }
    EXPECT_EQ(m["role"], "learner");
    EXPECT_EQ(m["step"], i + 1);
    EXPECT_EQ(m["policy_version"], i + 1);
    EXPECT_EQ(m["trained_trajectories"], 8) << "two groups of four, none excluded";
    EXPECT_EQ(m["updates"], 4) << "two epochs of two mini-batches";
    EXPECT_GT(m["entropy"].get<double>(), 0);
  }
  // Step 1 scores version-0 trajectories with the version-0 weights: the check is measured
  // and passes; later steps' trajectories are older than the weights and are not compared.
  ASSERT_TRUE(metrics[0]["logprob_mismatch_max"].is_number());
  EXPECT_LE(metrics[0]["logprob_mismatch_max"].get<double>(), 1e-5);
  EXPECT_EQ(metrics[0]["staleness_mean"], 0);
  EXPECT_EQ(metrics[3]["staleness_mean"], 3);
  EXPECT_EQ(ReadFile(run_dir + "/published_version"), "4\n");

  const std::string uninterrupted = ReadFile(run_dir + "/checkpoints/final/model.safetensors");
  ASSERT_FALSE(uninterrupted.empty());

  // Resume from the step-2 checkpoint: the server answers steps 3 and 4 with what it answered
  // before, and the generator and optimiser continue from where they were saved.
  LearnerRun resumed =
      RunLearner({"--config", config, "--run-dir", run_dir, "--replay", endpoints_.learner,
                  "--resume", run_dir + "/checkpoints/latest"},
                 false);
  ASSERT_EQ(resumed.exit_code, 0);
  EXPECT_EQ(resumed.finished["steps"], 2);
  EXPECT_EQ(resumed.finished["total_steps"], 4);
  EXPECT_EQ(ReadFile(run_dir + "/checkpoints/final/model.safetensors"), uninterrupted)
      << "a resumed run ended on other weights than the uninterrupted one";
  // Versions above everything published before: its own weights at once (5), then one per step.
  metrics = ReadMetrics(run_dir + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 6u);
  EXPECT_EQ(metrics[4]["step"], 3);
  EXPECT_EQ(metrics[4]["policy_version"], 6);
  EXPECT_EQ(metrics[5]["policy_version"], 7);
  EXPECT_EQ(resumed.finished["policy_version"], 7);
  EXPECT_EQ(ReadFile(run_dir + "/published_version"), "7\n");
}

TEST_F(LearnerProcess, TrajectoriesItsWeightsDoNotReproduceAreExcludedNotTrained) {
  // Weights from another seed than the actor's: every version-0 trajectory fails the check.
  const std::string config = WriteLearnerConfig(dir_, "other.yaml", "", /*init_seed=*/5);
  const std::string run_dir = dir_.Sub("run-other");
  LearnerRun run = RunLearner({"--config", config, "--run-dir", run_dir, "--replay",
                               endpoints_.learner, "--max-steps", "2"},
                              false);
  ASSERT_EQ(run.exit_code, 0);
  EXPECT_EQ(run.finished["excluded_trajectories"], 16);
  for (const nlohmann::json& m : ReadMetrics(run_dir + "/metrics.jsonl")) {
    EXPECT_EQ(m["trained_trajectories"], 0);
    EXPECT_EQ(m["mismatch_excluded"], 8);
    EXPECT_GT(m["logprob_mismatch_max"].get<double>(), 1e-3);
    EXPECT_EQ(m["updates"], 0);
    EXPECT_EQ(m["policy_version"], 0) << "nothing trained, nothing new to publish";
  }
}

TEST(LearnerCli, ABrokenRlConfigIsRefusedNamingTheKey) {
  TempDir dir;
  const std::string config =
      WriteLearnerConfig(dir, "bad.yaml", "scoring: {mismatch_treshold: 0.001}\n");
  strider::testing::RunResult run = strider::testing::RunCommand(
      {"/bin/sh", "-c", StriderBinary() + " learner --config " + config + " 2>&1"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("scoring.mismatch_treshold"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("mismatch_threshold"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("bad.yaml"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace strider
