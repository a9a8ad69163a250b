// The replay server (see replay/replay.h for the picture).
//
// Threads and what they own:
//   actor thread    the actor ROUTER socket and a PULL socket the writer wakes it with; decodes
//                   and validates every frame, enforces credit, queues segments, sends acks
//   writer threads  (writer_threads of them) each take a group of queued segments, write it as
//                   one WriteBatch with the log, publish it to the tables, apply retention, and
//                   hand completed keys back to the actor thread for acking. Several writers let
//                   RocksDB merge their batches into one log write and insert into the memtable
//                   in parallel, as it does for several threads calling Put.
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
#include <malloc.h>
#include <rocksdb/slice.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/config.h"
#include "common/process_memory.h"
#include "common/schema/messages.h"
#include "common/transport/zmq_util.h"
#include "replay/replay.h"
#include "replay/storage.h"
#include "replay/table.h"

namespace strider::replay {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t NowUnixMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

std::string DeriveLearnerEndpoint(const std::string& actor) {
  if (actor.rfind("ipc://", 0) == 0) return actor + ".sample";
  if (actor.rfind("inproc://", 0) == 0) return actor + "-sample";
  const size_t colon = actor.rfind(':');
  if (colon == std::string::npos) return actor;
  const std::string port = actor.substr(colon + 1);
  if (port == "0" || port == "*") return actor;
  try {
    return actor.substr(0, colon + 1) + std::to_string(std::stoi(port) + 1);
  } catch (...) {
    return actor;
  }
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
};

struct LearnerState {
  uint64_t last_step = 0;
  uint64_t fifo_position = 0;
};

class LatencyWindow {
 public:
  void Add(double ms) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (samples_.size() < kSize) {
      samples_.push_back(ms);
    } else {
      samples_[next_] = ms;
    }
    next_ = (next_ + 1) % kSize;
  }
  std::pair<double, double> P50P99() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (samples_.empty()) return {0, 0};
    std::vector<double> sorted = samples_;
    std::sort(sorted.begin(), sorted.end());
    auto at = [&](double q) { return sorted[std::min(sorted.size() - 1,
                                                     static_cast<size_t>(q * sorted.size()))]; };
    return {at(0.50), at(0.99)};
  }

 private:
  static constexpr size_t kSize = 4096;
  std::mutex mutex_;
  std::vector<double> samples_;
  size_t next_ = 0;
};

class ServerImpl : public ReplayServer {
 public:
  explicit ServerImpl(ServerOptions options) : options_(std::move(options)) {
    limits_.max_message_bytes = options_.max_message_bytes;
    limits_.max_token_id = options_.max_token_id;
    std::random_device device;
    instance_ = (uint64_t{device()} << 32) ^ device() ^ NowUnixMs();
  }
  ~ServerImpl() override { Stop(); }

  Status Init();
  std::string actor_endpoint() const override { return actor_endpoint_; }
  std::string learner_endpoint() const override { return learner_endpoint_; }
  std::string StatsJson() override;
  void Stop() override;

 private:
  Status Recover();
  void ActorLoop();
  void WriterLoop(int slot);
  // Takes up to write_batch_bytes of queued segments whose trajectories no other writer holds
  // and marks those trajectories busy. Requires queue_mutex_.
  std::vector<PendingSegment> TakeGroup(std::vector<std::string>* trajectories);
  void ReleaseTrajectories(const std::vector<std::string>& trajectories);
  void LearnerLoop();

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
  void SendAcks();

  void WriteGroup(std::vector<PendingSegment>& group, int slot,
                  const std::vector<std::string>& trajectories);
  void ApplyRetention();
  Status DeleteItems(const std::vector<std::pair<uint64_t, IndexRecord>>& victims);

  void HandleLearnerFrame(const std::string& identity, const zmq::message_t& frame);
  schema::SampleReply Sample(const schema::SampleRequest& request, Status* error);
  Status UpdatePriorities(const schema::PriorityUpdate& update);
  Table* FindTable(const std::string& name);  // empty: the first table; requires state_mutex_
  Result<LearnerState> LoadLearnerState(const std::string& table, const std::string& learner);

  void CountReject(std::string_view reason) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++rejects_[std::string(reason)];
  }

  ServerOptions options_;
  schema::DecodeLimits limits_;
  uint64_t instance_ = 0;
  std::unique_ptr<Store> store_;
  transport::NamedContext actor_context_;  // actor ROUTER, and the wake-up pair (inproc)
  // The learner socket has its own context, so its own I/O thread: sample requests and replies
  // never wait behind the actors' megabytes in a shared I/O thread.
  // Its I/O thread, like the learner thread, is latency-sensitive (transport::MarkLatencySensitive):
  // on waking it runs ahead of the writers and the actors' I/O instead of waiting out their slices.
  transport::LatencySensitiveContext learner_context_;
  zmq::socket_t actor_socket_;
  zmq::socket_t learner_socket_;
  zmq::socket_t wake_receiver_;  // actor thread
  zmq::socket_t wake_sender_;    // writer thread
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
  std::mutex queue_mutex_;
  std::condition_variable queue_ready_;
  std::deque<PendingSegment> queue_;
  // Bytes received and not yet written (queued or in a writer's group): max_queued_bytes.
  std::atomic<uint64_t> queued_bytes_{0};
  std::unordered_set<std::string> busy_trajectories_;  // in a batch being written

  // Completions: writer threads -> actor thread. Also guards wake_sender_.
  std::mutex done_mutex_;
  std::vector<Completion> done_;

  // One reusable batch per writer slot (only that writer touches it).
  std::vector<std::unique_ptr<rocksdb::WriteBatch>> write_batches_;
  size_t WriteBatchReserve() const { return options_.write_batch_bytes + (256 << 10); }

  // Shared by the writer threads.
  std::mutex commit_mutex_;
  std::unordered_map<std::string, uint64_t> stored_keys_;  // segment store key -> sequence
  uint64_t next_sequence_ = 1;
  uint64_t next_ticket_ = 0;
  // Writer slot -> table -> inserts counted in that slot (only that writer touches its slot).
  std::vector<std::map<std::string, uint64_t>> slot_inserts_;
  std::mutex publish_mutex_;
  std::condition_variable published_;
  uint64_t next_publish_ = 0;  // the ticket whose batch is published next

  // Shared by writer and learner threads.
  std::mutex state_mutex_;
  std::vector<std::unique_ptr<Table>> tables_;
  std::map<std::pair<std::string, std::string>, LearnerState> learners_;

  // Stats.
  Clock::time_point started_ = Clock::now();
  std::atomic<uint64_t> segments_stored_{0};
  std::atomic<uint64_t> duplicates_{0};
  std::atomic<uint64_t> bytes_stored_{0};
  std::atomic<uint64_t> deleted_segments_{0};
  std::atomic<uint64_t> write_errors_{0};
  std::atomic<uint64_t> sample_requests_{0};
  std::atomic<uint64_t> samples_not_ready_{0};
  std::atomic<uint64_t> samples_replayed_{0};
  std::atomic<uint64_t> segments_sampled_{0};
  LatencyWindow sample_latency_;
  std::mutex stats_mutex_;
  std::map<std::string, uint64_t> rejects_;
  Clock::time_point rate_since_ = Clock::now();
  uint64_t rate_bytes_ = 0;
  uint64_t rate_segments_ = 0;
};

