#include "replay/storage.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/env.h>
#include <rocksdb/table.h>
#include <spdlog/spdlog.h>

#include "common/durable_file.h"
#include "common/mutex.h"

namespace strider::replay {
namespace {

constexpr const char* kFamilies[] = {"default", "segments", "trajectories", "sequence", "meta"};

void PutLe(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
uint64_t GetLe(std::string_view in, size_t at) {
  uint64_t v;
  std::memcpy(&v, in.data() + at, 8);
  return v;
}

// RocksDB's own log. Its default writes <store>/LOG through a file writer that, once a write
// has failed on a full disk, aborts the process on the next one (an assertion Debian's build
// keeps); and what it warns about (a log record it could not replay, a corrupt block) stayed in
// that file where nobody looked. This one appends to the same file with plain stdio, ignoring
// failures, and repeats warnings and errors in the process's own log.
class StoreLogger : public rocksdb::Logger {
 public:
  // A read-only open (inspection, often beside a running server, printing JSON on stdout)
  // leaves the file to the writer and keeps quiet: `verify` reports what it finds itself.
  StoreLogger(const std::string& store, const std::string& file, bool quiet)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), store_(store), quiet_(quiet) {
    if (!file.empty()) file_ = std::fopen(file.c_str(), "a");
  }
  ~StoreLogger() override {
    if (file_ != nullptr) std::fclose(file_);
  }

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    char buffer[1024];
    const int n = std::vsnprintf(buffer, sizeof(buffer), format, ap);
    if (n < 0) return;
    const std::string_view text(buffer, std::min<size_t>(n, sizeof(buffer) - 1));
    if (file_ != nullptr) {
      MutexLock lock(&mutex_);
      std::fwrite(text.data(), 1, text.size(), file_);
      std::fputc('\n', file_);
      std::fflush(file_);
    }
    // RocksDB warns often under load (write stalls); its errors are what an operator must see.
    if (!quiet_ && level >= rocksdb::InfoLogLevel::WARN_LEVEL &&
        level < rocksdb::InfoLogLevel::HEADER_LEVEL) {
      if (level == rocksdb::InfoLogLevel::WARN_LEVEL) {
        spdlog::info("rocksdb ({}): {}", store_, text);
      } else {
        spdlog::warn("rocksdb ({}): {}", store_, text);
      }
    }
  }

 private:
  std::string store_;
  bool quiet_;
  Mutex mutex_;
  std::FILE* file_ PT_GUARDED_BY(mutex_) = nullptr;  // RocksDB logs from several threads
};

}  // namespace

Status FromRocks(const rocksdb::Status& status, std::string_view what) {
  if (status.ok()) return Status::Ok();
  const std::string message = std::string(what) + ": " + status.ToString();
  // Before IsIOError, which a full disk also is: callers stop writing rather than retry into it.
  if (status.IsNoSpace()) return Status::ResourceExhausted(message);
  if (status.IsNotFound()) return Status::NotFound(message);
  if (status.IsCorruption()) return Status::Corruption(message);
  if (status.IsIOError()) return Status::IoError(message);
  if (status.IsInvalidArgument()) return Status::InvalidArgument(message);
  return Status::Internal(message);
}

std::string EncodeU64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(value & 0xFF);
    value >>= 8;
  }
  return out;
}

uint64_t DecodeU64(std::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8 && i < bytes.size(); ++i) {
    value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  }
  return value;
}

std::string SegmentStoreKey(const schema::SegmentKey& key) {
  std::string out(key.trajectory.View());
  const uint32_t index = key.index;
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(index >> shift));
  return out;
}

Result<schema::SegmentKey> ParseSegmentStoreKey(std::string_view bytes) {
  if (bytes.size() != 20) {
    return Status::Corruption("segment key of " + std::to_string(bytes.size()) +
                              " bytes, expected 20");
  }
  schema::SegmentKey key;
  std::memcpy(key.trajectory.bytes.data(), bytes.data(), 16);
  key.index = 0;
  for (size_t i = 16; i < 20; ++i) key.index = (key.index << 8) | static_cast<uint8_t>(bytes[i]);
  return key;
}

std::string SequenceKey(uint64_t sequence) { return EncodeU64(sequence); }
uint64_t ParseSequenceKey(std::string_view bytes) { return DecodeU64(bytes); }

std::string EncodeIndexRecord(const IndexRecord& r) {
  std::string out = SegmentStoreKey(r.key);
  PutLe(out, r.min_policy_version);
  PutLe(out, r.max_policy_version);
  PutLe(out, r.bytes);
  PutLe(out, r.tokens);
  PutLe(out, r.insert_unix_ms);
  out += r.table;
  return out;
}

