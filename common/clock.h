// The clock for durations, deadlines and rates. Wall-clock time (system_clock) can jump when the
// machine's time is set; a timeout or a tokens-per-second figure measured with it would too.
#pragma once

#include <chrono>

namespace strider {

using Clock = std::chrono::steady_clock;

}  // namespace strider
