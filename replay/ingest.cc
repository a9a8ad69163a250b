// The replay server's ingest: the actor thread decodes, checks and queues segments and sends
// acks; the writer threads store groups of them and publish them to the tables (the picture is
// in replay/server_impl.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "replay/server_impl.h"

namespace strider::replay::internal {

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
  // Not waited for, as SendActor's replies: a client that misses it resends on its timer.
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
      Reject(actor_socket_, identity, NotAccepted(message->kind, "actor"), nullptr);
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
    Reject(actor_socket_, identity, NoTable(table), &key);
    return;
  }
  if (disk_full_) {
    // Nothing is queued that could not be written: the client keeps the segment and sends it
    // again after a pause.
    Reject(actor_socket_, identity, Status::ResourceExhausted(DiskFullMessage()), &key);
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
    MutexLock lock(&queue_mutex_);
    queue_.push_back(std::move(pending));
  }
  queue_ready_.Signal();
}

void ServerImpl::SendAcks() {
  std::vector<Completion> done;
  {
    MutexLock lock(&done_mutex_);
    done.swap(done_);
  }
  std::map<std::string, std::vector<schema::SegmentKey>> acks;
  for (const Completion& c : done) {
    auto it = in_flight_bytes_.find(c.identity);
    if (it != in_flight_bytes_.end()) {
      it->second -= std::min(it->second, c.bytes);
      if (it->second == 0) in_flight_bytes_.erase(it);
    }
    if (!c.refused.empty()) {
      Reject(actor_socket_, c.identity, Status::AlreadyExists(c.refused), &c.key);
    } else if (c.error.empty()) {
      acks[c.identity].push_back(c.key);
    } else if (c.disk_full) {
      Reject(actor_socket_, c.identity, Status::ResourceExhausted(c.error), &c.key);
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

void ServerImpl::EnterDiskFull(const std::string& why) {
  {
    MutexLock lock(&space_mutex_);
    if (disk_full_) return;
    disk_full_why_ = why;
    disk_full_ = true;
  }
  disk_full_episodes_++;
  spdlog::error("replay server: ingest stopped, segments are refused until there is room: {}",
                why);
}

std::string ServerImpl::DiskFullMessage() {
  MutexLock lock(&space_mutex_);
  return std::string(schema::reject::kDiskFull) + ": the replay store at " + options_.db_path +
         " takes no more segments (" + disk_full_why_ + "); send again later";
}

void ServerImpl::CheckSpace() {
  std::error_code error;
  uint64_t bytes = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(options_.db_path, error);
       !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
    std::error_code size_error;
    if (it->is_regular_file(size_error)) {
      const uintmax_t size = it->file_size(size_error);
      if (!size_error) bytes += size;
    }
  }
  store_bytes_ = bytes;
  if (!disk_full_) return;
  // Room means a write batch twice over (its log record and the memtable flush that follows),
  // on the disk and under the quota.
  const uint64_t room = 2 * options_.write_batch_bytes + (1 << 20);
  const std::filesystem::space_info space = std::filesystem::space(options_.db_path, error);
  if (error || space.available < room) return;
  if (options_.max_store_bytes > 0 && bytes + room > options_.max_store_bytes) return;
  // RocksDB's own recovery from a full disk waits for a free buffer of a memtable's size, which a
  // small disk never has, and a log file that failed stays failed: reopening starts a new log
  // and replays the old one up to its last whole record (the write that failed was never
  // acknowledged).
  Status reopened = ReopenStore();
  if (!reopened.ok()) {
    spdlog::warn("replay server: there is room again, but the store did not reopen: {}",
                 reopened.message());
    return;
  }
  {
    MutexLock lock(&space_mutex_);
    disk_full_ = false;
    disk_full_why_.clear();
  }
  spdlog::info("replay server: ingest resumed ({} bytes free, the store takes {} bytes)",
               space.available, bytes);
}

void ServerImpl::AbandonStale() {
  if (options_.abandon_after_s <= 0) return;
  const uint64_t now_ms = NowUnixMs();
  const auto limit_ms = static_cast<uint64_t>(options_.abandon_after_s * 1000);
  auto silent = [&](const OpenTrajectory& open) { return now_ms > open.last_unix_ms + limit_ms; };
  std::vector<std::string> stale;
  {
    MutexLock lock(&state_mutex_);
    for (const auto& [id, open] : open_) {
      if (silent(open)) stale.push_back(id);
    }
  }
  for (const std::string& id : stale) {
    {
      // Held like a writer holds it, so no segment of it is written meanwhile.
      MutexLock lock(&queue_mutex_);
      if (busy_trajectories_.count(id)) continue;
      busy_trajectories_.insert(id);
    }
    bool still_silent = false;
    {
      MutexLock lock(&state_mutex_);
      auto it = open_.find(id);
      still_silent = it != open_.end() && silent(it->second);
    }
    Status marked = still_silent ? store_->MarkAbandoned(id) : Status::Ok();
    if (still_silent && marked.ok()) {
      MutexLock lock(&state_mutex_);
      auto it = open_.find(id);
      if (it != open_.end()) {
        if (Table* table = FindTable(it->second.table)) table->Abandon(id, it->second.items);
        open_.erase(it);
      }
      abandoned_.insert(id);
      abandoned_count_++;
      schema::TrajectoryId trajectory;
      std::memcpy(trajectory.bytes.data(), id.data(), std::min(id.size(), trajectory.bytes.size()));
      spdlog::warn("replay server: trajectory {} abandoned: no segment for {} s and its last "
                   "one never came (its actor presumably died); it is never sampled",
                   trajectory.Hex(), options_.abandon_after_s);
    } else if (!marked.ok()) {
      spdlog::warn("replay server: marking a trajectory abandoned: {}", marked.message());
    }
    ReleaseTrajectories({id});
  }
}

Status ServerImpl::ReopenStore() {
  WriterMutexLock lock(&store_mutex_);
  segment_writers_.clear();
  store_.reset();
  Result<std::unique_ptr<Store>> reopened = Store::Open(options_.db_path, store_options_);
  Status status = reopened.status();
  if (reopened.ok()) {
    store_ = std::move(*reopened);
    status = MakeSegmentWriters();
    if (status.ok()) return Status::Ok();
    store_.reset();
  }
  // Reads go on from a read-only open; ingest stays stopped and the next check tries again.
  StoreOptions read_only = store_options_;
  read_only.read_only = true;
  Result<std::unique_ptr<Store>> fallback = Store::Open(options_.db_path, read_only);
  if (!fallback.ok()) {
    spdlog::critical("replay server: the store cannot be opened at all: {}",
                     fallback.status().message());
    std::abort();  // nothing left to serve from; a supervisor restarts the server
  }
  store_ = std::move(*fallback);
  // Ingest stays stopped over the read-only store, so writers that cannot be made there cost
  // nothing until the next reopen makes them again; the error is still worth a line.
  if (const Status writers = MakeSegmentWriters(); !writers.ok()) {
    spdlog::warn("replay server: segment writers over the read-only store: {}", writers.message());
  }
  return status;
}

Status ServerImpl::MakeSegmentWriters() {
  segment_writers_.clear();
  std::vector<std::string> names;
  for (const TableConfig& config : options_.tables) names.push_back(config.name);
  // Room for a group of write_batch_bytes and its index entries, summaries and counters.
  const size_t batch_reserve = options_.write_batch_bytes + (256 << 10);
  for (int slot = 0; slot < options_.writer_threads; ++slot) {
    STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<SegmentWriter> writer,
                             store_->NewSegmentWriter(slot, names, batch_reserve));
    segment_writers_.push_back(std::move(writer));
  }
  return Status::Ok();
}

std::string ServerImpl::ConflictMessage(const schema::SegmentKey& key) {
  return std::string(schema::reject::kConflict) + ": segment " + key.ToString() +
         " is already stored with different content; the stored one is kept";
}

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
    MutexLock lock(&queue_mutex_);
    for (const std::string& trajectory : trajectories) busy_trajectories_.erase(trajectory);
  }
  queue_ready_.SignalAll();
}

