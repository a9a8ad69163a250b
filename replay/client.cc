#include "replay/client.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <random>
#include <thread>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/transport/curve.h"
#include "common/transport/zmq_util.h"

namespace strider::replay {
namespace {

using std::chrono::milliseconds;

// A SendFrame that sent nothing (its segment waits to be batched) reads replies (acks) only when
// this long has passed since they were last read.
constexpr std::chrono::microseconds kReplyReadInterval{1000};
// How long a client waits after a disk_full reply before it sends again.
constexpr std::chrono::milliseconds kDiskFullPause{500};

std::string RandomSuffix() {
  std::random_device device;
  return std::to_string(device()) + std::to_string(device());
}

Status FromErrorReply(const schema::ErrorReply& error) {
  return Status::InvalidArgument("replay server rejected the request: " + error.message);
}

}  // namespace

struct ActorClient::Socket {
  zmq::context_t context{1};
  std::optional<transport::CurveClient> curve;
  zmq::socket_t socket;
  std::unique_ptr<transport::HandshakeWatch> watch;  // of `socket`
  std::deque<schema::SegmentKey> send_queue;
  bool needs_reconnect = false;
};

ActorClient::ActorClient(ActorClientOptions options)
    : options_(std::move(options)), socket_(std::make_unique<Socket>()) {}

ActorClient::~ActorClient() {
  if (!socket_) return;
  socket_->watch.reset();
  socket_->socket.close();
}

bool IsResent(const schema::ErrorReply& error) {
  return error.reason == schema::reject::kCredit || error.reason == schema::reject::kDiskFull ||
         error.message.rfind("storage:", 0) == 0;
}

Result<std::unique_ptr<ActorClient>> ActorClient::Connect(const ActorClientOptions& options) {
  STRIDER_RETURN_IF_ERROR(transport::CheckEndpoint(options.endpoint));
  std::unique_ptr<ActorClient> client(new ActorClient(options));
  if (options.auth.enabled()) {
    Result<transport::CurveClient> curve = transport::CurveClient::Load(options.auth);
    if (!curve.ok()) return curve.status().WithContext("replay actor client: auth");
    client->socket_->curve = std::move(*curve);
  }
  STRIDER_RETURN_IF_ERROR(client->Reconnect());
  client->reconnects_ = 0;
  return client;
}

Status ActorClient::Reconnect() {
  const auto give_up = Clock::now() + (options_.connect_timeout.count() > 0
                                           ? options_.connect_timeout
                                           : options_.give_up_after);
  while (true) {
    socket_->watch.reset();
    socket_->socket.close();
    STRIDER_ASSIGN_OR_RETURN(socket_->socket,
                             transport::MakeSocket(socket_->context, zmq::socket_type::dealer));
    socket_->socket.set(zmq::sockopt::routing_id, options_.client_id + "-" + RandomSuffix());
    if (socket_->curve) STRIDER_RETURN_IF_ERROR(socket_->curve->Secure(socket_->socket));
    STRIDER_ASSIGN_OR_RETURN(socket_->watch,
                             transport::HandshakeWatch::Start(socket_->context, socket_->socket));
    STRIDER_RETURN_IF_ERROR(transport::Connect(socket_->socket, options_.endpoint));
    ++reconnects_;
    socket_->needs_reconnect = false;
    credit_bytes_ = 0;
    // Everything unacknowledged goes again, on the new connection, in key order.
    in_flight_bytes_ = 0;
    waiting_bytes_ = 0;
    socket_->send_queue.clear();
    for (auto& [key, unacked] : unacked_) {
      if (unacked.sent) ++resent_;
      unacked.sent = false;
      waiting_bytes_ += unacked.frame->size();
      socket_->send_queue.push_back(key);
    }
    STRIDER_RETURN_IF_ERROR(transport::SendParts(
        socket_->socket, {schema::EncodeHello({options_.client_id, schema::ClientRole::kActor})}));
    const auto hello_deadline = std::min(Clock::now() + options_.ack_timeout, give_up);
    while (credit_bytes_ == 0 && Clock::now() < hello_deadline) {
      STRIDER_RETURN_IF_ERROR(Pump(milliseconds(20)));
      STRIDER_RETURN_IF_ERROR(socket_->watch->Check("replay server at " + options_.endpoint));
    }
    if (credit_bytes_ > 0) {
      last_progress_ = Clock::now();
      return Status::Ok();
    }
    if (Clock::now() >= give_up) {
      return Status::Unavailable(
          "replay server at " + options_.endpoint + " did not answer for " +
          std::to_string((options_.connect_timeout.count() > 0 ? options_.connect_timeout
                                                               : options_.give_up_after)
                             .count()) +
          " ms");
    }
  }
}

Status ActorClient::HandleReply(std::string_view frame) {
  Result<schema::Message> message = schema::Decode(frame, options_.limits);
  if (!message.ok()) {
    return message.status().WithContext("reply from replay server " + options_.endpoint);
  }
  switch (message->kind) {
    case schema::MessageKind::kCredit:
      if (server_instance_ != 0 && message->credit.server_instance != server_instance_) {
        // A new server process: what the old one had not acknowledged may be lost.
        socket_->needs_reconnect = true;
      }
      server_instance_ = message->credit.server_instance;
      credit_bytes_ = message->credit.bytes;
      server_max_frame_bytes_ = message->credit.max_frame_bytes;
      last_progress_ = Clock::now();
      break;
    case schema::MessageKind::kAck:
      for (const schema::SegmentKey& key : message->ack) {
        auto it = unacked_.find(key);
        if (it == unacked_.end() || !it->second.sent) continue;
        in_flight_bytes_ -= std::min<uint64_t>(in_flight_bytes_, it->second.frame->size());
        unacked_.erase(it);
        acked_.push_back(key);
        ++acked_count_;
      }
      last_progress_ = Clock::now();
      break;
    case schema::MessageKind::kError: {
      const schema::ErrorReply& error = message->error;
      errors_.push_back(error);
      // A full disk is no progress: a client refused long enough gives up as if the server
      // were gone (an actor then spills), and until then it pauses instead of resending at once.
      const bool disk_full = error.reason == schema::reject::kDiskFull;
      if (disk_full) {
        hold_until_ = Clock::now() + kDiskFullPause;
      } else {
        last_progress_ = Clock::now();
      }
      if (!error.has_key) break;
      auto it = unacked_.find(error.key);
      if (it == unacked_.end() || !it->second.sent) break;
      in_flight_bytes_ -= std::min<uint64_t>(in_flight_bytes_, it->second.frame->size());
      if (IsResent(error)) {
        // Transient: send it again later.
        it->second.sent = false;
        waiting_bytes_ += it->second.frame->size();
        socket_->send_queue.push_back(error.key);
      } else {
        unacked_.erase(it);  // the server will never take this segment
      }
      break;
    }
    case schema::MessageKind::kStats:
      last_stats_ = message->stats_json;
      break;
    default:
      break;
  }
  return Status::Ok();
}

Status ActorClient::Pump(milliseconds wait) {
  last_pump_ = Clock::now();
  STRIDER_ASSIGN_OR_RETURN(bool readable, transport::WaitReadable(socket_->socket, wait));
  if (!readable) return Status::Ok();
  while (true) {
    STRIDER_ASSIGN_OR_RETURN(std::vector<zmq::message_t> parts,
                             transport::ReceiveParts(socket_->socket));
    if (parts.empty()) return Status::Ok();
    // A reply that fails to decode is reported but does not break the stream.
    Status status = HandleReply(transport::View(parts.back()));
    if (!status.ok()) errors_.push_back({"reply", status.message(), false, {}});
  }
}

uint64_t ActorClient::FrameLimit() const {
  if (options_.batch_bytes == 0 || server_max_frame_bytes_ == 0) return 0;
  return std::min({options_.batch_bytes, server_max_frame_bytes_,
                   static_cast<uint64_t>(options_.limits.max_message_bytes)});
}

Status ActorClient::SendWaiting(bool flush) {
  auto& queue = socket_->send_queue;
  const uint64_t frame_limit = FrameLimit();
  std::vector<Unacked*> batch;
  while (true) {
    // Keys acknowledged, rejected or sent since they were queued leave the queue here.
    while (!queue.empty()) {
      auto it = unacked_.find(queue.front());
      if (it != unacked_.end() && !it->second.sent) break;
      queue.pop_front();
    }
    if (queue.empty() || credit_bytes_ == 0 || Clock::now() < hold_until_) return Status::Ok();
    // The next frame: waiting segments in order, within the credit and the frame limit.
    batch.clear();
    uint64_t bytes = 0;
    bool filled = false;  // the next segment cannot join this frame
    for (const schema::SegmentKey& key : queue) {
      auto it = unacked_.find(key);
      if (it == unacked_.end() || it->second.sent) continue;
      const uint64_t size = it->second.frame->size();
      if (in_flight_bytes_ + bytes + size > credit_bytes_ ||
          (!batch.empty() && bytes + size > frame_limit)) {
        filled = true;
        break;
      }
      batch.push_back(&it->second);
      bytes += size;
      if (frame_limit == 0) {
        filled = true;
        break;
      }
    }
    if (batch.empty()) return Status::Ok();  // the credit is used up
    // Nagle's rule: while earlier segments are unacknowledged, an unfilled frame waits for more.
    if (!flush && !filled && in_flight_bytes_ > 0) return Status::Ok();
    if (batch.size() == 1) {
      STRIDER_RETURN_IF_ERROR(transport::SendShared(socket_->socket, batch.front()->frame));
    } else {
      auto joined = std::make_shared<std::string>();
      joined->reserve(bytes);
      for (const Unacked* unacked : batch) joined->append(*unacked->frame);
      STRIDER_RETURN_IF_ERROR(transport::SendShared(socket_->socket, std::move(joined)));
    }
    ++frames_sent_;
    if (in_flight_bytes_ == 0) last_progress_ = Clock::now();
    in_flight_bytes_ += bytes;
    waiting_bytes_ -= bytes;
    for (Unacked* unacked : batch) unacked->sent = true;
  }
}

Status ActorClient::Send(const schema::SegmentData& segment) {
  STRIDER_ASSIGN_OR_RETURN(std::string frame, schema::EncodeSegment(segment, options_.limits));
  return SendFrame(segment.key(), std::move(frame));
}

Status ActorClient::SendFrame(const schema::SegmentKey& key, std::string frame) {
  return SendFrame(key, std::make_shared<const std::string>(std::move(frame)));
}

Status ActorClient::SendFrame(const schema::SegmentKey& key,
                              std::shared_ptr<const std::string> frame) {
  if (frame == nullptr) return Status::InvalidArgument("segment " + key.ToString() + ": no frame");
  if (frame->size() > options_.limits.max_message_bytes) {
    return Status::InvalidArgument("segment " + key.ToString() + " is " +
                                   std::to_string(frame->size()) +
                                   " bytes, over the message size limit");
  }
  auto [it, inserted] = unacked_.try_emplace(key);
  if (!inserted) return Status::Ok();  // already on its way
  it->second.frame = std::move(frame);
  waiting_bytes_ += it->second.frame->size();
  socket_->send_queue.push_back(key);
  const auto waiting_since = Clock::now();
  while (true) {
    if (socket_->needs_reconnect) STRIDER_RETURN_IF_ERROR(Reconnect());
    const uint64_t frames_before = frames_sent_;
    STRIDER_RETURN_IF_ERROR(SendWaiting(/*flush=*/false));
    // Less than a frame may wait to be batched; more waits only for credit. Replies are read
    // when a frame went out, else at most every kReplyReadInterval: a look at the socket costs
    // about as much as sending a segment.
    if (waiting_bytes_ == 0 || waiting_bytes_ < FrameLimit()) {
      if (frames_sent_ == frames_before && Clock::now() - last_pump_ < kReplyReadInterval) {
        return Status::Ok();
      }
      STRIDER_RETURN_IF_ERROR(Pump(milliseconds(0)));
      // The acks may have emptied the pipeline: then what waits goes now, not with the next one.
      return in_flight_bytes_ == 0 ? SendWaiting(/*flush=*/false) : Status::Ok();
    }
    STRIDER_RETURN_IF_ERROR(Pump(milliseconds(20)));
    const auto now = Clock::now();
    if (now - last_progress_ > options_.ack_timeout) STRIDER_RETURN_IF_ERROR(Reconnect());
    if (now - std::max(waiting_since, last_progress_) > options_.give_up_after) {
      return Status::Unavailable("replay server at " + options_.endpoint +
                                 " made no progress for " +
                                 std::to_string(options_.give_up_after.count()) + " ms");
    }
  }
}

Status ActorClient::Flush(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!unacked_.empty()) {
    if (socket_->needs_reconnect) STRIDER_RETURN_IF_ERROR(Reconnect());
    STRIDER_RETURN_IF_ERROR(SendWaiting(/*flush=*/true));
    STRIDER_RETURN_IF_ERROR(Pump(milliseconds(20)));
    const auto now = Clock::now();
    if (!unacked_.empty() && now - last_progress_ > options_.ack_timeout) {
      STRIDER_RETURN_IF_ERROR(Reconnect());
    }
    if (now >= deadline && !unacked_.empty()) {
      return Status::Unavailable(std::to_string(unacked_.size()) +
                                 " segments still unacknowledged by " + options_.endpoint);
    }
  }
  return Status::Ok();
}

