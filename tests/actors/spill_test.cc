// The spill directory (atomic files, bound, order, corruption) and the sender against a real
// replay server that is down, comes up, and holds segments spilled by an earlier run.
#include "actors/spill.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "actors/sender.h"
#include "replay/inspect.h"
#include "replay/replay.h"
#include "tests/replay/test_segments.h"
#include "tests/scratch_dir.h"

namespace strider::actors {
namespace {

using std::chrono::milliseconds;
using strider::testing::MakeSegment;
using strider::testing::TempDir;

std::string Frame(const schema::SegmentData& segment) {
  Result<std::string> frame = schema::EncodeSegment(segment);
  EXPECT_TRUE(frame.ok());
  return frame.ok() ? *frame : std::string();
}

TEST(SpillDirectory, KeepsOrderAcrossReopenAndEnforcesItsBound) {
  TempDir dir;
  const std::string path = dir.Sub("spill");
  std::vector<schema::SegmentKey> keys;
  uint64_t total = 0;
  {
    auto spill = SpillDirectory::Open(path, 1 << 20);
    ASSERT_TRUE(spill.ok()) << spill.status().ToString();
    for (int i = 0; i < 5; ++i) {
      auto segment = MakeSegment(100 - i, i, 64);  // keys not in write order
      const std::string frame = Frame(segment);
      ASSERT_TRUE(spill->Put(segment.key(), frame).ok());
      ASSERT_TRUE(spill->Put(segment.key(), frame).ok());  // twice: stored once
      keys.push_back(segment.key());
      total += frame.size();
    }
    EXPECT_EQ(spill->bytes(), total);
    EXPECT_EQ(spill->segments().size(), 5u);
  }
  auto reopened = SpillDirectory::Open(path, total + 10);
  ASSERT_TRUE(reopened.ok());
  ASSERT_EQ(reopened->segments().size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(reopened->segments()[i].key, keys[i]) << "write order lost at " << i;
    auto frame = reopened->Read(reopened->segments()[i]);
    ASSERT_TRUE(frame.ok());
    auto decoded = schema::Decode(*frame);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(decoded->segment.key(), keys[i]);
  }
  // Over the bound: refused, nothing written.
  auto extra = MakeSegment(7, 0, 64);
  Status full = reopened->Put(extra.key(), Frame(extra));
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  EXPECT_EQ(reopened->segments().size(), 5u);
  ASSERT_TRUE(reopened->Remove(keys[0]).ok());
  EXPECT_EQ(reopened->segments().size(), 4u);
  EXPECT_FALSE(std::filesystem::exists(reopened->segments().front().path + "x"));
  EXPECT_LT(reopened->bytes(), total);
}

TEST(SpillDirectory, CorruptFileIsSetAsideNotSent) {
  TempDir dir;
  const std::string path = dir.Sub("spill");
  auto spill = SpillDirectory::Open(path, 1 << 20);
  ASSERT_TRUE(spill.ok());
  auto segment = MakeSegment(1, 0, 64);
  ASSERT_TRUE(spill->Put(segment.key(), Frame(segment)).ok());
  const std::string file = spill->segments()[0].path;
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x5a');
  }
  auto read = spill->Read(spill->segments()[0]);
  EXPECT_TRUE(read.status().IsCorruption()) << read.status().ToString();
  EXPECT_TRUE(spill->segments().empty());
  EXPECT_TRUE(std::filesystem::exists(file + ".corrupt"));
  EXPECT_TRUE(SpillDirectory::Open(path, 0).status().IsInvalidArgument());
}

uint64_t StoredSegments(const std::string& db, const std::vector<schema::SegmentKey>& keys) {
  auto inspector = replay::Inspector::Open(db);
  EXPECT_TRUE(inspector.ok()) << inspector.status().ToString();
  if (!inspector.ok()) return 0;
  uint64_t found = 0;
  for (const auto& key : keys) found += (*inspector)->Segment(key).ok() ? 1 : 0;
  return found;
}

TEST(Sender, SpillsWhileTheServerIsDownAndSendsOnceItIsUp) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.Sub("replay.sock");
  SenderOptions options;
  options.endpoint = endpoint;
  options.spill_dir = dir.Sub("spill");
  options.spill_after = milliseconds(300);
  options.retry_every = milliseconds(100);
  auto sender = Sender::Start(options);
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  std::vector<schema::SegmentKey> keys;
  for (int i = 0; i < 20; ++i) {
    auto segment = MakeSegment(i, 0, 200, 1, true);
    keys.push_back(segment.key());
    ASSERT_TRUE((*sender)->Push(segment).ok());
  }
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(20000);
  while ((*sender)->stats().spill_files < 20 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_EQ((*sender)->stats().spill_files, 20u);
  EXPECT_FALSE((*sender)->stats().connected);

  replay::ServerOptions server_options;
  server_options.db_path = dir.Sub("db");
  server_options.actor_endpoint = endpoint;
  server_options.stats_interval_s = 0;
  auto server = replay::ReplayServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_TRUE((*sender)->Close(milliseconds(30000)).ok());
  const SenderStats stats = (*sender)->stats();
  EXPECT_EQ(stats.acked, 20u);
  // Each file goes out once per connection: again only after a connection was dropped (a server
  // slower to acknowledge than spill_after, as under ThreadSanitizer).
  EXPECT_GE(stats.sent_from_spill, 20u);
  if (stats.reconnects == 1) EXPECT_EQ(stats.sent_from_spill, 20u);
  EXPECT_EQ(stats.spill_files, 0u);
  EXPECT_TRUE(std::filesystem::is_empty(options.spill_dir));
  (*server)->Stop();
  EXPECT_EQ(StoredSegments(server_options.db_path, keys), 20u);
}

// The server goes away: the frames in flight and the queue reach the spill directory together,
// and what the actor queues while the sender tries to reconnect follows within one short
// connection attempt, not a whole spill_after (a SIGKILL in between would lose it).
TEST(Sender, WhenTheServerGoesAwayTheQueueIsSpilledWithTheFramesInFlight) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.Sub("replay.sock");
  replay::ServerOptions server_options;
  server_options.db_path = dir.Sub("db");
  server_options.actor_endpoint = endpoint;
  server_options.stats_interval_s = 0;
  auto server = replay::ReplayServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  SenderOptions options;
  options.endpoint = endpoint;
  options.spill_dir = dir.Sub("spill");
  options.spill_after = milliseconds(4000);
  options.retry_every = milliseconds(100);
  auto sender = Sender::Start(options);
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  auto wait_for = [&](auto done, milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    return done();
  };
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*sender)->Push(MakeSegment(700 + i, 0, 200)).ok());
  ASSERT_TRUE(wait_for([&] { return (*sender)->stats().acked == 5; }, milliseconds(10000)));
  (*server)->Stop();
  server->reset();

  for (int i = 0; i < 20; ++i) ASSERT_TRUE((*sender)->Push(MakeSegment(710 + i, 0, 200)).ok());
  ASSERT_TRUE(wait_for([&] { return (*sender)->stats().spill_files == 20; }, milliseconds(20000)));
  const auto queued_at = std::chrono::steady_clock::now();
  for (int i = 0; i < 30; ++i) ASSERT_TRUE((*sender)->Push(MakeSegment(740 + i, 0, 200)).ok());
  ASSERT_TRUE(wait_for([&] { return (*sender)->stats().spill_files == 50; }, milliseconds(20000)));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - queued_at).count();
  EXPECT_LT(seconds, 2.5) << "queued segments waited for a whole connection attempt";
  EXPECT_EQ((*sender)->stats().queued_segments, 0u);
  // Everything is spilled, so closing without waiting for a server loses nothing.
  EXPECT_TRUE((*sender)->Close(milliseconds(0)).ok());
}