Status ServerImpl::Init() {
  if (options_.db_path.empty()) return Status::InvalidArgument("replay server: --db is required");
  if (options_.credit_bytes < options_.max_message_bytes) {
    return Status::InvalidArgument(
        "server.credit_bytes must be at least server.max_message_bytes, or a maximal segment "
        "could never be sent");
  }
  if (options_.tables.empty()) options_.tables.push_back(TableConfig());
  {
    std::set<std::string> names;
    for (const TableConfig& t : options_.tables) {
      if (!names.insert(t.name).second) {
        return Status::InvalidArgument("two tables are named '" + t.name + "'");
      }
    }
  }
  if (options_.learner_endpoint.empty()) {
    options_.learner_endpoint = DeriveLearnerEndpoint(options_.actor_endpoint);
  }
  StoreOptions store_options;
  store_options.sync_wal = options_.sync_wal;
  store_options.compression = options_.compression;
  STRIDER_ASSIGN_OR_RETURN(store_, Store::Open(options_.db_path, store_options));
  STRIDER_RETURN_IF_ERROR(Recover());

  // ZeroMQ drops a peer whose message crosses this; below it, oversize gets a reply instead.
  const size_t hard_limit = 2 * options_.max_message_bytes + (1 << 20);
  STRIDER_ASSIGN_OR_RETURN(actor_socket_,
                           transport::MakeSocket(actor_context_.get(), zmq::socket_type::router,
                                                 hard_limit));
  STRIDER_ASSIGN_OR_RETURN(learner_socket_,
                           transport::MakeSocket(learner_context_.get(), zmq::socket_type::router,
                                                 1 << 20));
  // Actors may send faster than the disk. Few frames per connection wait inside ZeroMQ (4, up to
  // 16 MiB with batched frames): the server bounds what it holds itself (max_queued_bytes), and a
  // full pipe makes ZeroMQ stop reading that connection, so the rest waits in the actor's socket.
  actor_socket_.set(zmq::sockopt::rcvhwm, 4);
  actor_socket_.set(zmq::sockopt::sndhwm, 100000);
  STRIDER_ASSIGN_OR_RETURN(std::string actor_bound,
                           transport::Bind(actor_socket_, options_.actor_endpoint));
  STRIDER_ASSIGN_OR_RETURN(std::string learner_bound,
                           transport::Bind(learner_socket_, options_.learner_endpoint));
  learner_context_.MarkIoThreads();
  // Intake (receiving and checking segments) yields the cores to the writers: see
  // ServerOptions::intake_nice. The actor thread lowers its own priority when it starts.
  for (pid_t thread_id : actor_context_.IoThreads()) {
    (void)transport::LowerPriority(thread_id, options_.intake_nice);
  }
  actor_endpoint_ = transport::LocalEndpoint(actor_bound);
  learner_endpoint_ = transport::LocalEndpoint(learner_bound);
  STRIDER_ASSIGN_OR_RETURN(wake_receiver_,
                           transport::MakeSocket(actor_context_.get(), zmq::socket_type::pull));
  STRIDER_ASSIGN_OR_RETURN(wake_sender_,
                           transport::MakeSocket(actor_context_.get(), zmq::socket_type::push));
  const std::string wake = "inproc://replay-wake-" + std::to_string(instance_);
  STRIDER_RETURN_IF_ERROR(transport::Bind(wake_receiver_, wake).status());
  STRIDER_RETURN_IF_ERROR(transport::Connect(wake_sender_, wake));

  for (int slot = 0; slot < options_.writer_threads; ++slot) {
    write_batches_.push_back(std::make_unique<rocksdb::WriteBatch>(WriteBatchReserve()));
  }
  for (int slot = 0; slot < options_.writer_threads; ++slot) {
    writer_threads_.emplace_back([this, slot] {
      transport::NameThisThread("replay-writer" + std::to_string(slot));
      WriterLoop(slot);
    });
  }
  actor_thread_ = std::thread([this] {
    transport::NameThisThread("replay-actors");
    (void)transport::LowerPriority(0, options_.intake_nice);
    ActorLoop();
  });
  learner_thread_ = std::thread([this] {
    transport::NameThisThread("replay-learner");
    LearnerLoop();
  });
  spdlog::info("replay server: store {}, actors on {}, learners on {}, {} table(s)",
               options_.db_path, actor_endpoint_, learner_endpoint_, tables_.size());
  return Status::Ok();
}

