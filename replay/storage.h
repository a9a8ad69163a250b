// The replay store on disk: RocksDB with the column families of docs/design.md#replay-store.
//
//   segments      trajectory id (16) + segment index (4, big-endian) -> sequence (8, big-endian)
//                 + the segment's envelope (checksummed; the bytes that arrived on the wire)
//   trajectories  trajectory id (16) -> TrajectorySummary envelope
//   sequence      insertion number (8, big-endian) -> IndexRecord (below)
//   meta          text keys: schema version, counters, table definitions
//
// Sampling state (draw records, learner positions, times-sampled counts, priorities, sample
// counters) lives in a second, small RocksDB under <path>/sampling with its own write-ahead log.
// A sample's durable record is then a write of a few hundred bytes to a log nobody else uses: it
// never waits behind megabyte segment batches or a write stall of the segment store.
//
// The segment value starts with its sequence number so an index entry points to a segment and
// the segment points back; `verify` checks both directions. Every change that belongs together
// (a segment, its index entry, its trajectory summary and the counters; or a sample's draw
// record, the learner's position and the times-sampled counts) is one WriteBatch, written with
// the write-ahead log on, so a crash leaves all of it or none of it.
//
// Insert counters are written by several writer threads whose batches may reach the log in any
// order, so each writer has its own counter key (a slot) that only it writes, in the same batch
// as the inserts it counts: each slot is exact, and the totals are the sum (inserts) or the
// maximum (next sequence) over the slots.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include "common/schema/messages.h"
#include "common/status.h"

