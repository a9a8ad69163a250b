// ZeroMQ helpers shared by the replay server and its clients (later: actors, weight streaming).
//
// Every socket made here has linger 0 (closing never blocks on unsent data: the protocols above
// resend what was not acknowledged) and a hard receive size ceiling. The ceiling is a last line
// of defence only: ZeroMQ disconnects a peer that crosses it, so callers set it well above their
// own message size limit and reject oversized-but-plausible messages themselves, with a reply.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"

namespace strider::transport {

// OK for tcp://host:port, ipc://path and inproc://name; InvalidArgument naming the endpoint else.
Status CheckEndpoint(std::string_view endpoint);

// A socket of `type` with linger 0 and ZMQ_MAXMSGSIZE = `hard_max_message_bytes` (0: none).
Result<zmq::socket_t> MakeSocket(zmq::context_t& context, zmq::socket_type type,
                                 size_t hard_max_message_bytes = 0);

// Binds and returns the endpoint actually bound (port 0 or "*" resolved by the kernel).
Result<std::string> Bind(zmq::socket_t& socket, const std::string& endpoint);
Status Connect(zmq::socket_t& socket, const std::string& endpoint);

// The bound endpoint with a wildcard address (0.0.0.0, *) replaced by 127.0.0.1, for clients on
// the same host.
std::string LocalEndpoint(const std::string& bound_endpoint);

// True when `socket` has a message to read within `timeout` (0: just check).
Result<bool> WaitReadable(zmq::socket_t& socket, std::chrono::milliseconds timeout);

// All parts of one message, or an empty vector when none is waiting (non-blocking).
Result<std::vector<zmq::message_t>> ReceiveParts(zmq::socket_t& socket);

// Sends the parts as one message. Blocks while the peer's pipe is full unless `dont_wait`,
// in which case a full pipe gives ResourceExhausted.
Status SendParts(zmq::socket_t& socket, const std::vector<std::string_view>& parts,
                 bool dont_wait = false);

// Asks the scheduler to treat the calling thread as latency-sensitive: a short time slice (the
// EEVDF per-task slice of Linux 6.12 and later, no privilege needed), so that when it wakes it
// runs ahead of threads doing bulk work instead of waiting for their slices to end. Its share of
// CPU time stays the same. A no-op where the kernel does not support it.
void MarkLatencySensitive();

// A context whose I/O threads are latency-sensitive as above: for sockets that carry small
// requests and replies next to bulk traffic on the same machine. The I/O threads start with the
// first socket; call MarkIoThreads after creating it.
class LatencySensitiveContext {
 public:
  LatencySensitiveContext();
  zmq::context_t& get() { return context_; }
  // Marks this context's I/O threads (found by the name prefix it gave them), waiting up to
  // about 100 ms for them to have started.
  void MarkIoThreads();

 private:
  int prefix_;
  zmq::context_t context_;
};

// Sends `bytes` as a one-part message without copying them: ZeroMQ holds a reference until its
// I/O thread has written them (also past a close with pending messages). Blocks like SendParts.
Status SendShared(zmq::socket_t& socket, std::shared_ptr<const std::string> bytes,
                  bool dont_wait = false);

inline std::string_view View(const zmq::message_t& message) {
  return {static_cast<const char*>(message.data()), message.size()};
}

}  // namespace strider::transport
