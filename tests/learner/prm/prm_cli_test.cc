// `strider reward train-prm` and `score-prm` through the built binary, on a store a real replay
// server wrote (labelled_episodes.h) and still serves: the one JSON line with the held-out
// accuracy and the baseline, the checkpoint, the scores, and usage errors as exit code 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/model/config.h"
#include "common/model/model.h"
#include "replay/replay.h"
#include "tests/integration/child_process.h"
#include "tests/learner/prm/labelled_episodes.h"
#include "tests/scratch_dir.h"

namespace strider::reward {
namespace {

using strider::testing::RunCommand;
using strider::testing::SourceDir;
using strider::testing::StoreEpisodes;
using strider::testing::StriderBinary;
using strider::testing::TempDir;

std::vector<nlohmann::json> JsonLines(const std::string& output) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

TEST(PrmCli, TrainsPrintsItsAccuracyAndScoresFromTheCheckpoint) {
  TempDir dir;
  replay::ServerOptions options;
  options.db_path = dir.Sub("store");
  options.stats_interval_s = 0;
  Result<std::unique_ptr<replay::ReplayServer>> server = replay::ReplayServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  LabelCounts played;
  ASSERT_GT(StoreEpisodes((*server)->actor_endpoint(), 2000, 60, &played), 0);
  const std::string config = SourceDir() + "/configs/model/tiny.yaml";
  Result<ModelConfig> model_config = LoadModelConfig(config);
  ASSERT_TRUE(model_config.ok());
  Result<std::unique_ptr<Model>> model = Model::Create(*model_config, 0);
  ASSERT_TRUE(model.ok());
  ASSERT_TRUE((*model)->Save(dir.Sub("policy.safetensors")).ok());

  const std::vector<std::string> train = {
      StriderBinary(), "reward",         "train-prm",
      "--store",       dir.Sub("store"), "--model",
      config,          "--weights",      dir.Sub("policy.safetensors"),
      "--out",         dir.Sub("prm"),   "--heldout-fraction",
      "0.3",           "--threads",      "2"};
  strider::testing::RunResult trained = RunCommand(train);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::vector<nlohmann::json> report = JsonLines(trained.output);
  ASSERT_EQ(report.size(), 1u) << trained.output;
  EXPECT_GT(report[0]["heldout_accuracy"].get<double>(),
            report[0]["majority_baseline"].get<double>());
  EXPECT_EQ(report[0]["trajectories"], 60);
  EXPECT_EQ(report[0]["train_labels"]["unknown"].get<int64_t>() +
                report[0]["heldout_labels"]["unknown"].get<int64_t>(),
            played.unknown);
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("prm/head.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("prm/process_model.json")));

  strider::testing::RunResult scored =
      RunCommand({StriderBinary(), "reward", "score-prm", "--checkpoint", dir.Sub("prm"), "--store",
                  dir.Sub("store"), "--max-trajectories", "4"});
  ASSERT_EQ(scored.exit_code, 0) << scored.output;
  const std::vector<nlohmann::json> lines = JsonLines(scored.output);
  ASSERT_EQ(lines.size(), 5u) << scored.output;
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(lines[i]["scores"].size(), lines[i]["labels"].size());
    for (const auto& score : lines[i]["scores"]) {
      EXPECT_TRUE(score.get<double>() >= 0 && score.get<double>() <= 1);
    }
  }
  EXPECT_EQ(lines[4]["summary"], "score-prm");
  EXPECT_EQ(lines[4]["trajectories"], 4);

  // Every step held out: no training data, a usage error naming the counts.
  std::vector<std::string> all_held = train;
  all_held[all_held.size() - 3] = "0.999999";
  all_held.insert(all_held.end(), {"--max-trajectories", "1"});
  EXPECT_EQ(RunCommand(all_held).exit_code, 2);
  EXPECT_EQ(RunCommand({StriderBinary(), "reward", "score-prm", "--checkpoint", dir.Sub("store"),
                        "--store", dir.Sub("store")})
                .exit_code,
            2);  // not a checkpoint: no process_model.json
}

}  // namespace
}  // namespace strider::reward
