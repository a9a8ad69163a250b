// The replay server's implementation, shared by the files that hold its stages:
//   server.cc     start-up (validation, recovery), shutdown, stats
//   ingest.cc     the actor thread and the writer threads
//   retention.cc  deleting the oldest segments while a table's bounds are exceeded
//   sampling.cc   the learner thread: samples, priorities, stats requests
// Private to replay/: clients use replay/replay.h.
//
// Threads and what they own:
//   actor thread    the actor ROUTER socket and a PULL socket the writer wakes it with; decodes
//                   and validates every frame, enforces credit, queues segments, sends acks
//   writer threads  (writer_threads of them) each take a group of queued segments, write it
//                   with their SegmentWriter (one batch with the log), publish it to the tables,
//                   apply retention, and hand completed keys back to the actor thread for acking.
//                   Several writers let RocksDB merge their batches into one log write and insert
//                   into the memtable in parallel, as it does for several threads calling Put.
//   learner thread  the learner ROUTER socket; samples, updates priorities, answers stats
// Writers run concurrently, and RocksDB may put their batches into the log in any order, so:
//   - a trajectory is in at most one batch in flight (busy_trajectories_): its summary is
//     read, updated and written by one writer at a time, never overwritten by an older value;
//   - batches are published to the tables in the order of their sequence numbers (tickets),
//     so a fifo learner's position never passes a segment that is still being written;
//   - counters are per writer (meta::NextSequenceSlot, meta::TableInsertsSlot).
// The tables and the learners' sampling state are shared between writer and learner threads
// under state_mutex_. A sample's durable record is written while holding it, so retention can
// never delete a segment between a draw being chosen and the draw being recorded; it goes to
// the sampling store's own log (replay/storage.h), so it never queues behind segment batches.
// A writer publishes a batch in chunks of kPublishChunk segments and lets a waiting learner
// request in between (LockStateForLearner): a batch of hundreds of small segments takes
// milliseconds to insert, which a sample must not wait out. The tables still see every batch
// whole before the next, in ticket order, and only segments already durable.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/schema/messages.h"
#include "common/status.h"
#include "common/transport/curve.h"
#include "common/transport/zmq_util.h"
#include "replay/replay.h"
#include "replay/storage.h"
#include "replay/table.h"

namespace strider::replay::internal {

inline uint64_t NowUnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// What the writer needs of a segment besides its bytes: read while it was validated in place.
using schema::SegmentFacts;

struct PendingSegment {
  std::string identity;
  // The frame it arrived in (shared by the segments batched in one frame) and its envelope there:
  // the bytes the store keeps.
  std::shared_ptr<const zmq::message_t> received;
  std::string_view envelope;
  SegmentFacts facts;
};

struct Completion {
  std::string identity;
  schema::SegmentKey key;
  uint64_t bytes = 0;
  std::string error;  // non-empty: the write failed, send an error instead of an ack
  std::string refused;  // non-empty: this segment is refused for good (a conflict)
  bool disk_full = false;  // the error is a full disk: the client sends it again later
};

struct LearnerState {
  uint64_t last_step = 0;
  uint64_t fifo_position = 0;
};

class LatencyWindow {
 public:
  void Add(double ms) EXCLUDES(mutex_) {
    MutexLock lock(&mutex_);
    if (samples_.size() < kSize) {
      samples_.push_back(ms);
    } else {
      samples_[next_] = ms;
    }
    next_ = (next_ + 1) % kSize;
  }
  std::pair<double, double> P50P99() EXCLUDES(mutex_) {
    MutexLock lock(&mutex_);
    if (samples_.empty()) return {0, 0};
    std::vector<double> sorted = samples_;
    std::sort(sorted.begin(), sorted.end());
    auto at = [&](double q) { return sorted[std::min(sorted.size() - 1,
                                                     static_cast<size_t>(q * sorted.size()))]; };
    return {at(0.50), at(0.99)};
  }

