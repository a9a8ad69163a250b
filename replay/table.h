// A replay table: which stored segments a sampler may choose, under what limits.
//
// A table is defined by TableConfig (from the YAML `tables:` list, see docs/replay.md). Every
// segment belongs to exactly one table (the segment's `table` field). The table keeps, in memory:
//
//   stored_    every item of the table still in the store (retention works on this, oldest first)
//   sampler_   the items that may still be sampled: at most `capacity` newest ones, not yet
//              sampled `max_times_sampled` times, not found too stale
//
// A trajectory or group table (TableConfig::unit) also keeps, in memory, which segments each
// trajectory has and whether its last one is stored, and which members each group has: the
// sampler then holds units (a complete trajectory or group), each named by the item whose
// insert completed it. That bookkeeping is rebuilt from the stored segments at start-up, so
// ingest never reads the store for it.
//
// The server rebuilds a table from the store at start-up (items, times sampled, priorities,
// insert and sample counters), so its decisions after a restart are the ones it would have made.
//
// Threading: not thread-safe; the server serialises calls with its state mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/schema/messages.h"
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
  // What samples_per_insert leaves to sample now, in what it counts (items or tokens); infinite
  // without a ratio.
  double Budget(uint64_t inserts, uint64_t samples) const;
  const RateLimiterOptions& options() const { return options_; }

 private:
  RateLimiterOptions options_;
};

struct ItemInfo {
  uint64_t min_policy_version = 0;
  uint64_t max_policy_version = 0;
  uint64_t bytes = 0;
  uint64_t tokens = 0;
  uint64_t insert_unix_ms = 0;
  uint32_t times_sampled = 0;
  double priority = 1.0;
};

class Table {
 public:
  // `inserts` and `samples` are the durable counters (0 for a new store).
  Table(TableConfig config, uint64_t inserts, uint64_t samples, uint64_t seed = 0x5EED);

  // A stored item, at start-up (`counted` false: the insert counter already includes it) or
  // after its insert was written (`counted` true). Trajectory and group tables need the
  // segment's `facts` (an item without them never completes a unit); segment tables ignore them.
  // Trajectory and group tables count completed units as inserts, from 0 at start-up.
  void Insert(uint64_t item, const ItemInfo& info, bool counted,
              const schema::SegmentFacts* facts = nullptr);

  // Items retention wants deleted now, oldest first. They stay in the table until Erase. In a
  // trajectory or group table the oldest item brings every stored item of its trajectory.
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

  // The service closed this trajectory (16-byte id) after its actor went silent: none of its
  // items is sampled again, now or when more of it arrives later; in a group table its group is
  // sampled without it once the other members are complete (with at least two of them).
  // `items`: its stored items (a segment table keeps no trajectory index).
  void Abandon(const std::string& trajectory, const std::vector<uint64_t>& items);

  Status SetPriority(uint64_t item, double priority);

  // The items to return for a sampled item, in order: the item itself in a segment table; the
  // unit's segments (trajectories by group index, segments by index) otherwise.
  std::vector<uint64_t> ItemsOf(uint64_t item) const;
  // Every stored item of a trajectory or of a group's trajectories (16-byte ids), in order,
  // complete or not. InvalidArgument in a segment table, which keeps no such index.
  Result<std::vector<uint64_t>> ItemsOfTrajectory(const std::string& trajectory) const;
  Result<std::vector<uint64_t>> ItemsOfGroup(const std::string& group) const;

  const TableConfig& config() const { return config_; }
  const ItemInfo* Find(uint64_t item) const;
  size_t stored_items() const { return stored_.size(); }
  uint64_t stored_bytes() const { return stored_bytes_; }
  size_t sampleable_items() const { return sampler_->size(); }
  // In what the rate limiter counts: items (segments or units) or tokens.
  uint64_t inserts() const { return inserts_; }
  uint64_t samples() const { return samples_; }

 private:
  void RemoveFromSampler(uint64_t item);
  void AddToSampler(uint64_t item, const ItemInfo& info);
  // Trajectory and group tables: records a stored segment; returns the unit it completes.
  std::optional<std::vector<uint64_t>> Track(uint64_t item, const schema::SegmentFacts& facts);
  // The unit trajectory `id` completes now, named by `item`, if any (Track's second half).
  std::optional<std::vector<uint64_t>> TryComplete(const std::string& id, uint64_t item);
  // Adds a completed unit to the sampler and the insert counter.
  void AddUnit(uint64_t item);
  std::vector<uint64_t> ItemsInOrder(const std::string& trajectory) const;
  uint64_t TokensOf(uint64_t item) const;  // of the item, or of the unit it names
  bool per_unit() const { return config_.unit != SampleUnit::kSegment; }

  struct TrajectoryState {
    std::map<uint32_t, uint64_t> segments;  // segment index -> item
    int64_t last_index = -1;                // once the last segment is stored
    schema::EndReason end_reason = schema::EndReason::kNone;
    std::string group;  // 16 bytes; the trajectory's own id when it is in no group
    uint32_t group_index = 0;
    bool abandoned = false;  // closed by the service (Abandon): never in a unit
    bool complete() const {
      return last_index >= 0 && segments.size() == static_cast<size_t>(last_index) + 1;
    }
  };
  struct GroupState {
    uint32_t size = 1;
    std::map<uint32_t, std::string> members;  // group index -> trajectory
  };
  struct Unit {
    std::vector<uint64_t> items;  // in order
    std::vector<std::string> trajectories;
    uint64_t min_policy_version = 0;
    uint64_t max_policy_version = 0;
    uint64_t tokens = 0;
  };

  TableConfig config_;
  std::unique_ptr<Sampler> sampler_;
  RateLimiter limiter_;
  std::map<uint64_t, ItemInfo> stored_;
  std::set<uint64_t> in_sampler_;  // ordered, so the oldest leaves first when over capacity
  uint64_t stored_bytes_ = 0;
  uint64_t inserts_ = 0;
  uint64_t samples_ = 0;
  std::mt19937_64 rng_;
  // Trajectory and group tables only.
  std::map<std::string, TrajectoryState> trajectories_;  // by 16-byte id
  std::map<uint64_t, std::string> trajectory_of_;        // item -> its trajectory
  std::map<std::string, GroupState> groups_;
  std::map<uint64_t, Unit> units_;                 // by the item that completed it
  std::map<std::string, uint64_t> unit_of_;        // trajectory -> unit
  std::set<std::string> abandoned_;                // segment tables: closed trajectories
};

}  // namespace strider::replay
