// CURVE keys and the weight stream's authentication over real sockets on loopback: key files
// and their errors, the loopback rule, and a publisher that serves its authorised subscriber and
// refuses (and logs) a stranger's key, a keyless subscriber and a wrong server key.
#include "common/transport/curve.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "common/transport/weight_stream.h"
#include "tests/transport/test_keys.h"

namespace strider::transport {
namespace {

using strider::testing::LogCapture;
using strider::testing::TempDir;
using strider::testing::TestKeys;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

mode_t Mode(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(stat(path.c_str(), &info), 0) << path;
  return info.st_mode & 0777;
}

TEST(CurveKeys, WrittenPairLoadsBackWithPrivateSecret) {
  ASSERT_TRUE(CurveAvailable());
  TempDir dir;
  auto keys = GenerateCurveKeyPair();
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(keys->public_key.size(), kZ85KeyChars);
  EXPECT_EQ(keys->secret_key.size(), kZ85KeyChars);
  ASSERT_TRUE(WriteCurveKeyFiles(dir.Sub("keys"), "actor-0", *keys, false).ok());
  EXPECT_EQ(Mode(dir.Sub("keys/actor-0.key_secret")), 0600u);
  EXPECT_EQ(Mode(dir.Sub("keys/actor-0.key")), 0644u);

  auto pair = LoadCurveKeyPair(dir.Sub("keys/actor-0.key_secret"));
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  EXPECT_EQ(pair->public_key, keys->public_key);
  EXPECT_EQ(pair->secret_key, keys->secret_key);
  auto public_key = LoadCurvePublicKey(dir.Sub("keys/actor-0.key"));
  ASSERT_TRUE(public_key.ok());
  EXPECT_EQ(*public_key, keys->public_key);
  // The secret file never carries into the public one.
  std::ifstream file(dir.Sub("keys/actor-0.key"));
  std::string text((std::istreambuf_iterator<char>(file)), {});
  EXPECT_EQ(text.find(keys->secret_key), std::string::npos);

  auto other = GenerateCurveKeyPair();
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->public_key, keys->public_key);
  Status again = WriteCurveKeyFiles(dir.Sub("keys"), "actor-0", *other, false);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  EXPECT_NE(again.message().find("actor-0.key"), std::string::npos);
  EXPECT_EQ(LoadCurvePublicKey(dir.Sub("keys/actor-0.key")).value(), keys->public_key);
  ASSERT_TRUE(WriteCurveKeyFiles(dir.Sub("keys"), "actor-0", *other, true).ok());
  EXPECT_EQ(LoadCurvePublicKey(dir.Sub("keys/actor-0.key")).value(), other->public_key);

  EXPECT_TRUE(WriteCurveKeyFiles(dir.path(), "../escape", *keys, false).IsInvalidArgument());
  EXPECT_TRUE(WriteCurveKeyFiles(dir.path(), "", *keys, false).IsInvalidArgument());
}

TEST(CurveKeys, MalformedFilesAreErrorsNamingTheFile) {
  TempDir dir;
  auto keys = GenerateCurveKeyPair();
  auto other = GenerateCurveKeyPair();
  ASSERT_TRUE(keys.ok() && other.ok());
  auto expect_error = [](const Status& status, StatusCode code, const std::string& path,
                         const std::string& words) {
    EXPECT_EQ(status.code(), code) << status.ToString();
    EXPECT_NE(status.message().find(path), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(words), std::string::npos) << status.message();
  };
  expect_error(LoadCurveKeyPair(dir.Sub("missing.key_secret")).status(), StatusCode::kNotFound,
               "missing.key_secret", "no such key file");

  WriteFile(dir.Sub("short.key"), "public = abc\n");
  expect_error(LoadCurvePublicKey(dir.Sub("short.key")).status(), StatusCode::kInvalidArgument,
               "short.key:1", "40 Z85 characters");
  WriteFile(dir.Sub("junk.key"), "# comment\n\nthis is not a key\n");
  expect_error(LoadCurvePublicKey(dir.Sub("junk.key")).status(), StatusCode::kInvalidArgument,
               "junk.key:3", "expected 'public = KEY'");
  WriteFile(dir.Sub("unknown.key"), "private = " + keys->public_key + "\n");
  expect_error(LoadCurvePublicKey(dir.Sub("unknown.key")).status(), StatusCode::kInvalidArgument,
               "unknown.key:1", "unknown field 'private'");
  WriteFile(dir.Sub("empty.key"), "# nothing\n");
  expect_error(LoadCurvePublicKey(dir.Sub("empty.key")).status(), StatusCode::kInvalidArgument,
               "empty.key", "no 'public = KEY' line");
  // A public key file where a key pair belongs.
  WriteFile(dir.Sub("only.key"), "public = " + keys->public_key + "\n");
  expect_error(LoadCurveKeyPair(dir.Sub("only.key")).status(), StatusCode::kInvalidArgument,
               "only.key", "no 'secret = KEY' line");
  // A public key that is not the secret's.
  WriteFile(dir.Sub("mixed.key_secret"),
            "public = " + other->public_key + "\nsecret = " + keys->secret_key + "\n");
  expect_error(LoadCurveKeyPair(dir.Sub("mixed.key_secret")).status(),
               StatusCode::kInvalidArgument, "mixed.key_secret", "does not belong");
  // Z85 length but characters outside the alphabet.
  WriteFile(dir.Sub("alphabet.key"), "public = " + std::string(40, '~') + "\n");
  expect_error(LoadCurvePublicKey(dir.Sub("alphabet.key")).status(), StatusCode::kInvalidArgument,
               "alphabet.key:1", "not a CURVE key");

  std::filesystem::create_directories(dir.Sub("nokeys"));
  expect_error(LoadAuthorizedKeys({dir.Sub("nokeys")}).status(), StatusCode::kInvalidArgument,
               "nokeys", "without *.key files");
  EXPECT_TRUE(LoadAuthorizedKeys({}).status().IsInvalidArgument());
  // A directory holding one bad key file is refused whole, naming that file.
  std::filesystem::create_directories(dir.Sub("mixed"));
  WriteFile(dir.Sub("mixed/good.key"), "public = " + keys->public_key + "\n");
  WriteFile(dir.Sub("mixed/bad.key"), "public = nope\n");
  expect_error(LoadAuthorizedKeys({dir.Sub("mixed")}).status(), StatusCode::kInvalidArgument,
               "bad.key", "not a CURVE key");
  std::filesystem::remove(dir.Sub("mixed/bad.key"));
  auto loaded = LoadAuthorizedKeys({dir.Sub("mixed"), dir.Sub("only.key")});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->size(), 1u);  // the same key twice
}