 private:
  static constexpr size_t kSize = 4096;
  Mutex mutex_;
  std::vector<double> samples_ GUARDED_BY(mutex_);
  size_t next_ GUARDED_BY(mutex_) = 0;
};

// Rejects for a message an endpoint does not take and for a table the server does not have:
// the same reason and wording on both endpoints.
inline Status NotAccepted(schema::MessageKind kind, std::string_view endpoint) {
  return Status::InvalidArgument(std::string(schema::reject::kUnexpected) + ": " +
                                 std::string(schema::MessageKindName(kind)) +
                                 " is not accepted on the " + std::string(endpoint) +
                                 " endpoint");
}
inline Status NoTable(const std::string& name) {
  return Status::InvalidArgument(std::string(schema::reject::kUnexpected) + ": no table named '" +
                                 name + "'");
}

// Fills in what the options leave to the server (the learner endpoint, the default table) and
// checks what Start would otherwise find only after opening the store: the endpoints, the limits,
// the table names (server_config.cc).
Status CompleteAndCheckOptions(ServerOptions& options);

class ServerImpl : public ReplayServer {
 public:
  explicit ServerImpl(ServerOptions options) : options_(std::move(options)) {
    limits_.max_message_bytes = options_.max_message_bytes;
    limits_.max_token_id = options_.max_token_id;
    std::random_device device;
    instance_ = (uint64_t{device()} << 32) ^ device() ^ NowUnixMs();
  }
  ~ServerImpl() override { Stop(); }

  // Start-up runs before the server's threads exist, so nothing else touches the state yet,
  // and it calls functions that take the locks themselves (CheckSpace, ApplyRetention): the
  // analysis is off for it and for Recover.
  Status Init() NO_THREAD_SAFETY_ANALYSIS;
  std::string actor_endpoint() const override { return actor_endpoint_; }
  std::string learner_endpoint() const override { return learner_endpoint_; }
  std::string StatsJson() override { return Stats(true); }
  std::string StatsSnapshotJson() override { return Stats(false); }
  std::string Stats(bool new_window);
  void Stop() override;

 private:
  Status Recover() NO_THREAD_SAFETY_ANALYSIS;
  void ActorLoop();
  void WriterLoop(int slot) EXCLUDES(store_mutex_);
  // Takes up to write_batch_bytes of queued segments whose trajectories no other writer holds
  // and marks those trajectories busy.
  std::vector<PendingSegment> TakeGroup(std::vector<std::string>* trajectories)
      REQUIRES(queue_mutex_);
  void ReleaseTrajectories(const std::vector<std::string>& trajectories) EXCLUDES(queue_mutex_);
  void LearnerLoop() EXCLUDES(store_mutex_);

  void HandleActorFrame(const std::string& identity, zmq::message_t frame);
  void HandleActorMessage(const std::string& identity,
                          const std::shared_ptr<const zmq::message_t>& received,
                          std::string_view bytes);
  void SendActor(const std::string& identity, const std::string& frame);
  // The credit an actor connection gets: its bytes in flight, and batched frames up to the
  // message size limit.
  std::string CreditMessage() const {
    return schema::EncodeCredit({options_.credit_bytes, instance_, limits_.max_message_bytes});
  }
  void Reject(zmq::socket_t& socket, const std::string& identity, const Status& status,
              const schema::SegmentKey* key);
  void SendAcks() EXCLUDES(done_mutex_);

  static std::string ConflictMessage(const schema::SegmentKey& key);
  void WriteGroup(std::vector<PendingSegment>& group, int slot,
                  const std::vector<std::string>& trajectories) REQUIRES_SHARED(store_mutex_);
  void ApplyRetention() REQUIRES_SHARED(store_mutex_);
  // Disk full (or over max_store_bytes): ingest stops until CheckSpace finds room again.
  void EnterDiskFull(const std::string& why) EXCLUDES(space_mutex_);
  std::string DiskFullMessage() EXCLUDES(space_mutex_);
  // Measures the store on disk; while ingest is stopped, resumes it when there is room.
  void CheckSpace() EXCLUDES(store_mutex_);
  // Closes open trajectories silent for abandon_after_s (see ServerOptions).
  void AbandonStale() REQUIRES_SHARED(store_mutex_);
  // Closes and opens the store again (read-only when that fails); waits for every user of it.
  Status ReopenStore() EXCLUDES(store_mutex_);
  // One per writer slot, its counters read from the store.
  Status MakeSegmentWriters() REQUIRES(store_mutex_);
  Status DeleteItems(const std::vector<std::pair<uint64_t, IndexRecord>>& victims)
      REQUIRES_SHARED(store_mutex_);