std::vector<schema::SegmentKey> ActorClient::TakeAcked() {
  std::vector<schema::SegmentKey> out;
  out.swap(acked_);
  return out;
}

std::vector<schema::ErrorReply> ActorClient::TakeErrors() {
  std::vector<schema::ErrorReply> out;
  out.swap(errors_);
  return out;
}

Result<std::string> ActorClient::Stats(milliseconds timeout) {
  last_stats_.clear();
  STRIDER_RETURN_IF_ERROR(transport::SendParts(socket_->socket, {schema::EncodeStatsRequest()}));
  const auto deadline = Clock::now() + timeout;
  while (last_stats_.empty() && Clock::now() < deadline) {
    STRIDER_RETURN_IF_ERROR(Pump(milliseconds(20)));
  }
  if (last_stats_.empty()) return Status::Unavailable("no stats from " + options_.endpoint);
  return last_stats_;
}

// ------------------------------------------------------------------------------- learner

struct LearnerClient::Socket {
  // Requests and replies only: its I/O thread should not wait behind bulk work on this machine.
  transport::LatencySensitiveContext context;
  std::optional<transport::CurveClient> curve;
  zmq::socket_t socket;
  std::unique_ptr<transport::HandshakeWatch> watch;  // of `socket`
};

LearnerClient::LearnerClient(LearnerClientOptions options)
    : options_(std::move(options)), socket_(std::make_unique<Socket>()) {}

