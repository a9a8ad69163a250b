// The model configs shipped under configs/model/, as tests load them: ctest sets
// STRIDER_SOURCE_DIR, and a test run by hand from the source tree finds them relative to ".".
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/model/config.h"

namespace strider::testing {

// `name` is the file's stem ("tiny", "small", "tiny_incremental"). A config that does not load
// fails the calling test and returns the defaults.
inline ModelConfig ShippedModelConfig(const std::string& name) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  Result<ModelConfig> config = LoadModelConfig(std::string(source ? source : ".") +
                                               "/configs/model/" + name + ".yaml");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? *config : ModelConfig{};
}

}  // namespace strider::testing