TEST(CurveKeys, ConfigBlocksComeWhole) {
  auto read_server = [](const std::string& yaml) {
    auto root = ConfigReader::FromString(yaml, "<test>");
    EXPECT_TRUE(root.ok());
    ConfigReader auth = root->Section("auth");
    ServerAuth result = ReadServerAuth(auth);
    return std::make_pair(result, root->Finish());
  };
  auto [full, ok] = read_server(
      "auth:\n  secret_key: s.key_secret\n  authorized_keys: [a.key, dir]\n  insecure: false\n");
  EXPECT_TRUE(ok.ok()) << ok.ToString();
  EXPECT_EQ(full.secret_key, "s.key_secret");
  EXPECT_EQ(full.authorized_keys.size(), 2u);
  Status no_list = read_server("auth:\n  secret_key: s.key_secret\n").second;
  EXPECT_NE(no_list.message().find("auth.authorized_keys"), std::string::npos) << no_list.ToString();
  Status no_secret = read_server("auth:\n  authorized_keys: [a.key]\n").second;
  EXPECT_NE(no_secret.message().find("auth.secret_key"), std::string::npos) << no_secret.ToString();
  Status typo = read_server("auth:\n  secret: s.key_secret\n").second;
  EXPECT_FALSE(typo.ok());

  auto root = ConfigReader::FromString("auth:\n  secret_key: c.key_secret\n", "<test>");
  ASSERT_TRUE(root.ok());
  ConfigReader auth = root->Section("auth");
  (void)ReadClientAuth(auth);
  Status no_server = root->Finish();
  EXPECT_NE(no_server.message().find("auth.server_key"), std::string::npos) << no_server.ToString();
}

TEST(CurveLoopbackRule, NonLoopbackBindNeedsKeysOrInsecure) {
  for (const char* endpoint : {"tcp://127.0.0.1:5555", "tcp://127.1.2.3:0", "tcp://localhost:1",
                               "tcp://[::1]:9", "ipc:///tmp/x", "inproc://y"}) {
    EXPECT_TRUE(IsLoopbackEndpoint(endpoint)) << endpoint;
  }
  for (const char* endpoint : {"tcp://0.0.0.0:5555", "tcp://*:0", "tcp://10.0.0.2:1",
                               "tcp://eth0:1", "tcp://[::]:1", "tcp://127.0.0.1.example.com:1",
                               "tcp://128.0.0.1:1"}) {
    EXPECT_FALSE(IsLoopbackEndpoint(endpoint)) << endpoint;
  }
  ServerAuth none;
  Status refused = CheckBindAllowed("tcp://0.0.0.0:0", none, "weight publisher");
  EXPECT_TRUE(refused.IsInvalidArgument());
  EXPECT_NE(refused.message().find("tcp://0.0.0.0:0"), std::string::npos);
  EXPECT_NE(refused.message().find("insecure"), std::string::npos);

  WeightPublisherOptions options;
  options.endpoint = "tcp://0.0.0.0:0";
  auto publisher = WeightPublisher::Start(options);
  EXPECT_TRUE(publisher.status().IsInvalidArgument()) << publisher.status().ToString();
  options.auth.insecure = true;
  publisher = WeightPublisher::Start(options);
  EXPECT_TRUE(publisher.ok()) << publisher.status().ToString();

  TestKeys keys;
  options.auth = keys.Server();
  publisher = WeightPublisher::Start(options);
  EXPECT_TRUE(publisher.ok()) << publisher.status().ToString();
}

