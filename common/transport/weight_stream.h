// Versioned, chunked, checksummed weight streaming from a learner to actors
// (docs/design.md#processes-and-data-flow).
//
// No LibTorch: the payload is opaque bytes (a safetensors file); the receiver loads it.
//
//   learner: WeightPublisher ── ROUTER ──────────── DEALER ── WeightSubscriber :actor
//            Publish(version, bytes)   <── query(have v)      FetchNewer(v)
//                                      ──> manifest(v', size, chunks, CRC32C of the whole)
//                                      <── chunk i of v'  (a window of requests in flight)
//                                      ──> chunk i, CRC32C of the chunk
//
// The subscriber pulls: it asks for chunks a window at a time, so a slow actor never makes the
// publisher queue (or ZeroMQ drop) a whole model's bytes, and a fast one keeps the pipe full. A
// chunk is checked against its CRC32C on arrival and the assembled bytes against the whole
// CRC32C before they are handed out; a mismatch is Corruption, never a silent load. The
// publisher holds the newest `keep_versions` versions, so a fetch in progress survives one new
// publication; a fetch of a version no longer held fails with Unavailable and the next fetch
// starts over on the newest.
//
// Wire format (little-endian), one frame per message:
//   header: magic "STRW" u32, protocol u16 (1), kind u8
//   query    (1): have_version u64
//   chunk_req(2): version u64, index u32
//   manifest (3): version u64 (0: nothing newer), total_bytes u64, chunk_bytes u32, chunks u32,
//                 crc32c u32, metadata length u32 + bytes
//   chunk    (4): version u64, index u32, crc32c u32, length u32 + bytes
//   gone     (5): version u64
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "common/transport/curve.h"

namespace strider::transport {

struct WeightPublisherOptions {
  std::string endpoint = "tcp://127.0.0.1:0";  // port 0: any free port
  uint32_t chunk_bytes = 1 << 20;
  int keep_versions = 2;
  // CURVE (common/transport/curve.h): with auth.secret_key only the authorised actors' keys
  // connect; without it, binding a non-loopback address needs auth.insecure.
  ServerAuth auth;
};

class WeightPublisher {
 public:
  // Binds and serves on a background thread until destroyed.
  static Result<std::unique_ptr<WeightPublisher>> Start(const WeightPublisherOptions& options);
  ~WeightPublisher();
  // Makes `bytes` the newest version. Versions must increase (InvalidArgument otherwise).
  // `metadata` travels in the manifest (for example the model config name).
  Status Publish(uint64_t version, std::string bytes, std::string metadata = "");
  std::string endpoint() const;  // connectable from this host
  uint64_t chunks_served() const;

 private:
  struct Impl;
  explicit WeightPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct WeightUpdate {
  uint64_t version = 0;
  std::string bytes;
  std::string metadata;
};

struct WeightSubscriberOptions {
  std::string endpoint;
  int window = 4;                                 // chunk requests in flight
  std::chrono::milliseconds reply_timeout{5000};  // no reply this long: Unavailable
  size_t max_total_bytes = size_t{16} << 30;      // a manifest over this is refused
  ClientAuth auth;  // this actor's key pair and the publisher's public key; empty: no CURVE
};

// Single-threaded: one caller at a time (the actor runs it on its own thread).
class WeightSubscriber {
 public:
  static Result<std::unique_ptr<WeightSubscriber>> Connect(const WeightSubscriberOptions& options);
  ~WeightSubscriber();
  // The newest version if it is newer than `have_version`, fetched and verified; nullopt when
  // there is nothing newer. Unavailable when the publisher does not answer in time (the next
  // call reconnects), Corruption when a checksum fails, FailedPrecondition when the publisher
  // refused this subscriber's key or the two disagree on CURVE (the next call tries again).
  Result<std::optional<WeightUpdate>> FetchNewer(uint64_t have_version);

 private:
  struct Impl;
  explicit WeightSubscriber(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strider::transport