Status ServerImpl::Recover() {
  STRIDER_RETURN_IF_ERROR(store_->MigrateSamplingState());
  STRIDER_ASSIGN_OR_RETURN(next_sequence_, store_->NextSequence());
  if (next_sequence_ == 0) next_sequence_ = 1;
  if (options_.writer_threads < 1) options_.writer_threads = 1;
  slot_inserts_.resize(options_.writer_threads);
  rocksdb::WriteBatch definitions;
  std::map<std::string, Table*> by_name;
  for (const TableConfig& config : options_.tables) {
    STRIDER_ASSIGN_OR_RETURN(uint64_t inserts, store_->TableInserts(config.name));
    for (int slot = 0; slot < options_.writer_threads; ++slot) {
      STRIDER_ASSIGN_OR_RETURN(slot_inserts_[slot][config.name],
                               store_->GetCounter(meta::TableInsertsSlot(config.name, slot)));
    }
    STRIDER_ASSIGN_OR_RETURN(uint64_t samples,
                             store_->GetSamplingCounter(meta::TableSamples(config.name)));
    tables_.push_back(std::make_unique<Table>(config, inserts, samples, instance_));
    by_name[config.name] = tables_.back().get();
    definitions.Put(store_->meta(), meta::TableDefinition(config.name), TableConfigJson(config));
  }
  STRIDER_RETURN_IF_ERROR(store_->Write(&definitions));

  std::unordered_map<uint64_t, uint32_t> times_sampled;
  std::unordered_map<uint64_t, double> priorities;
  auto it = store_->ScanSampling();
  for (it->Seek(std::string(meta::kTimesSampledPrefix)); it->Valid(); it->Next()) {
    const std::string_view key(it->key().data(), it->key().size());
    if (key.substr(0, meta::kTimesSampledPrefix.size()) != meta::kTimesSampledPrefix) break;
    times_sampled[DecodeU64(key.substr(meta::kTimesSampledPrefix.size()))] =
        static_cast<uint32_t>(DecodeU64(std::string_view(it->value().data(), it->value().size())));
  }
  for (it->Seek(std::string(meta::kPriorityPrefix)); it->Valid(); it->Next()) {
    const std::string_view key(it->key().data(), it->key().size());
    if (key.substr(0, meta::kPriorityPrefix.size()) != meta::kPriorityPrefix) break;
    double priority = 0;
    if (it->value().size() == sizeof(double)) {
      std::memcpy(&priority, it->value().data(), sizeof(double));
    }
    priorities[DecodeU64(key.substr(meta::kPriorityPrefix.size()))] = priority;
  }

  uint64_t orphans = 0;
  auto seq = store_->Scan(store_->sequence());
  for (seq->SeekToFirst(); seq->Valid(); seq->Next()) {
    const uint64_t sequence = ParseSequenceKey({seq->key().data(), seq->key().size()});
    Result<IndexRecord> record = DecodeIndexRecord({seq->value().data(), seq->value().size()});
    if (!record.ok()) return record.status().WithContext("recovering the sequence index");
    stored_keys_[SegmentStoreKey(record->key)] = sequence;
    next_sequence_ = std::max(next_sequence_, sequence + 1);
    auto table = by_name.find(record->table);
    if (table == by_name.end()) {
      ++orphans;
      continue;
    }
    ItemInfo info;
    info.min_policy_version = record->min_policy_version;
    info.max_policy_version = record->max_policy_version;
    info.bytes = record->bytes;
    info.insert_unix_ms = record->insert_unix_ms;
    auto t = times_sampled.find(sequence);
    info.times_sampled = t == times_sampled.end() ? 0 : t->second;
    auto p = priorities.find(sequence);
    info.priority = p == priorities.end() ? table->second->config().sampler.default_priority
                                          : p->second;
    table->second->Insert(sequence, info, /*counted=*/false);
  }
  if (!seq->status().ok()) return FromRocks(seq->status(), "scanning the sequence index");
  if (orphans > 0) {
    spdlog::warn("replay server: {} stored segments belong to tables not in the config; they "
                 "are kept but never sampled or deleted by retention",
                 orphans);
  }
  spdlog::info("replay server: recovered {} segments, next sequence {}", stored_keys_.size(),
               next_sequence_);
  ApplyRetention();
  return Status::Ok();
}

void ServerImpl::Stop() {
  std::call_once(stop_once_, [this] {
    stopping_ = true;
    queue_ready_.notify_all();
    if (actor_thread_.joinable()) actor_thread_.join();
    if (learner_thread_.joinable()) learner_thread_.join();
    queue_ready_.notify_all();
    for (std::thread& writer : writer_threads_) {
      if (writer.joinable()) writer.join();
    }
    actor_socket_.close();
    learner_socket_.close();
    wake_receiver_.close();
    wake_sender_.close();
    store_.reset();
  });
}

// ---------------------------------------------------------------------------- actor thread

void ServerImpl::SendActor(const std::string& identity, const std::string& frame) {
  // Never block the ingest loop on one slow or vanished client: a full pipe drops the reply,
  // and the client's resend timer recovers.
  (void)transport::SendParts(actor_socket_, {identity, frame}, /*dont_wait=*/true);
}

void ServerImpl::Reject(zmq::socket_t& socket, const std::string& identity, const Status& status,
                        const schema::SegmentKey* key) {
  const std::string_view reason = schema::RejectReason(status);
  CountReject(reason);
  schema::ErrorReply error;
  error.reason = std::string(reason);
  error.message = status.message();
  if (key != nullptr) {
    error.has_key = true;
    error.key = *key;
  }
  spdlog::debug("replay server: rejected a message: {}", status.message());
  (void)transport::SendParts(socket, {identity, schema::EncodeError(error)}, true);
}

void ServerImpl::HandleActorFrame(const std::string& identity, zmq::message_t frame) {
  auto received = std::make_shared<const zmq::message_t>(std::move(frame));
  std::string_view rest = transport::View(*received);
  if (Status size = schema::CheckFrameSize(rest, limits_); !size.ok()) {
    Reject(actor_socket_, identity, size, nullptr);
    return;
  }
  // One envelope, or several back to back (a client batching segments). Each is handled on its
  // own; an envelope whose end cannot be found ends the frame, what came before it stands.
  do {
    Result<size_t> envelope_bytes = schema::LeadingEnvelopeBytes(rest);
    if (!envelope_bytes.ok()) {
      Reject(actor_socket_, identity, envelope_bytes.status(), nullptr);
      return;
    }
    HandleActorMessage(identity, received, rest.substr(0, *envelope_bytes));
    rest.remove_prefix(*envelope_bytes);
  } while (!rest.empty());
}

void ServerImpl::HandleActorMessage(const std::string& identity,
                                    const std::shared_ptr<const zmq::message_t>& received,
                                    std::string_view bytes) {
  // Validated on the reader over the received bytes, arrays never copied: the bytes themselves
  // are what the store keeps.
  Result<schema::Message> message =
      schema::Decode(bytes, limits_, schema::SegmentDecoding::kFactsOnly);
  if (!message.ok()) {
    Reject(actor_socket_, identity, message.status(), nullptr);
    return;
  }
  switch (message->kind) {
    case schema::MessageKind::kHello:
      greeted_.insert(identity);
      SendActor(identity, CreditMessage());
      return;
    case schema::MessageKind::kStatsRequest:
      SendActor(identity, schema::EncodeStats(StatsJson()));
      return;
    case schema::MessageKind::kSegment:
      break;
    default:
      Reject(actor_socket_, identity,
             Status::InvalidArgument(std::string(schema::reject::kUnexpected) + ": " +
                                     std::string(schema::MessageKindName(message->kind)) +
                                     " is not accepted on the actor endpoint"),
             nullptr);
      return;
  }
  SegmentFacts& segment = message->segment_facts;
  if (!greeted_.count(identity)) {
    // A client that spoke to a previous server instance: tell it who we are, so it resends what
    // that instance never acknowledged. Its segment is still taken.
    greeted_.insert(identity);
    SendActor(identity, CreditMessage());
  }
  const std::string table = segment.table.empty() ? options_.tables.front().name : segment.table;
  const bool known_table =
      std::any_of(options_.tables.begin(), options_.tables.end(),
                  [&](const TableConfig& t) { return t.name == table; });
  const schema::SegmentKey key = segment.key;
  if (!known_table) {
    Reject(actor_socket_, identity,
           Status::InvalidArgument(std::string(schema::reject::kUnexpected) +
                                   ": no table named '" + table + "'"),
           &key);
    return;
  }
  uint64_t& in_flight = in_flight_bytes_[identity];
  if (in_flight + bytes.size() > options_.credit_bytes) {
    Reject(actor_socket_, identity,
           Status::ResourceExhausted(std::string(schema::reject::kCredit) + ": " +
                                     std::to_string(in_flight + bytes.size()) +
                                     " unacknowledged bytes would exceed the credit of " +
                                     std::to_string(options_.credit_bytes)),
           &key);
    return;
  }
  in_flight += bytes.size();
  queued_bytes_ += bytes.size();
  PendingSegment pending;
  pending.identity = identity;
  pending.received = received;
  pending.envelope = bytes;
  pending.facts = std::move(segment);
  pending.facts.table = table;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push_back(std::move(pending));
  }
  queue_ready_.notify_one();
}