Result<IndexRecord> DecodeIndexRecord(std::string_view bytes) {
  constexpr size_t kFixed = 20 + 5 * 8;
  if (bytes.size() < kFixed) {
    return Status::Corruption("index record of " + std::to_string(bytes.size()) +
                              " bytes, expected at least " + std::to_string(kFixed));
  }
  IndexRecord r;
  STRIDER_ASSIGN_OR_RETURN(r.key, ParseSegmentStoreKey(bytes.substr(0, 20)));
  r.min_policy_version = GetLe(bytes, 20);
  r.max_policy_version = GetLe(bytes, 28);
  r.bytes = GetLe(bytes, 36);
  r.tokens = GetLe(bytes, 44);
  r.insert_unix_ms = GetLe(bytes, 52);
  r.table = std::string(bytes.substr(kFixed));
  return r;
}

namespace meta {
std::string TableDefinition(const std::string& table) { return "table/" + table + "/definition"; }
std::string TableInserts(const std::string& table) { return "table/" + table + "/inserts"; }
std::string TableSamples(const std::string& table) { return "table/" + table + "/samples"; }
std::string NextSequenceSlot(int slot) {
  return std::string(kNextSequence) + std::string(1, '\0') + std::to_string(slot);
}
std::string TableInsertsSlot(const std::string& table, int slot) {
  return TableInserts(table) + std::string(1, '\0') + std::to_string(slot);
}
std::string Acknowledged(int slot) { return std::string(kAcknowledgedPrefix) + std::to_string(slot); }
std::string TimesSampled(uint64_t sequence) {
  return std::string(kTimesSampledPrefix) + EncodeU64(sequence);
}
std::string Priority(uint64_t sequence) {
  return std::string(kPriorityPrefix) + EncodeU64(sequence);
}
// Table and learner names may hold '/', so they are separated by a NUL byte.
std::string LearnerState(const std::string& table, const std::string& learner) {
  return "learner/" + table + std::string(1, '\0') + learner;
}
std::string Draw(const std::string& table, const std::string& learner, uint64_t step) {
  return "draw/" + table + std::string(1, '\0') + learner + std::string(1, '\0') +
         EncodeU64(step);
}
}  // namespace meta

rocksdb::Options Store::MakeOptions(const StoreOptions& options) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.create_missing_column_families = true;
  if (options.compression == "zstd") {
    o.compression = rocksdb::kZSTD;
  } else if (options.compression == "snappy") {
    o.compression = rocksdb::kSnappyCompression;
  } else if (options.compression == "none") {
    o.compression = rocksdb::kNoCompression;
  } else {
    o.compression = rocksdb::kLZ4Compression;
  }
  // Segments are large values written once: bigger memtables mean fewer, larger flushes.
  o.write_buffer_size =
      std::clamp<uint64_t>(options.memtable_bytes / 4, uint64_t{1} << 20, uint64_t{64} << 20);
  o.max_write_buffer_number = 4;
  // One budget for the memtables of every column family. Without it each family keeps its own
  // until that one reaches write_buffer_size: the small families (index, trajectories,
  // sequence) fill slowly, so the server's memory grew for many minutes (the soak test saw
  // 167 MiB become 418 MiB in 10 minutes). Past the budget RocksDB flushes the largest.
  o.db_write_buffer_size = options.memtable_bytes;
  // One block cache for every family, holding index and filter blocks too, so table readers do
  // not grow with the number of table files; the level-0 ones stay pinned (read on every get).
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  table.cache_index_and_filter_blocks = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  o.max_open_files = options.max_open_files;
  o.max_background_jobs = 2;
  o.enable_pipelined_write = true;
  // Replay the log up to its first damaged record and stop there: the store opens consistent
  // (every batch whole or absent). What the damaged tail held is then missing, and the writers'
  // acknowledged marks in the sampling store say how much (Store::CheckLoss); the server refuses
  // to start on such a store until told to accept it. kAbsoluteConsistency would refuse to open
  // at all, leaving nothing to inspect or accept.
  o.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  return o;
}

StoreMemory Store::Memory() const {
  StoreMemory memory;
  uint64_t value = 0;
  if (db_->GetAggregatedIntProperty("rocksdb.cur-size-all-mem-tables", &value)) {
    memory.memtables_bytes = value;
  }
  if (db_->GetAggregatedIntProperty("rocksdb.estimate-table-readers-mem", &value)) {
    memory.table_readers_bytes = value;
  }
  // The cache is shared by every family: one family's figure is the whole.
  if (db_->GetIntProperty(segments(), "rocksdb.block-cache-usage", &value)) {
    memory.block_cache_bytes = value;
  }
  std::vector<rocksdb::LiveFileMetaData> files;
  db_->GetLiveFilesMetaData(&files);
  memory.table_files = files.size();
  return memory;
}

