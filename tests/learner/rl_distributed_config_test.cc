// `distributed:` of an RL learner config: which process groups carry a GPU learner's
// collectives (learner/rl/rl_config.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "learner/rl/rl_config.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

std::string SourceDir() {
  const char* root = std::getenv("STRIDER_SOURCE_DIR");  // set by ctest
  return root != nullptr ? root : ".";
}

TEST(RlDistributedConfig, CollectivesAreAutoNcclOrGloo) {
  strider::testing::TempDir dir;
  const auto load = [&](const std::string& distributed) {
    std::ofstream(dir.Sub("rl.yaml")) << "mode: rl\nmodel_config: " << SourceDir()
                                      << "/configs/model/tiny.yaml\n"
                                      << distributed;
    return rl::LoadRlLearnerConfig(dir.Sub("rl.yaml"));
  };
  Result<rl::RlLearnerConfig> defaulted = load("");
  ASSERT_TRUE(defaulted.ok()) << defaulted.status().ToString();
  EXPECT_EQ(defaulted->distributed.collectives, "auto");
  for (const char* choice : {"nccl", "gloo", "auto"}) {
    Result<rl::RlLearnerConfig> chosen =
        load(std::string("distributed: {world_size: 2, collectives: ") + choice + "}\n");
    ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
    EXPECT_EQ(chosen->distributed.collectives, choice);
  }
  Result<rl::RlLearnerConfig> bad = load("distributed: {collectives: mpi}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("collectives: must be auto, nccl or gloo"),
            std::string::npos)
      << bad.status().ToString();
}

}  // namespace
}  // namespace strider
