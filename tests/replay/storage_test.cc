// The store's write calls: what one call puts on disk, and the summary bookkeeping of inserts
// and deletions together.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "replay/storage.h"
#include "tests/replay/test_segments.h"
#include "tests/scratch_dir.h"

namespace strider::replay {
namespace {

using strider::testing::MakeTrajectoryId;
using strider::testing::TempDir;

std::unique_ptr<Store> OpenStore(const TempDir& dir) {
  Result<std::unique_ptr<Store>> store = Store::Open(dir.Sub("db"), StoreOptions());
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(*store) : nullptr;
}

std::unique_ptr<SegmentWriter> Writer(Store& store, int slot) {
  Result<std::unique_ptr<SegmentWriter>> writer = store.NewSegmentWriter(slot, {"main"}, 1 << 20);
  EXPECT_TRUE(writer.ok()) << writer.status().ToString();
  return writer.ok() ? std::move(*writer) : nullptr;
}

// A segment to write: its facts, its store key and stand-in envelope bytes (the store keeps
// whatever bytes it is given; validating them is the server's job).
struct TestSegment {
  TestSegment(uint64_t trajectory, uint32_t index, uint64_t sequence_, uint64_t tokens,
              uint64_t policy_version, bool is_last = false)
      : sequence(sequence_) {
    facts.key.trajectory = MakeTrajectoryId(trajectory);
    facts.key.index = index;
    facts.table = "main";
    facts.env = "calculator";
    facts.min_policy_version = policy_version;
    facts.max_policy_version = policy_version + 1;
    facts.tokens = tokens;
    facts.steps = 2;
    facts.is_last = is_last;
    facts.outcome_reward = is_last ? 1.5f : 0.0f;
    facts.end_reason = is_last ? schema::EndReason::kTruncatedLength : schema::EndReason::kNone;
    store_key = SegmentStoreKey(facts.key);
    envelope = "envelope " + std::to_string(trajectory) + "/" + std::to_string(index);
  }
  SegmentInsert Insert() const { return {sequence, store_key, envelope, &facts}; }
  IndexRecord Record() const {
    IndexRecord record;
    record.key = facts.key;
    record.tokens = facts.tokens;
    record.table = facts.table;
    return record;
  }

