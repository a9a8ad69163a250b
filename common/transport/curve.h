// CURVE authentication and encryption for the services' ZeroMQ endpoints (docs/fleet.md,
// "Authentication (CURVE)").
//
//   server socket (CURVE server, secret key) <── handshake ── client socket (server's public key,
//        │  ZAP request: mechanism, peer address, client public key      its own key pair)
//        v
//   ZapHandler thread on inproc://zeromq.zap.01 of the server socket's context:
//        200 for a listed client key, 400 (logged with key and address) for any other
//
// A refused peer never completes the handshake, so ZeroMQ never hands the server a message of
// it: nothing it sends is written, sampled or answered. Clients watch their own handshake
// (HandshakeWatch) so a refusal becomes an error naming the reason instead of a silent wait.
//
// Key files (`strider keys generate`), text, one `name = value` per line, `#` comments:
//   NAME.key         public = <40 Z85 characters>            hand it to peers that trust NAME
//   NAME.key_secret  public = <Z85>, secret = <Z85>, mode 0600: NAME's own identity
//
// No LibTorch here: replay, the CLI and the weight stream include it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/config.h"
#include "common/status.h"
#include "common/transport/auth.h"

namespace strider::transport {

inline constexpr size_t kZ85KeyChars = 40;

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters; empty for a public key alone
};

// False when this libzmq was built without CURVE (then every keyed endpoint is refused).
bool CurveAvailable();

Result<CurveKeyPair> GenerateCurveKeyPair();

// Writes DIR/NAME.key (mode 0644) and DIR/NAME.key_secret (mode 0600), creating DIR. An existing
// file of either name is AlreadyExists unless `overwrite`. NAME: letters, digits, '-', '_', '.'.
Status WriteCurveKeyFiles(const std::string& dir, const std::string& name,
                          const CurveKeyPair& keys, bool overwrite);

// The key pair of a NAME.key_secret file (its public key checked against the secret).
// NotFound for a missing file, InvalidArgument naming the file and line for a malformed one.
Result<CurveKeyPair> LoadCurveKeyPair(const std::string& path);
// The public key of a NAME.key or NAME.key_secret file.
Result<std::string> LoadCurvePublicKey(const std::string& path);
// The public keys of each path: a key file, or a directory whose *.key files are all read (one
// without any is an error, as is an empty list).
Result<std::set<std::string>> LoadAuthorizedKeys(const std::vector<std::string>& paths);

// Reads `secret_key`, `authorized_keys` and `insecure` from an `auth:` section, checking that
// they come together (authorized_keys without secret_key and the reverse are errors).
ServerAuth ReadServerAuth(ConfigReader& auth);
// Reads `secret_key` and `server_key`, which come together.
ClientAuth ReadClientAuth(ConfigReader& auth);

// True for addresses only this host can reach: tcp on 127.0.0.0/8, ::1 or localhost, ipc and
// inproc. Wildcards (*, 0.0.0.0, ::) and interface names are not loopback.
bool IsLoopbackEndpoint(std::string_view endpoint);
// The loopback rule: a non-loopback endpoint without a server key is InvalidArgument naming the
// endpoint and `what` unless auth.insecure.
Status CheckBindAllowed(const std::string& endpoint, const ServerAuth& auth,
                        std::string_view what);

// Answers ZAP requests (RFC 27) for every CURVE server socket of one ZeroMQ context, on its own
// thread, until destroyed. Destroy it before the context (it holds a socket there).
class ZapHandler {
 public:
  // `name` prefixes its log lines ("replay server actor endpoint").
  static Result<std::unique_ptr<ZapHandler>> Start(zmq::context_t& context,
                                                   std::set<std::string> authorized_z85,
                                                   std::string name);
  ~ZapHandler();
  uint64_t accepted() const { return accepted_; }
  uint64_t refused() const { return refused_; }

 private:
  ZapHandler(std::set<std::string> authorized, std::string name);
  void Loop();
  std::set<std::string> authorized_;  // binary keys, 32 bytes
  std::string name_;
  zmq::socket_t socket_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

// What a keyed server needs: its key pair and the ZAP handler of the context its sockets live
// in. Secure() before bind.
class CurveServer {
 public:
  // Loads the keys named by `auth` (enabled) and starts the ZAP handler in `context`.
  static Result<std::unique_ptr<CurveServer>> Start(zmq::context_t& context,
                                                    const ServerAuth& auth, std::string name);
  // Makes `socket` a CURVE server that asks the ZAP handler about each client.
  Status Secure(zmq::socket_t& socket) const;
  const ZapHandler& zap() const { return *zap_; }
  const std::string& public_key() const { return keys_.public_key; }

 private:
  CurveKeyPair keys_;
  std::unique_ptr<ZapHandler> zap_;
};

// A client's keys, loaded once; Secure() each socket before connecting.
class CurveClient {
 public:
  static Result<CurveClient> Load(const ClientAuth& auth);
  Status Secure(zmq::socket_t& socket) const;

 private:
  CurveKeyPair keys_;
  std::string server_public_;
};

// Follows the handshakes of one client socket (a ZeroMQ socket monitor) so a refused client
// can say so instead of waiting: create it before connecting, in the socket's context.
class HandshakeWatch {
 public:
  static Result<std::unique_ptr<HandshakeWatch>> Start(zmq::context_t& context,
                                                       zmq::socket_t& socket);
  ~HandshakeWatch();
  // Reads the events so far (never blocks): FailedPrecondition naming `peer` and the reason once
  // a handshake failed (the server refused this client's key, or the two sides disagree on
  // security: one has keys, the other not, or the server key is wrong), OK otherwise.
  Status Check(const std::string& peer);
  // A handshake completed since the start.
  bool succeeded() const { return succeeded_; }

 private:
  HandshakeWatch() = default;
  zmq::socket_t* monitored_ = nullptr;
  zmq::socket_t pair_;
  bool succeeded_ = false;
  int no_detail_in_a_row_ = 0;
  Status failure_;
};

}  // namespace strider::transport
