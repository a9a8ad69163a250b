// What the benchmark programs share besides their output format (bench_json.h): a failed setup
// step ends the run, because a figure measured after it would describe something else.
#pragma once

#include <errno.h>  // program_invocation_short_name

#include <cstdio>
#include <cstdlib>
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

}  // namespace strider::bench
