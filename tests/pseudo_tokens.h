// A reproducible stream of byte-token ids (an LCG's high bits mod 256), for prompts whose
// content does not matter but must be the same every run. Header-only, so tests and benchmark
// programs share it without a library.
#pragma once

#include <cstdint>
#include <vector>

namespace strider::testing {

inline std::vector<int64_t> PseudoRandomTokens(int64_t count, uint64_t seed) {
  std::vector<int64_t> tokens(count);
  uint64_t x = seed + 1;
  for (int64_t& token : tokens) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    token = static_cast<int64_t>((x >> 33) % 256);
  }
  return tokens;
}

}  // namespace strider::testing
