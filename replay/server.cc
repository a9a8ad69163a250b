// The replay server's start-up, recovery, shutdown and stats (replay/server_impl.h has the
// picture of its threads).
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "common/process_memory.h"
#include "replay/server_impl.h"

namespace strider::replay {
namespace internal {

Status ServerImpl::Init() {
  // Nothing is created or opened before the options are known to be usable.
  STRIDER_RETURN_IF_ERROR(CompleteAndCheckOptions(options_));
  store_options_.sync_wal = options_.sync_wal;
  store_options_.compression = options_.compression;
  store_options_.memtable_bytes = options_.memtable_mb << 20;
  store_options_.block_cache_bytes = options_.block_cache_mb << 20;
  store_options_.max_open_files = options_.max_open_files;
  // RocksDB creates the store's own directory, not its parents (runs/NAME/replay).
  if (const std::filesystem::path parent = std::filesystem::path(options_.db_path).parent_path();
      !parent.empty()) {
    std::error_code error;
    std::filesystem::create_directories(parent, error);
    if (error) {
      return Status::IoError("cannot create " + parent.string() + " for the replay store: " +
                             error.message());
    }
  }
  Result<std::unique_ptr<Store>> store = Store::Open(options_.db_path, store_options_);
  if (store.status().code() == StatusCode::kResourceExhausted) {
    // No room even to open for writing: serve what is stored, refuse segments until there is.
    spdlog::error("replay server: {}; serving the store read-only until there is room",
                  store.status().message());
    StoreOptions read_only = store_options_;
    read_only.read_only = true;
    store = Store::Open(options_.db_path, read_only);
    if (store.ok()) EnterDiskFull("no room to open the store for writing");
  }
  STRIDER_RETURN_IF_ERROR(store.status());
  store_ = std::move(*store);
  if (options_.verify_on_start != StartVerify::kNone) {
    const auto start = Clock::now();
    Result<TableCheck> checked =
        store_->VerifyTables(/*all=*/options_.verify_on_start == StartVerify::kAll);
    if (checked.status().code() == StatusCode::kCorruption) {
      return checked.status().WithContext(
          "replay server: the store is damaged; `strider replay inspect " + options_.db_path +
          " verify` lists what is readable, and `serve --no-verify` serves it as it is");
    }
    STRIDER_RETURN_IF_ERROR(checked.status().WithContext("replay server: checking table files"));
    spdlog::info(
        "replay server: checksums of {} table files ({:.1f} MiB) verified in {:.2f} s; {} files "
        "({:.1f} MiB) checked at an earlier start not read",
        checked->files, checked->bytes / 1048576.0,
        std::chrono::duration<double>(Clock::now() - start).count(), checked->skipped_files,
        checked->skipped_bytes / 1048576.0);
  }
  STRIDER_ASSIGN_OR_RETURN(LossReport loss, store_->CheckLoss());
  if (loss.lost > 0) {
    const std::string what = options_.db_path + " lost " + std::to_string(loss.lost) +
                             " acknowledged segments (" + loss.detail +
                             "): its write-ahead log was damaged, truncated or removed";
    if (!options_.accept_loss) {
      return Status::Corruption(
          "replay store " + what + ". `strider replay inspect " + options_.db_path +
          " verify` shows what is left; start with --accept-loss to serve it (the loss is "
          "recorded in the store)");
    }
    if (!disk_full_) STRIDER_RETURN_IF_ERROR(store_->AcceptLoss(loss));
    spdlog::warn("replay server: accepted: replay store {}", what);
  }
  STRIDER_RETURN_IF_ERROR(Recover());
  CheckSpace();  // the store's size, for max_store_bytes
  store_memory_ = store_->Memory();

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
  if (options_.auth.enabled()) {
    // A refused client never completes its handshake: the actor and learner threads never see
    // a message of it, so it can neither write nor sample.
    STRIDER_ASSIGN_OR_RETURN(actor_curve_,
                             transport::CurveServer::Start(actor_context_.get(), options_.auth,
                                                           "replay server (actor endpoint)"));
    transport::ServerAuth learner_auth = options_.auth;
    if (!options_.learner_keys.empty()) learner_auth.authorized_keys = options_.learner_keys;
    STRIDER_ASSIGN_OR_RETURN(learner_curve_,
                             transport::CurveServer::Start(learner_context_.get(), learner_auth,
                                                           "replay server (learner endpoint)"));
    STRIDER_RETURN_IF_ERROR(actor_curve_->Secure(actor_socket_));
    STRIDER_RETURN_IF_ERROR(learner_curve_->Secure(learner_socket_));
  }
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
  spdlog::info("replay server: store {}, actors on {}, learners on {}, {} table(s){}",
               options_.db_path, actor_endpoint_, learner_endpoint_, tables_.size(),
               options_.auth.enabled() ? ", CURVE with ZAP" : "");
  return Status::Ok();
}

Status ServerImpl::Recover() {
  if (!disk_full_) STRIDER_RETURN_IF_ERROR(store_->MigrateSamplingState());
  STRIDER_ASSIGN_OR_RETURN(next_sequence_, store_->NextSequence());
  if (next_sequence_ == 0) next_sequence_ = 1;
  if (options_.writer_threads < 1) options_.writer_threads = 1;
  std::vector<std::pair<std::string, std::string>> definitions;
  std::map<std::string, Table*> by_name;
  for (const TableConfig& config : options_.tables) {
    STRIDER_ASSIGN_OR_RETURN(uint64_t inserts, store_->TableInserts(config.name));
    STRIDER_ASSIGN_OR_RETURN(uint64_t samples,
                             store_->GetSamplingCounter(meta::TableSamples(config.name)));
    tables_.push_back(std::make_unique<Table>(config, inserts, samples, instance_));
    by_name[config.name] = tables_.back().get();
    definitions.push_back({config.name, TableConfigJson(config)});
  }
  STRIDER_RETURN_IF_ERROR(MakeSegmentWriters());
  if (!disk_full_) STRIDER_RETURN_IF_ERROR(store_->WriteTableDefinitions(definitions));

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

  // Trajectories still open, and those closed as abandoned: their items are collected below.
  std::unordered_map<std::string, OpenTrajectory> open, abandoned;
  auto summaries = store_->Scan(store_->trajectories());
  for (summaries->SeekToFirst(); summaries->Valid(); summaries->Next()) {
    Result<schema::TrajectorySummary> summary = schema::DecodeTrajectorySummary(
        std::string_view(summaries->value().data(), summaries->value().size()));
    if (!summary.ok()) continue;  // verify reports it; ingest rebuilds it
    const std::string id(summaries->key().data(), summaries->key().size());
    if (summary->abandoned) {
      abandoned[id];
    } else if (!summary->complete) {
      open[id];
    }
  }
  if (!summaries->status().ok()) {
    return FromRocks(summaries->status(), "scanning the trajectory summaries");
  }
  uint64_t orphans = 0;
  auto seq = store_->Scan(store_->sequence());
  for (seq->SeekToFirst(); seq->Valid(); seq->Next()) {
    const uint64_t sequence = ParseSequenceKey({seq->key().data(), seq->key().size()});
    Result<IndexRecord> record = DecodeIndexRecord({seq->value().data(), seq->value().size()});
    if (!record.ok()) return record.status().WithContext("recovering the sequence index");
    stored_keys_[SegmentStoreKey(record->key)] = sequence;
    next_sequence_ = std::max(next_sequence_, sequence + 1);
    const std::string id(record->key.trajectory.View());
    for (auto* tracked : {&open, &abandoned}) {
      auto found = tracked->find(id);
      if (found == tracked->end()) continue;
      found->second.table = record->table;
      found->second.items.push_back(sequence);
    }
    auto table = by_name.find(record->table);
    if (table == by_name.end()) {
      ++orphans;
      continue;
    }
    ItemInfo info;
    info.min_policy_version = record->min_policy_version;
    info.max_policy_version = record->max_policy_version;
    info.bytes = record->bytes;
    info.tokens = record->tokens;
    info.insert_unix_ms = record->insert_unix_ms;
    auto t = times_sampled.find(sequence);
    info.times_sampled = t == times_sampled.end() ? 0 : t->second;
    auto p = priorities.find(sequence);
    info.priority = p == priorities.end() ? table->second->config().sampler.default_priority
                                          : p->second;
    if (table->second->config().unit == SampleUnit::kSegment) {
      table->second->Insert(sequence, info, /*counted=*/false);
      continue;
    }
    // Trajectory and group tables rebuild their completion bookkeeping from the segments
    // themselves (the index record has no group): one read per segment, at start-up only.
    STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> value,
                             store_->Get(store_->segments(), SegmentStoreKey(record->key)));
    std::optional<schema::SegmentFacts> facts;
    if (value && value->size() > 8) {
      Result<schema::Message> message = schema::Decode(std::string_view(*value).substr(8), limits_,
                                                       schema::SegmentDecoding::kFactsOnly);
      if (message.ok() && message->kind == schema::MessageKind::kSegment) {
        facts = message->segment_facts;
      }
    }
    if (!facts) {
      spdlog::warn("replay server: segment {} could not be read back; table {} never samples "
                   "its trajectory",
                   record->key.ToString(), record->table);
    }
    table->second->Insert(sequence, info, /*counted=*/false, facts ? &*facts : nullptr);
  }
  if (!seq->status().ok()) return FromRocks(seq->status(), "scanning the sequence index");
  for (auto& [id, closed] : abandoned) {
    auto table = by_name.find(closed.table);
    if (table != by_name.end()) table->second->Abandon(id, closed.items);
    abandoned_.insert(id);
  }
  // An open trajectory's silence counts from this start: the store does not say when its last
  // segment arrived before.
  const uint64_t now_ms = NowUnixMs();
  for (auto& [id, still_open] : open) {
    still_open.last_unix_ms = now_ms;
    open_[id] = std::move(still_open);
  }
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
    queue_ready_.SignalAll();
    if (actor_thread_.joinable()) actor_thread_.join();
    if (learner_thread_.joinable()) learner_thread_.join();
    queue_ready_.SignalAll();
    for (std::thread& writer : writer_threads_) {
      if (writer.joinable()) writer.join();
    }
    actor_socket_.close();
    learner_socket_.close();
    wake_receiver_.close();
    {
      // The threads are joined: nothing else waits for these locks now.
      MutexLock lock(&done_mutex_);
      wake_sender_.close();
    }
    actor_curve_.reset();
    learner_curve_.reset();
    WriterMutexLock store_lock(&store_mutex_);
    store_.reset();
  });
}

