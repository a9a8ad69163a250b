// The replay server's ingest: the actor thread decodes, checks and queues segments and sends
// acks; the writer threads store groups of them and publish them to the tables (the picture is
// in replay/server_impl.h).
#include <spdlog/spdlog.h>

#include <algorithm>
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
  if (!stored.empty()) {
    std::vector<SegmentInsert> inserts;
    inserts.reserve(stored.size());
    for (const Stored& st : stored) {
      inserts.push_back({st.sequence, st.store_key, st.segment->envelope, &st.segment->facts});
    }
    Status status = segment_writers_[slot]->Write(inserts, now_ms);
    if (status.ok()) {
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
    for (size_t begin = 0; error.empty() && begin < stored.size(); begin += kPublishChunk) {
      // A learner request that waited for the previous chunk goes first: the lock is not fair,
      // and this thread would otherwise take it straight back.
      while (begin > 0 && learners_waiting_.load() > 0 && !stopping_) std::this_thread::yield();
      std::lock_guard<std::mutex> lock(state_mutex_);
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

}  // namespace strider::replay::internal
