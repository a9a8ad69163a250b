// The replay server with CURVE over real loopback sockets and a real store: authorised actors
// and learners work as without keys; a stranger's key and a keyless client are refused (and
// logged) on both endpoints and write or sample nothing; the loopback rule and bad key files
// stop the start before the store is created.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>
#include <zmq.hpp>

#include "common/schema/messages.h"
#include "common/transport/curve.h"
#include "common/transport/zmq_util.h"
#include "replay/client.h"
#include "replay/replay.h"
#include "tests/replay/test_segments.h"
#include "tests/scratch_dir.h"
#include "tests/transport/test_keys.h"

namespace strider::replay {
namespace {

using std::chrono::milliseconds;
using strider::testing::LogCapture;
using strider::testing::MakeSegment;
using strider::testing::TempDir;
using strider::testing::TestKeys;

class CurveReplay : public ::testing::Test {
 protected:
  void SetUp() override {
    auto learner = transport::GenerateCurveKeyPair();
    ASSERT_TRUE(learner.ok());
    ASSERT_TRUE(transport::WriteCurveKeyFiles(dir_.Sub("learners"), "learner", *learner, false)
                    .ok());
  }
  ServerOptions Options() const {
    ServerOptions options;
    options.db_path = dir_.Sub("db");
    options.actor_endpoint = "tcp://127.0.0.1:0";
    options.learner_endpoint = "tcp://127.0.0.1:0";
    options.stats_interval_s = 0;
    options.auth = keys_.Server();
    options.learner_keys = {dir_.Sub("learners")};
    return options;
  }
  void Start() {
    auto server = ReplayServer::Start(Options());
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }
  transport::ClientAuth LearnerAuth() const {
    return {dir_.Sub("learners/learner.key_secret"), keys_.public_key("server")};
  }
  Result<std::unique_ptr<ActorClient>> Actor(const transport::ClientAuth& auth) {
    ActorClientOptions options;
    options.endpoint = server_->actor_endpoint();
    options.client_id = "actor";
    options.give_up_after = milliseconds(3000);
    options.auth = auth;
    return ActorClient::Connect(options);
  }
  Result<std::unique_ptr<LearnerClient>> Learner(const transport::ClientAuth& auth) {
    LearnerClientOptions options;
    options.endpoint = server_->learner_endpoint();
    options.learner_id = "learner";
    options.request_timeout = milliseconds(2000);
    options.auth = auth;
    return LearnerClient::Connect(options);
  }
  nlohmann::json Stats() { return nlohmann::json::parse(server_->StatsSnapshotJson()); }
  void WriteSegments(int count) {
    auto actor = Actor(keys_.Client("client"));
    ASSERT_TRUE(actor.ok()) << actor.status().ToString();
    for (int i = 0; i < count; ++i) {
      ASSERT_TRUE((*actor)->Send(MakeSegment(7, i, 64, 1, i + 1 == count)).ok());
    }
    ASSERT_TRUE((*actor)->Flush(milliseconds(5000)).ok());
    EXPECT_EQ((*actor)->acked_count(), static_cast<uint64_t>(count));
  }

