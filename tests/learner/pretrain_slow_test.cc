// The tiny pretraining config's first two stages, shortened: the loss must fall within the
// first stage and stay below its start in the second (which trains through the inference path).
#include <gtest/gtest.h>

#include <filesystem>

#include "learner/pretrain/pretrain.h"
#include "learner/pretrain/pretrain_config.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

TEST(PretrainSlow, TinyFirstTwoStagesLossFalls) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  Result<PretrainConfig> config =
      LoadPretrainConfig(std::string(source ? source : ".") + "/configs/pretrain/tiny.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  config->eval_documents = 8;
  const testing::TempDir scratch;
  const std::filesystem::path run = scratch.Sub("run");
  PretrainOptions options;
  options.run_dir = run.string();
  options.stages = 2;
  options.max_steps_per_stage = 40;
  options.bar = 0;
  Result<std::vector<StageSummary>> summaries = RunPretraining(*config, options);
  ASSERT_TRUE(summaries.ok()) << summaries.status().ToString();
  ASSERT_EQ(summaries->size(), 2u);
  const StageSummary& first = (*summaries)[0];
  const StageSummary& second = (*summaries)[1];
  EXPECT_LT(first.last_loss, first.first_loss - 0.5) << first.first_loss << " -> " << first.last_loss;
  EXPECT_LT(second.last_loss, first.first_loss - 0.5);
  EXPECT_TRUE(std::filesystem::exists(run / "checkpoints" / config->stages[1].name / "final"));
  EXPECT_TRUE(std::filesystem::exists(run / "eval.jsonl"));
}

}  // namespace
}  // namespace strider
