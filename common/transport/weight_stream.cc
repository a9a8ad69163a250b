#include "common/transport/weight_stream.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/schema/crc32c.h"
#include "common/transport/zmq_util.h"

namespace strider::transport {
namespace {

constexpr uint32_t kMagic = 0x57525453;  // "STRW" little-endian
constexpr uint16_t kProtocol = 1;
enum Kind : uint8_t { kQuery = 1, kChunkRequest = 2, kManifest = 3, kChunk = 4, kGone = 5 };
constexpr size_t kHeaderBytes = 7;

class Writer {
 public:
  explicit Writer(Kind kind) {
    Put(kMagic);
    Put(kProtocol);
    Put(static_cast<uint8_t>(kind));
  }
  template <typename T>
  Writer& Put(T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out_.append(bytes, sizeof(T));
    return *this;
  }
  Writer& PutBytes(std::string_view bytes) {
    Put(static_cast<uint32_t>(bytes.size()));
    out_.append(bytes);
    return *this;
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool Get(T* value) {
    if (bytes_.size() - offset_ < sizeof(T)) return false;
    std::memcpy(value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }
  bool GetBytes(std::string_view* out) {
    uint32_t length = 0;
    if (!Get(&length) || bytes_.size() - offset_ < length) return false;
    *out = bytes_.substr(offset_, length);
    offset_ += length;
    return true;
  }
  // Checks the header and returns the kind, or 0.
  uint8_t Header() {
    uint32_t magic = 0;
    uint16_t protocol = 0;
    uint8_t kind = 0;
    if (!Get(&magic) || !Get(&protocol) || !Get(&kind)) return 0;
    if (magic != kMagic || protocol != kProtocol) return 0;
    return kind;
  }

 private:
  std::string_view bytes_;
  size_t offset_ = 0;
};

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

std::shared_ptr<const std::string> ChunkFrame(uint64_t version, uint32_t index,
                                              std::string_view chunk) {
  return std::make_shared<const std::string>(Writer(kChunk)
                                                 .Put(version)
                                                 .Put(index)
                                                 .Put(schema::Crc32c(chunk))
                                                 .PutBytes(chunk)
                                                 .Take());
}

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
  zmq::socket_t socket;
  std::string endpoint;
  std::mutex mutex;
  std::deque<Version> versions;  // oldest first
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> chunks_served{0};
  std::thread thread;

  // The reply to one request; an empty message for none.
  zmq::message_t Answer(std::string_view request) {
    Reader reader(request);
    const uint8_t kind = reader.Header();
    std::lock_guard<std::mutex> lock(mutex);
    if (kind == kQuery) {
      uint64_t have = 0;
      if (!reader.Get(&have)) return zmq::message_t();
      Writer writer(kManifest);
      if (versions.empty() || versions.back().version <= have) {
        writer.Put(uint64_t{0}).Put(uint64_t{0}).Put(uint32_t{0}).Put(uint32_t{0}).Put(uint32_t{0});
        writer.PutBytes("");
        return Frame(writer.Take());
      }
      const Version& newest = versions.back();
      const uint64_t total = newest.total_bytes;
      const uint32_t chunks =
          static_cast<uint32_t>((total + options.chunk_bytes - 1) / options.chunk_bytes);
      writer.Put(newest.version).Put(total).Put(options.chunk_bytes).Put(chunks).Put(newest.crc);
      writer.PutBytes(newest.metadata);
      return Frame(writer.Take());
    }
    if (kind == kChunkRequest) {
      uint64_t version = 0;
      uint32_t index = 0;
      if (!reader.Get(&version) || !reader.Get(&index)) return zmq::message_t();
      for (const Version& held : versions) {
        if (held.version != version) continue;
        if (index >= held.frames.size()) break;
        ++chunks_served;
        return SharedFrame(held.frames[index]);
      }
      return Frame(Writer(kGone).Put(version).Take());
    }
    return zmq::message_t();  // not ours: ignored, the peer times out
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
    published.frames.push_back(ChunkFrame(version, static_cast<uint32_t>(begin / chunk_bytes),
                                          std::string_view(bytes).substr(begin, chunk_bytes)));
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
  zmq::socket_t socket;
  bool connected = false;

  Status Reconnect() {
    socket.close();
    STRIDER_ASSIGN_OR_RETURN(socket,
                             MakeSocket(context, zmq::socket_type::dealer, size_t{1} << 31));
    STRIDER_RETURN_IF_ERROR(transport::Connect(socket, options.endpoint));
    connected = true;
    return Status::Ok();
  }

  // The next reply, or Unavailable after the timeout (the socket is then dropped, so late
  // replies of this exchange never mix into the next one).
  Result<zmq::message_t> Receive() {
    STRIDER_ASSIGN_OR_RETURN(bool readable, WaitReadable(socket, options.reply_timeout));
    if (readable) {
      STRIDER_ASSIGN_OR_RETURN(std::vector<zmq::message_t> parts, ReceiveParts(socket));
      if (!parts.empty()) return std::move(parts.back());
    }
    connected = false;
    return Status::Unavailable("weight publisher at " + options.endpoint + " did not answer in " +
                               std::to_string(options.reply_timeout.count()) + " ms");
  }

  Result<std::optional<WeightUpdate>> Fetch(uint64_t have) {
    if (!connected) STRIDER_RETURN_IF_ERROR(Reconnect());
    STRIDER_RETURN_IF_ERROR(SendParts(socket, {Writer(kQuery).Put(have).Take()}));
    STRIDER_ASSIGN_OR_RETURN(zmq::message_t manifest, Receive());
    Reader reader(View(manifest));
    uint64_t version = 0, total = 0;
    uint32_t chunk_bytes = 0, chunks = 0, crc = 0;
    std::string_view metadata;
    if (reader.Header() != kManifest || !reader.Get(&version) || !reader.Get(&total) ||
        !reader.Get(&chunk_bytes) || !reader.Get(&chunks) || !reader.Get(&crc) ||
        !reader.GetBytes(&metadata)) {
      connected = false;
      return Status::Corruption("weight stream: malformed manifest from " + options.endpoint);
    }
    if (version == 0 || version <= have) return std::optional<WeightUpdate>();
    if (total > options.max_total_bytes || chunk_bytes == 0 ||
        uint64_t{chunks} != (total + chunk_bytes - 1) / chunk_bytes) {
      connected = false;
      return Status::Corruption("weight stream: manifest of version " + std::to_string(version) +
                                " is inconsistent (" + std::to_string(total) + " bytes, " +
                                std::to_string(chunks) + " chunks of " +
                                std::to_string(chunk_bytes) + ")");
    }
    WeightUpdate update;
    update.version = version;
    update.metadata = std::string(metadata);
    update.bytes.resize(total);
    std::vector<bool> have_chunk(chunks, false);
    uint32_t next = 0, received = 0, in_flight = 0;
    uint32_t running = 0;
    bool in_order = true;
    while (received < chunks) {
      while (next < chunks && in_flight < static_cast<uint32_t>(options.window)) {
        STRIDER_RETURN_IF_ERROR(
            SendParts(socket, {Writer(kChunkRequest).Put(version).Put(next).Take()}));
        ++next;
        ++in_flight;
      }
      STRIDER_ASSIGN_OR_RETURN(zmq::message_t reply, Receive());
      Reader chunk_reader(View(reply));
      const uint8_t kind = chunk_reader.Header();
      if (kind == kGone) {
        connected = false;  // drop replies still in flight for the old version
        return Status::Unavailable("weight stream: version " + std::to_string(version) +
                                   " was replaced while it was being fetched");
      }
      uint64_t chunk_version = 0;
      uint32_t index = 0, chunk_crc = 0;
      std::string_view bytes;
      if (kind != kChunk || !chunk_reader.Get(&chunk_version) || !chunk_reader.Get(&index) ||
          !chunk_reader.Get(&chunk_crc) || !chunk_reader.GetBytes(&bytes) ||
          chunk_version != version || index >= chunks) {
        connected = false;
        return Status::Corruption("weight stream: malformed chunk reply for version " +
                                  std::to_string(version));
      }
      const uint64_t begin = uint64_t{index} * chunk_bytes;
      const uint64_t expected = std::min<uint64_t>(chunk_bytes, total - begin);
      if (bytes.size() != expected || schema::Crc32c(bytes) != chunk_crc) {
        connected = false;
        return Status::Corruption("weight stream: chunk " + std::to_string(index) + " of version " +
                                  std::to_string(version) + " fails its checksum or length");
      }
      if (!have_chunk[index]) {
        std::memcpy(update.bytes.data() + begin, bytes.data(), bytes.size());
        have_chunk[index] = true;
        ++received;
        // Replies come in request order on one socket: the whole's CRC runs along with them,
        // and is computed over the assembled bytes only when they came otherwise.
        if (in_order && index == received - 1) {
          running = schema::Crc32c(bytes.data(), bytes.size(), running);
        } else {
          in_order = false;
        }
      }
      --in_flight;
    }
    const uint32_t whole =
        in_order ? running : schema::Crc32c(update.bytes.data(), update.bytes.size());
    if (whole != crc) {
      return Status::Corruption("weight stream: version " + std::to_string(version) +
                                " fails the checksum of the whole");
    }
    return std::optional<WeightUpdate>(std::move(update));
  }
};

WeightSubscriber::WeightSubscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WeightSubscriber::~WeightSubscriber() { impl_->socket.close(); }

Result<std::unique_ptr<WeightSubscriber>> WeightSubscriber::Connect(
    const WeightSubscriberOptions& options) {
  STRIDER_RETURN_IF_ERROR(CheckEndpoint(options.endpoint));
  if (options.window < 1) return Status::InvalidArgument("weight subscriber: window must be >= 1");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  STRIDER_RETURN_IF_ERROR(impl->Reconnect());
  return std::unique_ptr<WeightSubscriber>(new WeightSubscriber(std::move(impl)));
}

Result<std::optional<WeightUpdate>> WeightSubscriber::FetchNewer(uint64_t have_version) {
  return impl_->Fetch(have_version);
}

}  // namespace strider::transport
