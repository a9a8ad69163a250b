// The replay service: where trajectories live between actors and learners.
//
//   actors --DEALER--> [actor ROUTER] --> writer thread --> RocksDB (WAL) --> ack
//   learners --DEALER--> [learner ROUTER] --> tables/samplers --> segments
//
// Start a server with ReplayServer::Start; talk to it with replay/client.h; look into a store
// (also while a server runs) with replay/inspect.h. docs/replay.md is the user guide: table
// configuration keys, the wire protocol and the choices made where the design left room.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/transport/auth.h"
#include "replay/samplers/interface.h"

namespace strider::replay {

struct RateLimiterOptions {
  // What inserts and samples count for samples_per_insert and tolerance: items (segments, or
  // units in a trajectory or group table) or their tokens (`count: tokens`), what a learner
  // trains on. min_fill and max_times_sampled count items either way.
  bool count_tokens = false;
  int64_t min_fill = 1;           // sampleable items needed before any sample
  double samples_per_insert = 0;  // 0: no ratio; else samples <= ratio * inserts + tolerance
  double tolerance = 0;           // slack of the ratio, in samples
  int64_t max_times_sampled = 0;  // 0: unlimited; else an item leaves the sampler after this many
};

struct RetentionOptions {
  // Oldest segments are deleted (with their index entries) while any bound is exceeded; 0 turns a
  // bound off. The defaults keep a store from growing without bound.
  int64_t max_segments = 1000000;
  int64_t max_bytes = int64_t{64} << 30;
  int64_t max_age_s = 0;
};

// What one sampled item of a table is.
enum class SampleUnit {
  kSegment,     // one stored segment, as soon as it is stored
  kTrajectory,  // every segment of one trajectory, once its last segment is stored
  // Every trajectory of one group (schema 1.2 group fields; a segment without a group is a
  // group of its own), once each member's last segment is stored. Members that ended
  // `abandoned` are left out; such a group is sampled only when at least two others remain.
  kGroup,
};
Result<SampleUnit> ParseSampleUnit(const std::string& name);
std::string SampleUnitName(SampleUnit unit);

// One table (an element of `tables:` in the server config).
struct TableConfig {
  std::string name = "main";
  // Trajectory and group tables count, limit and prioritise units: the rate limiter's inserts
  // and samples, max_times_sampled, capacity, priorities and the staleness bound (the oldest
  // policy version in the unit) apply to whole trajectories or groups. Retention still bounds
  // segments and bytes but deletes whole trajectories.
  SampleUnit unit = SampleUnit::kSegment;
  SamplerOptions sampler;
  int64_t max_staleness = -1;  // in policy versions; -1: unbounded
  int64_t capacity = 1000000;  // the most (newest) items the sampler chooses from
  RateLimiterOptions rate_limiter;
  RetentionOptions retention;
};

// Table files whose checksums a server checks at start (ServerOptions::verify_on_start).
enum class StartVerify {
  kNone,  // none: a damaged block is found when something reads it
  kNew,   // those no earlier check read
  kAll,   // every one: reads the whole store
};

struct ServerOptions {
  std::string db_path;
  // tcp://host:port (port 0: any free port) or ipc://path.
  std::string actor_endpoint = "tcp://127.0.0.1:0";
  // Empty: the actor endpoint's port + 1 (port 0 stays 0), or "<path>.sample" for ipc.
  std::string learner_endpoint;
  // Empty: one fifo table named "main" with default limits.
  std::vector<TableConfig> tables;

  // CURVE on both endpoints (`server.auth`, docs/replay.md): the server's key pair and the
  // clients let in. Without a key, binding a non-loopback address needs auth.insecure.
  transport::ServerAuth auth;
  // The clients let in on the learner endpoint; empty: auth.authorized_keys. Separate lists keep
  // actors from sampling and learners from writing.
  std::vector<std::string> learner_keys;

  // Limits on what clients send.
  uint64_t max_message_bytes = 64ull << 20;
  int32_t max_token_id = 1 << 24;
  // Unacknowledged bytes one actor connection may have in flight; at least max_message_bytes.
  uint64_t credit_bytes = 64ull << 20;

