#include "rollout_engine/sampling.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/model/torch_status.h"
#include "common/random.h"

namespace strider::rollout {

Status ValidateSamplingParams(const SamplingParams& p, int64_t vocabulary) {
  // The distribution's own fields are checked where the distribution is defined; the
  // never-sampled placeholder is the engine's, not the request's, so it is not checked here.
  STRIDER_RETURN_IF_ERROR(model::ValidateSamplingSettings(
      model::SamplingSettings{p.temperature, p.top_k, p.top_p, {}}, vocabulary));
  if (p.max_new_tokens < 1) {
    return Status::InvalidArgument("sampling: max_new_tokens must be >= 1, got " +
                                   std::to_string(p.max_new_tokens));
  }
  for (int64_t token : p.stop_tokens) {
    if (token < 0 || token >= vocabulary) {
      return Status::InvalidArgument("sampling: stop token " + std::to_string(token) +
                                     " is outside the vocabulary [0, " +
                                     std::to_string(vocabulary) + ")");
    }
  }
  for (const std::string& stop : p.stop_strings) {
    if (stop.empty()) return Status::InvalidArgument("sampling: empty stop string");
  }
  return Status::Ok();
}

double UniformDraw(uint64_t seed, uint64_t counter) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ counter);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

uint64_t DeriveSeed(uint64_t seed, uint64_t index) {
  return SplitMix64(seed ^ SplitMix64(index + 0x5851f42d4c957f2dull));
}

model::SamplingSettings TurnDistribution(const SamplingParams& params,
                                         std::vector<int64_t> never_sampled) {
  return model::RolloutSamplingSettings(params.temperature, params.top_k, params.top_p,
                                        std::move(never_sampled));
}

namespace {

// Inverse CDF over one row of the sampling distribution's log-probs, in descending probability
// with ties to the lower id: the order the sampler has always walked, so a draw picks the token
// it picked before the distribution was shared.
Sample DrawRow(const double* log_probs, const double* model_log_probs, int64_t vocabulary,
               double uniform) {
  std::vector<int32_t> order;
  order.reserve(vocabulary);
  for (int64_t i = 0; i < vocabulary; ++i) {
    if (log_probs[i] > -std::numeric_limits<double>::infinity()) {
      order.push_back(static_cast<int32_t>(i));
    }
  }
  TORCH_CHECK(!order.empty(), "sampling: no token has a finite probability (non-finite logits)");
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return log_probs[a] > log_probs[b] || (log_probs[a] == log_probs[b] && a < b);
  });
  double total = 0;
  for (int32_t id : order) total += std::exp(log_probs[id]);
  // Scaled by the total, so rounding in a sum that is 1 only up to rounding cannot leave a draw
  // past the last token.
  const double target = uniform * total;
  double running = 0;
  int32_t chosen = order.back();
  double entropy = 0;
  bool found = false;
  for (int32_t id : order) {
    const double q = std::exp(log_probs[id]);
    running += q;
    if (!found && target < running) {
      chosen = id;
      found = true;
    }
    if (q > 0) entropy -= q * log_probs[id];
  }
  Sample sample;
  sample.token = chosen;
  sample.log_prob = log_probs[chosen];
  sample.model_log_prob = model_log_probs[chosen];
  sample.entropy = entropy;
  return sample;
}

}  // namespace

