// Whole trajectories sampled from a replay server's learner endpoint, for tests that score
// what an actor stored.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "replay/client.h"

namespace strider::testing {

// `count` whole trajectories, each as its segments in order, in at most `attempts` sample
// calls; `step` is the learner step each call advances and names.
inline std::vector<std::vector<schema::SegmentData>> SampleTrajectories(
    replay::LearnerClient& learner, uint64_t& step, size_t count, int attempts) {
  std::vector<std::vector<schema::SegmentData>> out;
  std::map<uint64_t, size_t> by_unit;
  for (int attempt = 0; attempt < attempts && out.size() < count; ++attempt) {
    Result<replay::SampleBatch> batch = learner.Sample(
        ++step, static_cast<uint32_t>(count - out.size()), 0, std::chrono::milliseconds(5000));
    EXPECT_TRUE(batch.ok()) << batch.status().ToString();
    if (!batch.ok()) break;
    for (replay::SampledItem& item : batch->items) {
      auto [it, fresh] = by_unit.try_emplace(item.sequence, out.size());
      if (fresh) out.emplace_back();
      out[it->second].push_back(std::move(item.segment));
    }
  }
  EXPECT_EQ(out.size(), count);
  return out;
}

}  // namespace strider::testing