class CurveWeightStream : public ::testing::Test {
 protected:
  void SetUp() override {
    WeightPublisherOptions options;
    options.chunk_bytes = 4096;
    options.auth = keys_.Server();
    auto publisher = WeightPublisher::Start(options);
    ASSERT_TRUE(publisher.ok()) << publisher.status().ToString();
    publisher_ = std::move(*publisher);
    ASSERT_TRUE(publisher_->Publish(1, weights_, "tiny").ok());
  }
  Result<std::optional<WeightUpdate>> Fetch(const ClientAuth& auth) {
    WeightSubscriberOptions options;
    options.endpoint = publisher_->endpoint();
    options.reply_timeout = std::chrono::milliseconds(3000);
    options.auth = auth;
    STRIDER_ASSIGN_OR_RETURN(auto subscriber, WeightSubscriber::Connect(options));
    return subscriber->FetchNewer(0);
  }

  TestKeys keys_;
  std::string weights_ = std::string(20000, 'w');
  std::unique_ptr<WeightPublisher> publisher_;
};

TEST_F(CurveWeightStream, AuthorisedSubscriberReceivesWeights) {
  auto update = Fetch(keys_.Client("client"));
  ASSERT_TRUE(update.ok()) << update.status().ToString();
  ASSERT_TRUE(update->has_value());
  EXPECT_EQ((*update)->version, 1u);
  EXPECT_TRUE((*update)->bytes == weights_);
  EXPECT_EQ(publisher_->chunks_served(), 5u);
}

TEST_F(CurveWeightStream, StrangersKeyIsRefusedAndLogged) {
  LogCapture log;
  const auto started = std::chrono::steady_clock::now();
  auto update = Fetch(keys_.Client("stranger"));
  EXPECT_EQ(update.status().code(), StatusCode::kFailedPrecondition) << update.status().ToString();
  EXPECT_NE(update.status().message().find("refused this client's key"), std::string::npos);
  // Told, not left waiting for the reply timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(2500));
  EXPECT_EQ(publisher_->chunks_served(), 0u);
  const std::string stranger = LoadCurvePublicKey(keys_.public_key("stranger")).value();
  const std::string text = log.text();
  EXPECT_NE(text.find("weight publisher: refused a client from 127.0.0.1"), std::string::npos)
      << text;
  EXPECT_NE(text.find(stranger), std::string::npos) << text;
}

TEST_F(CurveWeightStream, KeylessSubscriberIsRefused) {
  auto update = Fetch(ClientAuth{});
  EXPECT_EQ(update.status().code(), StatusCode::kFailedPrecondition) << update.status().ToString();
  EXPECT_NE(update.status().message().find("security handshake failed"), std::string::npos);
  EXPECT_EQ(publisher_->chunks_served(), 0u);
}

TEST_F(CurveWeightStream, WrongServerKeyGetsNothing) {
  ClientAuth auth = keys_.Client("client");
  auth.server_key = keys_.public_key("stranger");
  auto update = Fetch(auth);
  EXPECT_FALSE(update.ok());
  EXPECT_TRUE(update.status().code() == StatusCode::kFailedPrecondition ||
              update.status().code() == StatusCode::kUnavailable)
      << update.status().ToString();
  EXPECT_EQ(publisher_->chunks_served(), 0u);
}

TEST(CurveWeightStreamPlain, KeyedSubscriberOfAKeylessPublisherIsToldSo) {
  TestKeys keys;
  auto publisher = WeightPublisher::Start(WeightPublisherOptions{});
  ASSERT_TRUE(publisher.ok());
  ASSERT_TRUE((*publisher)->Publish(1, "bytes").ok());
  WeightSubscriberOptions options;
  options.endpoint = (*publisher)->endpoint();
  options.reply_timeout = std::chrono::milliseconds(3000);
  options.auth = keys.Client("client");
  auto subscriber = WeightSubscriber::Connect(options);
  ASSERT_TRUE(subscriber.ok());
  auto update = (*subscriber)->FetchNewer(0);
  EXPECT_EQ(update.status().code(), StatusCode::kFailedPrecondition) << update.status().ToString();
  // A subscriber whose own key file is broken fails to start, naming it.
  options.auth.secret_key = keys.dir().Sub("nothing.key_secret");
  auto broken = WeightSubscriber::Connect(options);
  EXPECT_EQ(broken.status().code(), StatusCode::kNotFound);
  EXPECT_NE(broken.status().message().find("nothing.key_secret"), std::string::npos);
}

}  // namespace
}  // namespace strider::transport
