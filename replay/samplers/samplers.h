// Constructors of the concrete samplers, one file each; MakeSampler (factory.cc) picks one.
#pragma once

#include "replay/samplers/interface.h"

namespace strider::replay {

std::unique_ptr<Sampler> MakeFifoSampler(const SamplerOptions& options);
std::unique_ptr<Sampler> MakeUniformSampler(const SamplerOptions& options);
std::unique_ptr<Sampler> MakePrioritizedSampler(const SamplerOptions& options);
std::unique_ptr<Sampler> MakeNewestSampler(const SamplerOptions& options);

}  // namespace strider::replay
