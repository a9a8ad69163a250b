// Key pairs for the CURVE tests, written by the same code as `strider keys generate`: a server,
// an authorised client (its public key alone in the server's key directory) and a stranger
// (a valid pair the server was never told about).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "common/transport/curve.h"
#include "tests/scratch_dir.h"

namespace strider::testing {

class TestKeys {
 public:
  TestKeys() {
    for (const char* name : {"server", "client", "stranger"}) {
      auto keys = transport::GenerateCurveKeyPair();
      EXPECT_TRUE(keys.ok()) << keys.status().ToString();
      if (!keys.ok()) continue;
      const std::string dir = std::string(name) == "client" ? authorized_dir() : dir_.path();
      Status written = transport::WriteCurveKeyFiles(dir, name, *keys, false);
      EXPECT_TRUE(written.ok()) << written.ToString();
    }
  }
  std::string authorized_dir() const { return dir_.Sub("authorized"); }
  std::string secret(const std::string& name) const {
    return (name == "client" ? authorized_dir() : dir_.path()) + "/" + name + ".key_secret";
  }
  std::string public_key(const std::string& name) const {
    return (name == "client" ? authorized_dir() : dir_.path()) + "/" + name + ".key";
  }
  // The server's block: its pair, the authorised directory.
  transport::ServerAuth Server() const {
    transport::ServerAuth auth;
    auth.secret_key = secret("server");
    auth.authorized_keys = {authorized_dir()};
    return auth;
  }
  // A client's block: `name`'s pair and the server's public key.
  transport::ClientAuth Client(const std::string& name) const {
    transport::ClientAuth auth;
    auth.secret_key = secret(name);
    auth.server_key = public_key("server");
    return auth;
  }
  const TempDir& dir() const { return dir_; }

 private:
  TempDir dir_;
};

}  // namespace strider::testing

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <mutex>
#include <sstream>

namespace strider::testing {

// What the default logger writes while it lives (the ZAP handler's refusals).
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() {
    spdlog::default_logger()->flush();
    return stream_.str();
  }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

}  // namespace strider::testing