Result<std::unique_ptr<Store>> Store::Open(const std::string& path, const StoreOptions& options) {
  std::unique_ptr<Store> store(new Store());
  store->path_ = path;
  store->options_ = options;
  rocksdb::Options db_options = MakeOptions(options);
  std::error_code dir_error;
  if (!options.read_only) std::filesystem::create_directories(path, dir_error);
  db_options.info_log = std::make_shared<StoreLogger>(
      path, options.read_only || dir_error ? "" : path + "/LOG", options.read_only);
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const char* name : kFamilies) {
    families.emplace_back(name, rocksdb::ColumnFamilyOptions(db_options));
  }
  auto open_sampling = [&]() -> Status {
    // The sampling store: small writes only, so small memtables and no compression.
    rocksdb::Options sampling_options;
    sampling_options.create_if_missing = true;
    sampling_options.compression = rocksdb::kNoCompression;
    sampling_options.write_buffer_size = 4 << 20;
    sampling_options.max_background_jobs = 1;
    const std::string sampling_path = path + "/sampling";
    if (!options.read_only) std::filesystem::create_directories(sampling_path, dir_error);
    sampling_options.info_log = std::make_shared<StoreLogger>(
        sampling_path, options.read_only || dir_error ? "" : sampling_path + "/LOG",
        options.read_only);
    rocksdb::DB* sampling = nullptr;
    rocksdb::Status status;
    if (options.read_only) {
      // A store written by an older version has none yet: its reads find nothing.
      std::error_code error;
      if (std::filesystem::exists(sampling_path + "/CURRENT", error)) {
        sampling_options.create_if_missing = false;
        status = rocksdb::DB::OpenForReadOnly(sampling_options, sampling_path, &sampling);
        if (!status.ok()) return FromRocks(status, "opening the sampling store " + sampling_path);
      }
    } else {
      status = rocksdb::DB::Open(sampling_options, sampling_path, &sampling);
      if (!status.ok()) return FromRocks(status, "opening the sampling store " + sampling_path);
    }
    store->sampling_.reset(sampling);
    return Status::Ok();
  };
  // Read-only, the sampling store opens first: a running server writes each acknowledged mark
  // there after the segments it counts, so marks read first never run ahead of the segments
  // read second (Store::CheckLoss would otherwise see a loss that is only a race).
  if (options.read_only) STRIDER_RETURN_IF_ERROR(open_sampling());
  rocksdb::DB* db = nullptr;
  rocksdb::Status status;
  if (options.read_only) {
    db_options.create_if_missing = false;
    status = rocksdb::DB::OpenForReadOnly(db_options, path, families, &store->handles_, &db);
  } else {
    status = rocksdb::DB::Open(db_options, path, families, &store->handles_, &db);
  }
  if (!status.ok()) {
    if (options.read_only && status.IsPathNotFound()) {
      return Status::NotFound(path + ": no replay store here");
    }
    return FromRocks(status, "opening replay store " + path);
  }
  store->db_.reset(db);

  if (!options.read_only) STRIDER_RETURN_IF_ERROR(open_sampling());
  if (!options.read_only) {
    STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> version,
                             store->Get(store->meta(), meta::kSchema));
    const std::string current = std::to_string(schema::kSchemaMajor) + "." +
                                std::to_string(schema::kSchemaMinor);
    if (version && version->substr(0, version->find('.')) !=
                       std::to_string(schema::kSchemaMajor)) {
      return Status::FailedPrecondition(path + ": store has schema version " + *version +
                                        ", this build reads major version " +
                                        std::to_string(schema::kSchemaMajor));
    }
    if (!version) {
      rocksdb::WriteBatch batch;
      batch.Put(store->meta(), std::string(meta::kSchema), current);
      STRIDER_RETURN_IF_ERROR(store->Write(&batch));
    }
  }
  return store;
}

Store::~Store() {
  if (sampling_) {
    sampling_->Close();
    sampling_.reset();
  }
  if (db_) {
    for (auto* handle : handles_) db_->DestroyColumnFamilyHandle(handle);
    db_->Close();
  }
}

