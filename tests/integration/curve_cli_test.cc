// CURVE end to end through the binary: `strider keys generate` writes the key files, and
// `strider replay serve` with `server.auth` in its config takes an actor and a learner holding
// authorised keys while a stranger's key and a keyless client are refused; a non-loopback bind
// without keys is refused at start.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "common/transport/curve.h"
#include "replay/client.h"
#include "tests/integration/child_process.h"
#include "tests/replay/test_segments.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using std::chrono::milliseconds;
using testing::ChildProcess;
using testing::MakeSegment;
using testing::RunCommand;
using testing::StriderBinary;
using testing::TempDir;

mode_t Mode(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(stat(path.c_str(), &info), 0) << path;
  return info.st_mode & 0777;
}

TEST(KeysCli, GenerateWritesPairsAndKeepsExistingOnes) {
  TempDir dir;
  const std::string out = dir.Sub("keys");
  auto made = RunCommand({StriderBinary(), "keys", "generate", "--out", out, "--name", "replay",
                          "--name", "actor-0"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  for (const char* name : {"replay", "actor-0"}) {
    const std::string base = out + "/" + name;
    EXPECT_EQ(Mode(base + ".key_secret"), 0600u);
    EXPECT_EQ(Mode(base + ".key"), 0644u);
    auto pair = transport::LoadCurveKeyPair(base + ".key_secret");
    ASSERT_TRUE(pair.ok()) << pair.status().ToString();
    EXPECT_EQ(transport::LoadCurvePublicKey(base + ".key").value(), pair->public_key);
    EXPECT_NE(made.output.find(pair->public_key), std::string::npos) << made.output;
    EXPECT_EQ(made.output.find(pair->secret_key), std::string::npos);  // never printed
  }
  const std::string before = transport::LoadCurvePublicKey(out + "/replay.key").value();
  auto again = RunCommand({StriderBinary(), "keys", "generate", "--out", out, "--name", "replay"});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_EQ(transport::LoadCurvePublicKey(out + "/replay.key").value(), before);
  auto forced = RunCommand(
      {StriderBinary(), "keys", "generate", "--out", out, "--name", "replay", "--force"});
  EXPECT_EQ(forced.exit_code, 0);
  EXPECT_NE(transport::LoadCurvePublicKey(out + "/replay.key").value(), before);
  auto bad = RunCommand({StriderBinary(), "keys", "generate", "--out", out, "--name", "../x"});
  EXPECT_EQ(bad.exit_code, 2);
  auto plain = RunCommand({StriderBinary(), "keys", "generate", "--out", dir.Sub("default")});
  EXPECT_EQ(plain.exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("default/strider.key_secret")));
}

TEST(KeysCli, ReplayServeAdmitsOnlyAuthorisedKeys) {
  TempDir dir;
  const std::string keys = dir.Sub("keys");
  ASSERT_EQ(RunCommand({StriderBinary(), "keys", "generate", "--out", keys, "--name", "replay",
                        "--name", "stranger"})
                .exit_code,
            0);
  ASSERT_EQ(RunCommand({StriderBinary(), "keys", "generate", "--out", keys + "/actors", "--name",
                        "actor-0"})
                .exit_code,
            0);
  ASSERT_EQ(RunCommand({StriderBinary(), "keys", "generate", "--out", keys + "/learners",
                        "--name", "learner-0"})
                .exit_code,
            0);
  ChildProcess server;
  const testing::ReplayEndpoints endpoints = testing::StartReplayServer(
      server, dir.Sub("db"), dir.Sub("replay.yaml"),
      "server:\n  auth:\n    secret_key: " + keys + "/replay.key_secret\n" +
          "    authorized_keys: [" + keys + "/actors]\n    learner_keys: [" + keys +
          "/learners]\n");
  ASSERT_FALSE(endpoints.actor.empty());

  auto actor = [&](const transport::ClientAuth& auth) {
    replay::ActorClientOptions options;
    options.endpoint = endpoints.actor;
    options.give_up_after = milliseconds(3000);
    options.auth = auth;
    return replay::ActorClient::Connect(options);
  };
  const std::string server_key = keys + "/replay.key";
  auto refused = actor({keys + "/stranger.key_secret", server_key});
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition)
      << refused.status().ToString();
  auto keyless = actor({});
  EXPECT_EQ(keyless.status().code(), StatusCode::kFailedPrecondition)
      << keyless.status().ToString();
  auto allowed = actor({keys + "/actors/actor-0.key_secret", server_key});
  ASSERT_TRUE(allowed.ok()) << allowed.status().ToString();
  ASSERT_TRUE((*allowed)->Send(MakeSegment(3, 0, 64, 1, true)).ok());
  ASSERT_TRUE((*allowed)->Flush(milliseconds(5000)).ok());

  auto sample = [&](const transport::ClientAuth& auth) -> Result<replay::SampleBatch> {
    replay::LearnerClientOptions options;
    options.endpoint = endpoints.learner;
    options.request_timeout = milliseconds(2000);
    options.auth = auth;
    STRIDER_ASSIGN_OR_RETURN(auto learner, replay::LearnerClient::Connect(options));
    return learner->Sample(1, 1, 1, milliseconds(3000));
  };
  EXPECT_EQ(sample({keys + "/stranger.key_secret", server_key}).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(sample({keys + "/actors/actor-0.key_secret", server_key}).status().code(),
            StatusCode::kFailedPrecondition);
  auto batch = sample({keys + "/learners/learner-0.key_secret", server_key});
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(batch->items.size(), 1u);
}

TEST(KeysCli, ReplayServeRefusesAnOpenBindWithoutKeys) {
  TempDir dir;
  auto open = RunCommand({StriderBinary(), "replay", "serve", "--db", dir.Sub("db"), "--bind",
                          "tcp://0.0.0.0:0", "--sample-bind", "tcp://127.0.0.1:0"});
  EXPECT_EQ(open.exit_code, 2) << open.output;
  EXPECT_EQ(open.output.find("ready"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("db")));
}

}  // namespace
}  // namespace strider
