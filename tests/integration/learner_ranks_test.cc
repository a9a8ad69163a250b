// Data-parallel RL learner ranks (learner/distributed.h) as real processes on loopback: 2 and 4
// Gloo ranks end on the parameters of one learner given the same global batch; a rank that dies
// makes the others stop with an error naming it, and `--resume` continues the group; ranks
// that shard the experts also end on one learner's parameters and publish whole weights.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/model/model.h"
#include "common/model/parameters.h"
#include "common/transport/weight_stream.h"
#include "tests/integration/child_process.h"
#include "tests/integration/rl_fixture.h"
#include "tests/free_port.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::ChildProcess;
using strider::testing::LearnerConfigText;
using strider::testing::ReadFile;
using strider::testing::ReadMetrics;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;
using strider::testing::WaitEvent;
using strider::testing::WriteLearnerConfig;

// Every learner id reads every group once (fifo per id, no sampling limit), so learner groups
// of different sizes with their own ids see the same batches.
constexpr char kSharedReplayConfig[] =
    "server: {stats_interval_s: 0}\n"
    "tables:\n  - name: groups\n    unit: group\n    sampler: fifo\n"
    "    capacity: 1000\n    rate_limiter: {min_fill: 1, max_times_sampled: 0}\n";

class LearnerRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    endpoints_ = strider::testing::StartReplayServer(server_, dir_.Sub("db"),
                                                     dir_.Sub("replay.yaml"), kSharedReplayConfig);
    ASSERT_FALSE(endpoints_.actor.empty());
    ASSERT_NO_FATAL_FAILURE(strider::testing::PlayEpisodes(dir_, endpoints_.actor, 48));
  }
  void TearDown() override {
    server_.Signal(SIGTERM);
    EXPECT_EQ(server_.Wait(), 0);
  }

  // A group of `world` ranks as child processes, all started before any is waited for.
  std::vector<std::unique_ptr<ChildProcess>> StartGroup(int world, const std::string& config,
                                                        const std::string& run_dir,
                                                        const std::vector<std::string>& extra,
                                                        const std::vector<std::string>& resume = {}) {
    const std::string rendezvous = "127.0.0.1:" + std::to_string(strider::testing::FreeLoopbackPort());
    std::vector<std::unique_ptr<ChildProcess>> ranks;
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> argv = {StriderBinary(), "learner", "--config", config,
                                       "--run-dir", run_dir, "--replay", endpoints_.learner,
                                       "--publish", "tcp://127.0.0.1:0"};
      if (world > 1) {
        argv.insert(argv.end(), {"--rank", std::to_string(r), "--world-size",
                                 std::to_string(world), "--rendezvous", rendezvous});
      }
      if (!resume.empty()) argv.insert(argv.end(), {"--resume", resume[r]});
      argv.insert(argv.end(), extra.begin(), extra.end());
      ranks.push_back(std::make_unique<ChildProcess>());
      EXPECT_TRUE(ranks.back()->Start(argv, dir_.Sub("rank" + std::to_string(r) + "-" +
                                                      std::to_string(world) + ".err")));
    }
    return ranks;
  }

  TempDir dir_;
  ChildProcess server_;
  strider::testing::ReplayEndpoints endpoints_;
};

std::string RankDir(const std::string& run_dir, int rank) {
  return rank == 0 ? run_dir : run_dir + "/rank-" + std::to_string(rank);
}

// Largest |a - b| over every tensor of two checkpoints' weights.
double MaxDifference(const std::string& a_path, const std::string& b_path) {
  auto config = LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
  EXPECT_TRUE(config.ok());
  auto a = Model::Load(*config, a_path);
  auto b = Model::Load(*config, b_path);
  EXPECT_TRUE(a.ok()) << a_path;
  EXPECT_TRUE(b.ok()) << b_path;
  if (!a.ok() || !b.ok()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < (*a)->tensors().size(); ++i) {
    const at::Tensor& x = (*a)->tensors()[i].second;
    const at::Tensor& y = (*b)->tensors()[i].second;
    worst = std::max(worst, (x.to(at::kDouble) - y.to(at::kDouble)).abs().max().item<double>());
  }
  return worst;
}

