#include "actors/sender.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/clock.h"
#include "common/transport/curve.h"

namespace strider::actors {
namespace {
using std::chrono::milliseconds;
}  // namespace

Result<std::unique_ptr<Sender>> Sender::Start(const SenderOptions& options) {
  if (options.endpoint.empty()) {
    return Status::InvalidArgument("sender: the replay endpoint is empty");
  }
  if (options.spill_dir.empty()) {
    return Status::InvalidArgument("sender: a spill directory is required");
  }
  if (options.auth.enabled()) {
    // The key files are read again on each connection; a bad one is an error now, not a
    // connection that silently never happens.
    STRIDER_RETURN_IF_ERROR(
        transport::CurveClient::Load(options.auth).status().WithContext("replay.auth"));
  }
  STRIDER_ASSIGN_OR_RETURN(SpillDirectory spill,
                           SpillDirectory::Open(options.spill_dir, options.spill_max_bytes));
  if (!spill.segments().empty()) {
    spdlog::info("spill: {} segments ({} bytes) from an earlier run in {}; sending them first",
                 spill.segments().size(), spill.bytes(), options.spill_dir);
  }
  std::unique_ptr<Sender> sender(new Sender(options, std::move(spill)));
  sender->thread_ = std::thread([s = sender.get()] { s->Loop(); });
  return sender;
}

Sender::Sender(SenderOptions options, SpillDirectory spill)
    : options_(std::move(options)), spill_(std::move(spill)) {
  stats_.spill_files = spill_.segments().size();
  stats_.spill_bytes = spill_.bytes();
}

Sender::~Sender() {
  if (!thread_.joinable()) return;
  // An owner that closed the sender has seen Close's error already; this is the path of one
  // that returned early, whose segments the spill directory keeps where it can.
  Status closed = Close(milliseconds(0));
  if (!closed.ok()) spdlog::error("{}", closed.ToString());
}

Status Sender::Push(const schema::SegmentData& segment) {
  STRIDER_ASSIGN_OR_RETURN(std::string frame, schema::EncodeSegment(segment));
  {
    MutexLock lock(&mutex_);
    if (stop_) return Status::FailedPrecondition("sender: closed");
    queued_bytes_ += frame.size();
    queue_.push_back({segment.key(), std::move(frame)});
    stats_.queued_segments = queue_.size();
    stats_.queued_bytes = queued_bytes_;
  }
  wake_.Signal();
  return Status::Ok();
}

bool Sender::Backlogged() const {
  MutexLock lock(&mutex_);
  return queued_bytes_ > options_.queue_max_bytes;
}

SenderStats Sender::stats() const {
  MutexLock lock(&mutex_);
  return stats_;
}

Status Sender::Close(milliseconds timeout) {
  {
    MutexLock lock(&mutex_);
    if (!thread_.joinable()) return close_status_;
    stop_ = true;
    stop_deadline_ = Clock::now() + timeout;
  }
  wake_.Signal();
  thread_.join();
  MutexLock lock(&mutex_);
  return close_status_;
}

bool Sender::TryConnect() {
  replay::ActorClientOptions client_options;
  client_options.endpoint = options_.endpoint;
  client_options.client_id = options_.client_id;
  client_options.ack_timeout = std::max(milliseconds(500), options_.spill_after / 2);
  client_options.give_up_after = options_.spill_after;
  // Short, so a server that is gone blocks this thread only briefly: what the actor queues
  // meanwhile reaches the spill directory between attempts (Loop).
  client_options.connect_timeout = std::min(options_.spill_after, milliseconds(500));
  client_options.auth = options_.auth;
  Result<std::unique_ptr<replay::ActorClient>> client =
      replay::ActorClient::Connect(client_options);
  // A refused key stays refused until the server's list changes: said once, not every retry.
  // The segments wait in the spill directory meanwhile.
  if (!client.ok() && client.status().code() == StatusCode::kFailedPrecondition &&
      client.status().message() != last_refusal_) {
    last_refusal_ = client.status().message();
    spdlog::error("sender: {}; segments wait in {} and the connection is retried",
                  last_refusal_, options_.spill_dir);
  }
  MutexLock lock(&mutex_);
  if (!client.ok()) {
    stats_.connected = false;
    return false;
  }
  last_refusal_.clear();
  client_ = std::move(*client);
  last_progress_ = Clock::now();
  ++stats_.reconnects;
  stats_.connected = true;
  return true;
}

bool Sender::SendOne(const schema::SegmentKey& key, std::string bytes, bool from_spill) {
  Status status = client_->SendFrame(key, std::move(bytes));
  if (status.ok()) {
    if (from_spill) {
      MutexLock lock(&mutex_);
      ++stats_.sent_from_spill;
    }
    return true;
  }
  if (status.code() == StatusCode::kInvalidArgument) {
    // Over the server's message size: no retry can help. Counted and logged, never silent.
    spdlog::error("sender: segment {} refused: {}", key.ToString(), status.message());
    in_flight_.erase(key);
    MutexLock lock(&mutex_);
    ++stats_.rejected;
    return true;
  }
  DropConnection(status.message());
  return false;
}

void Sender::CollectAcks() {
  if (!client_) return;
  std::vector<schema::SegmentKey> acked = client_->TakeAcked();
  if (!acked.empty()) last_progress_ = Clock::now();
  for (const schema::SegmentKey& key : acked) {
    in_flight_.erase(key);
    Status removed = spill_.Remove(key);
    if (!removed.ok()) spdlog::warn("{}", removed.message());
  }
  uint64_t rejected = 0;
  for (const schema::ErrorReply& error : client_->TakeErrors()) {
    // Credit, storage and full-disk errors are transient: the client sends those segments
    // again, and they stay in flight here (spilled if the connection is dropped).
    if (!error.has_key || replay::IsResent(error)) continue;
    spdlog::error("replay server refused segment {}: {}: {}", error.key.ToString(), error.reason,
                  error.message);
    in_flight_.erase(error.key);
    // Refused for good: a copy left in the spill directory would be sent again by the next run.
    Status removed = spill_.Remove(error.key);
    if (!removed.ok()) spdlog::warn("{}", removed.message());
    ++rejected;
  }
  MutexLock lock(&mutex_);
  stats_.acked += acked.size();
  stats_.rejected += rejected;
  stats_.in_flight = in_flight_.size();
  stats_.spill_files = spill_.segments().size();
  stats_.spill_bytes = spill_.bytes();
}

void Sender::DropConnection(const std::string& why) {
  spdlog::warn("replay server {} unavailable ({}); spilling {} unacknowledged segments to {}",
               options_.endpoint, why, in_flight_.size(), options_.spill_dir);
  std::deque<Frame> back_to_queue;
  uint64_t spilled = 0;
  for (auto& [key, frame] : in_flight_) {
    if (!frame) continue;  // already a file
    Status put = spill_.Put(key, *frame);
    if (put.ok()) {
      ++spilled;
    } else {
      back_to_queue.push_back({key, std::move(*frame)});
    }
  }
  in_flight_.clear();
  client_.reset();
  unreachable_ = true;
  {
    MutexLock lock(&mutex_);
    for (auto it = back_to_queue.rbegin(); it != back_to_queue.rend(); ++it) {
      queued_bytes_ += it->bytes.size();
      queue_.push_front(std::move(*it));
    }
    stats_.spilled += spilled;
    stats_.connected = false;
    stats_.in_flight = 0;
    UpdateQueueStats();
  }
  // The queue goes with the frames in flight: the server is unreachable, and a process killed
  // while the next connection attempt waits must not take the queue with it.
  SpillQueue();
}

void Sender::UpdateQueueStats() {
  stats_.queued_segments = queue_.size();
  stats_.queued_bytes = queued_bytes_;
  stats_.spill_files = spill_.segments().size();
  stats_.spill_bytes = spill_.bytes();
}

void Sender::SpillQueue() {
  MutexLock lock(&mutex_);
  SpillQueueLocked();
}

void Sender::SpillQueueLocked() {
  while (!queue_.empty()) {
    Frame& front = queue_.front();
    Status put = spill_.Put(front.key, front.bytes);
    if (!put.ok()) {
      if (put.code() != StatusCode::kResourceExhausted) spdlog::error("{}", put.message());
      break;  // full: the rest waits in memory and the actor pauses new episodes
    }
    queued_bytes_ -= front.bytes.size();
    queue_.pop_front();
    ++stats_.spilled;
  }
  UpdateQueueStats();
}

bool Sender::Finished(bool past_deadline) {
  // Closing waits for spilled files too: they go out once the server answers, or stay on disk
  // for the next run when the deadline passes first.
  if (!stop_ || !((queue_.empty() && spill_.segments().empty()) || past_deadline)) return false;
  if (!queue_.empty()) {
    close_status_ = Status::ResourceExhausted(
        "sender: " + std::to_string(queue_.size()) +
        " segments were neither acknowledged nor spilled (spill directory full)");
  }
  return true;
}

void Sender::Loop() {
  while (true) {
    bool stopping = false;
    Clock::time_point deadline;
    {
      MutexLock lock(&mutex_);
      stopping = stop_;
      deadline = stop_deadline_;
    }
    const auto now = Clock::now();
    const bool past_deadline = stopping && now >= deadline;
    if (!client_ && !past_deadline && now >= next_connect_) {
      // Once the server has been unreachable, what arrived since the last look goes to disk
      // before the next attempt blocks this thread.
      if (unreachable_) SpillQueue();
      unreachable_ = !TryConnect();
      if (unreachable_) next_connect_ = Clock::now() + options_.retry_every;
    }
    if (!client_ || past_deadline) {
      if (client_) DropConnection("closing before every segment was acknowledged");
      SpillQueue();
      MutexLock lock(&mutex_);
      // `stopping` as read above: a Close since then is seen on the next pass.
      if (stopping && Finished(past_deadline)) return;
      wake_.WaitFor(&mutex_, milliseconds(100));
      continue;
    }

    // Spilled files first, oldest first.
    const std::vector<SpilledSegment> spilled = spill_.segments();
    for (const SpilledSegment& file : spilled) {
      if (!client_) break;
      if (in_flight_.count(file.key)) continue;
      Result<std::string> frame = spill_.Read(file);
      if (!frame.ok()) {
        spdlog::error("{}", frame.status().message());
        continue;
      }
      in_flight_[file.key] = std::nullopt;
      if (!SendOne(file.key, std::move(*frame), /*from_spill=*/true)) break;
      CollectAcks();
    }
    // Then the queue.
    while (client_) {
      Frame frame;
      {
        MutexLock lock(&mutex_);
        if (queue_.empty()) break;
        frame = std::move(queue_.front());
        queue_.pop_front();
        queued_bytes_ -= frame.bytes.size();
        stats_.queued_segments = queue_.size();
        stats_.queued_bytes = queued_bytes_;
      }
      if (in_flight_.empty()) last_progress_ = Clock::now();
      in_flight_[frame.key] = frame.bytes;
      if (!SendOne(frame.key, std::move(frame.bytes), /*from_spill=*/false)) break;
      CollectAcks();
    }
    if (!client_) continue;
    CollectAcks();
    if (!in_flight_.empty()) {
      // Pumps acknowledgements; the client resends after a server restart by itself. Within
      // 20 ms the usual answer is Unavailable (acknowledgements still due); a connection that
      // stays lost shows as no progress, which the check below acts on.
      Status pumped = client_->Flush(milliseconds(20));
      if (!pumped.ok() && pumped.code() != StatusCode::kUnavailable) {
        spdlog::debug("sender: {}", pumped.ToString());
      }
      CollectAcks();
      if (!in_flight_.empty() && Clock::now() - last_progress_ > options_.spill_after) {
        DropConnection("no acknowledgement for " + std::to_string(options_.spill_after.count()) +
                       " ms");
      }
      continue;
    }
    MutexLock lock(&mutex_);
    if (stop_ && queue_.empty() && spill_.segments().empty()) return;
    if (queue_.empty()) wake_.WaitFor(&mutex_, milliseconds(50));
  }
}

}  // namespace strider::actors
