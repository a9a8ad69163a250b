// The actor's outgoing segment stream: one thread that owns the replay ActorClient and the
// spill directory, so the decode loop never waits on the network.
//
//   decode loop ──Push──> [queue, bounded] ──> sender thread ──> ActorClient ──> replay server
//                                                   │   ^ acks delete spilled files
//                                                   v   │
//                                           spill directory (bounded)
//
// Order of sending: spilled files first (oldest first; they include files from an earlier run),
// then the queue. The server unreachable (no connection, or no progress for `spill_after`):
// queued and unacknowledged segments go to the spill directory together and the connection is
// retried every `retry_every`, each attempt waiting at most 0.5 s for the server's greeting;
// what is queued meanwhile goes to disk before each attempt. Spill full and server down: segments wait in the queue and Backlogged()
// tells the actor to start no new episodes, so data is never dropped. Close() flushes, and
// spills what the server did not acknowledge in time.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "actors/spill.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/schema/messages.h"
#include "common/status.h"
#include "replay/client.h"

namespace strider::actors {

struct SenderOptions {
  std::string endpoint;  // the replay server's actor endpoint
  std::string client_id = "actor";
  std::string spill_dir;  // required
  uint64_t spill_max_bytes = uint64_t{1} << 30;
  uint64_t queue_max_bytes = uint64_t{64} << 20;  // Backlogged() above this
  std::chrono::milliseconds spill_after{3000};    // no progress this long: spill, reconnect
  std::chrono::milliseconds retry_every{1000};
  transport::ClientAuth auth;  // CURVE keys for the replay server; empty: none
};

struct SenderStats {
  uint64_t queued_segments = 0;
  uint64_t queued_bytes = 0;
  uint64_t in_flight = 0;  // sent, not acknowledged
  uint64_t acked = 0;
  uint64_t spilled = 0;      // segments written to the spill directory (total)
  uint64_t spill_files = 0;  // files there now
  uint64_t spill_bytes = 0;
  uint64_t sent_from_spill = 0;
  uint64_t rejected = 0;  // segments the server refused for good
  uint64_t reconnects = 0;
  bool connected = false;
};

class Sender {
 public:
  static Result<std::unique_ptr<Sender>> Start(const SenderOptions& options);
  ~Sender();

  // Encodes (validating) and queues one segment. InvalidArgument for a segment that fails
  // validation: a bug of the caller, reported rather than sent.
  Status Push(const schema::SegmentData& segment) EXCLUDES(mutex_);
  // The queue is over its bound: start no new episodes.
  bool Backlogged() const EXCLUDES(mutex_);
  // Waits up to `timeout` for everything to be acknowledged, spills the rest, stops the thread.
  // Error when segments could be neither acknowledged nor spilled (they are reported by key).
  // Called by one thread at a time (the actor's loop, then the destructor).
  Status Close(std::chrono::milliseconds timeout) EXCLUDES(mutex_);
  SenderStats stats() const EXCLUDES(mutex_);

 private:
  struct Frame {
    schema::SegmentKey key;
    std::string bytes;
  };
  explicit Sender(SenderOptions options, SpillDirectory spill);
  void Loop() EXCLUDES(mutex_);
  bool TryConnect() EXCLUDES(mutex_);
  // Sends one frame; false when the connection is lost (the frame stays in flight).
  bool SendOne(const schema::SegmentKey& key, std::string bytes, bool from_spill)
      EXCLUDES(mutex_);
  void CollectAcks() EXCLUDES(mutex_);
  // Connection lost: in-flight frames from memory go to the spill directory (or back to the
  // front of the queue when it is full), the client is dropped.
  void DropConnection(const std::string& why) EXCLUDES(mutex_);
  // No connection: moves queued frames to the spill directory while it has room.
  void SpillQueue() EXCLUDES(mutex_);
  void SpillQueueLocked() REQUIRES(mutex_);
  // The queue's and the spill directory's sizes into stats_.
  void UpdateQueueStats() REQUIRES(mutex_);
  // Whether the loop is done: stopping, and nothing left to send or the deadline passed.
  bool Finished(bool past_deadline) REQUIRES(mutex_);

  const SenderOptions options_;
  mutable Mutex mutex_;
  CondVar wake_;  // Push and Close wake the sender thread
  std::deque<Frame> queue_ GUARDED_BY(mutex_);
  uint64_t queued_bytes_ GUARDED_BY(mutex_) = 0;
  bool stop_ GUARDED_BY(mutex_) = false;
  Clock::time_point stop_deadline_ GUARDED_BY(mutex_);
  SenderStats stats_ GUARDED_BY(mutex_);
  Status close_status_ GUARDED_BY(mutex_);

  // Sender thread only (the spill directory is also read under mutex_ for stats_, from that
  // thread).
  SpillDirectory spill_;
  std::unique_ptr<replay::ActorClient> client_;
  std::map<schema::SegmentKey, std::optional<std::string>> in_flight_;  // nullopt: from spill
  Clock::time_point last_progress_;
  Clock::time_point next_connect_;
  bool unreachable_ = false;  // a connection attempt failed or a connection was dropped
  std::string last_refusal_;  // the server's refusal of our key, once logged
  // Started by Start, joined by Close.
  std::thread thread_;
};

}  // namespace strider::actors
