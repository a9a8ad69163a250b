// Read-only inspection of a replay store: `strider replay inspect DIR ...`.
//
// Opens RocksDB read-only (no lock is taken), so it works while a server runs; it sees the
// store as of the moment it was opened, including writes still only in the write-ahead log.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/schema/messages.h"
#include "common/status.h"

namespace strider::replay {

class Store;

struct ListFilter {
  std::string env;                        // empty: any
  std::optional<uint64_t> policy_version; // trajectories with tokens from this version
  std::optional<double> min_reward;       // outcome reward bounds (inclusive)
  std::optional<double> max_reward;
  std::string trajectory_id;              // hex prefix; empty: any
};

struct StoredSegment {
  uint64_t sequence = 0;
  std::string table;
  schema::SegmentData segment;
};

struct VerifyReport {
  uint64_t segments = 0;
  uint64_t index_entries = 0;
  uint64_t trajectories = 0;
  std::vector<std::string> problems;  // empty: the store is consistent
  bool ok() const { return problems.empty(); }
};

class Inspector {
 public:
  static Result<std::unique_ptr<Inspector>> Open(const std::string& path);
  ~Inspector();

  // Counts, bytes, table definitions and counters, environments: a JSON object.
  Result<std::string> StatsJson();
  Result<std::vector<schema::TrajectorySummary>> List(const ListFilter& filter);
  // The stored segments of a trajectory in index order.
  Result<std::vector<StoredSegment>> Trajectory(const schema::TrajectoryId& id);
  Result<StoredSegment> Segment(const schema::SegmentKey& key);
  // One JSON line per stored segment, in insertion order; returns the count written.
  Result<uint64_t> ExportJsonl(std::ostream& out);
  // Checksums and decodability of every segment and summary; every index entry points to a
  // segment that points back; summaries agree with the segments stored.
  Result<VerifyReport> Verify();

 private:
  explicit Inspector(std::unique_ptr<Store> store);
  std::unique_ptr<Store> store_;
};

// The segment's tokens as text, one line per run of a role: "[model] ...".
std::string RenderSegmentText(const schema::SegmentData& segment);
// The fields a learner reads besides the tokens (schema 1.2: group, sampling, end reason,
// routing coverage, steps), a few lines for `inspect show`; empty for a 1.1 segment.
std::string RenderSegmentFields(const schema::SegmentData& segment);
// Every field of a stored segment as one JSON object (the export format, docs/replay.md).
std::string StoredSegmentJson(const StoredSegment& stored);
std::string TrajectorySummaryJson(const schema::TrajectorySummary& summary);

}  // namespace strider::replay
