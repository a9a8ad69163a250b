// Per-request sampling: temperature, top-k, top-p, on one row of logits, with a counter-based
// random stream per sequence.
//
// Plain C++ over float logits (no LibTorch): the decision for a row depends only on that row and
// on the sequence's (seed, counter), never on the batch it was computed in or on thread counts.
// The random stream is counter-based (draw i = Mix(seed, i)), so a snapshot stores two integers
// and a fork derives its children's seeds without sharing state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

struct Sample {
  int64_t token = 0;
  double log_prob = 0;        // under the sampling distribution (after temperature, k, p)
  double model_log_prob = 0;  // under the model's own distribution (temperature 1, no cut)
  double entropy = 0;         // of the sampling distribution, in nats
};

// The i-th uniform draw in [0, 1) of the stream `seed` (SplitMix64 of the pair).
double UniformDraw(uint64_t seed, uint64_t counter);
// A child stream's seed for fork member `index` of a parent stream.
uint64_t DeriveSeed(uint64_t seed, uint64_t index);

// Samples from `logits` (V values) with draw `uniform`. Ties in probability are broken by the
// lower token id, so the result is a pure function of its inputs. `banned` (when >= 0) is never
// sampled (the engine bans the image-patch placeholder, which only images may fill); it still
// counts in model_log_prob's normalisation, which is the model's own distribution.
Sample SampleToken(const float* logits, int64_t vocabulary, const SamplingParams& params,
                   double uniform, int64_t banned = -1);

}  // namespace strider::rollout
