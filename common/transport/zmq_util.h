// ZeroMQ helpers shared by the replay server and its clients (later: actors, weight streaming).
//
// Every socket made here has linger 0 (closing never blocks on unsent data: the protocols above
// resend what was not acknowledged) and a hard receive size ceiling. The ceiling is a last line
// of defence only: ZeroMQ disconnects a peer that crosses it, so callers set it well above their
// own message size limit and reject oversized-but-plausible messages themselves, with a reply.
#pragma once

#include <sys/types.h>

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

// Names the calling thread (cut to the kernel's 15 characters), as top -H, perf and
// /proc/PID/task show it: which stage is busy, at a glance.
void NameThisThread(const std::string& name);

// Lowers a thread's priority by `nice_steps` (its nice value goes up by that much; 0 leaves it
// as it is): in a contended machine it then gets the cores after threads at the usual priority.
// `thread_id` 0 is the calling thread; threads it creates later inherit the new value. Needs no
// privilege. False where the kernel refused.
bool LowerPriority(pid_t thread_id, int nice_steps);

// A ZeroMQ context whose I/O threads can be found, to set how they are scheduled: it names them
// "<n>/ZMQbg/IO/<i>" with a number n of its own. They start with its first socket.
class NamedContext {
 public:
  NamedContext();
  zmq::context_t& get() { return context_; }
  // The thread ids of its I/O threads, waiting up to about 100 ms for them to have started and
  // named themselves; empty if none has.
  std::vector<pid_t> IoThreads() const;

 private:
  int prefix_;
  zmq::context_t context_;
};

// A context whose I/O threads are latency-sensitive as above: for sockets that carry small
// requests and replies next to bulk traffic on the same machine. Call MarkIoThreads after
// creating the first socket.
class LatencySensitiveContext : public NamedContext {
 public:
  void MarkIoThreads();
};

// Sends `bytes` as a one-part message without copying them: ZeroMQ holds a reference until its
// I/O thread has written them (also past a close with pending messages). Blocks like SendParts.
Status SendShared(zmq::socket_t& socket, std::shared_ptr<const std::string> bytes,
                  bool dont_wait = false);

inline std::string_view View(const zmq::message_t& message) {
  return {static_cast<const char*>(message.data()), message.size()};
}

}  // namespace strider::transport
