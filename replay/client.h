// Clients of the replay server: ActorClient streams segments in, LearnerClient samples them.
//
// Both are single-threaded objects (one per thread) that own their ZeroMQ socket.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/schema/messages.h"
#include "common/status.h"
#include "common/transport/auth.h"

namespace strider::replay {

struct ActorClientOptions {
  std::string endpoint;  // the server's actor endpoint
  std::string client_id = "actor";
  // No acknowledgement for this long while segments are in flight: the connection is presumed
  // lost (for example the server restarted) and every unacknowledged segment is sent again on a
  // fresh connection.
  std::chrono::milliseconds ack_timeout{5000};
  // Send and Flush give up with Unavailable after waiting this long without any progress.
  std::chrono::milliseconds give_up_after{60000};
  // How long a (re)connection waits for the server's greeting before giving up; 0: give_up_after.
  // A caller with somewhere else to put its segments (an actor's spill directory) keeps it short,
  // so it is not blocked for long by a server that is gone.
  std::chrono::milliseconds connect_timeout{0};
  // Segments waiting to be sent go out several to a frame, up to this many bytes in all, when the
  // server reads such frames (its credit says so). A segment waits for others only while earlier
  // ones are unacknowledged, as in Nagle's algorithm: a lone segment goes out at once, a stream
  // goes out in frames of this size. Flush sends what waits. 0: one segment per frame.
  uint64_t batch_bytes = 4 << 20;
  schema::DecodeLimits limits;
  // This actor's key pair and the server's public key; empty: no CURVE. A server that refuses
  // the key (or wants one) makes Connect fail with FailedPrecondition saying so.
  transport::ClientAuth auth;
};

// Whether the client sends the segment of this error reply again by itself (credit exhausted,
// a storage error, a full disk); any other error with a key refuses that segment for good.
bool IsResent(const schema::ErrorReply& error);

// Streams segments with credit flow control:
//  - the server grants a credit (bytes); the client never has more unacknowledged envelope
//    bytes in flight, so Send blocks while the server's disk is behind (once a frame's worth of
//    segments waits);
//  - an ack means the segment is in the server's write-ahead log;
//  - unacknowledged segments are kept and resent after a reconnect; the server stores a
//    segment once however often it arrives.
class ActorClient {
 public:
  static Result<std::unique_ptr<ActorClient>> Connect(const ActorClientOptions& options);
  ~ActorClient();

  // Validates, encodes and sends one segment, or keeps it to go out with the next ones while
  // earlier segments are unacknowledged (ActorClientOptions::batch_bytes); blocks while the
  // credit is used up and a full frame waits. Errors:
  // InvalidArgument for a segment that fails validation (nothing is sent), Unavailable when the
  // server made no progress for give_up_after.
  Status Send(const schema::SegmentData& segment);
  // Sends an already encoded segment frame (the benchmark reuses frames). The shared form never
  // copies the bytes: ZeroMQ sends from them, and the client keeps a reference until the segment
  // is acknowledged (for resends), so the caller may share one frame between clients.
  Status SendFrame(const schema::SegmentKey& key, std::string frame);
  Status SendFrame(const schema::SegmentKey& key, std::shared_ptr<const std::string> frame);
  // Sends what waits and waits until every segment is acknowledged or rejected, up to `timeout`.
  Status Flush(std::chrono::milliseconds timeout);

  // Keys acknowledged since the last call (durable on the server).
  std::vector<schema::SegmentKey> TakeAcked();
  // Errors the server sent back (each names its reason) since the last call.
  std::vector<schema::ErrorReply> TakeErrors();

  uint64_t acked_count() const { return acked_count_; }
  // Frames sent on any connection: fewer than segments sent when they went out batched.
  uint64_t frames_sent() const { return frames_sent_; }
  uint64_t unacked_count() const { return unacked_.size(); }
  uint64_t in_flight_bytes() const { return in_flight_bytes_; }
  uint64_t credit_bytes() const { return credit_bytes_; }
  uint64_t reconnects() const { return reconnects_; }
  uint64_t resent() const { return resent_; }
  // Sends a stats request on the actor endpoint and returns the JSON.
  Result<std::string> Stats(std::chrono::milliseconds timeout);