  uint64_t sequence;
  schema::SegmentFacts facts;
  std::string store_key;
  std::string envelope;
};

std::optional<schema::TrajectorySummary> Summary(const Store& store, uint64_t trajectory) {
  Result<std::optional<std::string>> raw =
      store.Get(store.trajectories(), MakeTrajectoryId(trajectory).View());
  EXPECT_TRUE(raw.ok()) << raw.status().ToString();
  if (!raw.ok() || !raw->has_value()) return std::nullopt;
  Result<schema::TrajectorySummary> summary = schema::DecodeTrajectorySummary(**raw);
  EXPECT_TRUE(summary.ok()) << summary.status().ToString();
  if (!summary.ok()) return std::nullopt;
  return *summary;
}

TEST(Store, SegmentWriterStoresEachSegmentWithItsIndexEntrySummaryAndCounters) {
  TempDir dir;
  std::unique_ptr<Store> store = OpenStore(dir);
  ASSERT_NE(store, nullptr);
  std::unique_ptr<SegmentWriter> slot0 = Writer(*store, 0);
  std::unique_ptr<SegmentWriter> slot1 = Writer(*store, 1);
  const TestSegment a0(1, 0, 1, 100, 3);
  const TestSegment a1(1, 1, 2, 50, 2, /*is_last=*/true);
  const TestSegment b0(2, 0, 3, 70, 5);
  ASSERT_TRUE(slot0->Write({a0.Insert(), a1.Insert()}, 1000).ok());
  ASSERT_TRUE(slot1->Write({b0.Insert()}, 2000).ok());

  for (const TestSegment* s : {&a0, &a1, &b0}) {
    Result<std::optional<std::string>> value = store->Get(store->segments(), s->store_key);
    ASSERT_TRUE(value.ok() && value->has_value());
    EXPECT_EQ(**value, EncodeU64(s->sequence) + s->envelope);
    Result<std::optional<std::string>> index =
        store->Get(store->sequence(), SequenceKey(s->sequence));
    ASSERT_TRUE(index.ok() && index->has_value());
    Result<IndexRecord> record = DecodeIndexRecord(**index);
    ASSERT_TRUE(record.ok());
    EXPECT_EQ(record->key.index, s->facts.key.index);
    EXPECT_EQ(record->tokens, s->facts.tokens);
    EXPECT_EQ(record->bytes, s->envelope.size());
    EXPECT_EQ(record->table, "main");
  }
  std::optional<schema::TrajectorySummary> a = Summary(*store, 1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->segments_stored, 2u);
  EXPECT_EQ(a->tokens, 150u);
  EXPECT_EQ(a->steps, 4u);
  EXPECT_EQ(a->min_policy_version, 2u);
  EXPECT_EQ(a->max_policy_version, 4u);
  EXPECT_EQ(a->first_insert_unix_ms, 1000u);
  EXPECT_TRUE(a->complete);
  EXPECT_EQ(a->end_reason, schema::EndReason::kTruncatedLength) << "the last segment's";
  EXPECT_FLOAT_EQ(a->outcome_reward, 1.5f);
  std::optional<schema::TrajectorySummary> b = Summary(*store, 2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->segments_stored, 1u);
  EXPECT_FALSE(b->complete);
  EXPECT_EQ(b->end_reason, schema::EndReason::kNone);

  // The counters are the sum (inserts) and maximum (next sequence) over the slots, and a slot
  // goes on from what it counted before.
  EXPECT_EQ(*store->TableInserts("main"), 3u);
  EXPECT_EQ(*store->NextSequence(), 4u);
  slot0.reset();
  slot0 = Writer(*store, 0);
  const TestSegment b1(2, 1, 4, 10, 6);
  ASSERT_TRUE(slot0->Write({b1.Insert()}, 3000).ok());
  EXPECT_EQ(*store->TableInserts("main"), 4u);
  EXPECT_EQ(*store->NextSequence(), 5u);
  b = Summary(*store, 2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->segments_stored, 2u);
  EXPECT_EQ(b->tokens, 80u);
  EXPECT_EQ(b->first_insert_unix_ms, 2000u);
}

TEST(Store, DeletingSegmentsShrinksTheSummaryAndTheLastOneDeletesIt) {
  TempDir dir;
  std::unique_ptr<Store> store = OpenStore(dir);
  ASSERT_NE(store, nullptr);
  std::unique_ptr<SegmentWriter> writer = Writer(*store, 0);
  const TestSegment a0(1, 0, 1, 100, 3);
  const TestSegment a1(1, 1, 2, 50, 3);
  ASSERT_TRUE(writer->Write({a0.Insert(), a1.Insert()}, 1000).ok());

  ASSERT_TRUE(store->DeleteSegments({{a0.sequence, a0.Record()}}).ok());
  EXPECT_FALSE(store->Get(store->segments(), a0.store_key)->has_value());
  EXPECT_FALSE(store->Get(store->sequence(), SequenceKey(a0.sequence))->has_value());
  EXPECT_TRUE(store->Get(store->segments(), a1.store_key)->has_value());
  std::optional<schema::TrajectorySummary> a = Summary(*store, 1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->segments_stored, 1u);
  EXPECT_EQ(a->tokens, 50u);

  ASSERT_TRUE(store->DeleteSegments({{a1.sequence, a1.Record()}}).ok());
  EXPECT_FALSE(Summary(*store, 1).has_value());
}

TEST(Store, IngestRebuildsADamagedSummaryAndDeletionRefusesIt) {
  TempDir dir;
  std::unique_ptr<Store> store = OpenStore(dir);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->db()
                  ->Put(rocksdb::WriteOptions(), store->trajectories(),
                        std::string(MakeTrajectoryId(1).View()), "not a summary")
                  .ok());
  std::unique_ptr<SegmentWriter> writer = Writer(*store, 0);
  const TestSegment a0(1, 0, 1, 100, 3);
  ASSERT_TRUE(writer->Write({a0.Insert()}, 1000).ok());
  std::optional<schema::TrajectorySummary> a = Summary(*store, 1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->segments_stored, 1u);
  EXPECT_EQ(a->tokens, 100u);

  ASSERT_TRUE(store->db()
                  ->Put(rocksdb::WriteOptions(), store->trajectories(),
                        std::string(MakeTrajectoryId(1).View()), "not a summary")
                  .ok());
  EXPECT_FALSE(store->DeleteSegments({{a0.sequence, a0.Record()}}).ok());
  // Nothing of the refused deletion was written.
  EXPECT_TRUE(store->Get(store->segments(), a0.store_key)->has_value());
}

}  // namespace
}  // namespace strider::replay
