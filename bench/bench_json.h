// One JSON object per line for benchmark results (docs/design.md#benchmark-protocol):
//   {"bench": ..., "metric": ..., "value": ..., "unit": ..., "baseline": ..., "ratio": ...}
// `baseline` is the ceiling measured in the same run (raw RocksDB, raw ZeroMQ, memcpy, ...) or a
// target; `ratio` is value / baseline. Both are null when there is no baseline. Extra keys
// (context, wait policies, notes) may follow.
#pragma once

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strider::bench {

inline std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline std::string JsonNumber(std::optional<double> value) {
  if (!value || !std::isfinite(*value)) return "null";
  char text[64];
  std::snprintf(text, sizeof(text), "%.6g", *value);
  return text;
}

// Keys after the standard ones, in order; values are JSON text (JsonString, JsonNumber).
using JsonFields = std::vector<std::pair<std::string, std::string>>;

// Keys this process adds to every line it prints (the OpenMP wait policy its figures ran
// under, bench/ceiling.h). Set once, before the first line.
inline JsonFields& EveryLineFields() {
  static JsonFields fields;
  return fields;
}

// ",key:value" for each of `fields`, then for each of EveryLineFields().
inline std::string ExtraFieldsText(const JsonFields& fields) {
  std::string text;
  for (const auto& [key, value] : fields) text += "," + JsonString(key) + ":" + value;
  for (const auto& [key, value] : EveryLineFields()) text += "," + JsonString(key) + ":" + value;
  return text;
}

// Prints one result line to stdout and flushes, so partial runs still leave their figures.
inline void PrintResult(std::string_view bench, std::string_view metric, double value,
                        std::string_view unit, std::optional<double> baseline = std::nullopt,
                        const JsonFields& extra = {}) {
  std::optional<double> ratio;
  if (baseline && *baseline != 0) ratio = value / *baseline;
  std::printf(
      "{\"bench\":%s,\"metric\":%s,\"value\":%s,\"unit\":%s,\"baseline\":%s,\"ratio\":%s%s}\n",
      JsonString(bench).c_str(), JsonString(metric).c_str(), JsonNumber(value).c_str(),
      JsonString(unit).c_str(), JsonNumber(baseline).c_str(), JsonNumber(ratio).c_str(),
      ExtraFieldsText(extra).c_str());
  std::fflush(stdout);
}

}  // namespace strider::bench