LearnerClient::~LearnerClient() {
  if (!socket_) return;
  socket_->watch.reset();
  socket_->socket.close();
}

Result<std::unique_ptr<LearnerClient>> LearnerClient::Connect(
    const LearnerClientOptions& options) {
  STRIDER_RETURN_IF_ERROR(transport::CheckEndpoint(options.endpoint));
  std::unique_ptr<LearnerClient> client(new LearnerClient(options));
  if (options.auth.enabled()) {
    Result<transport::CurveClient> curve = transport::CurveClient::Load(options.auth);
    if (!curve.ok()) return curve.status().WithContext("replay learner client: auth");
    client->socket_->curve = std::move(*curve);
  }
  STRIDER_RETURN_IF_ERROR(client->Reconnect());
  return client;
}

Status LearnerClient::Reconnect() {
  socket_->watch.reset();
  socket_->socket.close();
  // Sample replies carry whole segments: no receive limit beyond the decoder's own.
  STRIDER_ASSIGN_OR_RETURN(socket_->socket,
                           transport::MakeSocket(socket_->context.get(), zmq::socket_type::dealer));
  socket_->context.MarkIoThreads();
  socket_->socket.set(zmq::sockopt::routing_id, options_.learner_id + "-" + RandomSuffix());
  if (socket_->curve) STRIDER_RETURN_IF_ERROR(socket_->curve->Secure(socket_->socket));
  STRIDER_ASSIGN_OR_RETURN(socket_->watch, transport::HandshakeWatch::Start(
                                               socket_->context.get(), socket_->socket));
  return transport::Connect(socket_->socket, options_.endpoint);
}