TEST_F(LearnerRanks, TwoAndFourRanksEndOnTheParametersOfOneLearnerWithTheSameBatch) {
  // Three steps of four groups (16 trajectories) each; one mini-batch per epoch, so each
  // update's gradient is over the whole batch whichever rank holds which group.
  std::map<int, std::string> run_dirs;
  for (int world : {1, 2, 4}) {
    LearnerConfigText text;
    text.replay = "{table: groups, learner_id: world" + std::to_string(world) +
                  ", units_per_step: 4, sample_timeout_s: 60}";
    text.train = "{steps: 3, ppo_epochs: 2, minibatches: 1, chunk_tokens: 64}";
    // Four ranks reduce the 1 MiB of gradients in about ten buckets, most of them sent while
    // backward still runs; two ranks in one.
    if (world == 4) text.extra = "distributed: {bucket_mb: 0.1}\n";
    const std::string config =
        WriteLearnerConfig(dir_, "ranks" + std::to_string(world) + ".yaml", text);
    run_dirs[world] = dir_.Sub("run" + std::to_string(world));
    auto ranks = StartGroup(world, config, run_dirs[world], {});
    for (int r = 0; r < world; ++r) {
      nlohmann::json finished = WaitEvent(*ranks[r], "finished", 240000);
      EXPECT_EQ(ranks[r]->Wait(), 0) << "rank " << r << " of " << world;
      ASSERT_TRUE(finished.is_object()) << "rank " << r << " of " << world;
      EXPECT_EQ(finished["total_steps"], 3);
    }
    // Every rank's metrics carry the group's batch: 16 trajectories a step.
    for (int r = 0; r < world; ++r) {
      std::vector<nlohmann::json> metrics = ReadMetrics(RankDir(run_dirs[world], r) + "/metrics.jsonl");
      ASSERT_EQ(metrics.size(), 3u) << "rank " << r << " of " << world;
      for (const nlohmann::json& m : metrics) {
        EXPECT_EQ(m["trajectories"], 16) << "rank " << r << " of " << world;
        EXPECT_EQ(m["updates"], 2);
        if (world > 1) EXPECT_EQ(m["world_size"], world);
        if (world == 2) EXPECT_EQ(m["allreduce_buckets"], 2);  // one per update
        if (world == 4) {
          EXPECT_GE(m["allreduce_buckets"].get<int>(), 2 * 8) << m.dump();
          EXPECT_GT(m["allreduce_buckets_during_backward"].get<int>(), 2 * 4) << m.dump();
        }
      }
    }
  }
  const std::string lone = run_dirs[1] + "/checkpoints/final/model.safetensors";
  for (int world : {2, 4}) {
    for (int r = 0; r < world; ++r) {
      const std::string weights =
          RankDir(run_dirs[world], r) + "/checkpoints/final/model.safetensors";
      // Summation order differs between one learner and a reduction over ranks: fp32 rounding.
      EXPECT_LT(MaxDifference(lone, weights), 2e-5) << "rank " << r << " of " << world;
    }
  }
  // Only rank 0 publishes, and it alone records the versions.
  EXPECT_EQ(ReadFile(run_dirs[2] + "/published_version"), "3\n");
  EXPECT_FALSE(std::filesystem::exists(run_dirs[2] + "/rank-1/published_version"));
}

