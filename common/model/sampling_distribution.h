// The distribution a token is sampled from: the model's logits under temperature, top-k and
// top-p truncation (renormalised over what is kept), with some token ids never sampled.
//
// One implementation for both sides of a policy ratio. The rollout sampler draws from
// SamplingLogProbs and stores its value at the drawn token as the behaviour log-prob; a learner
// evaluates the same function on its own logits for the same positions, on whole chunks and with
// gradients, so the ratio compares two evaluations of one distribution rather than two
// implementations that agree only approximately.
//
// Order of operations (that of the common open-source samplers):
//   1. never-sampled ids leave the vocabulary (probability exactly 0);
//   2. top-k keeps the k largest logits (ties: the lower id ranks first);
//   3. temperature divides the logits;
//   4. top-p keeps the smallest prefix, in that ranking, of the distribution over what step 2
//      kept whose mass reaches top_p (a token is kept when the mass ranked before it is below
//      top_p, so the most likely one always is);
//   5. softmax over the kept set.
// Temperature 0 is greedy: a point mass on the highest logit among the sampleable ids (ties to
// the lower id), log-prob 0 there and -inf elsewhere.
//
// Gradients: the kept set (the support) is computed without gradient, in fp64, and then held
// fixed; log-probs are differentiable in the logits through the kept entries only, which is the
// gradient of a truncated softmax with its truncation treated as a constant. Greedy log-probs
// are constants (zero gradient).
//
// Reproducing a stored behaviour log-prob needs the same settings: RolloutSamplingSettings
// builds them from the temperature, top-k and top-p stored with each segment. The support is
// decided on the logits it is given, so a token whose rank or cumulative mass lies within the
// rounding of two logit computations of a cut can be kept on one side and cut on the other
// (its log-prob is then -inf on that side); a learner's mismatch check sees this as any other
// disagreement.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace strider::model {

struct SamplingSettings {
  double temperature = 1.0;            // 0 = greedy; otherwise finite and > 0
  int64_t top_k = 0;                   // keep the k largest logits; 0 = no limit
  double top_p = 1.0;                  // nucleus mass in (0, 1]; 1 = no limit
  std::vector<int64_t> never_sampled;  // ids that get probability 0

  bool operator==(const SamplingSettings&) const = default;
};

// The ids the byte format never samples: its image-patch placeholder (token::kImagePatch),
// which only an image's patches fill. A model with its own tokenizer reserves none: the same id
// is an ordinary token of its vocabulary.
std::vector<int64_t> ByteFormatNeverSampled();

// The settings of a turn the rollout engine samples: `temperature`, `top_k` and `top_p` as the
// request (and the stored segment) gives them, and never the ids in `never_sampled` (the
// model's reserved ids; the first form: the byte format's).
SamplingSettings RolloutSamplingSettings(double temperature, int64_t top_k, double top_p);
SamplingSettings RolloutSamplingSettings(double temperature, int64_t top_k, double top_p,
                                         std::vector<int64_t> never_sampled);

// Checks ranges for a vocabulary of `vocabulary` ids; the message names the field. Every id in
// never_sampled must be inside the vocabulary and at least one id must remain.
Status ValidateSamplingSettings(const SamplingSettings& settings, int64_t vocabulary);

// The kept set: bool (..., V), true where the sampling distribution is positive. Computed in
// fp64 without gradient, one row at a time (rows in parallel for long chunks; a partial sort
// per row for top-k, a full one for top-p alone); `logits` is (..., V) in any floating dtype.
// Throws (model code) when the settings are out of range for V or a row has no finite logit to
// keep.
at::Tensor SamplingSupport(const at::Tensor& logits, const SamplingSettings& settings);

// Log-probabilities of the sampling distribution, (..., V) from logits (..., V): -inf outside
// the support. Computed in the logits' dtype (fp16/bf16 are widened to fp32); differentiable as
// the file comment says. Rows are independent: a row's values do not depend on the others.
at::Tensor SamplingLogProbs(const at::Tensor& logits, const SamplingSettings& settings);

// log q(tokens) for logits (..., V) and tokens (...) (int64): SamplingLogProbs gathered at the
// given ids. A learner passes its logits for the positions that predicted the action tokens.
at::Tensor SampledTokenLogProbs(const at::Tensor& logits, const at::Tensor& tokens,
                                const SamplingSettings& settings);

// Entropy in nats, (...), of distributions given as log-probs (..., V) that may hold -inf
// (SamplingLogProbs' output); differentiable, with no NaN from the -inf entries.
at::Tensor SamplingEntropy(const at::Tensor& log_probs);

namespace internal {
// SamplingSupport's cuts as tensor operations on x's device, for (R, V) fp64 logits: what every
// device but the CPU runs (the CPU's row loops are faster there). Exposed so that tests compare
// the two on the CPU.
at::Tensor SupportByTensorOps(const at::Tensor& x, const SamplingSettings& settings);
}  // namespace internal

}  // namespace strider::model
