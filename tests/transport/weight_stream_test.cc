// The weight stream over real ZeroMQ sockets: versions, chunking, checksums, a publisher that
// replaces a version mid-fetch, a corrupt chunk, a publisher that is not there.
#include "common/transport/weight_stream.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <zmq.hpp>

#include "common/schema/crc32c.h"
#include "common/transport/weight_frames.h"
#include "common/transport/zmq_util.h"

namespace strider::transport {
namespace {

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

std::unique_ptr<WeightSubscriber> Subscribe(const std::string& endpoint, int timeout_ms = 5000) {
  WeightSubscriberOptions options;
  options.endpoint = endpoint;
  options.reply_timeout = std::chrono::milliseconds(timeout_ms);
  auto subscriber = WeightSubscriber::Connect(options);
  EXPECT_TRUE(subscriber.ok()) << subscriber.status().ToString();
  return subscriber.ok() ? std::move(*subscriber) : nullptr;
}

TEST(WeightStream, DeliversEachNewerVersionWhole) {
  WeightPublisherOptions options;
  options.chunk_bytes = 64 * 1024;
  auto publisher = WeightPublisher::Start(options);
  ASSERT_TRUE(publisher.ok()) << publisher.status().ToString();
  auto subscriber = Subscribe((*publisher)->endpoint());
  ASSERT_NE(subscriber, nullptr);

  auto nothing = subscriber->FetchNewer(0);
  ASSERT_TRUE(nothing.ok()) << nothing.status().ToString();
  EXPECT_FALSE(nothing->has_value());

  const std::string v1 = RandomBytes(3 * 1024 * 1024 + 17, 1);  // not a multiple of a chunk
  ASSERT_TRUE((*publisher)->Publish(1, v1, "tiny").ok());
  auto first = subscriber->FetchNewer(0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->version, 1u);
  EXPECT_EQ((*first)->metadata, "tiny");
  EXPECT_TRUE((*first)->bytes == v1);
  EXPECT_EQ((*publisher)->chunks_served(), 49u);

  auto same = subscriber->FetchNewer(1);
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(same->has_value());

  const std::string v3 = RandomBytes(1000, 3);
  ASSERT_TRUE((*publisher)->Publish(3, v3).ok());
  EXPECT_TRUE((*publisher)->Publish(2, "x").IsInvalidArgument());
  auto third = subscriber->FetchNewer(1);
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE(third->has_value());
  EXPECT_EQ((*third)->version, 3u);
  EXPECT_TRUE((*third)->bytes == v3);
}

TEST(WeightStream, AbsentPublisherIsUnavailable) {
  auto subscriber = Subscribe("tcp://127.0.0.1:1", 200);
  ASSERT_NE(subscriber, nullptr);
  auto result = subscriber->FetchNewer(0);
  EXPECT_EQ(result.status().code(), StatusCode::kUnavailable) << result.status().ToString();
}

// A hand-written publisher whose chunk does not match its checksum.
TEST(WeightStream, CorruptChunkIsRefused) {
  zmq::context_t context(1);
  auto socket = MakeSocket(context, zmq::socket_type::router);
  ASSERT_TRUE(socket.ok());
  auto bound = Bind(*socket, "tcp://127.0.0.1:0");
  ASSERT_TRUE(bound.ok());
  std::thread fake([&] {
    auto put = [](std::string& out, auto value) {
      out.append(reinterpret_cast<const char*>(&value), sizeof(value));
    };
    for (int request = 0; request < 2; ++request) {
      if (!WaitReadable(*socket, std::chrono::milliseconds(5000)).value()) return;
      auto parts = ReceiveParts(*socket).value();
      std::string reply;
      put(reply, uint32_t{0x57525453});
      put(reply, uint16_t{1});
      const std::string payload = "0123456789";
      if (request == 0) {
        put(reply, uint8_t{3});
        put(reply, uint64_t{7});
        put(reply, uint64_t{payload.size()});
        put(reply, uint32_t{64});
        put(reply, uint32_t{1});
        put(reply, schema::Crc32c(payload));
        put(reply, uint32_t{0});
      } else {
        put(reply, uint8_t{4});
        put(reply, uint64_t{7});
        put(reply, uint32_t{0});
        put(reply, schema::Crc32c(payload) ^ 1u);  // wrong
        put(reply, static_cast<uint32_t>(payload.size()));
        reply += payload;
      }
      // A reply lost here makes FetchNewer below time out, which fails the test.
      (void)SendParts(*socket, {View(parts[0]), reply});
    }
  });
  auto subscriber = Subscribe(LocalEndpoint(*bound));
  ASSERT_NE(subscriber, nullptr);
  auto result = subscriber->FetchNewer(0);
  EXPECT_TRUE(result.status().IsCorruption()) << result.status().ToString();
  fake.join();
}

// The frame checks alone, without sockets (the fuzzer in tests/fuzz/ reaches the same code).
namespace wf = weight_frames;

wf::Manifest ManifestOf(const std::string& bytes, uint32_t chunk_bytes, uint64_t version) {
  wf::Manifest manifest;
  manifest.version = version;
  manifest.total_bytes = bytes.size();
  manifest.chunk_bytes = chunk_bytes;
  manifest.chunks = static_cast<uint32_t>((bytes.size() + chunk_bytes - 1) / chunk_bytes);
  manifest.crc32c = schema::Crc32c(bytes);
  manifest.metadata = "tiny";
  return manifest;
}

TEST(WeightFrames, ChunksInAnyOrderWithDuplicatesAssembleTheSource) {
  const std::string source = RandomBytes(1000, 7);
  auto parsed = wf::ParseManifest(wf::ManifestFrame(ManifestOf(source, 64, 3)), 1 << 20);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->chunks, 16u);
  wf::ChunkAssembler assembler(*parsed);
  for (uint32_t i : {5u, 0u, 15u, 5u, 1u, 2u, 3u, 4u, 6u, 7u, 8u, 9u, 10u, 11u, 12u, 13u, 14u}) {
    ASSERT_FALSE(assembler.complete());
    ASSERT_TRUE(assembler.Add(wf::ChunkFrame(3, i, source.substr(i * 64, 64))).ok()) << i;
  }
  ASSERT_TRUE(assembler.complete());
  auto update = assembler.Finish();
  ASSERT_TRUE(update.ok()) << update.status().ToString();
  EXPECT_EQ(update->bytes, source);
  EXPECT_EQ(update->version, 3u);
  EXPECT_EQ(update->metadata, "tiny");
}

TEST(WeightFrames, DamagedRepliesAreRefusedWithTheirReason) {
  const std::string source = RandomBytes(200, 8);
  wf::ChunkAssembler assembler(ManifestOf(source, 100, 9));
  std::string flipped = wf::ChunkFrame(9, 0, source.substr(0, 100));
  flipped[flipped.size() - 1] ^= 4;
  EXPECT_TRUE(assembler.Add(flipped).IsCorruption());
  EXPECT_TRUE(assembler.Add(wf::ChunkFrame(8, 0, source.substr(0, 100))).IsCorruption());
  EXPECT_TRUE(assembler.Add(wf::ChunkFrame(9, 2, "x")).IsCorruption());       // out of range
  EXPECT_TRUE(assembler.Add(wf::ChunkFrame(9, 1, source.substr(100, 99))).IsCorruption());
  std::string cut = wf::ChunkFrame(9, 0, source.substr(0, 100));
  cut.resize(cut.size() - 1);
  EXPECT_TRUE(assembler.Add(cut).IsCorruption());
  EXPECT_TRUE(assembler.Add(wf::QueryFrame(1)).IsCorruption());
  EXPECT_EQ(assembler.Add(wf::GoneFrame(9)).code(), StatusCode::kUnavailable);
  EXPECT_FALSE(assembler.complete());
  EXPECT_EQ(assembler.Finish().status().code(), StatusCode::kFailedPrecondition);

  // Every chunk intact but the manifest's checksum of the whole is not theirs.
  wf::Manifest wrong = ManifestOf(source, 100, 9);
  wrong.crc32c ^= 1;
  wf::ChunkAssembler whole(wrong);
  ASSERT_TRUE(whole.Add(wf::ChunkFrame(9, 1, source.substr(100))).ok());
  ASSERT_TRUE(whole.Add(wf::ChunkFrame(9, 0, source.substr(0, 100))).ok());
  auto update = whole.Finish();
  EXPECT_TRUE(update.status().IsCorruption());
  EXPECT_NE(update.status().message().find("checksum of the whole"), std::string::npos);
}

TEST(WeightFrames, InconsistentOrOversizedManifestsAreRefused) {
  wf::Manifest manifest = ManifestOf(RandomBytes(1000, 9), 100, 4);
  EXPECT_TRUE(wf::ParseManifest(wf::ManifestFrame(manifest), 1000).ok());
  auto over = wf::ParseManifest(wf::ManifestFrame(manifest), 999);
  EXPECT_TRUE(over.status().IsCorruption());
  EXPECT_NE(over.status().message().find("over the limit of 999 bytes"), std::string::npos);
  manifest.chunks = 11;
  EXPECT_TRUE(wf::ParseManifest(wf::ManifestFrame(manifest), 1000).status().IsCorruption());
  manifest.chunks = 0;
  manifest.chunk_bytes = 0;
  EXPECT_TRUE(wf::ParseManifest(wf::ManifestFrame(manifest), 1000).status().IsCorruption());
  std::string frame = wf::ManifestFrame(ManifestOf("abc", 2, 4));
  frame.pop_back();
  EXPECT_TRUE(wf::ParseManifest(frame, 1000).status().IsCorruption());
  // "Nothing newer" carries no sizes to check.
  auto nothing = wf::ParseManifest(wf::ManifestFrame(wf::Manifest{}), 0);
  ASSERT_TRUE(nothing.ok());
  EXPECT_EQ(nothing->version, 0u);
}

TEST(WeightFrames, RequestsParseOnlyWhenWhole) {
  auto query = wf::ParseRequest(wf::QueryFrame(42));
  ASSERT_TRUE(query.has_value());
  EXPECT_EQ(query->kind, wf::Kind::kQuery);
  EXPECT_EQ(query->version, 42u);
  auto chunk = wf::ParseRequest(wf::ChunkRequestFrame(7, 3));
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ(chunk->kind, wf::Kind::kChunkRequest);
  EXPECT_EQ(chunk->index, 3u);
  std::string cut = wf::ChunkRequestFrame(7, 3);
  cut.pop_back();
  EXPECT_FALSE(wf::ParseRequest(cut).has_value());
  EXPECT_FALSE(wf::ParseRequest(wf::GoneFrame(1)).has_value());
  std::string other_protocol = wf::QueryFrame(1);
  other_protocol[4] = 2;
  EXPECT_FALSE(wf::ParseRequest(other_protocol).has_value());
}

}  // namespace
}  // namespace strider::transport
