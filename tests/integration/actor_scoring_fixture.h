// The fixture of the tests that score what `strider actor` stored with the learner's scoring
// pass: `strider model init` weights loaded as a Model, a `strider replay serve` with one
// trajectory table, and a learner client on it. learner_logprob_test, batched_actor_logprob_test
// and gpu_fleet_test derive from it; each SetUp calls the steps it needs in order.
#pragma once

#include <gtest/gtest.h>

#include <csignal>
#include <cstdint>
#include <memory>
#include <string>

#include "common/model/model.h"
#include "replay/client.h"
#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider::testing {

class ActorScoringTest : public ::testing::Test {
 protected:
  // The trajectory table a per-trajectory RL learner samples (configs/replay/rl.yaml's
  // `trajectories`, in FIFO order so each trajectory comes back exactly once).
  static constexpr char kReplayConfig[] =
      "tables:\n"
      "  - name: trajectories\n"
      "    unit: trajectory\n"
      "    sampler: fifo\n"
      "    rate_limiter: {min_fill: 1}\n";

  // `strider model init` weights of configs/model/<model>.yaml from `seed` into weights_.
  void InitWeights(const std::string& model, int seed) {
    model_config_path_ = SourceDir() + "/configs/model/" + model + ".yaml";
    weights_ = dir_.Sub("weights.safetensors");
    const auto init = RunCommand({StriderBinary(), "model", "init", "--config",
                                  model_config_path_, "--out", weights_, "--seed",
                                  std::to_string(seed)});
    ASSERT_EQ(init.exit_code, 0) << init.output;
  }

  // weights_ as model_, LibTorch on `threads` threads; `device` overrides the config's.
  void LoadModel(int threads, const std::string& device = "") {
    Result<ModelConfig> config = LoadModelConfig(model_config_path_);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    if (!device.empty()) config->device = device;
    ConfigureRuntime(threads);
    Result<std::unique_ptr<Model>> model = Model::Load(*config, weights_);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = std::move(*model);
  }

  // The replay server of kReplayConfig in server_, and learner_ on it named `learner_id`.
  void StartReplay(const std::string& learner_id) {
    server_started_ = true;
    const ReplayEndpoints replay =
        StartReplayServer(server_, dir_.Sub("db"), dir_.Sub("replay.yaml"), kReplayConfig);
    ASSERT_FALSE(replay.actor.empty());
    actor_endpoint_ = replay.actor;
    replay::LearnerClientOptions options;
    options.endpoint = replay.learner;
    options.learner_id = learner_id;
    auto client = replay::LearnerClient::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    learner_ = std::move(*client);
  }

  void TearDown() override {
    if (!server_started_) return;  // a test that skipped before starting one
    learner_.reset();
    server_.Signal(SIGTERM);
    EXPECT_EQ(server_.Wait(), 0);
  }

  TempDir dir_;
  std::string model_config_path_;
  std::string weights_;
  std::unique_ptr<Model> model_;
  ChildProcess server_;
  bool server_started_ = false;
  std::string actor_endpoint_;
  std::unique_ptr<replay::LearnerClient> learner_;
  uint64_t step_ = 0;
};

}  // namespace strider::testing