Status Store::Write(rocksdb::WriteBatch* batch) {
  // The server opens a store read-only when the disk had no room to open it for writing.
  if (options_.read_only) return Status::ResourceExhausted(path_ + ": the store is open read-only");
  rocksdb::WriteOptions write_options;
  write_options.disableWAL = false;
  write_options.sync = options_.sync_wal;
  return FromRocks(db_->Write(write_options, batch), "replay store write");
}

Result<std::optional<std::string>> Store::Get(rocksdb::ColumnFamilyHandle* family,
                                              std::string_view key) const {
  std::string value;
  rocksdb::Status status =
      db_->Get(rocksdb::ReadOptions(), family, rocksdb::Slice(key.data(), key.size()), &value);
  if (status.IsNotFound()) return std::optional<std::string>();
  STRIDER_RETURN_IF_ERROR(FromRocks(status, "replay store read"));
  return std::optional<std::string>(std::move(value));
}

std::unique_ptr<rocksdb::Iterator> Store::Scan(rocksdb::ColumnFamilyHandle* family) const {
  return std::unique_ptr<rocksdb::Iterator>(db_->NewIterator(rocksdb::ReadOptions(), family));
}

Result<uint64_t> Store::GetCounter(std::string_view key) const {
  STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> value, Get(meta(), key));
  return value ? DecodeU64(*value) : 0;
}

}  // namespace strider::replay

namespace strider::replay {

Result<uint64_t> Store::NextSequence() const {
  STRIDER_ASSIGN_OR_RETURN(uint64_t next, GetCounter(meta::kNextSequence));
  const std::string prefix = std::string(meta::kNextSequence) + std::string(1, '\0');
  auto it = Scan(meta());
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    next = std::max(next, DecodeU64(std::string_view(it->value().data(), it->value().size())));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "reading the sequence counters");
  return next;
}

Result<uint64_t> Store::TableInserts(const std::string& table) const {
  STRIDER_ASSIGN_OR_RETURN(uint64_t total, GetCounter(meta::TableInserts(table)));
  const std::string prefix = meta::TableInserts(table) + std::string(1, '\0');
  auto it = Scan(meta());
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    total += DecodeU64(std::string_view(it->value().data(), it->value().size()));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "reading the insert counters");
  return total;
}

Status Store::WriteSampling(rocksdb::WriteBatch* batch) {
  if (options_.read_only) return Status::ResourceExhausted(path_ + ": the store is open read-only");
  if (!sampling_) return Status::FailedPrecondition("the sampling store is not open");
  rocksdb::WriteOptions write_options;
  write_options.sync = options_.sync_wal;
  return FromRocks(sampling_->Write(write_options, batch), "sampling store write");
}

Result<std::optional<std::string>> Store::GetSampling(std::string_view key) const {
  if (!sampling_) return std::optional<std::string>();
  std::string value;
  rocksdb::Status status =
      sampling_->Get(rocksdb::ReadOptions(), rocksdb::Slice(key.data(), key.size()), &value);
  if (status.IsNotFound()) return std::optional<std::string>();
  STRIDER_RETURN_IF_ERROR(FromRocks(status, "sampling store read"));
  return std::optional<std::string>(std::move(value));
}

std::unique_ptr<rocksdb::Iterator> Store::ScanSampling() const {
  if (!sampling_) return nullptr;
  return std::unique_ptr<rocksdb::Iterator>(sampling_->NewIterator(rocksdb::ReadOptions()));
}

Result<uint64_t> Store::GetSamplingCounter(std::string_view key) const {
  STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> value, GetSampling(key));
  return value ? DecodeU64(*value) : 0;
}

namespace {

// Insert counters by writer slot, summed over tables: meta keys "table/<name>/inserts\0<slot>".
Result<std::map<int, uint64_t>> SlotInserts(const Store& store) {
  std::map<int, uint64_t> by_slot;
  auto it = store.Scan(store.meta());
  const std::string prefix = "table/";
  const std::string marker = std::string("/inserts") + std::string(1, '\0');
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const std::string_view key(it->key().data(), it->key().size());
    const size_t at = key.rfind(marker);
    if (at == std::string_view::npos) continue;
    const std::string digits(key.substr(at + marker.size()));
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    by_slot[std::stoi(digits)] += DecodeU64(std::string_view(it->value().data(), it->value().size()));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "reading the insert counters");
  return by_slot;
}

