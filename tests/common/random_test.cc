#include "common/random.h"

#include <gtest/gtest.h>

namespace strider {
namespace {

// Seeded shuffles, generated records and sampling draws all come from these values: a change to
// the constants or the order of the steps would silently change every run's data.
TEST(SplitMix64, MatchesTheReferenceSequence) {
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64Next(&state), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64Next(&state), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(SplitMix64Next(&state), 0x06c45d188009454full);
  EXPECT_EQ(SplitMix64Next(&state), 0xf88bb8a8724c81ecull);
  EXPECT_EQ(state, 4 * kSplitMix64Increment);
  EXPECT_EQ(SplitMix64(1234567), 6457827717110365317ull);
}

TEST(SplitMix64, TheThreeFormsAgree) {
  for (uint64_t x : {0ull, 1ull, 0x5eedull, ~0ull}) {
    uint64_t state = x;
    const uint64_t next = SplitMix64Next(&state);
    EXPECT_EQ(next, SplitMix64(x));
    EXPECT_EQ(next, SplitMix64Finalize(x + kSplitMix64Increment));
    EXPECT_EQ(state, x + kSplitMix64Increment);
  }
}

}  // namespace
}  // namespace strider
