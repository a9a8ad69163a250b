// How the scoring pass (scoring.h) runs, apart from scoring.h so the RL learner's config
// (rl_config.h), which holds these under `scoring:`, reads them without LibTorch.
#pragma once

#include <cstdint>

namespace strider {
class ChunkRounds;  // learner/learner.h
}  // namespace strider

namespace strider::rl {

// The mismatch_threshold of a bfloat16 learner (`precision: bfloat16`) that does not set one:
// far above what bf16 rounding gives a token (docs/cuda.md, "Precision", has the measured
// figures), below what wrong weights give.
inline constexpr double kBFloat16MismatchThreshold = 1.0;

struct ScoringOptions {
  // Positions per Model::Append; memory grows with it, not with L. The RL learner's update pass
  // uses the same chunks (rl_step.h), and this is the default of its `train.chunk_tokens`.
  int64_t chunk_tokens = 512;
  // Force every position's stored experts. Needs segments whose routing covers every position
  // (schema 1.2 coverage `all`); off, the learner routes by itself (an ablation, or a model
  // without experts, where it has no effect).
  bool replay_routing = true;
  bool values = true;  // value-head estimates at step starts
  // Also the learner's log-probs under the full temperature-scaled distribution (no top-k or
  // top-p), the implicit rewards' policy side; set by the step, not read from a config.
  bool full_logprobs = false;
  // Largest |learner - behaviour| log-prob tolerated on a single-version trajectory. fp32 with
  // routing replay stays below 1e-5; a support cut decided differently gives an infinite one.
  double mismatch_threshold = 1e-4;

  // Expert-parallel ranks: the passes' model calls are rounds of these (learner.h).
  ChunkRounds* rounds = nullptr;
};

}  // namespace strider::rl