  void HandleLearnerFrame(const std::string& identity, const zmq::message_t& frame)
      REQUIRES_SHARED(store_mutex_);
  schema::SampleReply Sample(const schema::SampleRequest& request, Status* error)
      REQUIRES_SHARED(store_mutex_);
  // Fetch by key: every stored segment of a trajectory or group, nothing counted or recorded.
  schema::SampleReply Fetch(const schema::SampleRequest& request, Status* error)
      REQUIRES_SHARED(store_mutex_);
  // Appends the stored segment `item` under `handle`; skips one deleted by retention since.
  void ReadInto(uint64_t handle, uint64_t item, uint32_t times, schema::SampleReply* reply)
      REQUIRES_SHARED(store_mutex_);
  Status UpdatePriorities(const schema::PriorityUpdate& update) REQUIRES_SHARED(store_mutex_);
  Table* FindTable(const std::string& name) REQUIRES(state_mutex_);  // empty: the first table
  // state_mutex_ for a learner request: a publishing writer steps aside for it between chunks.
  class SCOPED_CAPABILITY LearnerStateLock {
   public:
    explicit LearnerStateLock(ServerImpl* server) ACQUIRE(server->state_mutex_)
        : mu_(&server->state_mutex_) {
      server->learners_waiting_.fetch_add(1);
      mu_->Lock();
      server->learners_waiting_.fetch_sub(1);
    }
    ~LearnerStateLock() RELEASE() { mu_->Unlock(); }
    LearnerStateLock(const LearnerStateLock&) = delete;
    LearnerStateLock& operator=(const LearnerStateLock&) = delete;

   private:
    Mutex* const mu_;
  };
  Result<LearnerState> LoadLearnerState(const std::string& table, const std::string& learner)
      REQUIRES(state_mutex_) REQUIRES_SHARED(store_mutex_);

  void CountReject(std::string_view reason) EXCLUDES(stats_mutex_) {
    MutexLock lock(&stats_mutex_);
    ++rejects_[std::string(reason)];
  }

  ServerOptions options_;
  schema::DecodeLimits limits_;
  uint64_t instance_ = 0;
  // Replaced only by ReopenStore, under an exclusive lock; every other use holds it shared.
  SharedMutex store_mutex_;
  std::unique_ptr<Store> store_ GUARDED_BY(store_mutex_);
  StoreOptions store_options_;
  transport::NamedContext actor_context_;  // actor ROUTER, and the wake-up pair (inproc)
  // The learner socket has its own context, so its own I/O thread: sample requests and replies
  // never wait behind the actors' megabytes in a shared I/O thread.
  // Its I/O thread, like the learner thread, is latency-sensitive (transport::MarkLatencySensitive):
  // on waking it runs ahead of the writers and the actors' I/O instead of waiting out their slices.
  transport::LatencySensitiveContext learner_context_;
  // With auth: each context's ZAP handler and the key pair (released in Stop, before the
  // contexts end).
  std::unique_ptr<transport::CurveServer> actor_curve_;
  std::unique_ptr<transport::CurveServer> learner_curve_;
  zmq::socket_t actor_socket_;
  zmq::socket_t learner_socket_;
  zmq::socket_t wake_receiver_;  // actor thread
  zmq::socket_t wake_sender_ GUARDED_BY(done_mutex_);  // writer threads
  std::string actor_endpoint_;
  std::string learner_endpoint_;
  std::thread actor_thread_;
  std::vector<std::thread> writer_threads_;
  std::thread learner_thread_;
  std::atomic<bool> stopping_{false};
  std::once_flag stop_once_;

  // Actor thread only.
  std::unordered_map<std::string, uint64_t> in_flight_bytes_;  // by connection identity
  std::unordered_set<std::string> greeted_;