  // Storage.
  bool sync_wal = false;  // also fsync the log: survives power loss, not only kill -9
  std::string compression = "lz4";
  // RocksDB's memory and descriptors (docs/replay.md, "Memory"): the memtables of every column
  // family together, one block cache for data, index and filter blocks, table files held open.
  uint64_t memtable_mb = 256;
  uint64_t block_cache_mb = 64;
  int max_open_files = 512;
  // Segments written per WriteBatch at most. Several writers' batches are merged by RocksDB into
  // one log write (group commit), so this bounds the work one writer does per round. 4 MiB
  // holds a batched frame from an actor (ActorClientOptions::batch_bytes) or four 1 MiB
  // segments, so megabyte segments share writes instead of each making its own (the
  // measurements: docs/results/replay.md).
  uint64_t write_batch_bytes = 4ull << 20;
  // Threads writing batches concurrently: RocksDB groups their writes and inserts them into the
  // memtable in parallel, like several threads calling Put.
  int writer_threads = 4;
  // Received segment bytes not yet written that the server holds at most (all connections
  // together). Above it the server stops reading from actors until the writers catch up, so
  // segments wait in the actors' sockets instead of the server's memory; one segment is always
  // taken, however large. Bounds memory and keeps it reused (no fresh pages to fault in).
  uint64_t max_queued_bytes = 16ull << 20;
  // How many nice steps below the writers the intake runs: the actor thread and the I/O thread
  // of the actors' socket (0: the same priority). The writers hold the one serial stage of
  // ingest, RocksDB's log write; on a machine with more runnable threads than cores, threads
  // at the same priority take turns with it, and every turn stalls the log. At a lower priority
  // the intake still reads whatever the writers leave room for (max_queued_bytes bounds it), and
  // takes the cores they leave idle. The learner side keeps its priority (sampling latency).
  int intake_nice = 10;
  // Bytes the store may take on disk (its directory, sampling state included); 0: no quota.
  // Over it, or when the disk is full, ingest stops: segments are refused with `disk_full`
  // (clients keep them and send them again), sampling and inspection go on, and ingest resumes
  // by itself once the store is back under the quota with room for a write batch.
  uint64_t max_store_bytes = 0;
  // A trajectory whose last segment has not arrived and that has had no segment for this long
  // is closed by the server as `abandoned` (its actor presumably died): never sampled again, its
  // group sampled without it, counted in stats. Checked every second; 0: never.
  double abandon_after_s = 1800;
  // A store whose segment log lost acknowledged segments (damaged, truncated or removed) is
  // refused at start unless this is set; then the loss is recorded in the store and serving
  // goes on with what is left.
  bool accept_loss = false;
  // Which table files have their block checksums checked before serving; a damaged one stops
  // the start with Corruption naming it. The default reads a file at the first start after it
  // was written and again only when it was written to since (the store directory's
  // CHECKED_TABLES lists what was checked), so a start after a short run reads little. Damage
  // that leaves a checked file's times alone (the medium's own decay) is found by kAll
  // (`--verify`), `inspect verify`, or a read of the damaged block.
  StartVerify verify_on_start = StartVerify::kNew;
  // Sample steps per learner whose answers are kept for replay after a learner restart.
  int64_t sample_log_steps = 1024;
  double stats_interval_s = 10;  // how often stats go to the log; 0: never
};

// Reads a server config (docs/replay.md, configs/replay/default.yaml) strictly: unknown keys and
// wrong types are errors naming file, line and key. Fields not in the file keep their defaults.
Result<ServerOptions> LoadServerConfig(const std::string& path);
Result<ServerOptions> ParseServerConfig(const std::string& yaml, const std::string& origin);

// Sets this process's allocator up for a server's traffic: megabyte segments and RocksDB
// memtable blocks come from one heap and stay there when freed. glibc otherwise gives each
// writer thread an arena of 64 MiB heaps and unmaps a heap once all of it is free, which a
// flushed memtable of 1 MiB values does, so every memtable would fault its pages in again
// (docs/results/replay.md has the counts). Process-wide: call once, before the server starts.
void ConfigureServerProcessMemory();

class ReplayServer {
 public:
  // Checks the options (limits, table names, both endpoints' form), then opens (or creates) the
  // store at options.db_path, rebuilds the tables from it, binds both endpoints and starts
  // serving on background threads. Options refused by the check leave nothing on disk; a bind
  // that fails later (an address in use) comes after the store is open.
  static Result<std::unique_ptr<ReplayServer>> Start(ServerOptions options);

  virtual ~ReplayServer() = default;  // stops the server

  // The bound endpoints, connectable from this host (wildcards and port 0 resolved).
  virtual std::string actor_endpoint() const = 0;
  virtual std::string learner_endpoint() const = 0;
  // Ingest rate, bytes, rejects by reason, table fill, sample latency (docs/replay.md). The
  // rates cover the time since the previous StatsJson, which starts a new window.
  virtual std::string StatsJson() = 0;
  // The same for an outside reader (the HTTP pages): the rates cover the current window so
  // far, and the window is left as it is, so scrapes do not change the periodic log's rates.
  virtual std::string StatsSnapshotJson() = 0;
  // Stops accepting, finishes writes in progress, closes the store. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace strider::replay