void ServerImpl::SendAcks() {
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> lock(done_mutex_);
    done.swap(done_);
  }
  std::map<std::string, std::vector<schema::SegmentKey>> acks;
  for (const Completion& c : done) {
    auto it = in_flight_bytes_.find(c.identity);
    if (it != in_flight_bytes_.end()) {
      it->second -= std::min(it->second, c.bytes);
      if (it->second == 0) in_flight_bytes_.erase(it);
    }
    if (c.error.empty()) {
      acks[c.identity].push_back(c.key);
    } else {
      Reject(actor_socket_, c.identity, Status::IoError("storage: " + c.error), &c.key);
    }
  }
  for (const auto& [identity, keys] : acks) SendActor(identity, schema::EncodeAck(keys));
}

void ServerImpl::ActorLoop() {
  zmq::pollitem_t items[] = {{actor_socket_.handle(), 0, ZMQ_POLLIN, 0},
                             {wake_receiver_.handle(), 0, ZMQ_POLLIN, 0}};
  auto next_log = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(options_.stats_interval_s));
  while (!stopping_) {
    // Over max_queued_bytes: leave segments in the sockets until a writer finishes a group (its
    // wake-up brings the loop back here).
    items[0].events = queued_bytes_ < options_.max_queued_bytes ? ZMQ_POLLIN : 0;
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& error) {
      if (error.num() == EINTR) continue;
      spdlog::error("replay server: poll failed: {}", error.what());
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      while (true) {
        zmq::message_t wake;
        if (!wake_receiver_.recv(wake, zmq::recv_flags::dontwait)) break;
      }
      SendAcks();
    }
    if (items[0].revents & ZMQ_POLLIN) {
      // A bounded batch per wake-up so acks are not starved by a flood of segments.
      for (int i = 0; i < 64 && queued_bytes_ < options_.max_queued_bytes; ++i) {
        Result<std::vector<zmq::message_t>> parts = transport::ReceiveParts(actor_socket_);
        if (!parts.ok() || parts->empty()) break;
        const std::string identity(transport::View((*parts)[0]));
        if (parts->size() != 2) {
          Reject(actor_socket_, identity,
                 Status::Corruption(std::string(schema::reject::kMalformed) +
                                    ": expected one frame per message, got " +
                                    std::to_string(parts->size() - 1)),
                 nullptr);
          continue;
        }
        HandleActorFrame(identity, std::move((*parts)[1]));
      }
    }
    if (options_.stats_interval_s > 0 && Clock::now() >= next_log) {
      spdlog::info("replay stats: {}", StatsJson());
      next_log = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(options_.stats_interval_s));
    }
  }
}

// --------------------------------------------------------------------------- writer thread

std::vector<PendingSegment> ServerImpl::TakeGroup(std::vector<std::string>* trajectories) {
  std::vector<PendingSegment> group;
  std::unordered_set<std::string> mine;
  std::unordered_set<std::string> passed;  // held elsewhere: later segments of it wait too
  uint64_t bytes = 0;
  // A bounded look-ahead: the queue holds at most a credit's worth per connection.
  size_t looked = 0;
  for (auto it = queue_.begin(); it != queue_.end() && looked < 4096; ++looked) {
    std::string trajectory(it->facts.key.trajectory.View());
    if (!mine.count(trajectory) &&
        (busy_trajectories_.count(trajectory) || passed.count(trajectory))) {
      passed.insert(std::move(trajectory));
      ++it;
      continue;
    }
    if (!group.empty() && bytes + it->envelope.size() > options_.write_batch_bytes) break;
    bytes += it->envelope.size();
    group.push_back(std::move(*it));
    it = queue_.erase(it);
    mine.insert(std::move(trajectory));
  }
  for (const std::string& trajectory : mine) {
    busy_trajectories_.insert(trajectory);
    trajectories->push_back(trajectory);
  }
  return group;
}

void ServerImpl::ReleaseTrajectories(const std::vector<std::string>& trajectories) {
  if (trajectories.empty()) return;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    for (const std::string& trajectory : trajectories) busy_trajectories_.erase(trajectory);
  }
  queue_ready_.notify_all();
}

void ServerImpl::WriterLoop(int slot) {
  auto next_age_check = Clock::now();
  while (true) {
    std::vector<PendingSegment> group;
    std::vector<std::string> trajectories;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_ready_.wait_for(lock, std::chrono::milliseconds(200),
                            [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty() && stopping_) return;
      group = TakeGroup(&trajectories);
      if (group.empty() && !queue_.empty()) {
        // Everything queued belongs to trajectories other writers hold: wait for a release.
        queue_ready_.wait_for(lock, std::chrono::milliseconds(5));
      }
    }
    if (!group.empty()) WriteGroup(group, slot, trajectories);
    if (slot == 0 && Clock::now() >= next_age_check) {
      ApplyRetention();
      next_age_check = Clock::now() + std::chrono::seconds(1);
    }
  }
}

