// The registry's config reading: `env:` sections read strictly against the keys an environment
// declares.
#include "envs/registry.h"

#include <gtest/gtest.h>

#include "common/config.h"

namespace strider::envs {
namespace {

TEST(Registry, ReadsEnvironmentConfigStrictly) {
  Result<ConfigReader> root = ConfigReader::FromString(
      "env:\n  name: calculator\n  options: {difficulty: 3, python: true}\n  step_timeout_ms: "
      "500\n",
      "<inline>");
  ASSERT_TRUE(root.ok());
  ConfigReader env = root->Section("env");
  Result<EnvironmentConfig> config = ReadEnvironmentConfig(env);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(root->Finish().ok());
  EXPECT_EQ(config->name, "calculator");
  EXPECT_EQ(config->options.at("difficulty"), "3");
  EXPECT_EQ(config->options.at("python"), "true");
  EXPECT_EQ(config->step_timeout_ms, 500);

  root = ConfigReader::FromString("env:\n  name: calculator\n  options:\n    level: 3\n", "f.yaml");
  ASSERT_TRUE(root.ok());
  env = root->Section("env");
  ASSERT_TRUE(ReadEnvironmentConfig(env).ok());
  const Status status = root->Finish();
  EXPECT_NE(status.message().find("f.yaml:4: env.options.level"), std::string::npos)
      << status.message();

  root = ConfigReader::FromString("env:\n  name: nope\n", "g.yaml");
  env = root->Section("env");
  Result<EnvironmentConfig> unknown = ReadEnvironmentConfig(env);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("g.yaml:2: env.name: unknown environment 'nope'"),
            std::string::npos)
      << unknown.status().message();
}

}  // namespace
}  // namespace strider::envs