  TempDir dir_;
  TestKeys keys_;
  std::unique_ptr<ReplayServer> server_;
};

TEST_F(CurveReplay, AuthorisedClientsWriteAndSample) {
  Start();
  WriteSegments(3);
  auto learner = Learner(LearnerAuth());
  ASSERT_TRUE(learner.ok()) << learner.status().ToString();
  auto batch = (*learner)->Sample(1, 3, 1, milliseconds(3000));
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(batch->items.size(), 3u);
  EXPECT_EQ(batch->items[0].segment.trajectory_id, MakeSegment(7, 0, 64).trajectory_id);
  EXPECT_EQ(Stats()["ingest"]["segments"], 3);
}

TEST_F(CurveReplay, StrangerAndKeylessActorsWriteNothing) {
  Start();
  LogCapture log;
  auto stranger = Actor(keys_.Client("stranger"));
  EXPECT_EQ(stranger.status().code(), StatusCode::kFailedPrecondition)
      << stranger.status().ToString();
  EXPECT_NE(stranger.status().message().find("refused this client's key"), std::string::npos);
  auto keyless = Actor(transport::ClientAuth{});
  EXPECT_EQ(keyless.status().code(), StatusCode::kFailedPrecondition)
      << keyless.status().ToString();
  EXPECT_NE(keyless.status().message().find("security handshake failed"), std::string::npos)
      << keyless.status().ToString();
  // A learner's key is not an actor's: the endpoints have their own lists.
  auto learner_as_actor = Actor(LearnerAuth());
  EXPECT_EQ(learner_as_actor.status().code(), StatusCode::kFailedPrecondition);

  // Below the client: raw sockets that send segment frames at once, without waiting for a
  // greeting, with a stranger's key and with none. Nothing reaches the store.
  zmq::context_t context;
  const std::string frame = schema::EncodeSegment(MakeSegment(9, 0, 64, 1, true)).value();
  std::vector<zmq::socket_t> raw;
  for (bool keyed : {true, false}) {
    raw.emplace_back(context, zmq::socket_type::dealer);
    raw.back().set(zmq::sockopt::linger, 0);
    if (keyed) {
      auto curve = transport::CurveClient::Load(keys_.Client("stranger"));
      ASSERT_TRUE(curve.ok());
      ASSERT_TRUE(curve->Secure(raw.back()).ok());
    }
    raw.back().connect(server_->actor_endpoint());
    ASSERT_TRUE(transport::SendParts(raw.back(), {schema::EncodeHello({"raw", schema::ClientRole::kActor})}).ok());
    ASSERT_TRUE(transport::SendParts(raw.back(), {frame}).ok());
  }
  std::this_thread::sleep_for(milliseconds(700));
  for (zmq::socket_t& socket : raw) {
    auto readable = transport::WaitReadable(socket, milliseconds(0));
    EXPECT_FALSE(readable.ok() && *readable) << "a refused socket got a reply";
  }
  const nlohmann::json stats = Stats();
  EXPECT_EQ(stats["ingest"]["segments"], 0);
  EXPECT_EQ(stats["rejects_total"], 0);  // never even decoded

  const std::string stranger_key =
      transport::LoadCurvePublicKey(keys_.public_key("stranger")).value();
  const std::string text = log.text();
  EXPECT_NE(text.find("replay server (actor endpoint): refused a client from 127.0.0.1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(stranger_key), std::string::npos) << text;

  // The authorised actor is unaffected by the refused ones.
  WriteSegments(2);
  EXPECT_EQ(Stats()["ingest"]["segments"], 2);
}

TEST_F(CurveReplay, StrangerAndKeylessLearnersSampleNothing) {
  Start();
  WriteSegments(2);
  LogCapture log;
  for (const transport::ClientAuth& auth :
       {keys_.Client("stranger"), transport::ClientAuth{}, keys_.Client("client")}) {
    auto learner = Learner(auth);
    ASSERT_TRUE(learner.ok()) << learner.status().ToString();  // connecting sends nothing
    const auto started = std::chrono::steady_clock::now();
    auto batch = (*learner)->Sample(1, 2, 1, milliseconds(1000));
    EXPECT_EQ(batch.status().code(), StatusCode::kFailedPrecondition)
        << batch.status().ToString();
    EXPECT_LT(std::chrono::steady_clock::now() - started, milliseconds(1500));
    EXPECT_FALSE((*learner)->Stats().ok());
  }
  EXPECT_EQ(Stats()["sample"]["requests"], 0);
  EXPECT_NE(log.text().find("replay server (learner endpoint): refused a client"),
            std::string::npos);

  auto learner = Learner(LearnerAuth());
  ASSERT_TRUE(learner.ok());
  auto batch = (*learner)->Sample(1, 2, 1, milliseconds(3000));
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(batch->items.size(), 2u);
}

TEST_F(CurveReplay, LoopbackRuleAndBadKeysStopTheStartBeforeTheStore) {
  ServerOptions plain = Options();
  plain.auth = {};
  plain.learner_keys.clear();
  plain.actor_endpoint = "tcp://0.0.0.0:0";
  auto refused = ReplayServer::Start(plain);
  EXPECT_TRUE(refused.status().IsInvalidArgument()) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("tcp://0.0.0.0:0"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(plain.db_path));
  plain.actor_endpoint = "tcp://127.0.0.1:0";
  plain.learner_endpoint = "tcp://*:0";
  EXPECT_TRUE(ReplayServer::Start(plain).status().IsInvalidArgument());
  EXPECT_FALSE(std::filesystem::exists(plain.db_path));

  ServerOptions broken = Options();
  broken.auth.secret_key = keys_.public_key("server");  // a public key where the pair belongs
  auto bad = ReplayServer::Start(broken);
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().message().find("server.key"), std::string::npos)
      << bad.status().ToString();
  broken = Options();
  broken.auth.authorized_keys = {dir_.Sub("missing.key")};
  bad = ReplayServer::Start(broken);
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("missing.key"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(broken.db_path));

  plain.auth.insecure = true;
  auto insecure = ReplayServer::Start(plain);
  ASSERT_TRUE(insecure.ok()) << insecure.status().ToString();
  insecure->reset();
  ServerOptions keyed = Options();
  keyed.actor_endpoint = "tcp://0.0.0.0:0";
  keyed.learner_endpoint = "tcp://0.0.0.0:0";
  auto wide = ReplayServer::Start(keyed);
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
}

TEST(CurveReplayConfig, AuthBlockIsReadStrictly) {
  auto options = ParseServerConfig(
      "server:\n  auth:\n    secret_key: keys/replay.key_secret\n"
      "    authorized_keys: [keys/actors]\n    learner_keys: [keys/learner.key]\n",
      "<test>");
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->auth.secret_key, "keys/replay.key_secret");
  EXPECT_EQ(options->auth.authorized_keys, std::vector<std::string>{"keys/actors"});
  EXPECT_EQ(options->learner_keys, std::vector<std::string>{"keys/learner.key"});
  EXPECT_FALSE(options->auth.insecure);
  auto insecure = ParseServerConfig("server:\n  auth:\n    insecure: true\n", "<test>");
  ASSERT_TRUE(insecure.ok());
  EXPECT_TRUE(insecure->auth.insecure);
  auto lonely = ParseServerConfig("server:\n  auth:\n    secret_key: a.key_secret\n", "<test>");
  EXPECT_NE(lonely.status().message().find("server.auth.authorized_keys"), std::string::npos)
      << lonely.status().ToString();
  auto typo = ParseServerConfig("server:\n  auth:\n    server_key: a.key\n", "<test>");
  EXPECT_FALSE(typo.ok());
}

}  // namespace
}  // namespace strider::replay
