#include "common/transport/weight_stream.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/schema/crc32c.h"
#include "common/transport/weight_frames.h"
#include "common/transport/zmq_util.h"

namespace strider::transport {
namespace {

using weight_frames::ChunkAssembler;
using weight_frames::Kind;
using weight_frames::Manifest;

struct Version {
  uint64_t version = 0;
  uint64_t total_bytes = 0;
  std::string metadata;
  uint32_t crc = 0;
  // Every chunk's reply frame (header, CRC32C and bytes), built once at Publish: every
  // subscriber asks for every chunk, and each reply is then sent without copying (ZeroMQ holds a
  // reference while it sends). The frames are the version's only copy of its bytes.
  std::vector<std::shared_ptr<const std::string>> frames;
};

// A message that sends `frame` in place, keeping it alive until ZeroMQ is done with it (its I/O
// thread may outlive the version's place among the held ones).
zmq::message_t SharedFrame(std::shared_ptr<const std::string> frame) {
  auto* owner = new std::shared_ptr<const std::string>(std::move(frame));
  const std::string& data = **owner;
  return zmq::message_t(
      const_cast<char*>(data.data()), data.size(),
      [](void*, void* hint) { delete static_cast<std::shared_ptr<const std::string>*>(hint); },
      owner);
}

zmq::message_t Frame(const std::string& bytes) { return zmq::message_t(bytes.data(), bytes.size()); }

}  // namespace

// ------------------------------------------------------------------------------- publisher

struct WeightPublisher::Impl {
  WeightPublisherOptions options;
  zmq::context_t context{1};
  std::unique_ptr<CurveServer> curve;  // before `context` is terminated: its ZAP socket lives there
  zmq::socket_t socket;
  std::string endpoint;
  std::mutex mutex;
  std::deque<Version> versions;  // oldest first
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> chunks_served{0};
  std::thread thread;

  // The reply to one request; an empty message for none.
  zmq::message_t Answer(std::string_view frame) {
    const std::optional<weight_frames::Request> request = weight_frames::ParseRequest(frame);
    if (!request) return zmq::message_t();  // not ours: ignored, the peer times out
    std::lock_guard<std::mutex> lock(mutex);
    if (request->kind == Kind::kQuery) {
      if (versions.empty() || versions.back().version <= request->version) {
        return Frame(weight_frames::ManifestFrame(Manifest{}));
      }
      const Version& newest = versions.back();
      Manifest manifest;
      manifest.version = newest.version;
      manifest.total_bytes = newest.total_bytes;
      manifest.chunk_bytes = options.chunk_bytes;
      manifest.chunks = static_cast<uint32_t>((newest.total_bytes + options.chunk_bytes - 1) /
                                              options.chunk_bytes);
      manifest.crc32c = newest.crc;
      manifest.metadata = newest.metadata;
      return Frame(weight_frames::ManifestFrame(manifest));
    }
    for (const Version& held : versions) {
      if (held.version != request->version) continue;
      if (request->index >= held.frames.size()) break;
      ++chunks_served;
      return SharedFrame(held.frames[request->index]);
    }
    return Frame(weight_frames::GoneFrame(request->version));
  }

