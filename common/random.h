// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators"): one
// 64-bit mixing step that turns a counter or a seed into well-spread bits. Seeded shuffles, record
// generators and sampling draws use it so that a value is a pure function of (seed, index),
// reproducible without a generator's state. Changing any constant here changes every seeded draw
// in the tree.
#pragma once

#include <cstdint>

namespace strider {

// The increment splitmix64 adds per step (2^64 divided by the golden ratio).
inline constexpr uint64_t kSplitMix64Increment = 0x9e3779b97f4a7c15ull;

// splitmix64's output function alone (Stafford's "Mix13"), for callers that already hold a
// well-varied 64-bit value, such as a running hash.
inline constexpr uint64_t SplitMix64Finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One splitmix64 step from `x`: the value a generator whose state is `x` returns next.
inline constexpr uint64_t SplitMix64(uint64_t x) {
  return SplitMix64Finalize(x + kSplitMix64Increment);
}

// The generator form: advances `*state` by one step and returns that step's value.
inline uint64_t SplitMix64Next(uint64_t* state) {
  *state += kSplitMix64Increment;
  return SplitMix64Finalize(*state);
}

}  // namespace strider
