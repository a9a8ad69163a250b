#include "common/transport/curve.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <zmq.h>

#include <algorithm>
#include <cstring>
#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/durable_file.h"
#include "common/transport/zmq_util.h"

namespace strider::transport {
namespace {

namespace fs = std::filesystem;

constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
// Every keyed server socket names this domain; ZeroMQ only consults a ZAP handler for sockets
// that have one (or use CURVE), and the handler refuses any other domain.
constexpr char kZapDomain[] = "strider";
// Handshakes lost without a reason in a row before a client calls it a refusal: a server whose
// key the client has wrong cannot decrypt the client's hello and just drops the connection, but
// so does, once, a server stopping mid-handshake.
constexpr int kNoDetailFailures = 3;

std::string Z85Encode(std::string_view binary) {
  std::array<char, kZ85KeyChars + 1> text{};
  zmq_z85_encode(text.data(), reinterpret_cast<const uint8_t*>(binary.data()), binary.size());
  return std::string(text.data());
}

bool ValidZ85Key(std::string_view text) {
  if (text.size() != kZ85KeyChars) return false;
  std::array<uint8_t, 32> binary{};
  const std::string copy(text);
  return zmq_z85_decode(binary.data(), copy.c_str()) != nullptr;
}

Result<std::string> ReadFile(const std::string& path) {
  std::error_code error;
  if (!fs::exists(path, error)) return Status::NotFound(path + ": no such key file");
  if (fs::is_directory(path, error)) {
    return Status::InvalidArgument(path + ": is a directory, not a key file");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status::IoError(path + ": cannot open key file");
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The `name = value` lines of a key file, each key a valid Z85 key.
Result<std::map<std::string, std::string>> ParseKeyFile(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::map<std::string, std::string> fields;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  auto trim = [](std::string s) {
    const auto first = s.find_first_not_of(" \t\r");
    if (first == std::string::npos) return std::string();
    return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
  };
  while (std::getline(lines, line)) {
    ++number;
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    const size_t equals = line.find('=');
    if (equals == std::string::npos) {
      return Status::InvalidArgument(where + "expected 'public = KEY' or 'secret = KEY'");
    }
    const std::string name = trim(line.substr(0, equals));
    const std::string value = trim(line.substr(equals + 1));
    if (name != "public" && name != "secret") {
      return Status::InvalidArgument(where + "unknown field '" + name +
                                     "' (a key file has 'public' and, secret, 'secret')");
    }
    if (!ValidZ85Key(value)) {
      return Status::InvalidArgument(where + name + " is not a CURVE key (" +
                                     std::to_string(kZ85KeyChars) +
                                     " Z85 characters expected, got " +
                                     std::to_string(value.size()) + " characters)");
    }
    if (!fields.emplace(name, value).second) {
      return Status::InvalidArgument(where + "'" + name + "' given twice");
    }
  }
  if (!fields.count("public")) {
    return Status::InvalidArgument(path + ": no 'public = KEY' line: not a strider key file");
  }
  return fields;
}

bool ValidKeyName(const std::string& name) {
  return !name.empty() && name[0] != '.' &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
         });
}

Status WriteText(const fs::path& path, const std::string& text, mode_t mode) {
  // The exact mode is set before the secret is written, so no one else can read it even for a
  // moment, and the key is on disk before a service is told to use it.
  return WriteFileDurably(path, text, mode);
}

std::string ShortKey(const std::string& binary) { return Z85Encode(binary); }

}  // namespace

bool CurveAvailable() { return zmq_has("curve") == 1; }

Result<CurveKeyPair> GenerateCurveKeyPair() {
  if (!CurveAvailable()) {
    return Status::Unimplemented("this libzmq was built without CURVE (zmq_has(\"curve\") is 0)");
  }
  std::array<char, kZ85KeyChars + 1> public_key{}, secret_key{};
  if (zmq_curve_keypair(public_key.data(), secret_key.data()) != 0) {
    return Status::Internal(std::string("zmq_curve_keypair failed: ") + zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{public_key.data(), secret_key.data()};
}

Status WriteCurveKeyFiles(const std::string& dir, const std::string& name,
                          const CurveKeyPair& keys, bool overwrite) {
  if (!ValidKeyName(name)) {
    return Status::InvalidArgument("key name '" + name +
                                   "' must be letters, digits, '-', '_' or '.', not starting "
                                   "with '.'");
  }
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return Status::IoError("cannot create " + dir + ": " + error.message());
  const fs::path public_path = fs::path(dir) / (name + ".key");
  const fs::path secret_path = fs::path(dir) / (name + ".key_secret");
  if (!overwrite) {
    for (const fs::path& path : {public_path, secret_path}) {
      if (fs::exists(path, error)) {
        return Status::AlreadyExists(path.string() +
                                     " exists; remove it or pass --force to replace the pair");
      }
    }
  }
  STRIDER_RETURN_IF_ERROR(WriteText(
      secret_path,
      "# strider CURVE key pair '" + name + "' (Z85). Secret: keep it on the host that uses it.\n"
      "public = " + keys.public_key + "\nsecret = " + keys.secret_key + "\n",
      0600));
  return WriteText(public_path,
                   "# strider CURVE public key '" + name +
                       "' (Z85). Give it to the services that should trust '" + name + "'.\n"
                       "public = " + keys.public_key + "\n",
                   0644);
}

Result<CurveKeyPair> LoadCurveKeyPair(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(auto fields, ParseKeyFile(path));
  auto secret = fields.find("secret");
  if (secret == fields.end()) {
    return Status::InvalidArgument(path + ": has no 'secret = KEY' line: a public key file (" +
                                   "NAME.key) where a key pair (NAME.key_secret) is needed");
  }
  std::array<char, kZ85KeyChars + 1> derived{};
  if (zmq_curve_public(derived.data(), secret->second.c_str()) != 0 ||
      fields["public"] != derived.data()) {
    return Status::InvalidArgument(path + ": its public key does not belong to its secret key");
  }
  return CurveKeyPair{fields["public"], secret->second};
}

Result<std::string> LoadCurvePublicKey(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(auto fields, ParseKeyFile(path));
  return fields["public"];
}

Result<std::set<std::string>> LoadAuthorizedKeys(const std::vector<std::string>& paths) {
  if (paths.empty()) {
    return Status::InvalidArgument(
        "auth.authorized_keys is empty: a keyed server needs the clients it lets in");
  }
  std::set<std::string> keys;
  for (const std::string& path : paths) {
    std::error_code error;
    if (!fs::is_directory(path, error)) {
      STRIDER_ASSIGN_OR_RETURN(std::string key, LoadCurvePublicKey(path));
      keys.insert(key);
      continue;
    }
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(path, error)) {
      if (entry.path().extension() == ".key") files.push_back(entry.path());
    }
    if (error) return Status::IoError("cannot read " + path + ": " + error.message());
    if (files.empty()) return Status::InvalidArgument(path + ": a key directory without *.key files");
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      STRIDER_ASSIGN_OR_RETURN(std::string key, LoadCurvePublicKey(file.string()));
      keys.insert(key);
    }
  }
  return keys;
}

ServerAuth ReadServerAuth(ConfigReader& auth) {
  ServerAuth result;
  auth.Optional("secret_key", &result.secret_key);
  auth.Optional("authorized_keys", &result.authorized_keys);
  auth.Optional("insecure", &result.insecure);
  auth.Check(result.secret_key.empty() || !result.authorized_keys.empty(), "authorized_keys",
             "is required with secret_key (the clients' NAME.key files or a directory of them)");
  auth.Check(!result.secret_key.empty() || result.authorized_keys.empty(), "secret_key",
             "is required with authorized_keys (this server's NAME.key_secret)");
  return result;
}

ClientAuth ReadClientAuth(ConfigReader& auth) {
  ClientAuth result;
  auth.Optional("secret_key", &result.secret_key);
  auth.Optional("server_key", &result.server_key);
  auth.Check(result.secret_key.empty() || !result.server_key.empty(), "server_key",
             "is required with secret_key (the server's NAME.key)");
  auth.Check(!result.secret_key.empty() || result.server_key.empty(), "secret_key",
             "is required with server_key (this client's NAME.key_secret)");
  return result;
}

bool IsLoopbackEndpoint(std::string_view endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return true;
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  std::string_view rest = endpoint.substr(6);
  // A source address (tcp://src;dst) is about the other end: look at the bound one.
  if (const size_t semicolon = rest.find(';'); semicolon != std::string_view::npos) {
    rest = rest.substr(semicolon + 1);
  }
  const size_t colon = rest.rfind(':');
  const std::string_view host = colon == std::string_view::npos ? rest : rest.substr(0, colon);
  if (host == "localhost" || host == "[::1]" || host == "::1") return true;
  if (host.rfind("127.", 0) != 0) return false;
  int dots = 0;
  for (char c : host) {
    if (c == '.') {
      ++dots;
    } else if (!std::isdigit(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return dots == 3;
}

Status CheckBindAllowed(const std::string& endpoint, const ServerAuth& auth,
                        std::string_view what) {
  if (auth.enabled() || auth.insecure || IsLoopbackEndpoint(endpoint)) return Status::Ok();
  return Status::InvalidArgument(
      std::string(what) + ": " + endpoint +
      " is reachable from other hosts and has no keys: set auth.secret_key and "
      "auth.authorized_keys (`strider keys generate`), bind a loopback address, or set "
      "auth.insecure: true to accept any client");
}

// ------------------------------------------------------------------------------ ZAP handler

ZapHandler::ZapHandler(std::set<std::string> authorized, std::string name)
    : authorized_(std::move(authorized)), name_(std::move(name)) {}

Result<std::unique_ptr<ZapHandler>> ZapHandler::Start(zmq::context_t& context,
                                                      std::set<std::string> authorized_z85,
                                                      std::string name) {
  std::set<std::string> binary;
  for (const std::string& z85 : authorized_z85) {
    std::array<uint8_t, 32> key{};
    if (z85.size() != kZ85KeyChars || zmq_z85_decode(key.data(), z85.c_str()) == nullptr) {
      return Status::InvalidArgument(name + ": '" + z85 + "' is not a Z85 CURVE public key");
    }
    binary.insert(std::string(reinterpret_cast<const char*>(key.data()), key.size()));
  }
  std::unique_ptr<ZapHandler> handler(new ZapHandler(std::move(binary), std::move(name)));
  STRIDER_ASSIGN_OR_RETURN(handler->socket_, MakeSocket(context, zmq::socket_type::rep));
  try {
    handler->socket_.bind(kZapEndpoint);
  } catch (const zmq::error_t& error) {
    return Status::Internal(handler->name_ + ": cannot start its ZAP handler on " + kZapEndpoint +
                            ": " + error.what() + " (one handler per ZeroMQ context)");
  }
  handler->thread_ = std::thread([h = handler.get()] {
    NameThisThread("zap");
    h->Loop();
  });
  return handler;
}

ZapHandler::~ZapHandler() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  socket_.close();
}

void ZapHandler::Loop() {
  while (!stop_) {
    Result<bool> readable = WaitReadable(socket_, std::chrono::milliseconds(50));
    if (!readable.ok() || !*readable) continue;
    Result<std::vector<zmq::message_t>> parts = ReceiveParts(socket_);
    if (!parts.ok() || parts->empty()) continue;
    // RFC 27 request: version, request id, domain, address, routing id, mechanism, credentials.
    const std::vector<zmq::message_t>& request = *parts;
    const std::string version = request.size() > 0 ? std::string(View(request[0])) : "";
    const std::string request_id = request.size() > 1 ? std::string(View(request[1])) : "";
    std::string status = "400", text;
    std::string address, key;
    if (request.size() < 6 || version != "1.0") {
      status = "500";
      text = "malformed ZAP request";
    } else {
      const std::string_view domain = View(request[2]);
      address = std::string(View(request[3]));
      const std::string_view mechanism = View(request[5]);
      if (mechanism != "CURVE" || request.size() < 7 || request[6].size() != 32) {
        text = "CURVE required";
      } else if (domain != kZapDomain) {
        text = "unknown domain";
      } else {
        key = std::string(View(request[6]));
        if (authorized_.count(key)) {
          status = "200";
          text = "OK";
        } else {
          text = "client key not authorised";
        }
      }
      if (status == "200") {
        ++accepted_;
      } else {
        ++refused_;
        spdlog::warn("{}: refused a client from {}: {} (key {})", name_,
                     address.empty() ? "an unknown address" : address, text,
                     key.empty() ? "none" : ShortKey(key));
      }
    }
    // Reply: version, request id, status code, status text, user id, metadata.
    const std::string user_id = key.empty() ? "" : ShortKey(key);
    // Unanswered, the client's handshake stalls until libzmq's own timeout; say why.
    if (const Status sent = SendParts(socket_, {"1.0", request_id, status, text, user_id, ""});
        !sent.ok()) {
      spdlog::warn("{}: cannot answer an authentication request: {}", name_, sent.message());
    }
  }
}

// ------------------------------------------------------------------------------ server, client

Result<std::unique_ptr<CurveServer>> CurveServer::Start(zmq::context_t& context,
                                                        const ServerAuth& auth, std::string name) {
  if (!auth.enabled()) return Status::InvalidArgument(name + ": no auth.secret_key");
  if (!CurveAvailable()) {
    return Status::Unimplemented(name + ": this libzmq was built without CURVE");
  }
  auto server = std::make_unique<CurveServer>();
  Result<CurveKeyPair> keys = LoadCurveKeyPair(auth.secret_key);
  if (!keys.ok()) return keys.status().WithContext(name + ": auth.secret_key");
  server->keys_ = std::move(*keys);
  Result<std::set<std::string>> authorized = LoadAuthorizedKeys(auth.authorized_keys);
  if (!authorized.ok()) return authorized.status().WithContext(name + ": auth.authorized_keys");
  STRIDER_ASSIGN_OR_RETURN(server->zap_,
                           ZapHandler::Start(context, std::move(*authorized), std::move(name)));
  return server;
}

Status CurveServer::Secure(zmq::socket_t& socket) const {
  try {
    socket.set(zmq::sockopt::curve_server, true);
    socket.set(zmq::sockopt::curve_secretkey, keys_.secret_key);
    socket.set(zmq::sockopt::zap_domain, kZapDomain);
    return Status::Ok();
  } catch (const zmq::error_t& error) {
    return Status::Internal(std::string("cannot make a CURVE server socket: ") + error.what());
  }
}

Result<CurveClient> CurveClient::Load(const ClientAuth& auth) {
  if (!auth.enabled()) return Status::InvalidArgument("no auth.secret_key");
  if (!CurveAvailable()) return Status::Unimplemented("this libzmq was built without CURVE");
  CurveClient client;
  STRIDER_ASSIGN_OR_RETURN(client.keys_, LoadCurveKeyPair(auth.secret_key));
  STRIDER_ASSIGN_OR_RETURN(client.server_public_, LoadCurvePublicKey(auth.server_key));
  return client;
}

Status CurveClient::Secure(zmq::socket_t& socket) const {
  try {
    socket.set(zmq::sockopt::curve_serverkey, server_public_);
    socket.set(zmq::sockopt::curve_publickey, keys_.public_key);
    socket.set(zmq::sockopt::curve_secretkey, keys_.secret_key);
    return Status::Ok();
  } catch (const zmq::error_t& error) {
    return Status::Internal(std::string("cannot make a CURVE client socket: ") + error.what());
  }
}

// ------------------------------------------------------------------------------ handshake watch

Result<std::unique_ptr<HandshakeWatch>> HandshakeWatch::Start(zmq::context_t& context,
                                                              zmq::socket_t& socket) {
  static std::atomic<uint64_t> next{0};
  const std::string endpoint = "inproc://strider-handshake-" + std::to_string(next++);
  std::unique_ptr<HandshakeWatch> watch(new HandshakeWatch());
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(),
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0) {
    return Status::Internal(std::string("cannot monitor a ZeroMQ socket: ") +
                            zmq_strerror(zmq_errno()));
  }
  watch->monitored_ = &socket;
  STRIDER_ASSIGN_OR_RETURN(watch->pair_, MakeSocket(context, zmq::socket_type::pair));
  try {
    watch->pair_.connect(endpoint);
  } catch (const zmq::error_t& error) {
    (void)zmq_socket_monitor(socket.handle(), nullptr, 0);
    return Status::Internal(std::string("cannot read a socket monitor: ") + error.what());
  }
  return watch;
}

HandshakeWatch::~HandshakeWatch() {
  // The monitored socket may be closed already (then its monitor is gone with it).
  if (monitored_ != nullptr && monitored_->handle() != nullptr) {
    (void)zmq_socket_monitor(monitored_->handle(), nullptr, 0);
  }
  pair_.close();
}

Status HandshakeWatch::Check(const std::string& peer) {
  while (failure_.ok()) {
    Result<std::vector<zmq::message_t>> parts = ReceiveParts(pair_);
    if (!parts.ok() || parts->empty()) break;
    if ((*parts)[0].size() < 6) continue;
    uint16_t event = 0;
    uint32_t value = 0;
    std::memcpy(&event, (*parts)[0].data(), sizeof(event));
    std::memcpy(&value, static_cast<const char*>((*parts)[0].data()) + 2, sizeof(value));
    switch (event) {
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        succeeded_ = true;
        no_detail_in_a_row_ = 0;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        failure_ = Status::FailedPrecondition(
            peer + " refused this client's key (ZAP status " + std::to_string(value) +
            "): add its NAME.key to the server's auth.authorized_keys");
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        failure_ = Status::FailedPrecondition(
            peer + ": security handshake failed (ZeroMQ protocol error 0x" +
            fmt::format("{:x}", value) +
            "): one side has CURVE keys (auth:) and the other not, or the server key is wrong");
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        if (++no_detail_in_a_row_ >= kNoDetailFailures) {
          failure_ = Status::FailedPrecondition(
              peer + ": security handshake failed: the connection closed during it " +
              std::to_string(kNoDetailFailures) +
              " times in a row: the server wants CURVE keys this client lacks (auth:), or "
              "auth.server_key is not the server's public key");
        }
        break;
      default:
        break;
    }
  }
  return failure_;
}

}  // namespace strider::transport
