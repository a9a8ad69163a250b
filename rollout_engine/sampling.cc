#include "rollout_engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace strider::rollout {

Status ValidateSamplingParams(const SamplingParams& p, int64_t vocabulary) {
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    return Status::InvalidArgument("sampling: temperature must be finite and >= 0, got " +
                                   std::to_string(p.temperature));
  }
  if (p.top_k < 0) {
    return Status::InvalidArgument("sampling: top_k must be >= 0, got " +
                                   std::to_string(p.top_k));
  }
  if (!(p.top_p > 0 && p.top_p <= 1)) {
    return Status::InvalidArgument("sampling: top_p must be in (0, 1], got " +
                                   std::to_string(p.top_p));
  }
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

namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

double UniformDraw(uint64_t seed, uint64_t counter) {
  const uint64_t bits = Mix(Mix(seed) ^ counter);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

uint64_t DeriveSeed(uint64_t seed, uint64_t index) {
  return Mix(seed ^ Mix(index + 0x5851f42d4c957f2dull));
}

Sample SampleToken(const float* logits, int64_t vocabulary, const SamplingParams& p,
                   double uniform, int64_t banned) {
  // The model's own distribution, in double.
  double max_logit = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < vocabulary; ++i) max_logit = std::max(max_logit, double(logits[i]));
  double model_sum = 0;
  for (int64_t i = 0; i < vocabulary; ++i) model_sum += std::exp(logits[i] - max_logit);
  const double model_log_norm = max_logit + std::log(model_sum);

  Sample sample;
  if (p.temperature == 0) {  // greedy: a point mass
    int64_t best = banned == 0 ? 1 : 0;
    for (int64_t i = best + 1; i < vocabulary; ++i) {
      if (i != banned && logits[i] > logits[best]) best = i;
    }
    sample.token = best;
    sample.log_prob = 0;
    sample.entropy = 0;
    sample.model_log_prob = logits[best] - model_log_norm;
    return sample;
  }

  // Candidates in descending probability, ties by lower id.
  std::vector<int32_t> order(vocabulary);
  std::iota(order.begin(), order.end(), 0);
  if (banned >= 0 && banned < vocabulary) order.erase(order.begin() + banned);
  auto more_likely = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int64_t keep = static_cast<int64_t>(order.size());
  if (p.top_k > 0 && p.top_k < keep) {
    keep = p.top_k;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), more_likely);
  } else {
    std::sort(order.begin(), order.end(), more_likely);
  }
  std::vector<double> weight(keep);
  double total = 0;
  for (int64_t j = 0; j < keep; ++j) {
    weight[j] = std::exp((logits[order[j]] - max_logit) / p.temperature);
    total += weight[j];
  }
  if (p.top_p < 1) {
    double mass = 0;
    int64_t cut = keep;
    for (int64_t j = 0; j < keep; ++j) {
      mass += weight[j] / total;
      if (mass >= p.top_p) {
        cut = j + 1;
        break;
      }
    }
    keep = cut;
    total = 0;
    for (int64_t j = 0; j < keep; ++j) total += weight[j];
  }
  // Inverse CDF over the kept candidates.
  const double target = uniform * total;
  double running = 0;
  int64_t chosen = keep - 1;
  for (int64_t j = 0; j < keep; ++j) {
    running += weight[j];
    if (target < running) {
      chosen = j;
      break;
    }
  }
  double entropy = 0;
  for (int64_t j = 0; j < keep; ++j) {
    const double q = weight[j] / total;
    if (q > 0) entropy -= q * std::log(q);
  }
  sample.token = order[chosen];
  sample.log_prob = std::log(weight[chosen] / total);
  sample.entropy = entropy;
  sample.model_log_prob = logits[sample.token] - model_log_norm;
  return sample;
}

}  // namespace strider::rollout
