// Benchmark-only entry points of the rollout engine, kept out of engine.h so that the actor and
// the learner cannot reach them: what they do is meaningless for a real sequence.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "rollout_engine/engine.h"

namespace strider::rollout {

// Makes an idle sequence `tokens` longer without running the model, by appending synthetic
// latent rows (random c_kv with unit root-mean-square as RMSNorm leaves it, random shared key
// parts) to its cache. A long context then costs seconds instead of a quadratic prefill. The
// rows belong to no token history: incremental states and the next-token distribution are
// unchanged and later log-probabilities mean nothing; decode cost per token does not depend on
// the cached values, which is what benchmarks measure with it. `engine` must come from
// Engine::Create (InvalidArgument otherwise); the engine's mutex is held as for any method.
// Errors as Append (NotFound, FailedPrecondition, OutOfRange, ResourceExhausted), and
// InvalidArgument for tokens < 1.
Status FillForBenchmark(Engine* engine, SequenceId id, int64_t tokens, uint64_t seed);

}  // namespace strider::rollout
