#include "envs/vision_count/vision_count.h"

#include <gtest/gtest.h>

#include "envs/registry.h"
#include "envs/tools.h"
#include "tests/envs/play.h"

namespace strider::envs {
namespace {

TEST(VisionCount, ScriptedPolicyCountsFromThePixels) {
  for (const Options& options : std::vector<Options>{
           {}, {{"grid", "8"}, {"cell", "8"}, {"colours", "4"}}, {{"grid", "3"}, {"cell", "16"}}}) {
    Result<std::unique_ptr<Environment>> env =
        MakeEnvironment({.name = "vision_count", .options = options});
    ASSERT_TRUE(env.ok()) << env.status().ToString();
    Result<std::unique_ptr<ScriptedPolicy>> policy = MakeScriptedPolicy({.name = "vision_count"});
    ASSERT_TRUE(policy.ok());
    int zooms = 0;
    for (uint64_t seed = 0; seed < 30; ++seed) {
      testing::Episode episode = testing::Play(**env, **policy, seed);
      ASSERT_FALSE(episode.steps.empty());
      EXPECT_EQ(episode.steps.back().outcome_reward, 1.0) << "seed " << seed;
      const Image& image = episode.observations[0].images.at(0);
      EXPECT_EQ(image.width % 4, 0);
      EXPECT_EQ(image.pixels.size(), static_cast<size_t>(image.width) * image.height * 3);
      if (episode.steps.size() == 2) {
        ++zooms;
        const StepResult& zoom = episode.steps[0];
        EXPECT_EQ(zoom.label, StepLabel::kCorrect);
        ASSERT_EQ(zoom.observation.images.size(), 1u);
        EXPECT_EQ(zoom.observation.images[0].width,
                  2 * image.width / std::stoi(options.count("grid") ? options.at("grid") : "4"));
      }
    }
    EXPECT_GT(zooms, 5);
  }
}

TEST(VisionCount, DefaultImageFitsTheTinyModelsPatchGrid) {
  Result<std::unique_ptr<Environment>> env = MakeEnvironment({.name = "vision_count"});
  ASSERT_TRUE(env.ok());
  Result<Observation> a = (*env)->Reset(9, {});
  ASSERT_TRUE(a.ok());
  // configs/model/tiny.yaml: patch 4, at most 8x8 patches.
  EXPECT_EQ(a->images[0].width, 32);
  EXPECT_EQ(a->images[0].height, 32);
  Result<Observation> b = (*env)->Reset(9, {});
  EXPECT_EQ(a->images[0].pixels, b->images[0].pixels);
  EXPECT_EQ(a->text, b->text);
}

TEST(VisionCount, BadZoomsAreErrorResults) {
  Result<std::unique_ptr<Environment>> env = MakeEnvironment({.name = "vision_count"});
  ASSERT_TRUE(env.ok());
  ASSERT_TRUE((*env)->Reset(1, {}).ok());
  Result<StepResult> outside = (*env)->Step(MakeAction(FormatToolCall("zoom", "4, 0")));
  ASSERT_TRUE(outside.ok());
  EXPECT_EQ(outside->observation.text, "error: cell (4, 0) is outside the 4x4 grid");
  EXPECT_EQ(outside->label, StepLabel::kIncorrect);
  EXPECT_TRUE(outside->observation.images.empty());
  Result<StepResult> words = (*env)->Step(MakeAction(FormatToolCall("zoom", "top left")));
  EXPECT_EQ(words->observation.text, "error: zoom takes two integers: zoom(row, col)");
  EXPECT_FALSE(MakeEnvironment({.name = "vision_count", .options = {{"cell", "6"}}}).ok());
}

}  // namespace
}  // namespace strider::envs