  void Loop() {
    while (!stop) {
      Result<bool> readable = WaitReadable(socket, std::chrono::milliseconds(50));
      if (!readable.ok() || !*readable) continue;
      while (true) {
        Result<std::vector<zmq::message_t>> parts = ReceiveParts(socket);
        if (!parts.ok() || parts->size() < 2) break;
        zmq::message_t reply = Answer(View(parts->back()));
        if (reply.size() == 0) continue;
        // ROUTER: the peer's identity first. dont_wait: a peer that stopped reading loses its
        // reply and asks again after its timeout, instead of stalling everyone else.
        try {
          if (socket.send((*parts)[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
            (void)socket.send(reply, zmq::send_flags::dontwait);
          }
        } catch (const zmq::error_t&) {
          // A peer gone mid-reply: it reconnects and asks again.
        }
      }
    }
  }
};

WeightPublisher::WeightPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WeightPublisher::~WeightPublisher() {
  impl_->stop = true;
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->socket.close();
}

Result<std::unique_ptr<WeightPublisher>> WeightPublisher::Start(
    const WeightPublisherOptions& options) {
  STRIDER_RETURN_IF_ERROR(CheckEndpoint(options.endpoint));
  STRIDER_RETURN_IF_ERROR(CheckBindAllowed(options.endpoint, options.auth, "weight publisher"));
  if (options.chunk_bytes == 0) {
    return Status::InvalidArgument("weight publisher: chunk_bytes must be > 0");
  }
  if (options.keep_versions < 1) {
    return Status::InvalidArgument("weight publisher: keep_versions must be >= 1");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  STRIDER_ASSIGN_OR_RETURN(impl->socket,
                           MakeSocket(impl->context, zmq::socket_type::router, size_t{1} << 20));
  if (options.auth.enabled()) {
    STRIDER_ASSIGN_OR_RETURN(impl->curve,
                             CurveServer::Start(impl->context, options.auth, "weight publisher"));
    STRIDER_RETURN_IF_ERROR(impl->curve->Secure(impl->socket));
  }
  STRIDER_ASSIGN_OR_RETURN(std::string bound, Bind(impl->socket, options.endpoint));
  impl->endpoint = LocalEndpoint(bound);
  std::unique_ptr<WeightPublisher> publisher(new WeightPublisher(std::move(impl)));
  publisher->impl_->thread = std::thread([p = publisher->impl_.get()] { p->Loop(); });
  return publisher;
}

Status WeightPublisher::Publish(uint64_t version, std::string bytes, std::string metadata) {
  Version published;
  published.version = version;
  published.crc = schema::Crc32c(bytes);
  published.total_bytes = bytes.size();
  const uint64_t chunk_bytes = impl_->options.chunk_bytes;
  for (uint64_t begin = 0; begin < bytes.size() || (begin == 0 && bytes.empty());
       begin += chunk_bytes) {
    published.frames.push_back(std::make_shared<const std::string>(weight_frames::ChunkFrame(
        version, static_cast<uint32_t>(begin / chunk_bytes),
        std::string_view(bytes).substr(begin, chunk_bytes))));
    if (bytes.empty()) break;
  }
  std::string().swap(bytes);  // the frames hold the bytes now
  published.metadata = std::move(metadata);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (version == 0 || (!impl_->versions.empty() && impl_->versions.back().version >= version)) {
    return Status::InvalidArgument(
        "weight publisher: version " + std::to_string(version) + " is not newer than " +
        std::to_string(impl_->versions.empty() ? 0 : impl_->versions.back().version) +
        " (versions start at 1 and increase)");
  }
  impl_->versions.push_back(std::move(published));
  while (static_cast<int>(impl_->versions.size()) > impl_->options.keep_versions) {
    impl_->versions.pop_front();
  }
  return Status::Ok();
}

std::string WeightPublisher::endpoint() const { return impl_->endpoint; }
uint64_t WeightPublisher::chunks_served() const { return impl_->chunks_served; }

// ------------------------------------------------------------------------------- subscriber

struct WeightSubscriber::Impl {
  WeightSubscriberOptions options;
  zmq::context_t context{1};
  std::optional<CurveClient> curve;
  zmq::socket_t socket;
  std::unique_ptr<HandshakeWatch> watch;  // of `socket`
  bool connected = false;

  Status Reconnect() {
    watch.reset();
    socket.close();
    STRIDER_ASSIGN_OR_RETURN(socket,
                             MakeSocket(context, zmq::socket_type::dealer, size_t{1} << 31));
    if (curve) STRIDER_RETURN_IF_ERROR(curve->Secure(socket));
    STRIDER_ASSIGN_OR_RETURN(watch, HandshakeWatch::Start(context, socket));
    STRIDER_RETURN_IF_ERROR(transport::Connect(socket, options.endpoint));
    connected = true;
    return Status::Ok();
  }

  // The next reply, or Unavailable after the timeout (the socket is then dropped, so late
  // replies of this exchange never mix into the next one), or at once the reason a security
  // handshake failed.
  Result<zmq::message_t> Receive() {
    const auto deadline = std::chrono::steady_clock::now() + options.reply_timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      STRIDER_ASSIGN_OR_RETURN(
          bool readable,
          WaitReadable(socket, std::clamp(left, std::chrono::milliseconds(0),
                                          std::chrono::milliseconds(20))));
      if (readable) {
        STRIDER_ASSIGN_OR_RETURN(std::vector<zmq::message_t> parts, ReceiveParts(socket));
        if (!parts.empty()) return std::move(parts.back());
      }
      if (Status handshake = watch->Check("weight publisher at " + options.endpoint);
          !handshake.ok()) {
        connected = false;
        return handshake;
      }
      if (left.count() <= 0) break;
    }
    connected = false;
    return Status::Unavailable("weight publisher at " + options.endpoint + " did not answer in " +
                               std::to_string(options.reply_timeout.count()) + " ms");
  }

  Result<std::optional<WeightUpdate>> Fetch(uint64_t have) {
    if (!connected) STRIDER_RETURN_IF_ERROR(Reconnect());
    STRIDER_RETURN_IF_ERROR(SendParts(socket, {weight_frames::QueryFrame(have)}));
    STRIDER_ASSIGN_OR_RETURN(zmq::message_t reply, Receive());
    Result<Manifest> manifest = weight_frames::ParseManifest(View(reply), options.max_total_bytes);
    if (!manifest.ok()) {
      connected = false;
      return Status::Corruption(manifest.status().message() + " (from " + options.endpoint + ")");
    }
    if (manifest->version == 0 || manifest->version <= have) return std::optional<WeightUpdate>();
    const uint64_t version = manifest->version;
    const uint32_t chunks = manifest->chunks;
    ChunkAssembler assembler(std::move(*manifest));
    uint32_t next = 0, in_flight = 0;
    while (!assembler.complete()) {
      while (next < chunks && in_flight < static_cast<uint32_t>(options.window)) {
        STRIDER_RETURN_IF_ERROR(
            SendParts(socket, {weight_frames::ChunkRequestFrame(version, next)}));
        ++next;
        ++in_flight;
      }
      STRIDER_ASSIGN_OR_RETURN(zmq::message_t chunk, Receive());
      if (Status added = assembler.Add(View(chunk)); !added.ok()) {
        connected = false;  // drops replies still in flight for this exchange
        return added;
      }
      --in_flight;
    }
    STRIDER_ASSIGN_OR_RETURN(WeightUpdate update, assembler.Finish());
    return std::optional<WeightUpdate>(std::move(update));
  }
};

WeightSubscriber::WeightSubscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WeightSubscriber::~WeightSubscriber() {
  impl_->watch.reset();
  impl_->socket.close();
}

Result<std::unique_ptr<WeightSubscriber>> WeightSubscriber::Connect(
    const WeightSubscriberOptions& options) {
  STRIDER_RETURN_IF_ERROR(CheckEndpoint(options.endpoint));
  if (options.window < 1) return Status::InvalidArgument("weight subscriber: window must be >= 1");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (options.auth.enabled()) {
    Result<CurveClient> curve = CurveClient::Load(options.auth);
    if (!curve.ok()) return curve.status().WithContext("weight subscriber: auth");
    impl->curve = std::move(*curve);
  }
  STRIDER_RETURN_IF_ERROR(impl->Reconnect());
  return std::unique_ptr<WeightSubscriber>(new WeightSubscriber(std::move(impl)));
}

Result<std::optional<WeightUpdate>> WeightSubscriber::FetchNewer(uint64_t have_version) {
  return impl_->Fetch(have_version);
}

}  // namespace strider::transport