Result<schema::Message> LearnerClient::Call(const std::string& request,
                                            schema::MessageKind expected, uint64_t step,
                                            milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  // Replies can hold many segments: decode them with a limit that fits.
  schema::DecodeLimits reply_limits = options_.limits;
  reply_limits.max_message_bytes = std::numeric_limits<size_t>::max();
  while (true) {
    // A socket whose handshake failed has no peer: a send on it would block for good.
    STRIDER_RETURN_IF_ERROR(socket_->watch->Check("replay server at " + options_.endpoint));
    STRIDER_RETURN_IF_ERROR(transport::SendParts(socket_->socket, {request}));
    const auto resend_at = std::min(deadline, Clock::now() + options_.request_timeout);
    while (Clock::now() < resend_at) {
      STRIDER_ASSIGN_OR_RETURN(bool readable,
                               transport::WaitReadable(socket_->socket, milliseconds(10)));
      if (!readable) {
        STRIDER_RETURN_IF_ERROR(socket_->watch->Check("replay server at " + options_.endpoint));
        continue;
      }
      STRIDER_ASSIGN_OR_RETURN(std::vector<zmq::message_t> parts,
                               transport::ReceiveParts(socket_->socket));
      if (parts.empty()) continue;
      Result<schema::Message> reply = schema::Decode(transport::View(parts.back()), reply_limits);
      if (!reply.ok()) return reply.status().WithContext("reply from " + options_.endpoint);
      if (reply->kind == schema::MessageKind::kError) return FromErrorReply(reply->error);
      if (reply->kind != expected) continue;
      if (expected == schema::MessageKind::kSampleReply && reply->sample_reply.step != step) {
        continue;  // a late answer to an earlier attempt
      }
      return reply;
    }
    if (Clock::now() >= deadline) {
      return Status::Unavailable("replay server at " + options_.endpoint + " did not answer");
    }
    // Maybe the server restarted and lost the request: ask again on a fresh connection.
    STRIDER_RETURN_IF_ERROR(Reconnect());
  }
}