std::string ServerImpl::Stats(bool new_window) {
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
    MutexLock lock(&stats_mutex_);
    for (const auto& [reason, count] : rejects_) {
      rejects[reason] = count;
      rejects_total += count;
    }
    const double seconds = std::chrono::duration<double>(now - rate_since_).count();
    if (seconds > 0) {
      rate_mb = static_cast<double>(bytes - rate_bytes_) / seconds / 1e6;
      rate_segments = static_cast<double>(segments - rate_segments_) / seconds;
    }
    if (new_window) {
      rate_since_ = now;
      rate_bytes_ = bytes;
      rate_segments_ = segments;
    }
  }
  j["ingest"] = {{"segments", segments},
                 {"bytes", bytes},
                 {"duplicates", duplicates_.load()},
                 {"conflicts", conflicts_.load()},
                 {"write_errors", write_errors_.load()},
                 {"disk_full", disk_full_.load()},
                 {"disk_full_stops", disk_full_episodes_.load()},
                 {"store_bytes", store_bytes_.load()},
                 {"segments_per_s", rate_segments},
                 {"mb_per_s", rate_mb}};
  j["rejects"] = rejects;
  j["rejects_total"] = rejects_total;
  const auto [p50, p99] = sample_latency_.P50P99();
  j["sample"] = {{"requests", sample_requests_.load()},
                 {"segments", segments_sampled_.load()},
                 {"not_ready", samples_not_ready_.load()},
                 {"replayed", samples_replayed_.load()},
                 {"unrecorded", unrecorded_draws_.load()},
                 {"latency_ms_p50", p50},
                 {"latency_ms_p99", p99}};
  j["retention"] = {{"deleted_segments", deleted_segments_.load()}};
  {
    MutexLock lock(&state_mutex_);
    j["trajectories"] = {{"open", open_.size()}, {"abandoned", abandoned_count_.load()}};
  }
  nlohmann::json tables = nlohmann::json::array();
  {
    MutexLock lock(&state_mutex_);
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
  {
    // Read by the first writer with its periodic checks: StatsJson runs on threads that may
    // already hold the store lock.
    MutexLock lock(&memory_mutex_);
    const StoreMemory& memory = store_memory_;
    j["memory"] = {{"resident_bytes", ResidentBytes()},
                   {"memtables_bytes", memory.memtables_bytes},
                   {"table_readers_bytes", memory.table_readers_bytes},
                   {"block_cache_bytes", memory.block_cache_bytes},
                   {"table_files", memory.table_files}};
  }
  return j.dump();
}

}  // namespace internal

Result<std::unique_ptr<ReplayServer>> ReplayServer::Start(ServerOptions options) {
  auto server = std::make_unique<internal::ServerImpl>(std::move(options));
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
