// The weight stream over real ZeroMQ sockets: versions, chunking, checksums, a publisher that
// replaces a version mid-fetch, a corrupt chunk, a publisher that is not there.
#include "common/transport/weight_stream.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <zmq.hpp>

#include "common/schema/crc32c.h"
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
      (void)SendParts(*socket, {View(parts[0]), reply});
    }
  });
  auto subscriber = Subscribe(LocalEndpoint(*bound));
  ASSERT_NE(subscriber, nullptr);
  auto result = subscriber->FetchNewer(0);
  EXPECT_TRUE(result.status().IsCorruption()) << result.status().ToString();
  fake.join();
}

}  // namespace
}  // namespace strider::transport
