// The `auth:` blocks of the services' configs: which CURVE keys an endpoint uses
// (common/transport/curve.h does the work; docs/fleet.md, "Authentication (CURVE)"). Plain
// structs without ZeroMQ, for the option structs of the replay server, its clients, the actor
// and the learner.
#pragma once

#include <string>
#include <vector>

namespace strider::transport {

// The `auth:` block of a service that binds an endpoint (replay server, weight publisher).
struct ServerAuth {
  // This service's NAME.key_secret; empty: no CURVE (plain ZeroMQ, anyone may connect).
  std::string secret_key;
  // Key files or directories of *.key files: the clients allowed in. Required with secret_key.
  std::vector<std::string> authorized_keys;
  // Allows binding a non-loopback address without secret_key.
  bool insecure = false;
  bool enabled() const { return !secret_key.empty(); }
};

// The `auth:` block of a service that connects (actor, learner client).
struct ClientAuth {
  std::string secret_key;  // this client's NAME.key_secret; empty: no CURVE
  std::string server_key;  // the server's NAME.key (or NAME.key_secret); needed with secret_key
  bool enabled() const { return !secret_key.empty(); }
};

}  // namespace strider::transport