namespace strider::replay {

// Acknowledged segments the store no longer holds: a writer slot's mark in the sampling store
// (its own log, in its own directory) counts more segments than the slot's insert counters in
// the segment store, whose log lost its tail.
// What the segment store holds in memory and on disk, from RocksDB's own properties.
struct StoreMemory {
  uint64_t memtables_bytes = 0;      // active and immutable memtables, every column family
  uint64_t table_readers_bytes = 0;  // index and filter blocks of open table files
  uint64_t block_cache_bytes = 0;    // data blocks cached for reads
  uint64_t table_files = 0;          // live table files (each holds a descriptor while open)
};

// What Store::VerifyTables read and what it found already checked.
struct TableCheck {
  uint64_t files = 0;  // table files read, every block's checksum found right
  uint64_t bytes = 0;
  uint64_t skipped_files = 0;  // listed in kCheckedTables as they are now: not read again
  uint64_t skipped_bytes = 0;
};

// The file in the store directory listing the table files of both stores that passed a check,
// one "<path under the store> <bytes> <mtime ns> <ctime ns>" a line. RocksDB never reuses a
// file's number nor writes a table file after creating it, so a file whose line still matches
// is the file that was checked; one written to since (a flipped byte, a copy put back) is not.
inline constexpr std::string_view kCheckedTables = "CHECKED_TABLES";

struct LossReport {
  uint64_t lost = 0;  // segments acknowledged and not stored
  std::string detail;  // per slot: "slot 0: acknowledged 68, stored 57"; empty when none lost
};

struct StoreOptions {
  bool read_only = false;   // inspection: never writes, works while a server has the store open
  bool sync_wal = false;    // fsync the log on every write: survives power loss, not just kill -9
  std::string compression = "lz4";  // lz4, zstd, snappy or none (RocksDB's block compression)
  // Memory bounds, so a long-running server's resident set levels off (docs/replay.md, "Memory"):
  uint64_t memtable_bytes = 256ull << 20;    // every column family's memtables together
  uint64_t block_cache_bytes = 64ull << 20;  // data, index and filter blocks, one shared cache
  int max_open_files = 512;                  // table files held open (one descriptor each)
};

// The per-segment index entry: what samplers and retention need without reading the segment.
struct IndexRecord {
  schema::SegmentKey key;
  uint64_t min_policy_version = 0;
  uint64_t max_policy_version = 0;
  uint64_t bytes = 0;   // envelope size
  uint64_t tokens = 0;
  uint64_t insert_unix_ms = 0;
  std::string table;
};

std::string EncodeIndexRecord(const IndexRecord& record);
Result<IndexRecord> DecodeIndexRecord(std::string_view bytes);

std::string SegmentStoreKey(const schema::SegmentKey& key);
Result<schema::SegmentKey> ParseSegmentStoreKey(std::string_view bytes);
std::string SequenceKey(uint64_t sequence);
uint64_t ParseSequenceKey(std::string_view bytes);  // caller checks the size is 8
std::string EncodeU64(uint64_t value);  // fixed 8 bytes, big-endian
uint64_t DecodeU64(std::string_view bytes);

// Keys in the `meta` column family.
namespace meta {
inline constexpr std::string_view kSchema = "schema_version";
inline constexpr std::string_view kNextSequence = "next_sequence";
std::string TableDefinition(const std::string& table);  // "table/<name>/definition"
std::string TableInserts(const std::string& table);
std::string TableSamples(const std::string& table);  // in the sampling store
// Per-writer slots of the counters above (the plain keys are read too, for older stores).
std::string NextSequenceSlot(int slot);
std::string TableInsertsSlot(const std::string& table, int slot);
// The keys below live in the sampling store.
// Segments one writer slot has stored in all (the sum of its table insert counters), written
// after each group it stores and before that group is acknowledged: see Store::CheckLoss.
std::string Acknowledged(int slot);                     // "acked/" + slot
inline constexpr std::string_view kAcknowledgedPrefix = "acked/";
// Segments whose loss an operator accepted (serve --accept-loss), summed over starts; in `meta`.
inline constexpr std::string_view kAcceptedLoss = "accepted_loss";
std::string TimesSampled(uint64_t sequence);            // "sampled/" + 8-byte sequence
std::string Priority(uint64_t sequence);                // "priority/" + 8-byte sequence
inline constexpr std::string_view kTimesSampledPrefix = "sampled/";
inline constexpr std::string_view kPriorityPrefix = "priority/";
inline constexpr std::string_view kLearnerPrefix = "learner/";
inline constexpr std::string_view kDrawPrefix = "draw/";
// A learner's fifo position and last answered step, and the draw answered at each step.
std::string LearnerState(const std::string& table, const std::string& learner);
std::string Draw(const std::string& table, const std::string& learner, uint64_t step);
}  // namespace meta

// One segment for SegmentWriter::Write. The views must stay valid until Write returns.
struct SegmentInsert {
  uint64_t sequence = 0;
  std::string_view store_key;  // SegmentStoreKey(facts->key)
  std::string_view envelope;   // the bytes as received: what the store keeps
  const schema::SegmentFacts* facts = nullptr;  // facts->table names the table (not empty)
};

// One answered sample step of a learner, for Store::RecordDraw.
struct DrawRecord {
  std::string table;
  std::string learner;
  uint64_t step = 0;
  std::vector<uint64_t> items;
  std::vector<uint32_t> times_sampled;  // per item, after this draw
  uint64_t fifo_position = 0;           // the learner's position after this draw
  uint64_t table_samples = 0;           // the table's sample counter after this draw
  uint64_t forget_step = 0;             // a step whose draw is no longer kept; 0: none
};

class SegmentWriter;

// Threads: Open and the destructor must not overlap any other call. Everything else may be
// called from several threads at once (RocksDB orders the writes), with two caveats the caller
// keeps:
//   - a trajectory's summary is read, changed and written back by SegmentWriter::Write and
//     DeleteSegments, so calls touching the same trajectory must not overlap (the server holds
//     a trajectory while one of them runs);
//   - NextSequence and TableInserts add up the writer slots: exact only while no SegmentWriter
//     writes (the server reads them before its writers start).
class Store {
 public:
  // Creates the store and its column families when absent (read-write only).
  static Result<std::unique_ptr<Store>> Open(const std::string& path, const StoreOptions& options);
  ~Store();

  rocksdb::ColumnFamilyHandle* segments() const { return handles_[1]; }
  rocksdb::ColumnFamilyHandle* trajectories() const { return handles_[2]; }
  rocksdb::ColumnFamilyHandle* sequence() const { return handles_[3]; }
  rocksdb::ColumnFamilyHandle* meta() const { return handles_[4]; }
  rocksdb::DB* db() const { return db_.get(); }

  // nullopt when absent.
  Result<std::optional<std::string>> Get(rocksdb::ColumnFamilyHandle* family,
                                         std::string_view key) const;
  std::unique_ptr<rocksdb::Iterator> Scan(rocksdb::ColumnFamilyHandle* family) const;

  // A meta counter (8 bytes big-endian), 0 when absent.
  Result<uint64_t> GetCounter(std::string_view key) const;
  // The next unused sequence number as counted (the maximum over the writer slots).
  Result<uint64_t> NextSequence() const;
  // Segments ever inserted into a table (the sum over the writer slots).
  Result<uint64_t> TableInserts(const std::string& table) const;

