// Constructors of the concrete samplers; MakeSampler (factory.cc) picks one. fifo and newest
// share insertion_order.cc (they differ only in direction), the others have a file each.
#pragma once

#include "replay/samplers/interface.h"

namespace strider::replay {

std::unique_ptr<Sampler> MakeFifoSampler(const SamplerOptions& options);
std::unique_ptr<Sampler> MakeUniformSampler(const SamplerOptions& options);
std::unique_ptr<Sampler> MakePrioritizedSampler(const SamplerOptions& options);
std::unique_ptr<Sampler> MakeNewestSampler(const SamplerOptions& options);

}  // namespace strider::replay
