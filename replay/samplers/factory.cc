#include "replay/samplers/samplers.h"

namespace strider::replay {

Result<SamplerKind> ParseSamplerKind(const std::string& name) {
  if (name == "fifo") return SamplerKind::kFifo;
  if (name == "uniform") return SamplerKind::kUniform;
  if (name == "prioritized") return SamplerKind::kPrioritized;
  if (name == "newest") return SamplerKind::kNewest;
  return Status::InvalidArgument("unknown sampler '" + name +
                                 "' (expected fifo, uniform, prioritized or newest)");
}

std::string SamplerKindName(SamplerKind kind) {
  switch (kind) {
    case SamplerKind::kFifo: return "fifo";
    case SamplerKind::kUniform: return "uniform";
    case SamplerKind::kPrioritized: return "prioritized";
    case SamplerKind::kNewest: return "newest";
  }
  return "unknown";
}

std::unique_ptr<Sampler> MakeSampler(const SamplerOptions& options) {
  switch (options.kind) {
    case SamplerKind::kFifo: return MakeFifoSampler(options);
    case SamplerKind::kUniform: return MakeUniformSampler(options);
    case SamplerKind::kPrioritized: return MakePrioritizedSampler(options);
    case SamplerKind::kNewest: return MakeNewestSampler(options);
  }
  return nullptr;
}

}  // namespace strider::replay