// The acknowledged marks by writer slot ("acked/<slot>" in the sampling store); empty without one.
Result<std::map<int, uint64_t>> AcknowledgedMarks(const Store& store) {
  std::map<int, uint64_t> marks;
  auto it = store.ScanSampling();
  if (it == nullptr) return marks;
  const std::string prefix(meta::kAcknowledgedPrefix);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    const std::string slot(it->key().data() + prefix.size(), it->key().size() - prefix.size());
    if (slot.empty() || slot.find_first_not_of("0123456789") != std::string::npos) continue;
    marks[std::stoi(slot)] = DecodeU64(std::string_view(it->value().data(), it->value().size()));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "reading the acknowledged marks");
  return marks;
}

// A table file as a check saw it: RocksDB writes a table file once and never changes it, so a
// write to it afterwards (a flipped byte, a copy put back from elsewhere) changes its times.
struct TableStamp {
  uint64_t size = 0;
  int64_t modified_ns = 0;
  int64_t changed_ns = 0;  // the inode's: not settable from user space, unlike the other
  bool operator==(const TableStamp&) const = default;
};

std::optional<TableStamp> StampOf(const std::string& file) {
  struct stat info;
  if (::stat(file.c_str(), &info) != 0) return std::nullopt;
  return TableStamp{static_cast<uint64_t>(info.st_size),
                    info.st_mtim.tv_sec * 1000000000LL + info.st_mtim.tv_nsec,
                    info.st_ctim.tv_sec * 1000000000LL + info.st_ctim.tv_nsec};
}

}  // namespace

Result<TableCheck> Store::VerifyTables(bool all) const {
  struct Table {
    std::string name;  // under the store directory
    uint64_t largest_seqno = 0;
    const rocksdb::Options* options = nullptr;
  };
  // The segment store's table format, and the sampling store's (RocksDB's defaults).
  const rocksdb::Options segment_options = MakeOptions(options_);
  const rocksdb::Options sampling_options;
  std::vector<Table> tables;
  const auto add = [&](rocksdb::DB* db, const std::string& under, const rocksdb::Options* options) {
    std::vector<rocksdb::LiveFileMetaData> files;
    db->GetLiveFilesMetaData(&files);
    for (const rocksdb::LiveFileMetaData& file : files) {
      tables.push_back({under + file.relative_filename, file.largest_seqno, options});
    }
  };
  add(db_.get(), "", &segment_options);
  if (sampling_) add(sampling_.get(), "sampling/", &sampling_options);

  const std::filesystem::path listing = std::filesystem::path(path_) / kCheckedTables;
  std::map<std::string, TableStamp> checked_before;
  if (!all) {
    std::ifstream in(listing);
    std::string name;
    TableStamp stamp;
    while (in >> name >> stamp.size >> stamp.modified_ns >> stamp.changed_ns) {
      checked_before[name] = stamp;
    }
  }
  rocksdb::ReadOptions read;
  read.fill_cache = false;        // read once, not to be served from the cache
  read.readahead_size = 4 << 20;  // whole files front to back: large sequential reads
  TableCheck check;
  std::string listed;
  for (const Table& table : tables) {
    const std::string file = path_ + "/" + table.name;
    // Stamped before the read: a write during it makes the next start read the file again.
    const std::optional<TableStamp> stamp = StampOf(file);
    if (!stamp) continue;  // compacted away since the listing
    const auto before = checked_before.find(table.name);
    if (before != checked_before.end() && before->second == *stamp) {
      ++check.skipped_files;
      check.skipped_bytes += stamp->size;
    } else {
      const rocksdb::Status verified = rocksdb::VerifySstFileChecksum(
          *table.options, rocksdb::EnvOptions(*table.options), read, file, table.largest_seqno);
      if (!verified.ok()) {
        if (!StampOf(file)) continue;  // compacted away during the read
        return FromRocks(verified, "table file " + file + " fails its checksums");
      }
      ++check.files;
      check.bytes += stamp->size;
    }
    listed += table.name + " " + std::to_string(stamp->size) + " " +
              std::to_string(stamp->modified_ns) + " " + std::to_string(stamp->changed_ns) + "\n";
  }
  if (!options_.read_only) {
    // Only a record of work done: without it the next start reads these files again.
    if (Status written = WriteFileDurably(listing, listed); !written.ok()) {
      spdlog::warn("replay store: {}; the next start checks these table files again",
                   written.ToString());
    }
  }
  return check;
}

Result<LossReport> Store::CheckLoss() const {
  LossReport report;
  STRIDER_ASSIGN_OR_RETURN(auto marks, AcknowledgedMarks(*this));
  STRIDER_ASSIGN_OR_RETURN(auto stored, SlotInserts(*this));
  for (const auto& [slot, acknowledged] : marks) {
    const uint64_t have = stored.count(slot) ? stored[slot] : 0;
    if (acknowledged > have) {
      report.lost += acknowledged - have;
      report.detail += (report.detail.empty() ? "" : "; ") + std::string("writer slot ") +
                       std::to_string(slot) + ": acknowledged " + std::to_string(acknowledged) +
                       ", stored " + std::to_string(have);
    }
  }
  return report;
}