void ServerImpl::WriterLoop(int slot) {
  auto next_age_check = Clock::now();
  while (true) {
    std::vector<PendingSegment> group;
    std::vector<std::string> trajectories;
    {
      MutexLock lock(&queue_mutex_);
      const auto deadline = Clock::now() + std::chrono::milliseconds(200);
      while (!stopping_ && queue_.empty()) {
        if (!queue_ready_.WaitUntil(&queue_mutex_, deadline)) break;
      }
      if (queue_.empty() && stopping_) return;
      group = TakeGroup(&trajectories);
      if (group.empty() && !queue_.empty()) {
        // Everything queued belongs to trajectories other writers hold: wait for a release.
        queue_ready_.WaitFor(&queue_mutex_, std::chrono::milliseconds(5));
      }
    }
    if (!group.empty()) {
      ReaderMutexLock store_lock(&store_mutex_);  // ReopenStore waits
      WriteGroup(group, slot, trajectories);
    }
    if (slot == 0 && Clock::now() >= next_age_check) {
      CheckSpace();  // takes the store lock itself to reopen the store
      if (!disk_full_) {
        ReaderMutexLock store_lock(&store_mutex_);
        ApplyRetention();
        AbandonStale();
        const StoreMemory memory = store_->Memory();
        MutexLock memory_lock(&memory_mutex_);
        store_memory_ = memory;
      }
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
  // Per segment of the group: why it is refused ("" when it is stored or a true duplicate).
  std::vector<std::string> refused(group.size());
  std::vector<size_t> repeats;  // keys stored by an earlier batch: compared below
  uint64_t ticket = 0;
  {
    // Sequence numbers and tickets in one order. No other writer holds these trajectories, so
    // no other writer can be storing these keys right now: stored_keys_ is exact for them.
    MutexLock lock(&commit_mutex_);
    std::unordered_map<std::string, const PendingSegment*> in_group;
    for (size_t i = 0; i < group.size(); ++i) {
      const PendingSegment& p = group[i];
      std::string store_key = SegmentStoreKey(p.facts.key);
      if (stored_keys_.count(store_key)) {
        repeats.push_back(i);
        continue;
      }
      auto [first, inserted] = in_group.emplace(store_key, &p);
      if (!inserted) {
        if (first->second->envelope != p.envelope) refused[i] = ConflictMessage(p.facts.key);
        continue;  // the first of the group is stored
      }
      stored.push_back({next_sequence_++, &p, std::move(store_key)});
    }
    if (!stored.empty()) ticket = next_ticket_++;
  }
  // A key stored before: an identical retry is acknowledged again; different bytes under the
  // same key are a conflict, refused, and the first content stays.
  for (size_t i : repeats) {
    const PendingSegment& p = group[i];
    Result<std::optional<std::string>> value =
        store_->Get(store_->segments(), SegmentStoreKey(p.facts.key));
    if (value.ok() && value->has_value() && (*value)->size() >= 8 &&
        std::string_view(**value).substr(8) != p.envelope) {
      refused[i] = ConflictMessage(p.facts.key);
    }
    // Deleted by retention meanwhile, or unreadable: it was stored and acknowledged once.
  }
  std::map<std::string, uint32_t> conflicts;  // by trajectory, for its summary
  for (size_t i = 0; i < group.size(); ++i) {
    if (!refused[i].empty()) {
      conflicts_++;
      conflicts[std::string(group[i].facts.key.trajectory.View())] += 1;
      spdlog::warn("replay server: {}", refused[i]);
    }
  }
  duplicates_ += group.size() - stored.size() -
                 std::count_if(refused.begin(), refused.end(),
                               [](const std::string& r) { return !r.empty(); });

  std::string error;
  bool disk_full = false;
  if (!stored.empty()) {
    std::vector<SegmentInsert> inserts;
    inserts.reserve(stored.size());
    uint64_t group_bytes = 0;
    for (const Stored& st : stored) {
      inserts.push_back({st.sequence, st.store_key, st.segment->envelope, &st.segment->facts});
      group_bytes += st.segment->envelope.size();
    }
    if (!disk_full_ && options_.max_store_bytes > 0 &&
        store_bytes_ + group_bytes > options_.max_store_bytes) {
      EnterDiskFull("the store would pass max_store_bytes (" +
                    std::to_string(options_.max_store_bytes) + " bytes)");
    }
    // Once a write found the disk full, no other is tried until CheckSpace finds room: RocksDB
    // (built with assertions on Debian) aborts on writes retried into a failed log file.
    Status status = disk_full_ ? Status::ResourceExhausted(DiskFullMessage())
                               : segment_writers_[slot]->Write(inserts, now_ms);
    if (status.ok()) {
      store_bytes_ += group_bytes;
      MutexLock lock(&commit_mutex_);
      for (const Stored& st : stored) stored_keys_[st.store_key] = st.sequence;
    } else if (status.code() == StatusCode::kResourceExhausted) {
      // Nothing of the group is durable; the clients keep it and send it again.
      if (!disk_full_) EnterDiskFull(status.message());
      disk_full = true;
      error = DiskFullMessage();
    } else {
      // Nothing of the group is durable: tell the clients, they resend after their ack
      // timeout. Its sequence numbers stay unused (gaps are allowed).
      write_errors_++;
      error = status.ToString();
      spdlog::error("replay server: {}", error);
    }

    // Publish in ticket order, so the tables see sequence numbers in increasing order.
    MutexLock publish(&publish_mutex_);
    while (next_publish_ != ticket) published_.Wait(&publish_mutex_);
    for (size_t begin = 0; error.empty() && begin < stored.size(); begin += kPublishChunk) {
      // A learner request that waited for the previous chunk goes first: the lock is not fair,
      // and this thread would otherwise take it straight back.
      while (begin > 0 && learners_waiting_.load() > 0 && !stopping_) std::this_thread::yield();
      MutexLock lock(&state_mutex_);
      const size_t end = std::min(stored.size(), begin + kPublishChunk);
      for (size_t i = begin; i < end; ++i) {
        const Stored& st = stored[i];
        Table* table = FindTable(st.segment->facts.table);
        if (table == nullptr) continue;
        ItemInfo info;
        info.min_policy_version = st.segment->facts.min_policy_version;
        info.max_policy_version = st.segment->facts.max_policy_version;
        info.bytes = st.segment->envelope.size();
        info.tokens = st.segment->facts.tokens;
        info.insert_unix_ms = now_ms;
        info.priority = table->config().sampler.default_priority;
        table->Insert(st.sequence, info, /*counted=*/true, &st.segment->facts);
        const std::string id(st.segment->facts.key.trajectory.View());
        if (abandoned_.count(id)) {
          table->Abandon(id, {st.sequence});  // late: stored, never sampled
        } else if (st.segment->facts.is_last) {
          open_.erase(id);
        } else {
          OpenTrajectory& open = open_[id];
          open.last_unix_ms = now_ms;
          open.table = st.segment->facts.table;
          open.items.push_back(st.sequence);
        }
        segments_stored_++;
        bytes_stored_ += info.bytes;
      }
    }
    ++next_publish_;
    published_.SignalAll();
  }
  // Counted in the trajectories' summaries (written after the group, whose batch may have
  // created them), while this writer still holds the trajectories.
  if (!conflicts.empty() && !disk_full_) {
    Status counted = store_->AddConflicts(conflicts);
    if (!counted.ok()) spdlog::warn("replay server: counting conflicts: {}", counted.message());
  }
  ReleaseTrajectories(trajectories);

  // Retention before the acks, so a client that saw its ack also sees the bound respected.
  if (!stored.empty() && error.empty()) ApplyRetention();
  {
    MutexLock lock(&done_mutex_);
    uint64_t bytes = 0;
    for (size_t i = 0; i < group.size(); ++i) {
      const PendingSegment& p = group[i];
      done_.push_back({p.identity, p.facts.key, p.envelope.size(),
                       refused[i].empty() ? error : std::string(), refused[i], disk_full});
      bytes += p.envelope.size();
    }
    queued_bytes_ -= bytes;
    // A full wake pipe already holds a wake-up for this one to join.
    (void)transport::SendParts(wake_sender_, {std::string_view("w", 1)}, true);
  }
}

}  // namespace strider::replay::internal
