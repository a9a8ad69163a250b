#include "replay/storage.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <rocksdb/table.h>

namespace strider::replay {
namespace {

constexpr const char* kFamilies[] = {"default", "segments", "trajectories", "sequence", "meta"};

void PutLe(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
uint64_t GetLe(std::string_view in, size_t at) {
  uint64_t v;
  std::memcpy(&v, in.data() + at, 8);
  return v;
}

}  // namespace

Status FromRocks(const rocksdb::Status& status, std::string_view what) {
  if (status.ok()) return Status::Ok();
  const std::string message = std::string(what) + ": " + status.ToString();
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
  o.write_buffer_size = 64 << 20;
  o.max_write_buffer_number = 4;
  o.max_background_jobs = 2;
  o.enable_pipelined_write = true;
  return o;
}

Result<std::unique_ptr<Store>> Store::Open(const std::string& path, const StoreOptions& options) {
  std::unique_ptr<Store> store(new Store());
  store->path_ = path;
  store->options_ = options;
  rocksdb::Options db_options = MakeOptions(options);
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const char* name : kFamilies) {
    families.emplace_back(name, rocksdb::ColumnFamilyOptions(db_options));
  }
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

  // The sampling store: small writes only, so small memtables and no compression.
  rocksdb::Options sampling_options;
  sampling_options.create_if_missing = true;
  sampling_options.compression = rocksdb::kNoCompression;
  sampling_options.write_buffer_size = 4 << 20;
  sampling_options.max_background_jobs = 1;
  const std::string sampling_path = path + "/sampling";
  rocksdb::DB* sampling = nullptr;
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
