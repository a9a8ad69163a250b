// The extension point that decides which stored items a sample returns.
//
// Items are insertion numbers (the `sequence` column family's keys), inserted in increasing
// order. A sampler holds only items that may be sampled; the table removes items that left the
// table (capacity, retention) or can never be sampled again (sampled the maximum number of times,
// too stale).
//
// Threading: methods are not called concurrently; the owning Table serialises them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"

namespace strider::replay {

enum class SamplerKind { kFifo, kUniform, kPrioritized, kNewest };

struct SamplerOptions {
  SamplerKind kind = SamplerKind::kFifo;
  double priority_exponent = 1.0;  // prioritized: P(i) proportional to priority_i^exponent
  double default_priority = 1.0;   // prioritized: priority of an item nobody has updated
};

Result<SamplerKind> ParseSamplerKind(const std::string& name);
std::string SamplerKindName(SamplerKind kind);

class Sampler {
 public:
  virtual ~Sampler() = default;

  // `item` is larger than every item inserted before. `priority` matters to prioritized only.
  virtual void Insert(uint64_t item, double priority) = 0;
  // No-op for an item not held.
  virtual void Remove(uint64_t item) = 0;
  // InvalidArgument for a sampler without priorities; NotFound for an item not held.
  virtual Status SetPriority(uint64_t item, double priority) = 0;

  // Up to `count` distinct items for which `eligible` is true. `after` is the caller's read
  // position: fifo returns the oldest items greater than it; the others ignore it. `eligible`
  // may be called for items that are not returned.
  virtual std::vector<uint64_t> Sample(size_t count, uint64_t after, std::mt19937_64& rng,
                                       const std::function<bool(uint64_t)>& eligible) = 0;

  virtual size_t size() const = 0;
  virtual bool Contains(uint64_t item) const = 0;
  // The options this sampler was made with, for stats and the table definition in `meta`.
  virtual SamplerOptions options() const = 0;
};

// The one factory: a switch over the kind.
std::unique_ptr<Sampler> MakeSampler(const SamplerOptions& options);

}  // namespace strider::replay