void ServerImpl::WriteGroup(std::vector<PendingSegment>& group, int slot,
                            const std::vector<std::string>& trajectories) {
  const uint64_t now_ms = NowUnixMs();
  struct Stored {
    uint64_t sequence;
    const PendingSegment* segment;
    std::string store_key;
  };
  std::vector<Stored> stored;
  uint64_t ticket = 0;
  {
    // Sequence numbers and tickets in one order. No other writer holds these trajectories, so
    // no other writer can be storing these keys right now: stored_keys_ is exact for them.
    std::lock_guard<std::mutex> lock(commit_mutex_);
    std::unordered_set<std::string> in_group;
    for (const PendingSegment& p : group) {
      std::string store_key = SegmentStoreKey(p.facts.key);
      if (stored_keys_.count(store_key) || !in_group.insert(store_key).second) {
        duplicates_++;  // stored by an earlier batch (or this one): already in the log
        continue;
      }
      stored.push_back({next_sequence_++, &p, std::move(store_key)});
    }
    if (!stored.empty()) ticket = next_ticket_++;
  }

  std::string error;
  std::map<std::string, uint64_t> inserts;  // by table
  if (!stored.empty()) {
    // This writer's own batch, kept between groups: its buffer is reserved once and reused, so
    // building a batch neither regrows (copying what it holds) nor touches fresh pages.
    rocksdb::WriteBatch& batch = *write_batches_[slot];
    batch.Clear();
    std::map<std::string, schema::TrajectorySummary> summaries;  // by trajectory id bytes
    std::vector<std::string> sequence_prefixes;  // the 8-byte prefixes must outlive Write
    sequence_prefixes.reserve(stored.size());
    for (const Stored& st : stored) {
      const PendingSegment& p = *st.segment;
      sequence_prefixes.push_back(EncodeU64(st.sequence));
      // The segment value is the sequence number followed by the envelope as received;
      // SliceParts avoids concatenating megabytes.
      rocksdb::Slice key_slice(st.store_key);
      rocksdb::Slice value_parts[2] = {
          rocksdb::Slice(sequence_prefixes.back()),
          rocksdb::Slice(p.envelope.data(), p.envelope.size())};
      batch.Put(store_->segments(), rocksdb::SliceParts(&key_slice, 1),
                rocksdb::SliceParts(value_parts, 2));
      IndexRecord record;
      record.key = p.facts.key;
      record.min_policy_version = p.facts.min_policy_version;
      record.max_policy_version = p.facts.max_policy_version;
      record.bytes = p.envelope.size();
      record.tokens = p.facts.tokens;
      record.insert_unix_ms = now_ms;
      record.table = p.facts.table;
      batch.Put(store_->sequence(), SequenceKey(st.sequence), EncodeIndexRecord(record));

      // This writer holds the trajectory, so the stored summary is the latest one.
      const std::string trajectory(p.facts.key.trajectory.View());
      auto summary_it = summaries.find(trajectory);
      if (summary_it == summaries.end()) {
        schema::TrajectorySummary summary;
        Result<std::optional<std::string>> existing =
            store_->Get(store_->trajectories(), trajectory);
        if (existing.ok() && existing->has_value()) {
          Result<schema::TrajectorySummary> decoded = schema::DecodeTrajectorySummary(**existing);
          if (decoded.ok()) summary = *decoded;
        }
        if (summary.segments_stored == 0) {
          summary.trajectory_id = p.facts.key.trajectory;
          summary.first_insert_unix_ms = now_ms;
          summary.min_policy_version = p.facts.min_policy_version;
        }
        summary_it = summaries.emplace(trajectory, summary).first;
      }
      schema::TrajectorySummary& s = summary_it->second;
      s.env = p.facts.env;
      s.table = p.facts.table;
      s.min_policy_version = s.segments_stored == 0
                                 ? p.facts.min_policy_version
                                 : std::min(s.min_policy_version, p.facts.min_policy_version);
      s.max_policy_version = std::max(s.max_policy_version, p.facts.max_policy_version);
      s.segments_stored += 1;
      s.tokens += p.facts.tokens;
      s.steps += p.facts.steps;
      s.process_reward_sum += p.facts.process_reward_sum;
      if (p.facts.is_last) {
        s.complete = true;
        s.outcome_reward = p.facts.outcome_reward;
      }
      inserts[p.facts.table] += 1;
    }
    for (const auto& [trajectory, summary] : summaries) {
      batch.Put(store_->trajectories(), trajectory, schema::EncodeTrajectorySummary(summary));
    }
    // This writer's own counter slots: only it writes them, one batch after another, so each
    // slot is exact whatever order the writers' batches reach the log in.
    std::map<std::string, uint64_t>& slot_inserts = slot_inserts_[slot];
    for (const auto& [table, count] : inserts) {
      batch.Put(store_->meta(), meta::TableInsertsSlot(table, slot),
                EncodeU64(slot_inserts[table] + count));
    }
    batch.Put(store_->meta(), meta::NextSequenceSlot(slot), EncodeU64(stored.back().sequence + 1));
    Status status = store_->Write(&batch);
    if (batch.GetDataSize() > 2 * WriteBatchReserve()) {
      // An outsized segment grew it: do not keep that much memory per writer.
      write_batches_[slot] = std::make_unique<rocksdb::WriteBatch>(WriteBatchReserve());
    }
    if (status.ok()) {
      for (const auto& [table, count] : inserts) slot_inserts[table] += count;
      std::lock_guard<std::mutex> lock(commit_mutex_);
      for (const Stored& st : stored) stored_keys_[st.store_key] = st.sequence;
    } else {
      // Nothing of the group is durable: tell the clients, they resend after their ack
      // timeout. Its sequence numbers stay unused (gaps are allowed).
      write_errors_++;
      error = status.ToString();
      spdlog::error("replay server: {}", error);
    }

    // Publish in ticket order, so the tables see sequence numbers in increasing order.
    std::unique_lock<std::mutex> publish(publish_mutex_);
    published_.wait(publish, [&] { return next_publish_ == ticket; });
    if (error.empty()) {
      std::lock_guard<std::mutex> lock(state_mutex_);
      for (const Stored& st : stored) {
        Table* table = FindTable(st.segment->facts.table);
        if (table == nullptr) continue;
        ItemInfo info;
        info.min_policy_version = st.segment->facts.min_policy_version;
        info.max_policy_version = st.segment->facts.max_policy_version;
        info.bytes = st.segment->envelope.size();
        info.insert_unix_ms = now_ms;
        info.priority = table->config().sampler.default_priority;
        table->Insert(st.sequence, info, /*counted=*/true);
        segments_stored_++;
        bytes_stored_ += info.bytes;
      }
    }
    ++next_publish_;
    published_.notify_all();
  }
  ReleaseTrajectories(trajectories);

  // Retention before the acks, so a client that saw its ack also sees the bound respected.
  if (!stored.empty() && error.empty()) ApplyRetention();
  {
    std::lock_guard<std::mutex> lock(done_mutex_);
    uint64_t bytes = 0;
    for (const PendingSegment& p : group) {
      done_.push_back({p.identity, p.facts.key, p.envelope.size(), error});
      bytes += p.envelope.size();
    }
    queued_bytes_ -= bytes;
    (void)transport::SendParts(wake_sender_, {std::string_view("w", 1)}, true);
  }
}