  // The sampling store (see the top of this file). In a read-only store opened before any
  // server created it, reads find nothing.
  Result<std::optional<std::string>> GetSampling(std::string_view key) const;
  std::unique_ptr<rocksdb::Iterator> ScanSampling() const;  // null when there is none
  Result<uint64_t> GetSamplingCounter(std::string_view key) const;
  StoreMemory Memory() const;
  // Reads table files of both stores one at a time and checks every block's checksum: with
  // `all` every live file, else only those kCheckedTables does not list as they are now (new
  // files, and files written to since their check). Corruption naming the first damaged file.
  // A read-write store then rewrites kCheckedTables with every live file checked now or before
  // (a file a compaction deleted meanwhile is skipped: the compaction read it with its
  // checksums checked). A server runs it at start (ServerOptions::verify_on_start).
  Result<TableCheck> VerifyTables(bool all) const;
  // Compares the acknowledged marks with the insert counters (see LossReport). A store written
  // before the marks existed reports nothing lost.
  Result<LossReport> CheckLoss() const;
  // After an operator accepted a loss: the marks come down to the counters, and `meta` adds the
  // lost count to kAcceptedLoss. Read-write only.
  Status AcceptLoss(const LossReport& loss);
  // Moves sampling state that older versions kept in `meta` into the sampling store. At start-up,
  // before any other sampling write.
  Status MigrateSamplingState();

  // The writer of one counter slot (see the top of this file); it reads the slot's counters of
  // `tables` now. At most one writer per slot may exist at a time.
  Result<std::unique_ptr<SegmentWriter>> NewSegmentWriter(int slot,
                                                         const std::vector<std::string>& tables,
                                                         size_t batch_reserve_bytes);
  // Table definitions (name, TableConfigJson) into `meta`, in one write.
  Status WriteTableDefinitions(const std::vector<std::pair<std::string, std::string>>& tables);
  // Deletes segments with their index entries and updates (or, at zero segments, deletes) their
  // trajectories' summaries, in one write. Their sampling state stays: ForgetSampling.
  Status DeleteSegments(const std::vector<std::pair<uint64_t, IndexRecord>>& records);
  // Marks a stored, incomplete trajectory `abandoned` (end reason too); nothing for one that is
  // complete or not stored. The caller holds the trajectory (see above).
  Status MarkAbandoned(std::string_view trajectory);
  // Adds to the conflict counts of stored trajectories (trajectory id bytes -> segments that
  // arrived again with other bytes), in one write; a trajectory no longer stored is skipped.
  // The caller holds the trajectories (see above).
  Status AddConflicts(const std::map<std::string, uint32_t>& by_trajectory);
  // Deletes the times-sampled counts and priorities of these sequence numbers.
  Status ForgetSampling(const std::vector<uint64_t>& sequences);
  // A sample step's durable record: the draw, the learner's position, the times-sampled counts
  // and the table's sample counter in one write to the sampling store.
  Status RecordDraw(const DrawRecord& draw);
  // Stores priorities (sequence, priority) in the sampling store, in one write.
  Status WritePriorities(const std::vector<std::pair<uint64_t, double>>& priorities);

  const std::string& path() const { return path_; }

  // The RocksDB options Open uses, for a baseline that must match (bench/replay_bench).
  static rocksdb::Options MakeOptions(const StoreOptions& options);

 private:
  friend class SegmentWriter;
  Store() = default;
  // Writes with the write-ahead log: when this returns OK the batch survives kill -9. Every
  // batch is built here, so what belongs together is written together.
  Status Write(rocksdb::WriteBatch* batch);
  Status WriteSampling(rocksdb::WriteBatch* batch);
  std::string path_;
  StoreOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // default, then the four above
  std::unique_ptr<rocksdb::DB> sampling_;
};

// Writes groups of segments for one counter slot: each segment with its index entry, its
// trajectory's summary and the slot's counters, in one batch with the write-ahead log. The batch
// is kept between groups (reserved once, so building one neither regrows nor touches fresh
// pages). One thread at a time; writers of different slots may write concurrently.
class SegmentWriter {
 public:
  // Nothing of the group is durable unless OK; the slot's counters then count it. The caller
  // holds the segments' trajectories (see Store) and has checked that no key is stored yet.
  Status Write(const std::vector<SegmentInsert>& segments, uint64_t now_unix_ms);

 private:
  friend class Store;
  SegmentWriter(Store* store, int slot, size_t batch_reserve_bytes)
      : store_(store),
        slot_(slot),
        batch_reserve_bytes_(batch_reserve_bytes),
        batch_(std::make_unique<rocksdb::WriteBatch>(batch_reserve_bytes)) {}
  // The slot's total over tables (its acknowledged mark).
  uint64_t Total() const;
  Store* store_;
  int slot_;
  size_t batch_reserve_bytes_;
  std::unique_ptr<rocksdb::WriteBatch> batch_;
  std::map<std::string, uint64_t> inserts_;  // by table, as counted in this slot
};

Status FromRocks(const rocksdb::Status& status, std::string_view what);

}  // namespace strider::replay
