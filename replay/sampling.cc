// The replay server's learner side: samples (with their durable draw records), priority
// updates and stats requests on the learner endpoint.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <tuple>

#include "replay/server_impl.h"

namespace strider::replay::internal {

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
  if (request.is_fetch()) return Fetch(request, error);
  std::vector<uint64_t> items;
  // What the reply holds: (handle, stored item, times sampled); in a trajectory or group table
  // every segment of a unit carries the unit's handle.
  std::vector<std::tuple<uint64_t, uint64_t, uint32_t>> parts;
  {
    LearnerStateLock lock(this);
    Table* table = FindTable(request.table);
    if (table == nullptr) {
      *error = NoTable(request.table);
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
      // A rank of a group reads the draw another rank made: that is no replay.
      if (request.world_size <= 1) samples_replayed_++;
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
      DrawRecord record;
      record.table = name;
      record.learner = request.learner_id;
      record.step = request.step;
      record.items = items;
      for (uint64_t item : items) {
        state.fifo_position = std::max(state.fifo_position, item);
        const ItemInfo* info = table->Find(item);
        record.times_sampled.push_back(info ? info->times_sampled : 1);
      }
      state.last_step = request.step;
      record.fifo_position = state.fifo_position;
      record.table_samples = table->samples();
      if (request.step > static_cast<uint64_t>(options_.sample_log_steps)) {
        record.forget_step = request.step - static_cast<uint64_t>(options_.sample_log_steps);
      }
      // The sampling store's own log: a few hundred bytes that never wait behind segments.
      Status written = store_->RecordDraw(record);
      if (written.code() == StatusCode::kResourceExhausted) {
        // A full disk: sampling goes on from memory. This draw is not durable, so a learner
        // that restarts and asks for this step again may get other items (docs/replay.md).
        unrecorded_draws_++;
        EnterDiskFull(written.message());  // once: a later call finds ingest stopped already
      } else if (!written.ok()) {
        // The draw already counted in memory; it is not durable, so the learner retries and may
        // get different items. Logged as a storage failure.
        *error = written;
        return reply;
      }
      learners_[{name, request.learner_id}] = state;
      // A group's later ranks find the draw recorded: the client stops waiting on this flag
      // even when a rank's slice is empty.
      reply.replayed = request.world_size > 1;
    }
    if (request.world_size > 1) {
      // Learner ranks share the step's draw; each takes its slice of the units, so the group
      // trains on every drawn unit exactly once (and a resumed rank on the same slice again).
      const size_t n = items.size();
      const size_t begin = n * request.rank / request.world_size;
      const size_t end = n * (request.rank + 1) / request.world_size;
      items = std::vector<uint64_t>(items.begin() + begin, items.begin() + end);
    }
    for (uint64_t item : items) {
      const ItemInfo* info = table->Find(item);
      const uint32_t times = info ? info->times_sampled : 0;
      for (uint64_t part : table->ItemsOf(item)) parts.push_back({item, part, times});
    }
  }
  for (const auto& [handle, item, times] : parts) ReadInto(handle, item, times, &reply);
  segments_sampled_ += reply.segments.size();
  return reply;
}

void ServerImpl::ReadInto(uint64_t handle, uint64_t item, uint32_t times,
                          schema::SampleReply* reply) {
  Result<std::optional<std::string>> record = store_->Get(store_->sequence(), SequenceKey(item));
  if (!record.ok() || !record->has_value()) return;  // deleted by retention since
  Result<IndexRecord> index = DecodeIndexRecord(**record);
  if (!index.ok()) return;
  Result<std::optional<std::string>> value =
      store_->Get(store_->segments(), SegmentStoreKey(index->key));
  if (!value.ok() || !value->has_value() || (*value)->size() < 8) return;
  reply->segments.push_back({handle, (*value)->substr(8), times});
}

schema::SampleReply ServerImpl::Fetch(const schema::SampleRequest& request, Status* error) {
  schema::SampleReply reply;
  reply.step = request.step;
  std::vector<uint64_t> items;
  {
    LearnerStateLock lock(this);
    Table* table = FindTable(request.table);
    if (table == nullptr) {
      *error = NoTable(request.table);
      return reply;
    }
    Result<std::vector<uint64_t>> found = request.fetch_group.empty()
                                              ? table->ItemsOfTrajectory(request.fetch_trajectory)
                                              : table->ItemsOfGroup(request.fetch_group);
    if (!found.ok()) {
      *error = Status::InvalidArgument(std::string(schema::reject::kUnexpected) + ": " +
                                       found.status().message());
      return reply;
    }
    items = std::move(*found);
  }
  // Nothing is sampled: each segment carries its own sequence and is not counted.
  for (uint64_t item : items) ReadInto(item, item, 0, &reply);
  if (reply.segments.empty()) {
    reply.not_ready_reason = std::string("no stored segments of that ") +
                             (request.fetch_group.empty() ? "trajectory" : "group");
  }
  return reply;
}

Status ServerImpl::UpdatePriorities(const schema::PriorityUpdate& update) {
  LearnerStateLock lock(this);
  Table* table = FindTable(update.table);
  if (table == nullptr) {
    return NoTable(update.table);
  }
  if (table->config().sampler.kind != SamplerKind::kPrioritized) {
    return Status::InvalidArgument(std::string(schema::reject::kUnexpected) + ": table '" +
                                   table->config().name + "' uses the " +
                                   SamplerKindName(table->config().sampler.kind) +
                                   " sampler, which has no priorities");
  }
  std::vector<std::pair<uint64_t, double>> stored;
  for (size_t i = 0; i < update.sequences.size(); ++i) {
    // Items deleted by retention since the learner sampled them are skipped, not errors.
    if (!table->SetPriority(update.sequences[i], update.priorities[i]).ok()) continue;
    stored.push_back({update.sequences[i], update.priorities[i]});
  }
  return store_->WritePriorities(stored);
}

void ServerImpl::HandleLearnerFrame(const std::string& identity, const zmq::message_t& frame) {
  const auto received = Clock::now();
  Result<schema::Message> message = schema::Decode(transport::View(frame), limits_);
  if (!message.ok()) {
    Reject(learner_socket_, identity, message.status(), nullptr);
    return;
  }
  auto send = [&](const std::string& reply) {
    // As SendActor: never block on one learner. A reply its full pipe drops is asked for again
    // when the learner's request times out (LearnerClient resends after request_timeout).
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
      Reject(learner_socket_, identity, NotAccepted(message->kind, "learner"), nullptr);
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
    ReaderMutexLock store_lock(&store_mutex_);  // ReopenStore waits
    HandleLearnerFrame(identity, (*parts)[1]);
  }
}

}  // namespace strider::replay::internal