void ServerImpl::ApplyRetention() {
  std::vector<std::pair<uint64_t, IndexRecord>> victims;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    const uint64_t now_ms = NowUnixMs();
    for (auto& table : tables_) {
      for (uint64_t item : table->SelectForDeletion(now_ms)) {
        victims.push_back({item, IndexRecord()});
        // Out of the sampler now, so no draw can choose it while it is being deleted.
        table->Erase(item);
      }
    }
  }
  if (victims.empty()) return;
  Status status = DeleteItems(victims);
  if (!status.ok()) spdlog::error("replay server: retention failed: {}", status.ToString());
}

Status ServerImpl::DeleteItems(const std::vector<std::pair<uint64_t, IndexRecord>>& victims) {
  // Index records first: they name the trajectories whose summaries change.
  std::vector<std::pair<uint64_t, IndexRecord>> records;
  std::unordered_set<std::string> wanted;
  for (const auto& [sequence, unused] : victims) {
    STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> raw,
                             store_->Get(store_->sequence(), SequenceKey(sequence)));
    if (!raw) continue;
    STRIDER_ASSIGN_OR_RETURN(IndexRecord record, DecodeIndexRecord(*raw));
    wanted.insert(std::string(record.key.trajectory.View()));
    records.push_back({sequence, std::move(record)});
  }
  // Hold those trajectories like a writer does, so no insert batch rewrites their summaries
  // at the same time. Whoever holds them now is writing and never waits for retention.
  std::vector<std::string> trajectories(wanted.begin(), wanted.end());
  {
    std::unique_lock<std::mutex> lock(queue_mutex_);
    queue_ready_.wait(lock, [&] {
      return std::none_of(trajectories.begin(), trajectories.end(), [&](const std::string& t) {
        return busy_trajectories_.count(t) > 0;
      });
    });
    for (const std::string& t : trajectories) busy_trajectories_.insert(t);
  }
  Status status = [&]() -> Status {
    rocksdb::WriteBatch batch;
    rocksdb::WriteBatch sampling;
    std::map<std::string, schema::TrajectorySummary> summaries;
    std::vector<std::string> forgotten;
    for (const auto& [sequence, record] : records) {
      const std::string store_key = SegmentStoreKey(record.key);
      batch.Delete(store_->segments(), store_key);
      batch.Delete(store_->sequence(), SequenceKey(sequence));
      sampling.Delete(meta::TimesSampled(sequence));
      sampling.Delete(meta::Priority(sequence));
      forgotten.push_back(store_key);
      const std::string trajectory(record.key.trajectory.View());
      auto it = summaries.find(trajectory);
      if (it == summaries.end()) {
        STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> existing,
                                 store_->Get(store_->trajectories(), trajectory));
        schema::TrajectorySummary summary;
        if (existing) {
          STRIDER_ASSIGN_OR_RETURN(summary, schema::DecodeTrajectorySummary(*existing));
        }
        it = summaries.emplace(trajectory, summary).first;
      }
      it->second.segments_stored -= std::min<uint32_t>(it->second.segments_stored, 1);
      it->second.tokens -= std::min(it->second.tokens, record.tokens);
    }
    for (const auto& [trajectory, summary] : summaries) {
      if (summary.segments_stored == 0) {
        batch.Delete(store_->trajectories(), trajectory);
      } else {
        batch.Put(store_->trajectories(), trajectory, schema::EncodeTrajectorySummary(summary));
      }
    }
    STRIDER_RETURN_IF_ERROR(store_->Write(&batch));
    {
      std::lock_guard<std::mutex> lock(commit_mutex_);
      for (const std::string& key : forgotten) stored_keys_.erase(key);
    }
    deleted_segments_ += forgotten.size();
    // Sampling state of deleted segments is dead weight, never wrong: sequence numbers are not
    // reused, and recovery only looks it up for stored segments. A crash before this write
    // leaves it behind harmlessly.
    return store_->WriteSampling(&sampling);
  }();
  ReleaseTrajectories(trajectories);
  return status;
}

// -------------------------------------------------------------------------- learner thread

Table* ServerImpl::FindTable(const std::string& name) {
  if (name.empty()) return tables_.front().get();
  for (auto& table : tables_) {
    if (table->config().name == name) return table.get();
  }
  return nullptr;
}

Result<LearnerState> ServerImpl::LoadLearnerState(const std::string& table,
                                                  const std::string& learner) {
  auto key = std::make_pair(table, learner);
  auto it = learners_.find(key);
  if (it != learners_.end()) return it->second;
  LearnerState state;
  STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> raw,
                           store_->GetSampling(meta::LearnerState(table, learner)));
  if (raw && raw->size() == 16) {
    state.last_step = DecodeU64(raw->substr(0, 8));
    state.fifo_position = DecodeU64(raw->substr(8, 8));
  }
  learners_[key] = state;
  return state;
}

