// Server options: the YAML config (docs/replay.md) and the checks Start makes before it
// creates or opens anything.
#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "common/config.h"
#include "common/transport/curve.h"
#include "common/transport/zmq_util.h"
#include "replay/server_impl.h"

namespace strider::replay {
namespace {

std::string DeriveLearnerEndpoint(const std::string& actor) {
  if (actor.rfind("ipc://", 0) == 0) return actor + ".sample";
  if (actor.rfind("inproc://", 0) == 0) return actor + "-sample";
  const size_t colon = actor.rfind(':');
  if (colon == std::string::npos) return actor;
  const std::string port = actor.substr(colon + 1);
  if (port == "0" || port == "*") return actor;
  try {
    return actor.substr(0, colon + 1) + std::to_string(std::stoi(port) + 1);
  } catch (...) {
    return actor;
  }
}


}  // namespace

namespace internal {

Status CompleteAndCheckOptions(ServerOptions& options) {
  if (options.db_path.empty()) return Status::InvalidArgument("replay server: --db is required");
  if (options.credit_bytes < options.max_message_bytes) {
    return Status::InvalidArgument(
        "server.credit_bytes must be at least server.max_message_bytes, or a maximal segment "
        "could never be sent");
  }
  if (options.tables.empty()) options.tables.push_back(TableConfig());
  std::set<std::string> names;
  for (const TableConfig& t : options.tables) {
    if (!names.insert(t.name).second) {
      return Status::InvalidArgument("two tables are named '" + t.name + "'");
    }
  }
  if (options.learner_endpoint.empty()) {
    options.learner_endpoint = DeriveLearnerEndpoint(options.actor_endpoint);
  }
  STRIDER_RETURN_IF_ERROR(
      transport::CheckEndpoint(options.actor_endpoint).WithContext("replay server: actor endpoint"));
  STRIDER_RETURN_IF_ERROR(transport::CheckEndpoint(options.learner_endpoint)
                              .WithContext("replay server: learner endpoint"));
  STRIDER_RETURN_IF_ERROR(transport::CheckBindAllowed(options.actor_endpoint, options.auth,
                                                      "replay server: actor endpoint"));
  STRIDER_RETURN_IF_ERROR(transport::CheckBindAllowed(options.learner_endpoint, options.auth,
                                                      "replay server: learner endpoint"));
  if (!options.auth.enabled()) {
    if (!options.learner_keys.empty()) {
      return Status::InvalidArgument("replay server: auth.learner_keys needs auth.secret_key");
    }
    return Status::Ok();
  }
  if (options.auth.authorized_keys.empty()) {
    return Status::InvalidArgument(
        "replay server: auth.authorized_keys is required with auth.secret_key");
  }
  // Every key file is read now, so a bad one stops the start before the store is touched.
  STRIDER_RETURN_IF_ERROR(transport::LoadCurveKeyPair(options.auth.secret_key)
                              .status()
                              .WithContext("replay server: auth.secret_key"));
  STRIDER_RETURN_IF_ERROR(transport::LoadAuthorizedKeys(options.auth.authorized_keys)
                              .status()
                              .WithContext("replay server: auth.authorized_keys"));
  if (!options.learner_keys.empty()) {
    STRIDER_RETURN_IF_ERROR(transport::LoadAuthorizedKeys(options.learner_keys)
                                .status()
                                .WithContext("replay server: auth.learner_keys"));
  }
  return Status::Ok();
}

}  // namespace internal

Result<ServerOptions> ParseServerConfig(const std::string& yaml, const std::string& origin) {
  STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromString(yaml, origin));
  ServerOptions options;
  ConfigReader server = root.Section("server");
  server.Optional("db", &options.db_path);
  server.Optional("bind", &options.actor_endpoint);
  server.Optional("sample_bind", &options.learner_endpoint);
  int64_t max_message_bytes = static_cast<int64_t>(options.max_message_bytes);
  int64_t credit_bytes = static_cast<int64_t>(options.credit_bytes);
  int64_t write_batch_bytes = static_cast<int64_t>(options.write_batch_bytes);
  int64_t writer_threads = options.writer_threads;
  int64_t max_queued_bytes = static_cast<int64_t>(options.max_queued_bytes);
  int64_t max_token_id = options.max_token_id;
  int64_t intake_nice = options.intake_nice;
  server.Optional("max_message_bytes", &max_message_bytes);
  server.Optional("credit_bytes", &credit_bytes);
  server.Optional("write_batch_bytes", &write_batch_bytes);
  server.Optional("writer_threads", &writer_threads);
  server.Optional("max_queued_bytes", &max_queued_bytes);
  server.Optional("intake_nice", &intake_nice);
  server.Optional("max_token_id", &max_token_id);
  server.Optional("sync_wal", &options.sync_wal);
  server.Optional("compression", &options.compression);
  int64_t memtable_mb = static_cast<int64_t>(options.memtable_mb);
  int64_t block_cache_mb = static_cast<int64_t>(options.block_cache_mb);
  int64_t max_open_files = options.max_open_files;
  server.Optional("memtable_mb", &memtable_mb);
  server.Optional("block_cache_mb", &block_cache_mb);
  server.Optional("max_open_files", &max_open_files);
  server.Check(memtable_mb >= 4 && memtable_mb <= (1 << 20), "memtable_mb",
               "must be in [4, 1048576]");
  server.Check(block_cache_mb >= 1 && block_cache_mb <= (1 << 20), "block_cache_mb",
               "must be in [1, 1048576]");
  server.Check(max_open_files == -1 || (max_open_files >= 16 && max_open_files <= 1 << 20),
               "max_open_files", "must be -1 (no limit) or in [16, 1048576]");
  options.memtable_mb = static_cast<uint64_t>(std::max<int64_t>(memtable_mb, 4));
  options.block_cache_mb = static_cast<uint64_t>(std::max<int64_t>(block_cache_mb, 1));
  options.max_open_files = static_cast<int>(max_open_files);
  int64_t max_store_bytes = static_cast<int64_t>(options.max_store_bytes);
  server.Optional("max_store_bytes", &max_store_bytes);
  server.Optional("abandon_after_s", &options.abandon_after_s);
  server.Check(options.abandon_after_s >= 0, "abandon_after_s", "must be >= 0 (0: never)");
  server.Check(max_store_bytes >= 0, "max_store_bytes", "must be >= 0 (0: no quota)");
  options.max_store_bytes = static_cast<uint64_t>(std::max<int64_t>(max_store_bytes, 0));
  server.Optional("sample_log_steps", &options.sample_log_steps);
  server.Optional("stats_interval_s", &options.stats_interval_s);
  std::string verify_on_start = "new";
  server.Optional("verify_on_start", &verify_on_start);
  if (verify_on_start == "all") {
    options.verify_on_start = StartVerify::kAll;
  } else if (verify_on_start == "none") {
    options.verify_on_start = StartVerify::kNone;
  } else if (verify_on_start == "new") {
    options.verify_on_start = StartVerify::kNew;
  } else {
    server.Fail("verify_on_start", "'" + verify_on_start + "' is none of new, all, none");
  }
  ConfigReader auth = server.Section("auth");
  options.auth = transport::ReadServerAuth(auth);
  auth.Optional("learner_keys", &options.learner_keys);
  auth.Check(options.learner_keys.empty() || options.auth.enabled(), "learner_keys",
             "needs secret_key");
  server.Check(max_message_bytes >= 4096, "max_message_bytes", "must be at least 4096");
  server.Check(credit_bytes >= max_message_bytes, "credit_bytes",
               "must be at least max_message_bytes");
  server.Check(write_batch_bytes >= 1, "write_batch_bytes", "must be positive");
  server.Check(writer_threads >= 1 && writer_threads <= 64, "writer_threads",
               "must be in [1, 64]");
  server.Check(max_queued_bytes >= 1, "max_queued_bytes", "must be positive");
  server.Check(intake_nice >= 0 && intake_nice <= 19, "intake_nice", "must be in [0, 19]");
  server.Check(max_token_id >= 1 && max_token_id <= INT32_MAX, "max_token_id",
               "must be in [1, 2^31)");
  server.Check(options.compression == "lz4" || options.compression == "zstd" ||
                   options.compression == "snappy" || options.compression == "none",
               "compression", "must be lz4, zstd, snappy or none");
  server.Check(options.sample_log_steps >= 1, "sample_log_steps", "must be >= 1");
  server.Check(options.stats_interval_s >= 0, "stats_interval_s", "must be >= 0");
  options.max_message_bytes = static_cast<uint64_t>(max_message_bytes);
  options.credit_bytes = static_cast<uint64_t>(credit_bytes);
  options.write_batch_bytes = static_cast<uint64_t>(write_batch_bytes);
  options.writer_threads = static_cast<int>(writer_threads);
  options.max_queued_bytes = static_cast<uint64_t>(max_queued_bytes);
  options.intake_nice = static_cast<int>(intake_nice);
  options.max_token_id = static_cast<int32_t>(max_token_id);
  std::set<std::string> names;
  for (ConfigReader& table : root.List("tables")) {
    options.tables.push_back(ReadTableConfig(table));
    if (!names.insert(options.tables.back().name).second) {
      table.Fail("name", "another table already has the name '" + options.tables.back().name +
                             "'");
    }
  }
  STRIDER_RETURN_IF_ERROR(root.Finish());
  return options;
}

Result<ServerOptions> LoadServerConfig(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status::NotFound(path + ": cannot open config file");
  std::stringstream text;
  text << file.rdbuf();
  return ParseServerConfig(text.str(), path);
}

}  // namespace strider::replay
