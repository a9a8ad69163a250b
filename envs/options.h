// Reading an environment's string options (config `options:` merged with per-episode overrides).
// Internal to envs/: each environment declares its keys, and every error names the environment,
// the key and the accepted values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "envs/environment.h"

namespace strider::envs {

class OptionReader {
 public:
  // `episode` overrides `config`; keys outside `known` are an error (reported by status()).
  OptionReader(std::string environment, const Options& config, const Options& episode,
               const std::vector<std::string>& known);

  int64_t Int(const std::string& key, int64_t fallback, int64_t min, int64_t max);
  bool Bool(const std::string& key, bool fallback);
  std::string String(const std::string& key, const std::string& fallback);

  // The first problem met, or OK.
  const Status& status() const { return status_; }

 private:
  void Fail(const std::string& key, const std::string& problem);

  std::string environment_;
  Options merged_;
  Status status_;
};

}  // namespace strider::envs