schema::SampleReply ServerImpl::Sample(const schema::SampleRequest& request, Status* error) {
  schema::SampleReply reply;
  reply.step = request.step;
  std::vector<uint64_t> items;
  std::vector<uint32_t> times;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    Table* table = FindTable(request.table);
    if (table == nullptr) {
      *error = Status::InvalidArgument(std::string(schema::reject::kUnexpected) +
                                       ": no table named '" + request.table + "'");
      return reply;
    }
    const std::string& name = table->config().name;
    Result<LearnerState> loaded = LoadLearnerState(name, request.learner_id);
    if (!loaded.ok()) {
      *error = loaded.status();
      return reply;
    }
    LearnerState state = *loaded;
    const std::string draw_key = meta::Draw(name, request.learner_id, request.step);
    Result<std::optional<std::string>> previous = store_->GetSampling(draw_key);
    if (!previous.ok()) {
      *error = previous.status();
      return reply;
    }
    if (previous->has_value()) {
      // The learner restarted from a checkpoint before this step: the same answer again.
      const std::string& raw = **previous;
      for (size_t at = 0; at + 8 <= raw.size(); at += 8) {
        items.push_back(DecodeU64(std::string_view(raw).substr(at, 8)));
      }
      reply.replayed = true;
      samples_replayed_++;
    } else if (request.step <= state.last_step) {
      *error = Status::OutOfRange(
          std::string(schema::reject::kRange) + ": learner '" + request.learner_id +
          "' asked for step " + std::to_string(request.step) + " of table '" + name +
          "'; its answer is no longer kept (last step " + std::to_string(state.last_step) +
          ", the server keeps " + std::to_string(options_.sample_log_steps) + " steps)");
      return reply;
    } else {
      Table::Draw draw = table->Sample(request.count, state.fifo_position, request.policy_version);
      if (draw.items.empty()) {
        reply.not_ready_reason = draw.not_ready_reason;
        samples_not_ready_++;
        return reply;
      }
      items = draw.items;
      rocksdb::WriteBatch batch;
      std::string encoded;
      for (uint64_t item : items) {
        encoded += EncodeU64(item);
        state.fifo_position = std::max(state.fifo_position, item);
        const ItemInfo* info = table->Find(item);
        batch.Put(meta::TimesSampled(item), EncodeU64(info ? info->times_sampled : 1));
      }
      state.last_step = request.step;
      batch.Put(draw_key, encoded);
      batch.Put(meta::LearnerState(name, request.learner_id),
                EncodeU64(state.last_step) + EncodeU64(state.fifo_position));
      batch.Put(meta::TableSamples(name), EncodeU64(table->samples()));
      if (request.step > static_cast<uint64_t>(options_.sample_log_steps)) {
        batch.Delete(meta::Draw(name, request.learner_id,
                                request.step - static_cast<uint64_t>(options_.sample_log_steps)));
      }
      // The sampling store's own log: a few hundred bytes that never wait behind segments.
      Status written = store_->WriteSampling(&batch);
      if (!written.ok()) {
        // The draw already counted in memory; it is not durable, so the learner retries and may
        // get different items. Logged as a storage failure.
        *error = written;
        return reply;
      }
      learners_[{name, request.learner_id}] = state;
    }
    for (uint64_t item : items) {
      const ItemInfo* info = table->Find(item);
      times.push_back(info ? info->times_sampled : 0);
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    Result<std::optional<std::string>> record =
        store_->Get(store_->sequence(), SequenceKey(items[i]));
    if (!record.ok() || !record->has_value()) continue;  // deleted by retention since
    Result<IndexRecord> index = DecodeIndexRecord(**record);
    if (!index.ok()) continue;
    Result<std::optional<std::string>> value =
        store_->Get(store_->segments(), SegmentStoreKey(index->key));
    if (!value.ok() || !value->has_value() || (*value)->size() < 8) continue;
    reply.segments.push_back({items[i], (*value)->substr(8), times[i]});
  }
  segments_sampled_ += reply.segments.size();
  return reply;
}

Status ServerImpl::UpdatePriorities(const schema::PriorityUpdate& update) {
  std::lock_guard<std::mutex> lock(state_mutex_);
  Table* table = FindTable(update.table);
  if (table == nullptr) {
    return Status::InvalidArgument(std::string(schema::reject::kUnexpected) +
                                   ": no table named '" + update.table + "'");
  }
  if (table->config().sampler.kind != SamplerKind::kPrioritized) {
    return Status::InvalidArgument(std::string(schema::reject::kUnexpected) + ": table '" +
                                   table->config().name + "' uses the " +
                                   SamplerKindName(table->config().sampler.kind) +
                                   " sampler, which has no priorities");
  }
  rocksdb::WriteBatch batch;
  for (size_t i = 0; i < update.sequences.size(); ++i) {
    // Items deleted by retention since the learner sampled them are skipped, not errors.
    if (!table->SetPriority(update.sequences[i], update.priorities[i]).ok()) continue;
    batch.Put(meta::Priority(update.sequences[i]),
              std::string(reinterpret_cast<const char*>(&update.priorities[i]), sizeof(double)));
  }
  return store_->WriteSampling(&batch);
}

void ServerImpl::HandleLearnerFrame(const std::string& identity, const zmq::message_t& frame) {
  const auto received = Clock::now();
  Result<schema::Message> message = schema::Decode(transport::View(frame), limits_);
  if (!message.ok()) {
    Reject(learner_socket_, identity, message.status(), nullptr);
    return;
  }
  auto send = [&](const std::string& reply) {
    (void)transport::SendParts(learner_socket_, {identity, reply}, true);
  };
  switch (message->kind) {
    case schema::MessageKind::kHello:
      send(schema::EncodeCredit({0, instance_}));
      return;
    case schema::MessageKind::kStatsRequest:
      send(schema::EncodeStats(StatsJson()));
      return;
    case schema::MessageKind::kSampleRequest: {
      sample_requests_++;
      Status error;
      schema::SampleReply reply = Sample(message->sample_request, &error);
      if (!error.ok()) {
        Reject(learner_socket_, identity, error, nullptr);
        return;
      }
      send(schema::EncodeSampleReply(reply));
      if (!reply.segments.empty()) {
        sample_latency_.Add(
            std::chrono::duration<double, std::milli>(Clock::now() - received).count());
      }
      return;
    }
    case schema::MessageKind::kPriorityUpdate: {
      Status status = UpdatePriorities(message->priority_update);
      if (!status.ok()) {
        Reject(learner_socket_, identity, status, nullptr);
      } else {
        send(schema::EncodeAck({}));
      }
      return;
    }
    default:
      Reject(learner_socket_, identity,
             Status::InvalidArgument(std::string(schema::reject::kUnexpected) + ": " +
                                     std::string(schema::MessageKindName(message->kind)) +
                                     " is not accepted on the learner endpoint"),
             nullptr);
  }
}

void ServerImpl::LearnerLoop() {
  // Sample requests are small and latency-bound; everything else here is bulk work.
  transport::MarkLatencySensitive();
  while (!stopping_) {
    Result<bool> readable = transport::WaitReadable(learner_socket_, std::chrono::milliseconds(100));
    if (!readable.ok()) {
      spdlog::error("replay server: {}", readable.status().ToString());
      return;
    }
    if (!*readable) continue;
    Result<std::vector<zmq::message_t>> parts = transport::ReceiveParts(learner_socket_);
    if (!parts.ok() || parts->empty()) continue;
    const std::string identity(transport::View((*parts)[0]));
    if (parts->size() != 2) {
      Reject(learner_socket_, identity,
             Status::Corruption(std::string(schema::reject::kMalformed) +
                                ": expected one frame per message"),
             nullptr);
      continue;
    }
    HandleLearnerFrame(identity, (*parts)[1]);
  }
}

