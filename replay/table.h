// A replay table: which stored segments a sampler may choose, under what limits.
//
// A table is defined by TableConfig (from the YAML `tables:` list, see docs/replay.md). Every
// segment belongs to exactly one table (the segment's `table` field). The table keeps, in memory:
//
//   stored_    every item of the table still in the store (retention works on this, oldest first)
//   sampler_   the items that may still be sampled: at most `capacity` newest ones, not yet
//              sampled `max_times_sampled` times, not found too stale
//
// The server rebuilds a table from the store at start-up (items, times sampled, priorities,
// insert and sample counters), so its decisions after a restart are the ones it would have made.
//
// Threading: not thread-safe; the server serialises calls with its state mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "replay/replay.h"
#include "replay/samplers/interface.h"

namespace strider::replay {

// Reads one element of `tables:`; problems are recorded in `reader` (file, line, key).
TableConfig ReadTableConfig(ConfigReader& reader);
// JSON text of the definition, stored in `meta` and shown by stats.
std::string TableConfigJson(const TableConfig& config);

// Decides whether a sample may be taken now.
class RateLimiter {
 public:
  explicit RateLimiter(RateLimiterOptions options) : options_(options) {}
  // How many of `wanted` samples may be taken now (0..wanted); when 0, `reason` says why.
  size_t Allowed(size_t wanted, size_t sampleable, uint64_t inserts, uint64_t samples,
                 std::string* reason) const;
  const RateLimiterOptions& options() const { return options_; }

 private:
  RateLimiterOptions options_;
};

struct ItemInfo {
  uint64_t min_policy_version = 0;
  uint64_t max_policy_version = 0;
  uint64_t bytes = 0;
  uint64_t insert_unix_ms = 0;
  uint32_t times_sampled = 0;
  double priority = 1.0;
};

class Table {
 public:
  // `inserts` and `samples` are the durable counters (0 for a new store).
  Table(TableConfig config, uint64_t inserts, uint64_t samples, uint64_t seed = 0x5EED);

  // A stored item, at start-up (`counted` false: the insert counter already includes it) or
  // after its insert was written (`counted` true).
  void Insert(uint64_t item, const ItemInfo& info, bool counted);

  // Items retention wants deleted now, oldest first. They stay in the table until Erase.
  std::vector<uint64_t> SelectForDeletion(uint64_t now_unix_ms) const;
  // Forgets an item entirely (it was deleted from the store).
  void Erase(uint64_t item);

  struct Draw {
    std::vector<uint64_t> items;
    std::string not_ready_reason;  // set when items is empty
  };
  // Chooses up to `count` items and counts them as sampled. `after` is the learner's fifo read
  // position; `policy_version` the learner's, for the staleness bound.
  Draw Sample(size_t count, uint64_t after, uint64_t policy_version);

  Status SetPriority(uint64_t item, double priority);

  const TableConfig& config() const { return config_; }
  const ItemInfo* Find(uint64_t item) const;
  size_t stored_items() const { return stored_.size(); }
  uint64_t stored_bytes() const { return stored_bytes_; }
  size_t sampleable_items() const { return sampler_->size(); }
  uint64_t inserts() const { return inserts_; }
  uint64_t samples() const { return samples_; }

 private:
  void RemoveFromSampler(uint64_t item);

  TableConfig config_;
  std::unique_ptr<Sampler> sampler_;
  RateLimiter limiter_;
  std::map<uint64_t, ItemInfo> stored_;
  std::set<uint64_t> in_sampler_;  // ordered, so the oldest leaves first when over capacity
  uint64_t stored_bytes_ = 0;
  uint64_t inserts_ = 0;
  uint64_t samples_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace strider::replay