namespace {

Result<SampleBatch> ToBatch(schema::SampleReply& reply, const schema::DecodeLimits& limits) {
  SampleBatch batch;
  batch.step = reply.step;
  batch.replayed = reply.replayed;
  for (schema::SampledSegment& sampled : reply.segments) {
    STRIDER_ASSIGN_OR_RETURN(schema::Message decoded, schema::Decode(sampled.envelope, limits));
    if (decoded.kind != schema::MessageKind::kSegment) {
      return Status::Corruption("sample reply holds a " +
                                std::string(schema::MessageKindName(decoded.kind)) +
                                " where a segment belongs");
    }
    batch.items.push_back({sampled.sequence, sampled.times_sampled, std::move(decoded.segment)});
  }
  return batch;
}

}  // namespace

Result<SampleBatch> LearnerClient::FetchTrajectory(const schema::TrajectoryId& trajectory) {
  schema::SampleRequest request{options_.table, options_.learner_id, 0, 1, 0};
  request.fetch_trajectory = std::string(trajectory.View());
  return Fetch(schema::EncodeSampleRequest(request));
}

Result<SampleBatch> LearnerClient::FetchGroup(const schema::TrajectoryId& group) {
  schema::SampleRequest request{options_.table, options_.learner_id, 0, 1, 0};
  request.fetch_group = std::string(group.View());
  return Fetch(schema::EncodeSampleRequest(request));
}

Result<SampleBatch> LearnerClient::Fetch(const std::string& request) {
  STRIDER_ASSIGN_OR_RETURN(
      schema::Message reply,
      Call(request, schema::MessageKind::kSampleReply, 0, options_.request_timeout * 2));
  if (reply.sample_reply.segments.empty()) {
    return Status::NotFound(reply.sample_reply.not_ready_reason);
  }
  return ToBatch(reply.sample_reply, options_.limits);
}

Result<SampleBatch> LearnerClient::Sample(uint64_t step, uint32_t count, uint64_t policy_version,
                                          milliseconds timeout) {
  schema::SampleRequest sample{options_.table, options_.learner_id, step, count, policy_version};
  sample.rank = options_.rank;
  sample.world_size = std::max<uint32_t>(1, options_.world_size);
  const std::string request = schema::EncodeSampleRequest(sample);
  const auto deadline = Clock::now() + timeout;
  while (true) {
    // `timeout` bounds the wait for data, not the server's answer: the last poll before the
    // deadline may have a millisecond left, and a busy server (an actor flooding it) takes
    // longer than that to answer "not ready". Only a request unanswered for request_timeout
    // means the server is gone.
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    STRIDER_ASSIGN_OR_RETURN(schema::Message reply,
                             Call(request, schema::MessageKind::kSampleReply, step,
                                  std::max(left, options_.request_timeout)));
    if (!reply.sample_reply.segments.empty() || reply.sample_reply.replayed) {
      return ToBatch(reply.sample_reply, options_.limits);
    }
    if (Clock::now() >= deadline) {
      return Status::ResourceExhausted("no sample for step " + std::to_string(step) + ": " +
                                       reply.sample_reply.not_ready_reason);
    }
    std::this_thread::sleep_for(milliseconds(2));
  }
}

Status LearnerClient::UpdatePriorities(const std::vector<uint64_t>& sequences,
                                       const std::vector<double>& priorities) {
  schema::PriorityUpdate update{options_.table, sequences, priorities};
  return Call(schema::EncodePriorityUpdate(update), schema::MessageKind::kAck, 0,
              options_.request_timeout * 2)
      .status();
}

Result<std::string> LearnerClient::Stats() {
  STRIDER_ASSIGN_OR_RETURN(schema::Message reply,
                           Call(schema::EncodeStatsRequest(), schema::MessageKind::kStats, 0,
                                options_.request_timeout * 2));
  return reply.stats_json;
}

}  // namespace strider::replay