std::string ServerImpl::StatsJson() {
  nlohmann::json j;
  const auto now = Clock::now();
  j["instance"] = instance_;
  j["uptime_s"] = std::chrono::duration<double>(now - started_).count();
  const uint64_t bytes = bytes_stored_;
  const uint64_t segments = segments_stored_;
  nlohmann::json rejects = nlohmann::json::object();
  uint64_t rejects_total = 0;
  double rate_mb = 0;
  double rate_segments = 0;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    for (const auto& [reason, count] : rejects_) {
      rejects[reason] = count;
      rejects_total += count;
    }
    const double seconds = std::chrono::duration<double>(now - rate_since_).count();
    if (seconds > 0) {
      rate_mb = static_cast<double>(bytes - rate_bytes_) / seconds / 1e6;
      rate_segments = static_cast<double>(segments - rate_segments_) / seconds;
    }
    rate_since_ = now;
    rate_bytes_ = bytes;
    rate_segments_ = segments;
  }
  j["ingest"] = {{"segments", segments},
                 {"bytes", bytes},
                 {"duplicates", duplicates_.load()},
                 {"write_errors", write_errors_.load()},
                 {"segments_per_s", rate_segments},
                 {"mb_per_s", rate_mb}};
  j["rejects"] = rejects;
  j["rejects_total"] = rejects_total;
  const auto [p50, p99] = sample_latency_.P50P99();
  j["sample"] = {{"requests", sample_requests_.load()},
                 {"segments", segments_sampled_.load()},
                 {"not_ready", samples_not_ready_.load()},
                 {"replayed", samples_replayed_.load()},
                 {"latency_ms_p50", p50},
                 {"latency_ms_p99", p99}};
  j["retention"] = {{"deleted_segments", deleted_segments_.load()}};
  nlohmann::json tables = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    for (const auto& table : tables_) {
      const TableConfig& c = table->config();
      tables.push_back({{"name", c.name},
                        {"sampler", SamplerKindName(c.sampler.kind)},
                        {"stored_segments", table->stored_items()},
                        {"stored_bytes", table->stored_bytes()},
                        {"sampleable", table->sampleable_items()},
                        {"capacity", c.capacity},
                        {"fill", static_cast<double>(table->sampleable_items()) /
                                     static_cast<double>(c.capacity)},
                        {"inserts", table->inserts()},
                        {"samples", table->samples()}});
    }
  }
  j["tables"] = tables;
  return j.dump();
}

}  // namespace

Result<ServerOptions> ParseServerConfig(const std::string& yaml, const std::string& origin) {
  STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromString(yaml, origin));
  ServerOptions options;
  ConfigReader server = root.Section("server");
  server.Optional("db", &options.db_path);
  server.Optional("bind", &options.actor_endpoint);
  server.Optional("sample_bind", &options.learner_endpoint);
  int64_t max_message_bytes = static_cast<int64_t>(options.max_message_bytes);
  int64_t credit_bytes = static_cast<int64_t>(options.credit_bytes);
  int64_t write_batch_bytes = static_cast<int64_t>(options.write_batch_bytes);
  int64_t writer_threads = options.writer_threads;
  int64_t max_queued_bytes = static_cast<int64_t>(options.max_queued_bytes);
  int64_t max_token_id = options.max_token_id;
  int64_t intake_nice = options.intake_nice;
  server.Optional("max_message_bytes", &max_message_bytes);
  server.Optional("credit_bytes", &credit_bytes);
  server.Optional("write_batch_bytes", &write_batch_bytes);
  server.Optional("writer_threads", &writer_threads);
  server.Optional("max_queued_bytes", &max_queued_bytes);
  server.Optional("intake_nice", &intake_nice);
  server.Optional("max_token_id", &max_token_id);
  server.Optional("sync_wal", &options.sync_wal);
  server.Optional("compression", &options.compression);
  server.Optional("sample_log_steps", &options.sample_log_steps);
  server.Optional("stats_interval_s", &options.stats_interval_s);
  server.Check(max_message_bytes >= 4096, "max_message_bytes", "must be at least 4096");
  server.Check(credit_bytes >= max_message_bytes, "credit_bytes",
               "must be at least max_message_bytes");
  server.Check(write_batch_bytes >= 1, "write_batch_bytes", "must be positive");
  server.Check(writer_threads >= 1 && writer_threads <= 64, "writer_threads",
               "must be in [1, 64]");
  server.Check(max_queued_bytes >= 1, "max_queued_bytes", "must be positive");
  server.Check(intake_nice >= 0 && intake_nice <= 19, "intake_nice", "must be in [0, 19]");
  server.Check(max_token_id >= 1 && max_token_id <= INT32_MAX, "max_token_id",
               "must be in [1, 2^31)");
  server.Check(options.compression == "lz4" || options.compression == "zstd" ||
                   options.compression == "snappy" || options.compression == "none",
               "compression", "must be lz4, zstd, snappy or none");
  server.Check(options.sample_log_steps >= 1, "sample_log_steps", "must be >= 1");
  server.Check(options.stats_interval_s >= 0, "stats_interval_s", "must be >= 0");
  options.max_message_bytes = static_cast<uint64_t>(max_message_bytes);
  options.credit_bytes = static_cast<uint64_t>(credit_bytes);
  options.write_batch_bytes = static_cast<uint64_t>(write_batch_bytes);
  options.writer_threads = static_cast<int>(writer_threads);
  options.max_queued_bytes = static_cast<uint64_t>(max_queued_bytes);
  options.intake_nice = static_cast<int>(intake_nice);
  options.max_token_id = static_cast<int32_t>(max_token_id);
  std::set<std::string> names;
  for (ConfigReader& table : root.List("tables")) {
    options.tables.push_back(ReadTableConfig(table));
    if (!names.insert(options.tables.back().name).second) {
      table.Fail("name", "another table already has the name '" + options.tables.back().name +
                             "'");
    }
  }
  STRIDER_RETURN_IF_ERROR(root.Finish());
  return options;
}

Result<ServerOptions> LoadServerConfig(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status::NotFound(path + ": cannot open config file");
  std::stringstream text;
  text << file.rdbuf();
  return ParseServerConfig(text.str(), path);
}

Result<std::unique_ptr<ReplayServer>> ReplayServer::Start(ServerOptions options) {
  auto server = std::make_unique<ServerImpl>(std::move(options));
  Status status = server->Init();
  if (!status.ok()) {
    server->Stop();
    return status;
  }
  return std::unique_ptr<ReplayServer>(std::move(server));
}

void ConfigureServerProcessMemory() {
  mallopt(M_ARENA_MAX, 1);  // one heap for all threads
  KeepFreedMemoryInHeap();  // segments and memtable blocks from it, kept when freed
}

}  // namespace strider::replay