 private:
  struct Unacked {
    std::shared_ptr<const std::string> frame;
    bool sent = false;
  };
  explicit ActorClient(ActorClientOptions options);
  Status Reconnect();
  // Sends waiting segments while the credit allows, several to a frame when the server reads
  // such frames. Without `flush`, an unfilled frame stays while segments are in flight.
  Status SendWaiting(bool flush);
  // The most bytes of one batched frame on this connection; 0: one segment per frame.
  uint64_t FrameLimit() const;
  // Reads what the server sent, waiting up to `wait` for the first message.
  Status Pump(std::chrono::milliseconds wait);
  Status HandleReply(std::string_view frame);

  struct Socket;
  ActorClientOptions options_;
  std::unique_ptr<Socket> socket_;
  std::map<schema::SegmentKey, Unacked> unacked_;  // sent or waiting for credit
  std::vector<schema::SegmentKey> acked_;
  std::vector<schema::ErrorReply> errors_;
  std::string last_stats_;
  uint64_t credit_bytes_ = 0;
  uint64_t server_max_frame_bytes_ = 0;
  uint64_t server_instance_ = 0;
  uint64_t in_flight_bytes_ = 0;
  uint64_t waiting_bytes_ = 0;  // in unacked_, not sent
  uint64_t frames_sent_ = 0;
  uint64_t acked_count_ = 0;
  uint64_t reconnects_ = 0;
  uint64_t resent_ = 0;
  std::chrono::steady_clock::time_point last_progress_;
  std::chrono::steady_clock::time_point hold_until_{};  // no sends before (a disk_full reply)
  std::chrono::steady_clock::time_point last_pump_;
};

struct LearnerClientOptions {
  std::string endpoint;  // the server's learner endpoint
  std::string learner_id = "learner";
  std::string table;     // empty: the server's first table
  // Data-parallel learner ranks: the `world_size` ranks of one learner id share each step's
  // draw, and rank r gets units [r n / world_size, (r + 1) n / world_size) of the n drawn
  // (schema 1.3; `count` in Sample is the whole group's).
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // A request unanswered for this long is sent again on a fresh connection (it is idempotent).
  std::chrono::milliseconds request_timeout{3000};
  schema::DecodeLimits limits;
  // As ActorClientOptions::auth; a refusal is FailedPrecondition from the call that met it.
  transport::ClientAuth auth;
};

struct SampledItem {
  uint64_t sequence = 0;  // the handle for UpdatePriorities
  uint32_t times_sampled = 0;
  schema::SegmentData segment;
};

struct SampleBatch {
  uint64_t step = 0;
  bool replayed = false;  // this step was answered before (the learner resumed)
  std::vector<SampledItem> items;
};

// Samples with durable, idempotent steps: the server records the answer to (learner, step), so a
// learner that restarts from a checkpoint taken after step S and asks for S+1, S+2, ... gets
// exactly what it got before for steps already answered and fresh data after them.
class LearnerClient {
 public:
  static Result<std::unique_ptr<LearnerClient>> Connect(const LearnerClientOptions& options);
  ~LearnerClient();

  // Up to `count` segments for `step` (from 1); in a trajectory or group table, `count` units,
  // each as all its segments in order, every one carrying the unit's handle. Waits (retrying every few ms) while the table
  // is not ready (rate limiter, too few items) up to `timeout`, then ResourceExhausted naming
  // the server's reason. Unavailable only when a request went unanswered for request_timeout,
  // however short `timeout` is.
  Result<SampleBatch> Sample(uint64_t step, uint32_t count, uint64_t policy_version,
                             std::chrono::milliseconds timeout);
  Status UpdatePriorities(const std::vector<uint64_t>& sequences,
                          const std::vector<double>& priorities);
  // Every stored segment of one trajectory, or of one group's trajectories (by group index),
  // in order, complete or not; nothing is counted as sampled. Needs a trajectory or group
  // table (InvalidArgument otherwise); NotFound when none of it is stored. Items carry their
  // own sequence numbers (priorities are set with the handles Sample returns).
  Result<SampleBatch> FetchTrajectory(const schema::TrajectoryId& trajectory);
  Result<SampleBatch> FetchGroup(const schema::TrajectoryId& group);
  Result<std::string> Stats();

 private:
  explicit LearnerClient(LearnerClientOptions options);
  Status Reconnect();
  Result<SampleBatch> Fetch(const std::string& request);
  // Sends `request` and waits for a reply accepted by `accept`, resending on timeouts.
  Result<schema::Message> Call(const std::string& request, schema::MessageKind expected,
                               uint64_t step, std::chrono::milliseconds timeout);

  struct Socket;
  LearnerClientOptions options_;
  std::unique_ptr<Socket> socket_;
};

}  // namespace strider::replay
