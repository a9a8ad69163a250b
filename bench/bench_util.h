// What the benchmark programs share besides their output format (bench_json.h): a failed setup
// step ends the run, because a figure measured after it would describe something else.
#pragma once

#include <errno.h>  // program_invocation_short_name
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>

#include "common/status.h"

namespace strider::bench {

// The value of `result`, or exits with status 1 after printing the program's name, `what` and
// the error.
template <typename T>
T Unwrap(Result<T> result, const std::string& what) {
  if (!result.ok()) {
    std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what.c_str(),
                 result.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(result).value();
}

// Exits with status 1 after printing the program's name, `what` and the error unless `status`
// is ok.
inline void Check(const Status& status, const std::string& what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what.c_str(),
                 status.ToString().c_str());
    std::exit(1);
  }
}

// This program's executable (/proc/self/exe), or empty where it cannot be read.
inline std::string SelfPath() {
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  return length > 0 ? std::string(self, static_cast<size_t>(length)) : std::string();
}

// Runs this program again with `arguments` (a shell word list, quoted by the caller), hands
// each line it prints on stdout to `on_line` as it comes, and returns its exit status (-1 when
// it cannot be started). Benchmarks run a measurement in a fresh process this way when memory
// one measurement freed would stay in the heap and read as the next one's.
inline int RunSelf(const std::string& arguments,
                   const std::function<void(const std::string& line)>& on_line) {
  const std::string self = SelfPath();
  if (self.empty()) return -1;
  FILE* child = popen(("'" + self + "' " + arguments).c_str(), "r");
  if (child == nullptr) return -1;
  char buffer[8192];
  while (std::fgets(buffer, sizeof(buffer), child) != nullptr) on_line(buffer);
  return pclose(child);
}

}  // namespace strider::bench
