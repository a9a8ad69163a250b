// The model commands as a user runs them: real `strider` processes, files on disk, exit codes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/integration/child_process.h"

namespace strider {
namespace {

using testing::RunCommand;
using testing::RunResult;
using testing::StriderBinary;

std::string SourcePath(const std::string& relative) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return std::string(source ? source : ".") + "/" + relative;
}

class ModelCommands : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = std::filesystem::temp_directory_path() /
                 ("strider_model_cli_" + std::to_string(::getpid()));
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }
  std::filesystem::path directory_;
};

TEST_F(ModelCommands, InitThenEvalGivesTheSameLogProbsOnBothPaths) {
  const std::string tiny = SourcePath("configs/model/tiny.yaml");
  const std::string weights = (directory_ / "tiny.safetensors").string();
  RunResult init = RunCommand({StriderBinary(), "model", "init", "--config", tiny, "--out",
                               weights, "--seed", "7"});
  ASSERT_EQ(init.exit_code, 0) << init.output;
  ASSERT_TRUE(std::filesystem::exists(weights));

  std::vector<double> totals;
  for (const char* path : {"train", "inference"}) {
    RunResult eval = RunCommand({StriderBinary(), "model", "eval", "--config", tiny, "--weights",
                                 weights, "--text", "tool results come back as text", "--path",
                                 path});
    ASSERT_EQ(eval.exit_code, 0) << eval.output;
    nlohmann::json json = nlohmann::json::parse(eval.output);
    EXPECT_EQ(json["path"], path);
    EXPECT_TRUE(json["logprobs"][0].is_null());  // the first token has no prediction
    EXPECT_EQ(json["logprobs"].size(), json["tokens"].size());
    totals.push_back(json["total_logprob"].get<double>());
  }
  EXPECT_NEAR(totals[0], totals[1], 1e-4);
}

TEST_F(ModelCommands, CheckPassesAndInfoCountsTheReference) {
  RunResult check = RunCommand({StriderBinary(), "model", "check", "--config",
                                SourcePath("configs/model/tiny.yaml"), "--tokens", "300"});
  ASSERT_EQ(check.exit_code, 0) << check.output;
  nlohmann::json report = nlohmann::json::parse(check.output);
  EXPECT_TRUE(report["passed"].get<bool>());
  EXPECT_LE(report["max_abs_logprob_diff"].get<double>(), 1e-5);

  RunResult info = RunCommand(
      {StriderBinary(), "model", "info", "--config", SourcePath("configs/model/reference.yaml")});
  ASSERT_EQ(info.exit_code, 0) << info.output;
  nlohmann::json counts = nlohmann::json::parse(info.output);
  EXPECT_NEAR(counts["total_params"].get<double>() / 2.8e12, 1.0, 0.05);
  EXPECT_NEAR(counts["active_params"].get<double>() / 104e9, 1.0, 0.05);
  EXPECT_EQ(counts["kv_cache_values_per_token_per_layer"].get<int64_t>(), 576);
}

TEST_F(ModelCommands, BadInputExitsWithUsageErrors) {
  // Weights made for another config are a usage error (exit 2), not a crash.
  const std::string weights = (directory_ / "tiny.safetensors").string();
  ASSERT_EQ(RunCommand({StriderBinary(), "model", "init", "--config",
                        SourcePath("configs/model/tiny.yaml"), "--out", weights})
                .exit_code,
            0);
  EXPECT_EQ(RunCommand({StriderBinary(), "model", "eval", "--config",
                        SourcePath("configs/model/small.yaml"), "--weights", weights, "--tokens",
                        "1,2,3"})
                .exit_code,
            2);
  // A config with an unknown key.
  const std::string broken = (directory_ / "broken.yaml").string();
  std::ofstream(broken) << "model:\n  vocabulary: 288\n  width: 64\n  layers: 4\n  widht: 3\n";
  EXPECT_EQ(RunCommand({StriderBinary(), "model", "info", "--config", broken}).exit_code, 2);
  // A missing config file and a missing flag.
  EXPECT_EQ(RunCommand({StriderBinary(), "model", "info", "--config", "/nonexistent.yaml"})
                .exit_code,
            2);
  EXPECT_EQ(RunCommand({StriderBinary(), "model", "info"}).exit_code, 2);
  // Token ids outside the vocabulary.
  EXPECT_EQ(RunCommand({StriderBinary(), "model", "eval", "--config",
                        SourcePath("configs/model/tiny.yaml"), "--weights", weights, "--tokens",
                        "1,99999"})
                .exit_code,
            2);
}

}  // namespace
}  // namespace strider