Status Store::AcceptLoss(const LossReport& loss) {
  if (loss.lost == 0) return Status::Ok();
  STRIDER_ASSIGN_OR_RETURN(auto marks, AcknowledgedMarks(*this));
  STRIDER_ASSIGN_OR_RETURN(auto stored, SlotInserts(*this));
  // Every mark comes down to its slot's counters (0 for a slot whose counters are all gone).
  rocksdb::WriteBatch lowered;
  for (const auto& [slot, acknowledged] : marks) {
    (void)acknowledged;
    lowered.Put(meta::Acknowledged(slot), EncodeU64(stored.count(slot) ? stored[slot] : 0));
  }
  STRIDER_ASSIGN_OR_RETURN(uint64_t accepted, GetCounter(meta::kAcceptedLoss));
  rocksdb::WriteBatch record;
  record.Put(meta(), std::string(meta::kAcceptedLoss), EncodeU64(accepted + loss.lost));
  // The record first: a crash in between leaves the loss both recorded and still detected, and
  // the next accepted start records it again (counted twice rather than not at all).
  STRIDER_RETURN_IF_ERROR(Write(&record));
  return WriteSampling(&lowered);
}

Status Store::MigrateSamplingState() {
  rocksdb::WriteBatch copy;
  rocksdb::WriteBatch erase;
  auto it = Scan(meta());
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const std::string_view key(it->key().data(), it->key().size());
    const bool table_samples = key.substr(0, 6) == "table/" && key.size() > 8 &&
                               key.substr(key.size() - 8) == "/samples";
    if (!table_samples && key.substr(0, meta::kTimesSampledPrefix.size()) !=
                              meta::kTimesSampledPrefix &&
        key.substr(0, meta::kPriorityPrefix.size()) != meta::kPriorityPrefix &&
        key.substr(0, meta::kLearnerPrefix.size()) != meta::kLearnerPrefix &&
        key.substr(0, meta::kDrawPrefix.size()) != meta::kDrawPrefix) {
      continue;
    }
    copy.Put(it->key(), it->value());
    erase.Delete(meta(), it->key());
  }
  if (!it->status().ok()) return FromRocks(it->status(), "scanning meta for sampling state");
  if (copy.Count() == 0) return Status::Ok();
  // Copy first, erase second: a crash in between leaves both copies, and the next start moves
  // the same values again.
  STRIDER_RETURN_IF_ERROR(WriteSampling(&copy));
  return Write(&erase);
}

}  // namespace strider::replay

namespace strider::replay {
namespace {

// The summaries of the trajectories one batch changes: each read from the store once, changed
// for every segment of the batch, and written into the batch once.
class SummaryEdits {
 public:
  explicit SummaryEdits(const Store& store) : store_(store) {}

  // A summary that cannot be read or decoded is an error when `strict`; otherwise it starts
  // again from nothing (ingest never refuses segments over a damaged summary; `verify` reports
  // the mismatch), as a trajectory seen for the first time does.
  Result<schema::TrajectorySummary*> For(std::string_view trajectory, bool strict) {
    auto it = summaries_.find(trajectory);
    if (it != summaries_.end()) return &it->second;
    schema::TrajectorySummary summary;
    Result<std::optional<std::string>> existing = store_.Get(store_.trajectories(), trajectory);
    if (strict && !existing.ok()) return existing.status();
    if (existing.ok() && existing->has_value()) {
      Result<schema::TrajectorySummary> decoded = schema::DecodeTrajectorySummary(**existing);
      if (strict && !decoded.ok()) return decoded.status();
      if (decoded.ok()) summary = *decoded;
    }
    return &summaries_.emplace(std::string(trajectory), summary).first->second;
  }

  // A summary counting no segment is deleted: its trajectory is gone from the store.
  void WriteInto(rocksdb::WriteBatch& batch) const {
    for (const auto& [trajectory, summary] : summaries_) {
      if (summary.segments_stored == 0) {
        batch.Delete(store_.trajectories(), trajectory);
      } else {
        batch.Put(store_.trajectories(), trajectory, schema::EncodeTrajectorySummary(summary));
      }
    }
  }