namespace internal {

std::vector<Sample> DrawByTensorOps(const at::Tensor& log_probs, const at::Tensor& model_log_probs,
                                    const std::vector<double>& uniforms) {
  constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();
  const int64_t rows = log_probs.size(0);
  // The loop's walk: descending probability, ties to the lower id (a stable sort keeps id
  // order among equal values), the tokens of probability 0 last.
  const auto [sorted, order] =
      at::sort(log_probs, /*stable=*/true, /*dim=*/1, /*descending=*/true);
  const at::Tensor finite = sorted > kMinusInfinity;                          // (B, V)
  const at::Tensor count = finite.sum(1);                                     // (B)
  TORCH_CHECK((count > 0).all().item<bool>(),
              "sampling: no token has a finite probability (non-finite logits)");
  const at::Tensor q = sorted.exp();                                          // 0 where -inf
  const at::Tensor running = q.cumsum(1);
  const at::Tensor target =
      at::tensor(uniforms, at::kDouble).to(log_probs.device()) * running.select(1, -1);
  // The first rank whose running mass exceeds the target; past the last finite token (rounding)
  // the last finite token, as the loop does.
  const at::Tensor rank =
      at::minimum((running <= target.unsqueeze(1)).sum(1), count - 1).unsqueeze(1);  // (B, 1)
  const at::Tensor token = order.gather(1, rank);                                   // (B, 1)
  const at::Tensor entropy = -(q * sorted.masked_fill(finite.logical_not(), 0)).sum(1);
  // Only these four numbers per row come back to the host (docs/cuda.md).
  const at::Tensor host = at::stack({token.squeeze(1).to(at::kDouble),
                                     log_probs.gather(1, token).squeeze(1),
                                     model_log_probs.gather(1, token).squeeze(1), entropy},
                                    1)
                              .cpu()
                              .contiguous();
  const double* data = host.data_ptr<double>();
  std::vector<Sample> samples(rows);
  for (int64_t b = 0; b < rows; ++b) {
    samples[b].token = static_cast<int64_t>(data[4 * b]);
    samples[b].log_prob = data[4 * b + 1];
    samples[b].model_log_prob = data[4 * b + 2];
    samples[b].entropy = data[4 * b + 3];
  }
  return samples;
}

}  // namespace internal

Result<std::vector<Sample>> SampleTokens(const at::Tensor& logits,
                                         const std::vector<model::SamplingSettings>& distributions,
                                         const std::vector<double>& uniforms) {
  if (logits.dim() != 2 || logits.size(0) != static_cast<int64_t>(distributions.size()) ||
      distributions.size() != uniforms.size()) {
    return Status::InvalidArgument("sampling: logits must be (B, V) with B settings and draws");
  }
  const int64_t rows = logits.size(0);
  const int64_t vocabulary = logits.size(1);
  for (const model::SamplingSettings& distribution : distributions) {
    STRIDER_RETURN_IF_ERROR(model::ValidateSamplingSettings(distribution, vocabulary));
  }
  return model::Guarded("sampling", [&]() -> Result<std::vector<Sample>> {
    at::NoGradGuard no_grad;
    const at::Tensor x = logits.to(at::kDouble).contiguous();
    const at::Tensor model_log_probs = at::log_softmax(x, -1).contiguous();
    // Rows with equal settings in one call (a step's rows usually all share them).
    at::Tensor log_probs;
    std::vector<bool> done(rows, false);
    for (int64_t b = 0; b < rows; ++b) {
      if (done[b]) continue;
      std::vector<int64_t> group;
      for (int64_t other = b; other < rows; ++other) {
        if (!done[other] && distributions[other] == distributions[b]) {
          group.push_back(other);
          done[other] = true;
        }
      }
      if (static_cast<int64_t>(group.size()) == rows) {
        log_probs = model::SamplingLogProbs(x, distributions[b]);
        break;
      }
      if (!log_probs.defined()) log_probs = at::empty_like(x);
      const at::Tensor index = at::tensor(group, at::kLong).to(x.device());
      log_probs.index_copy_(0, index,
                            model::SamplingLogProbs(x.index_select(0, index), distributions[b]));
    }
    log_probs = log_probs.contiguous();
    // Off the CPU the draw runs where the logits are and only the samples come back.
    if (!x.device().is_cpu()) {
      return internal::DrawByTensorOps(log_probs, model_log_probs, uniforms);
    }
    std::vector<Sample> samples;
    samples.reserve(rows);
    for (int64_t b = 0; b < rows; ++b) {
      samples.push_back(DrawRow(log_probs.data_ptr<double>() + b * vocabulary,
                                model_log_probs.data_ptr<double>() + b * vocabulary, vocabulary,
                                uniforms[b]));
    }
    return samples;
  });
}

Result<Sample> SampleToken(const float* logits, int64_t vocabulary,
                           const model::SamplingSettings& distribution, double uniform) {
  at::Tensor row = at::from_blob(const_cast<float*>(logits), {1, vocabulary}, at::kFloat);
  STRIDER_ASSIGN_OR_RETURN(std::vector<Sample> samples,
                           SampleTokens(row, {distribution}, {uniform}));
  return samples[0];
}

}  // namespace strider::rollout
