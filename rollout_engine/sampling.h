// Per-request sampling: draws from the sampling distribution of common/model/
// sampling_distribution.h (temperature, top-k, top-p, never-sampled ids) with a counter-based
// random stream per sequence.
//
// The distribution is the shared one, so the log-prob stored with a sample is exactly the value
// a learner gets from model::SamplingLogProbs on the same logits and settings. A row's decision
// depends only on that row and on the sequence's (seed, counter), never on the batch it was
// computed in: the distribution is computed row by row (a row's values do not depend on the
// others) and the draw walks one row. The random stream is counter-based (draw i = Mix(seed,
// i)), so a snapshot stores two integers and a fork derives its children's seeds without
// sharing state.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/model/sampling_distribution.h"
#include "common/status.h"

namespace strider::rollout {

struct SamplingParams {
  double temperature = 1.0;   // 0 = greedy (argmax); otherwise > 0
  int64_t top_k = 0;          // keep the k most likely tokens; 0 = all
  double top_p = 1.0;         // keep the smallest set with mass >= top_p; in (0, 1]
  int64_t max_new_tokens = 256;          // the turn ends after this many sampled tokens
  std::vector<int64_t> stop_tokens;      // the turn ends after sampling one of these
  std::vector<std::string> stop_strings; // ... or when the turn's bytes end with one of these
  uint64_t seed = 0;                     // the sequence's random stream
};

// Checks ranges against a vocabulary of `vocabulary` ids; the message names the field.
Status ValidateSamplingParams(const SamplingParams& params, int64_t vocabulary);

// The distribution a turn with `params` samples from: model::RolloutSamplingSettings of its
// temperature, top-k and top-p, never sampling the model's reserved ids (`never_sampled`: the
// engine's EngineOptions::never_sampled). A learner rebuilds it from the settings stored with
// each segment and the reserved ids stored with the trajectory.
model::SamplingSettings TurnDistribution(
    const SamplingParams& params,
    std::vector<int64_t> never_sampled = model::ByteFormatNeverSampled());

struct Sample {
  int64_t token = 0;
  double log_prob = 0;        // under the sampling distribution (model::SamplingLogProbs)
  double model_log_prob = 0;  // under the model's own distribution (temperature 1, no cut)
  double entropy = 0;         // of the sampling distribution, in nats
};

// The i-th uniform draw in [0, 1) of the stream `seed` (SplitMix64 of the pair).
double UniformDraw(uint64_t seed, uint64_t counter);
// A child stream's seed for fork member `index` of a parent stream.
uint64_t DeriveSeed(uint64_t seed, uint64_t index);

// Samples row b of `logits` (B, V) from distributions[b] with draw uniforms[b], by inverse CDF
// over the kept tokens in descending probability (ties: the lower id first), so the result is a
// pure function of the row, its settings and its draw. Probabilities are computed in fp64 from
// the logits as given. Never-sampled ids count in model_log_prob's normalisation, which is the
// model's own distribution. InvalidArgument for mismatched sizes or out-of-range settings.
Result<std::vector<Sample>> SampleTokens(const at::Tensor& logits,
                                         const std::vector<model::SamplingSettings>& distributions,
                                         const std::vector<double>& uniforms);

namespace internal {
// SampleTokens' draw as tensor operations on the log-probs' device, from the sampling
// distribution's and the model's log-probs (B, V) in fp64: what every device but the CPU runs.
// Exposed so that tests compare it with the CPU's row loop.
std::vector<Sample> DrawByTensorOps(const at::Tensor& log_probs, const at::Tensor& model_log_probs,
                                    const std::vector<double>& uniforms);
}  // namespace internal

// SampleTokens for one row of `vocabulary` logits.
Result<Sample> SampleToken(const float* logits, int64_t vocabulary,
                           const model::SamplingSettings& distribution, double uniform);

}  // namespace strider::rollout