  // Ingest queue: actor thread -> writer threads. queue_ready_ also signals trajectories
  // released by a writer.
  Mutex queue_mutex_;
  CondVar queue_ready_;
  std::deque<PendingSegment> queue_ GUARDED_BY(queue_mutex_);
  // Bytes received and not yet written (queued or in a writer's group): max_queued_bytes.
  std::atomic<uint64_t> queued_bytes_{0};
  // In a batch being written.
  std::unordered_set<std::string> busy_trajectories_ GUARDED_BY(queue_mutex_);

  // Completions: writer threads -> actor thread. Also guards wake_sender_.
  Mutex done_mutex_;
  std::vector<Completion> done_ GUARDED_BY(done_mutex_);

  // One per writer slot (only that writer touches it): its batch and its counters.
  std::vector<std::unique_ptr<SegmentWriter>> segment_writers_ GUARDED_BY(store_mutex_);

  // Shared by the writer threads.
  Mutex commit_mutex_;
  // Segment store key -> sequence.
  std::unordered_map<std::string, uint64_t> stored_keys_ GUARDED_BY(commit_mutex_);
  uint64_t next_sequence_ GUARDED_BY(commit_mutex_) = 1;
  uint64_t next_ticket_ GUARDED_BY(commit_mutex_) = 0;
  Mutex publish_mutex_;
  CondVar published_;
  // The ticket whose batch is published next.
  uint64_t next_publish_ GUARDED_BY(publish_mutex_) = 0;

  // Shared by writer and learner threads.
  Mutex state_mutex_;
  std::atomic<int> learners_waiting_{0};  // learner requests waiting for state_mutex_
  static constexpr size_t kPublishChunk = 32;  // well under a millisecond of table inserts
  std::vector<std::unique_ptr<Table>> tables_ GUARDED_BY(state_mutex_);
  // Trajectories without their last segment yet, by 16-byte id, for AbandonStale; and those it
  // closed (a late segment of one is stored but never sampled).
  struct OpenTrajectory {
    uint64_t last_unix_ms = 0;
    std::string table;
    std::vector<uint64_t> items;
  };
  std::unordered_map<std::string, OpenTrajectory> open_ GUARDED_BY(state_mutex_);
  std::unordered_set<std::string> abandoned_ GUARDED_BY(state_mutex_);
  std::map<std::pair<std::string, std::string>, LearnerState> learners_ GUARDED_BY(state_mutex_);

  // Stats.
  Clock::time_point started_ = Clock::now();
  std::atomic<uint64_t> segments_stored_{0};
  std::atomic<uint64_t> duplicates_{0};
  std::atomic<uint64_t> conflicts_{0};  // same key, different bytes: refused
  std::atomic<uint64_t> bytes_stored_{0};
  std::atomic<uint64_t> deleted_segments_{0};
  std::atomic<uint64_t> write_errors_{0};
  // Ingest stopped for want of space; the reason, under space_mutex_.
  std::atomic<bool> disk_full_{false};
  Mutex space_mutex_;
  std::string disk_full_why_ GUARDED_BY(space_mutex_);
  // The store's size on disk at the last CheckSpace plus what was written since.
  std::atomic<uint64_t> store_bytes_{0};
  // RocksDB's memory and table files, taken with the first writer's periodic checks.
  Mutex memory_mutex_;
  StoreMemory store_memory_ GUARDED_BY(memory_mutex_);
  std::atomic<uint64_t> disk_full_episodes_{0};  // times ingest stopped for space
  std::atomic<uint64_t> unrecorded_draws_{0};    // sample steps answered without a record
  std::atomic<uint64_t> abandoned_count_{0};     // trajectories closed by AbandonStale
  std::atomic<uint64_t> sample_requests_{0};
  std::atomic<uint64_t> samples_not_ready_{0};
  std::atomic<uint64_t> samples_replayed_{0};
  std::atomic<uint64_t> segments_sampled_{0};
  LatencyWindow sample_latency_;
  Mutex stats_mutex_;
  std::map<std::string, uint64_t> rejects_ GUARDED_BY(stats_mutex_);
  Clock::time_point rate_since_ GUARDED_BY(stats_mutex_) = Clock::now();
  uint64_t rate_bytes_ GUARDED_BY(stats_mutex_) = 0;
  uint64_t rate_segments_ GUARDED_BY(stats_mutex_) = 0;
};

}  // namespace strider::replay::internal