TEST_F(LearnerRanks, ALostRankStopsTheOthersNamingItAndTheGroupResumes) {
  LearnerConfigText text;
  text.replay = "{table: groups, learner_id: lost, units_per_step: 2, sample_timeout_s: 60}";
  text.train = "{steps: 100, ppo_epochs: 1, minibatches: 1, chunk_tokens: 64}";
  text.checkpoint = "{every_steps: 1}";
  text.extra = "distributed: {timeout_s: 30}\n";
  const std::string config = WriteLearnerConfig(dir_, "lost.yaml", text);
  const std::string run_dir = dir_.Sub("run-lost");
  {
    auto ranks = StartGroup(2, config, run_dir, {});
    ASSERT_TRUE(WaitEvent(*ranks[0], "ready", 60000).is_object());
    // Two steps done, then rank 1 is killed without warning.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (ReadMetrics(run_dir + "/rank-1/metrics.jsonl").size() < 2 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ranks[1]->Signal(SIGKILL);
    ranks[1]->Wait();
    const auto killed = std::chrono::steady_clock::now();
    const int code = ranks[0]->Wait();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
    EXPECT_NE(code, 0);
    EXPECT_LT(seconds, 45) << "rank 0 must stop within the collective timeout";
    const std::string error = ReadFile(dir_.Sub("rank0-2.err"));
    EXPECT_NE(error.find("learner rank 1 of 2 stopped answering"), std::string::npos) << error;
  }
  const size_t done = ReadMetrics(run_dir + "/metrics.jsonl").size();
  ASSERT_GE(done, 2u);
  // Each rank from its own latest checkpoint; rank 0's position is the group's.
  auto ranks = StartGroup(2, config, run_dir, {"--max-steps", "2"},
                          {run_dir + "/checkpoints/latest", run_dir + "/rank-1/checkpoints/latest"});
  for (int r = 0; r < 2; ++r) {
    nlohmann::json finished = WaitEvent(*ranks[r], "finished", 240000);
    EXPECT_EQ(ranks[r]->Wait(), 0) << "rank " << r;
    ASSERT_TRUE(finished.is_object()) << "rank " << r;
    EXPECT_EQ(finished["steps"], 2);
    EXPECT_EQ(finished["total_steps"], static_cast<int64_t>(done) + 2);
  }
  EXPECT_EQ(ReadFile(run_dir + "/checkpoints/final/model.safetensors"),
            ReadFile(run_dir + "/rank-1/checkpoints/final/model.safetensors"))
      << "the ranks' weights parted";
}