 private:
  const Store& store_;
  std::map<std::string, schema::TrajectorySummary, std::less<>> summaries_;  // by id bytes
};

void AddSegment(const schema::SegmentFacts& facts, uint64_t now_ms,
                schema::TrajectorySummary& s) {
  if (s.segments_stored == 0) {
    s.trajectory_id = facts.key.trajectory;
    s.first_insert_unix_ms = now_ms;
    s.min_policy_version = facts.min_policy_version;
  }
  s.env = facts.env;
  s.table = facts.table;
  s.min_policy_version = s.segments_stored == 0
                             ? facts.min_policy_version
                             : std::min(s.min_policy_version, facts.min_policy_version);
  s.max_policy_version = std::max(s.max_policy_version, facts.max_policy_version);
  s.segments_stored += 1;
  s.tokens += facts.tokens;
  s.steps += facts.steps;
  s.process_reward_sum += facts.process_reward_sum;
  if (facts.is_last) {
    s.complete = true;
    s.outcome_reward = facts.outcome_reward;
    s.end_reason = facts.end_reason;
  }
}

void RemoveSegment(const IndexRecord& record, schema::TrajectorySummary& s) {
  s.segments_stored -= std::min<uint32_t>(s.segments_stored, 1);
  s.tokens -= std::min(s.tokens, record.tokens);
}

}  // namespace

Result<std::unique_ptr<SegmentWriter>> Store::NewSegmentWriter(
    int slot, const std::vector<std::string>& tables, size_t batch_reserve_bytes) {
  std::unique_ptr<SegmentWriter> writer(new SegmentWriter(this, slot, batch_reserve_bytes));
  for (const std::string& table : tables) {
    STRIDER_ASSIGN_OR_RETURN(writer->inserts_[table],
                             GetCounter(meta::TableInsertsSlot(table, slot)));
  }
  return writer;
}

Status SegmentWriter::Write(const std::vector<SegmentInsert>& segments, uint64_t now_unix_ms) {
  if (segments.empty()) return Status::Ok();
  rocksdb::WriteBatch& batch = *batch_;
  batch.Clear();
  SummaryEdits summaries(*store_);
  std::map<std::string, uint64_t> inserts;  // by table, in this group
  std::vector<std::string> sequence_prefixes;  // the 8-byte prefixes must outlive Write
  sequence_prefixes.reserve(segments.size());
  for (const SegmentInsert& segment : segments) {
    const schema::SegmentFacts& facts = *segment.facts;
    sequence_prefixes.push_back(EncodeU64(segment.sequence));
    // The segment value is the sequence number followed by the envelope as received;
    // SliceParts avoids concatenating megabytes.
    rocksdb::Slice key_slice(segment.store_key.data(), segment.store_key.size());
    rocksdb::Slice value_parts[2] = {
        rocksdb::Slice(sequence_prefixes.back()),
        rocksdb::Slice(segment.envelope.data(), segment.envelope.size())};
    batch.Put(store_->segments(), rocksdb::SliceParts(&key_slice, 1),
              rocksdb::SliceParts(value_parts, 2));
    IndexRecord record;
    record.key = facts.key;
    record.min_policy_version = facts.min_policy_version;
    record.max_policy_version = facts.max_policy_version;
    record.bytes = segment.envelope.size();
    record.tokens = facts.tokens;
    record.insert_unix_ms = now_unix_ms;
    record.table = facts.table;
    batch.Put(store_->sequence(), SequenceKey(segment.sequence), EncodeIndexRecord(record));
    // The caller holds the trajectory, so the stored summary is the latest one.
    Result<schema::TrajectorySummary*> summary =
        summaries.For(facts.key.trajectory.View(), /*strict=*/false);
    if (!summary.ok()) return summary.status();
    AddSegment(facts, now_unix_ms, **summary);
    inserts[facts.table] += 1;
  }
  summaries.WriteInto(batch);
  // This writer's own counter slots: only it writes them, one batch after another, so each
  // slot is exact whatever order the writers' batches reach the log in.
  for (const auto& [table, count] : inserts) {
    batch.Put(store_->meta(), meta::TableInsertsSlot(table, slot_),
              EncodeU64(inserts_[table] + count));
  }
  batch.Put(store_->meta(), meta::NextSequenceSlot(slot_),
            EncodeU64(segments.back().sequence + 1));
  Status status = store_->Write(&batch);
  if (batch.GetDataSize() > 2 * batch_reserve_bytes_) {
    // An outsized segment grew it: do not keep that much memory per writer.
    batch_ = std::make_unique<rocksdb::WriteBatch>(batch_reserve_bytes_);
  }
  if (!status.ok()) return status;
  for (const auto& [table, count] : inserts) inserts_[table] += count;
  // The mark goes to the sampling store, whose log a damaged segment log does not take with it.
  // Written after the group is durable and before it is acknowledged: a crash in between leaves
  // the mark low, never high, so it can miss a loss but never invent one.
  // A mark that fails to write (a full disk) stays low: the group is durable all the same.
  rocksdb::WriteBatch mark;
  mark.Put(meta::Acknowledged(slot_), EncodeU64(Total()));
  (void)store_->WriteSampling(&mark);
  return Status::Ok();
}

uint64_t SegmentWriter::Total() const {
  uint64_t total = 0;
  for (const auto& [table, count] : inserts_) total += count;
  return total;
}

Status Store::WriteTableDefinitions(
    const std::vector<std::pair<std::string, std::string>>& tables) {
  rocksdb::WriteBatch batch;
  for (const auto& [name, definition] : tables) {
    batch.Put(meta(), meta::TableDefinition(name), definition);
  }
  return Write(&batch);
}

Status Store::DeleteSegments(const std::vector<std::pair<uint64_t, IndexRecord>>& records) {
  rocksdb::WriteBatch batch;
  SummaryEdits summaries(*this);
  for (const auto& [sequence, record] : records) {
    batch.Delete(segments(), SegmentStoreKey(record.key));
    batch.Delete(this->sequence(), SequenceKey(sequence));
    STRIDER_ASSIGN_OR_RETURN(schema::TrajectorySummary * summary,
                             summaries.For(record.key.trajectory.View(), /*strict=*/true));
    RemoveSegment(record, *summary);
  }
  summaries.WriteInto(batch);
  return Write(&batch);
}

Status Store::MarkAbandoned(std::string_view trajectory) {
  STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> stored, Get(trajectories(), trajectory));
  if (!stored) return Status::Ok();
  STRIDER_ASSIGN_OR_RETURN(schema::TrajectorySummary summary,
                           schema::DecodeTrajectorySummary(*stored));
  if (summary.complete || summary.abandoned) return Status::Ok();
  summary.abandoned = true;
  summary.end_reason = schema::EndReason::kAbandoned;
  rocksdb::WriteBatch batch;
  batch.Put(trajectories(), rocksdb::Slice(trajectory.data(), trajectory.size()),
            schema::EncodeTrajectorySummary(summary));
  return Write(&batch);
}