TEST(Sender, SendsFilesAnEarlierRunSpilledBeforeNewSegments) {
  TempDir dir;
  replay::ServerOptions server_options;
  server_options.db_path = dir.Sub("db");
  server_options.stats_interval_s = 0;
  auto server = replay::ReplayServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<schema::SegmentKey> keys;
  {
    auto spill = SpillDirectory::Open(dir.Sub("spill"), 1 << 20);
    ASSERT_TRUE(spill.ok());
    for (int i = 0; i < 5; ++i) {
      auto segment = MakeSegment(500 + i, 0, 100, 1, true);
      keys.push_back(segment.key());
      ASSERT_TRUE(spill->Put(segment.key(), Frame(segment)).ok());
    }
  }
  SenderOptions options;
  options.endpoint = (*server)->actor_endpoint();
  options.spill_dir = dir.Sub("spill");
  auto sender = Sender::Start(options);
  ASSERT_TRUE(sender.ok());
  auto fresh = MakeSegment(900, 0, 100, 1, true);
  keys.push_back(fresh.key());
  ASSERT_TRUE((*sender)->Push(fresh).ok());
  // Invalid data is refused before it is queued.
  auto bad = MakeSegment(901, 0, 100);
  bad.roles.pop_back();
  EXPECT_TRUE((*sender)->Push(bad).IsCorruption() || (*sender)->Push(bad).IsInvalidArgument());
  ASSERT_TRUE((*sender)->Close(milliseconds(30000)).ok());
  EXPECT_EQ((*sender)->stats().acked, 6u);
  EXPECT_EQ((*sender)->stats().sent_from_spill, 5u);
  (*server)->Stop();
  EXPECT_EQ(StoredSegments(server_options.db_path, keys), 6u);
}

}  // namespace
}  // namespace strider::actors
