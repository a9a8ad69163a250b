// libFuzzer target for the config loader (common/config.h): a config file is user input. No
// input may crash, hang or read out of bounds; a bad one gives an error naming what was wrong.
// The reads mirror a typical section: scalars of each type, lists, nested sections, a list of
// mappings, then Finish (unknown keys).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  strider::Result<strider::ConfigReader> root = strider::ConfigReader::FromString(text, "<fuzz>");
  if (!root.ok()) {
    if (root.status().message().empty()) std::abort();
    return 0;
  }
  strider::ConfigReader server = root->Section("server");
  std::string bind;
  int64_t bytes = 0;
  double seconds = 0;
  bool sync = false;
  int threads = 0;
  std::vector<int64_t> backoff;
  std::vector<std::string> names;
  server.Optional("bind", &bind);
  server.Optional("max_message_bytes", &bytes);
  server.Optional("stats_interval_s", &seconds);
  server.Optional("sync_wal", &sync);
  server.Optional("writer_threads", &threads);
  server.Optional("backoff_s", &backoff);
  server.Optional("names", &names);
  server.Check(bytes >= 0, "max_message_bytes", "must be >= 0");
  for (strider::ConfigReader& table : root->List("tables")) {
    std::string name;
    table.Required("name", &name);
    strider::ConfigReader limiter = table.Section("rate_limiter");
    int64_t min_fill = 0;
    limiter.Optional("min_fill", &min_fill);
  }
  strider::Status status = root->Finish();
  if (!status.ok() && status.message().empty()) std::abort();
  return 0;
}
