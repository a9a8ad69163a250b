#include "envs/options.h"

#include <algorithm>

namespace strider::envs {

OptionReader::OptionReader(std::string environment, const Options& config, const Options& episode,
                           const std::vector<std::string>& known)
    : environment_(std::move(environment)), merged_(config) {
  for (const auto& [key, value] : episode) merged_[key] = value;
  for (const auto& [key, value] : merged_) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      Fail(key, "unknown option (known: " + (list.empty() ? std::string("none") : list) + ")");
      return;
    }
  }
}

void OptionReader::Fail(const std::string& key, const std::string& problem) {
  if (!status_.ok()) return;
  status_ = Status::InvalidArgument(environment_ + ": option '" + key + "': " + problem);
}

int64_t OptionReader::Int(const std::string& key, int64_t fallback, int64_t min, int64_t max) {
  auto it = merged_.find(key);
  if (it == merged_.end()) return fallback;
  const std::string& text = it->second;
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size()) {
    Fail(key, "expected an integer, got '" + text + "'");
    return fallback;
  }
  if (value < min || value > max) {
    Fail(key, std::to_string(value) + " is outside [" + std::to_string(min) + ", " +
                  std::to_string(max) + "]");
    return fallback;
  }
  return value;
}

bool OptionReader::Bool(const std::string& key, bool fallback) {
  auto it = merged_.find(key);
  if (it == merged_.end()) return fallback;
  if (it->second == "true" || it->second == "1") return true;
  if (it->second == "false" || it->second == "0") return false;
  Fail(key, "expected true or false, got '" + it->second + "'");
  return fallback;
}

std::string OptionReader::String(const std::string& key, const std::string& fallback) {
  auto it = merged_.find(key);
  return it == merged_.end() ? fallback : it->second;
}

}  // namespace strider::envs
