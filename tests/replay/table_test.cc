#include <gtest/gtest.h>

#include <cstdlib>

#include <map>
#include <set>

#include "replay/replay.h"
#include "replay/samplers/interface.h"
#include "replay/table.h"

namespace strider::replay {
namespace {

auto kAll = [](uint64_t) { return true; };

std::unique_ptr<Sampler> Make(SamplerKind kind, double exponent = 1.0) {
  SamplerOptions options;
  options.kind = kind;
  options.priority_exponent = exponent;
  return MakeSampler(options);
}

TEST(SamplerFactory, MakesEveryKindAndReportsItsOptions) {
  for (const char* name : {"fifo", "uniform", "prioritized", "newest"}) {
    Result<SamplerKind> kind = ParseSamplerKind(name);
    ASSERT_TRUE(kind.ok()) << name;
    auto sampler = Make(*kind);
    ASSERT_NE(sampler, nullptr);
    EXPECT_EQ(SamplerKindName(sampler->options().kind), name);
  }
  EXPECT_FALSE(ParseSamplerKind("lifo").ok());
}

TEST(FifoSampler, ReturnsOldestFirstAfterThePosition) {
  auto fifo = Make(SamplerKind::kFifo);
  std::mt19937_64 rng(1);
  for (uint64_t i = 1; i <= 10; ++i) fifo->Insert(i, 1);
  EXPECT_EQ(fifo->Sample(3, 0, rng, kAll), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(fifo->Sample(3, 3, rng, kAll), (std::vector<uint64_t>{4, 5, 6}));
  fifo->Remove(8);
  EXPECT_EQ(fifo->Sample(5, 6, rng, kAll), (std::vector<uint64_t>{7, 9, 10}));
  EXPECT_FALSE(fifo->SetPriority(7, 2).ok());
}

TEST(NewestSampler, ReturnsNewestFirst) {
  auto newest = Make(SamplerKind::kNewest);
  std::mt19937_64 rng(1);
  for (uint64_t i = 1; i <= 10; ++i) newest->Insert(i, 1);
  EXPECT_EQ(newest->Sample(2, 0, rng, kAll), (std::vector<uint64_t>{10, 9}));
  EXPECT_EQ(newest->Sample(2, 0, rng, [](uint64_t i) { return i % 2 == 1; }),
            (std::vector<uint64_t>{9, 7}));
}

TEST(UniformSampler, DrawsEveryItemEquallyOften) {
  auto uniform = Make(SamplerKind::kUniform);
  std::mt19937_64 rng(7);
  for (uint64_t i = 0; i < 10; ++i) uniform->Insert(i, 1);
  uniform->Remove(3);  // 9 items left, swap-removal must keep them all reachable
  std::map<uint64_t, int> counts;
  const int draws = 45000;
  for (int d = 0; d < draws; ++d) counts[uniform->Sample(1, 0, rng, kAll).at(0)]++;
  EXPECT_EQ(counts.count(3), 0u);
  ASSERT_EQ(counts.size(), 9u);
  // Expected 5000 each; the binomial standard deviation is about 67, so 6 sigma is 400.
  for (const auto& [item, count] : counts) EXPECT_NEAR(count, 5000, 400) << item;
}

TEST(UniformSampler, BatchHasDistinctEligibleItems) {
  auto uniform = Make(SamplerKind::kUniform);
  std::mt19937_64 rng(3);
  for (uint64_t i = 0; i < 100; ++i) uniform->Insert(i, 1);
  auto batch = uniform->Sample(20, 0, rng, [](uint64_t i) { return i >= 90; });
  std::set<uint64_t> distinct(batch.begin(), batch.end());
  EXPECT_EQ(batch.size(), 10u);
  EXPECT_EQ(distinct.size(), 10u);
  for (uint64_t i : batch) EXPECT_GE(i, 90u);
}

TEST(PrioritizedSampler, DrawsInProportionToPriority) {
  auto prioritized = Make(SamplerKind::kPrioritized);
  std::mt19937_64 rng(11);
  for (uint64_t i = 1; i <= 4; ++i) prioritized->Insert(i, static_cast<double>(i));
  std::map<uint64_t, int> counts;
  const int draws = 50000;
  for (int d = 0; d < draws; ++d) counts[prioritized->Sample(1, 0, rng, kAll).at(0)]++;
  for (uint64_t i = 1; i <= 4; ++i) {
    EXPECT_NEAR(counts[i] / static_cast<double>(draws), i / 10.0, 0.012) << i;
  }
}

TEST(PrioritizedSampler, UpdatedPrioritiesAndRemovalsTakeEffect) {
  auto prioritized = Make(SamplerKind::kPrioritized, /*exponent=*/2.0);
  std::mt19937_64 rng(5);
  for (uint64_t i = 1; i <= 2000; ++i) prioritized->Insert(i, 0.0);  // forces the tree to grow
  ASSERT_TRUE(prioritized->SetPriority(7, 1.0).ok());
  ASSERT_TRUE(prioritized->SetPriority(1500, 2.0).ok());  // weight 4 with exponent 2
  EXPECT_FALSE(prioritized->SetPriority(99999, 1.0).ok());
  std::map<uint64_t, int> counts;
  for (int d = 0; d < 20000; ++d) counts[prioritized->Sample(1, 0, rng, kAll).at(0)]++;
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_NEAR(counts[1500] / 20000.0, 0.8, 0.02);
  prioritized->Remove(1500);
  for (int d = 0; d < 100; ++d) EXPECT_EQ(prioritized->Sample(1, 0, rng, kAll).at(0), 7u);
  EXPECT_EQ(prioritized->size(), 1999u);
}

ItemInfo Info(uint64_t version, uint64_t bytes = 100, uint64_t ms = 1000) {
  ItemInfo info;
  info.min_policy_version = version;
  info.max_policy_version = version;
  info.bytes = bytes;
  info.insert_unix_ms = ms;
  return info;
}

TEST(Table, StalenessBoundIsRespected) {
  TableConfig config;
  config.sampler.kind = SamplerKind::kUniform;
  config.max_staleness = 2;
  Table table(config, 0, 0);
  for (uint64_t i = 1; i <= 10; ++i) table.Insert(i, Info(/*version=*/i), true);
  for (int round = 0; round < 50; ++round) {
    Table::Draw draw = table.Sample(3, 0, /*policy_version=*/10);
    for (uint64_t item : draw.items) EXPECT_GE(table.Find(item)->min_policy_version, 8u);
  }
  // Only versions 8, 9, 10 can ever be sampled by a learner at version 10.
  EXPECT_EQ(table.sampleable_items(), 3u);
  Table::Draw none = table.Sample(1, 0, /*policy_version=*/50);
  EXPECT_TRUE(none.items.empty());
  EXPECT_FALSE(none.not_ready_reason.empty());
}

TEST(Table, RetentionKeepsCountAndBytesUnderTheirBounds) {
  TableConfig config;
  config.retention.max_segments = 5;
  config.retention.max_bytes = 350;
  Table table(config, 0, 0);
  for (uint64_t i = 1; i <= 20; ++i) {
    table.Insert(i, Info(1, /*bytes=*/100), true);
    for (uint64_t victim : table.SelectForDeletion(2000)) table.Erase(victim);
    EXPECT_LE(table.stored_items(), 5u);
    EXPECT_LE(table.stored_bytes(), 350u);
  }
  EXPECT_EQ(table.stored_items(), 3u);  // the byte bound is the tighter one
  EXPECT_TRUE(table.Find(20) && table.Find(18) && !table.Find(17));
}

TEST(Table, RetentionByAgeDeletesOldItems) {
  TableConfig config;
  config.retention.max_age_s = 10;
  Table table(config, 0, 0);
  table.Insert(1, Info(1, 10, /*ms=*/1000), true);
  table.Insert(2, Info(1, 10, /*ms=*/9000), true);
  EXPECT_EQ(table.SelectForDeletion(/*now=*/12000), (std::vector<uint64_t>{1}));
}

TEST(Table, CapacityLimitsWhatIsSampledNotWhatIsStored) {
  TableConfig config;
  config.capacity = 3;
  Table table(config, 0, 0);
  for (uint64_t i = 1; i <= 10; ++i) table.Insert(i, Info(1), true);
  EXPECT_EQ(table.stored_items(), 10u);
  EXPECT_EQ(table.sampleable_items(), 3u);
  EXPECT_EQ(table.Sample(10, 0, 1).items, (std::vector<uint64_t>{8, 9, 10}));
}

TEST(RateLimiter, MinFillAndSamplesPerInsert) {
  TableConfig config;
  config.sampler.kind = SamplerKind::kUniform;
  config.rate_limiter.min_fill = 4;
  config.rate_limiter.samples_per_insert = 2.0;
  config.rate_limiter.tolerance = 1.0;
  Table table(config, 0, 0);
  for (uint64_t i = 1; i <= 3; ++i) table.Insert(i, Info(1), true);
  Table::Draw draw = table.Sample(1, 0, 1);
  EXPECT_TRUE(draw.items.empty());
  EXPECT_NE(draw.not_ready_reason.find("min_fill"), std::string::npos);
  table.Insert(4, Info(1), true);
  // 4 inserts * 2 + 1 tolerance = 9 samples allowed in all.
  size_t total = 0;
  for (int i = 0; i < 5; ++i) total += table.Sample(4, 0, 1).items.size();
  EXPECT_EQ(total, 9u);
  draw = table.Sample(1, 0, 1);
  EXPECT_NE(draw.not_ready_reason.find("samples_per_insert"), std::string::npos);
  table.Insert(5, Info(1), true);
  EXPECT_EQ(table.Sample(4, 0, 1).items.size(), 2u);
}

TEST(RateLimiter, CountingTokensBoundsTheTokensSampledPerTokenInserted) {
  TableConfig config;
  config.rate_limiter.count_tokens = true;
  config.rate_limiter.samples_per_insert = 1.0;
  config.rate_limiter.max_times_sampled = 0;
  Table table(config, /*inserts=*/7, 0);  // the durable segment count is not what it counts
  for (uint64_t i = 1; i <= 3; ++i) {
    ItemInfo info = Info(1);
    info.tokens = 100;
    table.Insert(i, info, true);
  }
  EXPECT_EQ(table.inserts(), 300u);
  // 300 tokens may be sampled: two items, then one (taken while budget is left), then none.
  EXPECT_EQ(table.Sample(2, 0, 1).items.size(), 2u);
  EXPECT_EQ(table.Sample(2, 2, 1).items.size(), 1u);
  EXPECT_EQ(table.samples(), 300u);
  Table::Draw draw = table.Sample(2, 3, 1);
  EXPECT_TRUE(draw.items.empty());
  EXPECT_NE(draw.not_ready_reason.find("300 tokens sampled"), std::string::npos)
      << draw.not_ready_reason;
}

TEST(RateLimiter, MaxTimesSampledRetiresItems) {
  TableConfig config;
  config.sampler.kind = SamplerKind::kUniform;
  config.rate_limiter.max_times_sampled = 2;
  Table table(config, 0, 0);
  for (uint64_t i = 1; i <= 5; ++i) table.Insert(i, Info(1), true);
  size_t total = 0;
  for (int i = 0; i < 20; ++i) total += table.Sample(3, 0, 1).items.size();
  EXPECT_EQ(total, 10u);
  for (uint64_t i = 1; i <= 5; ++i) EXPECT_EQ(table.Find(i)->times_sampled, 2u);
}

TEST(ServerConfig, ReadsTablesAndNamesTheBadKey) {
  Result<ServerOptions> options = ParseServerConfig(R"(
server:
  credit_bytes: 134217728
tables:
  - name: rl
    sampler: prioritized
    priority_exponent: 0.6
    max_staleness: 4
    rate_limiter: {min_fill: 8, samples_per_insert: 1.5, tolerance: 16, max_times_sampled: 3}
    retention: {max_segments: 1000, max_age_s: 3600}
  - name: eval
    sampler: newest
)", "test.yaml");
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  ASSERT_EQ(options->tables.size(), 2u);
  EXPECT_EQ(options->tables[0].sampler.kind, SamplerKind::kPrioritized);
  EXPECT_EQ(options->tables[0].rate_limiter.max_times_sampled, 3);
  EXPECT_EQ(options->tables[0].retention.max_age_s, 3600);
  EXPECT_EQ(options->tables[1].sampler.kind, SamplerKind::kNewest);
  EXPECT_EQ(options->credit_bytes, 134217728u);

  Result<ServerOptions> bad = ParseServerConfig(
      "tables:\n  - name: rl\n    sampler: fifo\n    capacty: 10\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.yaml"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("capacty"), std::string::npos) << bad.status().message();

  bad = ParseServerConfig("tables:\n  - name: rl\n    sampler: lifo\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(":3:"), std::string::npos) << bad.status().message();

  bad = ParseServerConfig("server:\n  intake_nice: 20\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("intake_nice"), std::string::npos)
      << bad.status().message();
}

// The example the docs point to is a config the server accepts, and says what the defaults are.
TEST(ServerConfig, TheExampleConfigLoadsWithTheDefaults) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  Result<ServerOptions> options =
      LoadServerConfig(std::string(source ? source : ".") + "/configs/replay/default.yaml");
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  const ServerOptions defaults;
  EXPECT_EQ(options->max_message_bytes, defaults.max_message_bytes);
  EXPECT_EQ(options->credit_bytes, defaults.credit_bytes);
  EXPECT_EQ(options->write_batch_bytes, defaults.write_batch_bytes);
  EXPECT_EQ(options->intake_nice, defaults.intake_nice);
  EXPECT_EQ(options->sync_wal, defaults.sync_wal);
  EXPECT_EQ(options->compression, defaults.compression);
  EXPECT_GE(options->tables.size(), 2u);
}

TEST(ServerConfig, ReadsTheUnitAndWhatTheRateLimiterCounts) {
  Result<ServerOptions> options = ParseServerConfig(R"(
tables:
  - name: groups
    unit: group
  - name: trajectories
    unit: trajectory
    rate_limiter: {count: tokens, samples_per_insert: 2}
  - name: segments
)", "test.yaml");
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  EXPECT_EQ(options->tables[0].unit, SampleUnit::kGroup);
  EXPECT_FALSE(options->tables[0].rate_limiter.count_tokens);
  EXPECT_EQ(options->tables[1].unit, SampleUnit::kTrajectory);
  EXPECT_TRUE(options->tables[1].rate_limiter.count_tokens);
  EXPECT_EQ(options->tables[2].unit, SampleUnit::kSegment);
  EXPECT_NE(TableConfigJson(options->tables[0]).find("\"unit\":\"group\""), std::string::npos);

  Result<ServerOptions> bad =
      ParseServerConfig("tables:\n  - name: rl\n    unit: step\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unit"), std::string::npos) << bad.status().message();
  bad = ParseServerConfig("tables:\n  - name: rl\n    rate_limiter: {count: bytes}\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("count"), std::string::npos) << bad.status().message();
}

TEST(ServerConfig, TheRlConfigHasAGroupAndATrajectoryTable) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  Result<ServerOptions> options =
      LoadServerConfig(std::string(source ? source : ".") + "/configs/replay/rl.yaml");
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  ASSERT_EQ(options->tables.size(), 2u);
  EXPECT_EQ(options->tables[0].unit, SampleUnit::kGroup);
  EXPECT_EQ(options->tables[1].unit, SampleUnit::kTrajectory);
  EXPECT_TRUE(options->tables[1].rate_limiter.count_tokens);
}

}  // namespace
}  // namespace strider::replay