// Expert-parallel ranks: each trains half of every sparse layer's routed experts, the rest
// replicated. Stopped after two steps and resumed from their shard checkpoints for the third,
// they end on the weights of one learner that trained the same three batches.
TEST_F(LearnerRanks, ExpertParallelRanksEndOnTheParametersOfOneLearner) {
  std::map<int, std::string> run_dirs;
  std::map<int, std::string> configs;
  for (int world : {1, 2}) {
    LearnerConfigText text;
    text.replay = "{table: groups, learner_id: experts" + std::to_string(world) +
                  ", units_per_step: 4, sample_timeout_s: 60}";
    text.train = "{steps: 3, ppo_epochs: 2, minibatches: 1, chunk_tokens: 64}";
    text.extra = "distributed: {expert_parallel: true}\n";
    configs[world] = WriteLearnerConfig(dir_, "experts" + std::to_string(world) + ".yaml", text);
    run_dirs[world] = dir_.Sub("experts-run" + std::to_string(world));
  }
  {
    auto lone = StartGroup(1, configs[1], run_dirs[1], {});
    EXPECT_EQ(lone[0]->Wait(), 0);
  }
  {
    auto ranks = StartGroup(2, configs[2], run_dirs[2], {"--max-steps", "2"});
    for (int r = 0; r < 2; ++r) EXPECT_EQ(ranks[r]->Wait(), 0) << "rank " << r;
  }
  auto ranks = StartGroup(2, configs[2], run_dirs[2], {},
                          {run_dirs[2] + "/checkpoints/final",
                           run_dirs[2] + "/rank-1/checkpoints/final"});
  // What an actor receives from rank 0: whole weights, every expert gathered from its rank.
  nlohmann::json ready = WaitEvent(*ranks[0], "ready", 60000);
  ASSERT_TRUE(ready.is_object());
  auto model_config = LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
  ASSERT_TRUE(model_config.ok());
  std::unique_ptr<Model> published;
  {
    transport::WeightSubscriberOptions options;
    options.endpoint = ready["weights"];
    options.reply_timeout = std::chrono::milliseconds(2000);
    auto client = transport::WeightSubscriber::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (published == nullptr && std::chrono::steady_clock::now() < deadline) {
      auto update = (*client)->FetchNewer(0);
      if (update.ok() && update->has_value()) {
        auto model = Model::LoadFromBytes(*model_config, (*update)->bytes);
        ASSERT_TRUE(model.ok()) << model.status().ToString();
        published = std::move(*model);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ASSERT_NE(published, nullptr) << "rank 0 published nothing after resuming";
  EXPECT_FALSE(published->sharded());
  for (int r = 0; r < 2; ++r) {
    nlohmann::json finished = WaitEvent(*ranks[r], "finished", 240000);
    EXPECT_EQ(ranks[r]->Wait(), 0) << "rank " << r;
    ASSERT_TRUE(finished.is_object())
        << "rank " << r << ": " << ReadFile(dir_.Sub("rank" + std::to_string(r) + "-2.err"));
    EXPECT_EQ(finished["total_steps"], 3);
    std::vector<nlohmann::json> metrics =
        ReadMetrics(RankDir(run_dirs[2], r) + "/metrics.jsonl");
    ASSERT_EQ(metrics.size(), 3u) << "rank " << r;
    for (const nlohmann::json& m : metrics) {
      EXPECT_EQ(m["trajectories"], 16) << "rank " << r;
      EXPECT_EQ(m["expert_parallel"], 2);
      EXPECT_GT(m["expert_rounds"].get<int>(), 0) << m.dump();
    }
  }
  auto config = LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
  ASSERT_TRUE(config.ok());
  auto whole = Model::Load(*config, run_dirs[1] + "/checkpoints/final/model.safetensors");
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  // Training moved every rank's experts well beyond the tolerance below.
  auto initial = Model::Create(*config, 0);
  ASSERT_TRUE(initial.ok());
  // Largest change of rank r's experts (4 of the 8 in each sparse layer) from the initial ones.
  auto experts_moved = [&](const Model& trained, int r) {
    double moved = 0;
    for (size_t i = 0; i < trained.tensors().size(); ++i) {
      const auto& [name, tensor] = trained.tensors()[i];
      if (!IsRoutedExpertTensor(name)) continue;
      EXPECT_EQ(tensor.size(0), 8) << name;
      moved = std::max(moved, (tensor.narrow(0, 4 * r, 4) -
                               (*initial)->tensors()[i].second.narrow(0, 4 * r, 4))
                                  .abs().max().item<double>());
    }
    return moved;
  };
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(experts_moved(**whole, r), 1e-3) << "experts of rank " << r;
    // The published weights (two or three steps in) hold each rank's trained experts.
    EXPECT_GT(experts_moved(*published, r), 1e-3) << "published experts of rank " << r;
  }
  for (int r = 0; r < 2; ++r) {
    auto shard = Model::Load(*config, RankDir(run_dirs[2], r) + "/checkpoints/final/model.safetensors");
    ASSERT_TRUE(shard.ok()) << shard.status().ToString();
    ASSERT_TRUE((*shard)->sharded());
    const ExpertShard part = (*shard)->expert_shard();
    EXPECT_EQ(part.first, 4 * r);
    double worst = 0;
    for (size_t i = 0; i < (*whole)->tensors().size(); ++i) {
      const auto& [name, expected] = (*whole)->tensors()[i];
      const at::Tensor want =
          IsRoutedExpertTensor(name) ? expected.narrow(0, part.first, part.count) : expected;
      const at::Tensor got = (*shard)->tensors()[i].second;
      ASSERT_EQ(got.sizes(), want.sizes()) << name;
      worst = std::max(worst, (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>());
    }
    // Tokens meet their experts on another rank and gradients are summed in another order.
    EXPECT_LT(worst, 2e-5) << "rank " << r;
  }
}

TEST(LearnerRanksCli, BadRankFlagsAreRefused) {
  TempDir dir;
  const std::string config = WriteLearnerConfig(dir, "learner.yaml");
  for (const std::string& flags :
       {std::string("--rank 2 --world-size 2"), std::string("--rendezvous nohost"),
        std::string("--world-size 2 --rendezvous 127.0.0.1:70000")}) {
    strider::testing::RunResult run = strider::testing::RunCommand(
        {"/bin/sh", "-c", StriderBinary() + " learner --config " + config + " " + flags + " 2>&1"});
    EXPECT_NE(run.exit_code, 0) << flags;
    EXPECT_TRUE(run.output.find("--rank") != std::string::npos ||
                run.output.find("rendezvous") != std::string::npos)
        << flags << ": " << run.output;
  }
}

}  // namespace
}  // namespace strider