Status Store::AddConflicts(const std::map<std::string, uint32_t>& by_trajectory) {
  rocksdb::WriteBatch batch;
  for (const auto& [trajectory, count] : by_trajectory) {
    STRIDER_ASSIGN_OR_RETURN(std::optional<std::string> stored, Get(trajectories(), trajectory));
    if (!stored) continue;
    STRIDER_ASSIGN_OR_RETURN(schema::TrajectorySummary summary,
                             schema::DecodeTrajectorySummary(*stored));
    summary.conflicts += count;
    batch.Put(trajectories(), trajectory, schema::EncodeTrajectorySummary(summary));
  }
  return batch.Count() == 0 ? Status::Ok() : Write(&batch);
}

Status Store::ForgetSampling(const std::vector<uint64_t>& sequences) {
  rocksdb::WriteBatch batch;
  for (uint64_t sequence : sequences) {
    batch.Delete(meta::TimesSampled(sequence));
    batch.Delete(meta::Priority(sequence));
  }
  return WriteSampling(&batch);
}

Status Store::RecordDraw(const DrawRecord& draw) {
  rocksdb::WriteBatch batch;
  std::string encoded;
  for (size_t i = 0; i < draw.items.size(); ++i) {
    encoded += EncodeU64(draw.items[i]);
    batch.Put(meta::TimesSampled(draw.items[i]), EncodeU64(draw.times_sampled[i]));
  }
  batch.Put(meta::Draw(draw.table, draw.learner, draw.step), encoded);
  batch.Put(meta::LearnerState(draw.table, draw.learner),
            EncodeU64(draw.step) + EncodeU64(draw.fifo_position));
  batch.Put(meta::TableSamples(draw.table), EncodeU64(draw.table_samples));
  if (draw.forget_step > 0) batch.Delete(meta::Draw(draw.table, draw.learner, draw.forget_step));
  return WriteSampling(&batch);
}

Status Store::WritePriorities(const std::vector<std::pair<uint64_t, double>>& priorities) {
  rocksdb::WriteBatch batch;
  for (const auto& [sequence, priority] : priorities) {
    batch.Put(meta::Priority(sequence),
              std::string(reinterpret_cast<const char*>(&priority), sizeof(double)));
  }
  return WriteSampling(&batch);
}

}  // namespace strider::replay
