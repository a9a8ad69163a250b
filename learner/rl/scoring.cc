// Scoring pass: one no-gradient RunChunkedPass per model over the joined trajectory; the
// objective callback gathers each chunk's action-token log-probs (and values) instead of
// returning a loss.
#include "learner/rl/scoring.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "common/model/sampling_distribution.h"
#include "learner/learner.h"
#include "reward/trajectory.h"

namespace strider::rl {
namespace {

// Each trajectory position's segment, in segment-index order (JoinSegments accepts any order).
std::vector<const schema::SegmentData*> Ordered(std::span<const schema::SegmentData> segments) {
  std::vector<const schema::SegmentData*> ordered;
  for (const schema::SegmentData& s : segments) ordered.push_back(&s);
  std::sort(ordered.begin(), ordered.end(),
            [](const auto* a, const auto* b) { return a->segment_index < b->segment_index; });
  return ordered;
}

// The stored experts of every position as a replay record (1, L, k) per sparse layer.
Result<RoutingRecord> ReplayRecord(const std::vector<const schema::SegmentData*>& ordered,
                                   int64_t length) {
  const schema::RoutingRecord& first = ordered.front()->routing;
  const int64_t layers = first.layers;
  const int64_t k = first.top_k;
  std::vector<int64_t> experts;
  experts.reserve(length * layers * k);
  for (const schema::SegmentData* s : ordered) {
    if (s->routing.layers != layers || s->routing.top_k != k) {
      return Status::InvalidArgument("scoring: " + s->key().ToString() +
                                     " has a routing record of another shape");
    }
    std::vector<bool> has_record;
    const std::vector<uint16_t> rows = schema::ExpertsByPosition(*s, &has_record);
    const auto missing = std::find(has_record.begin(), has_record.end(), false);
    if (missing != has_record.end()) {
      return Status::FailedPrecondition(
          "scoring: routing replay needs experts for every position; " + s->key().ToString() +
          " has none at offset " + std::to_string(missing - has_record.begin()) + " (coverage " +
          std::string(schema::RoutingCoverageName(s->routing.coverage)) + ")");
    }
    experts.insert(experts.end(), rows.begin(), rows.end());
  }
  // (L, layers, k) -> one (1, L, k) tensor per layer.
  at::Tensor all = at::tensor(experts, at::kLong).view({length, layers, k});
  RoutingRecord record;
  for (int64_t layer = 0; layer < layers; ++layer) {
    record.layers.push_back({all.select(1, layer).unsqueeze(0).contiguous(), at::Tensor()});
  }
  return record;
}

// Where each distinct sampling distribution's action tokens are, as indices into the
// trajectory's action list; segments usually all share one.
struct Distribution {
  model::SamplingSettings settings;
  std::vector<int64_t> actions;
};

struct ScoredPass {
  std::vector<float> logprobs;  // per action token
  at::Tensor values;            // (L) when asked for
};

Result<ScoredPass> Score(const Model& model, const ModelInput& input,
                         const std::vector<int64_t>& positions,
                         const std::vector<Distribution>& distributions,
                         const RoutingRecord* replay, bool values, int64_t chunk_tokens) {
  ChunkedPassOptions pass;
  pass.path = TrainingPath::kInference;
  pass.chunk_tokens = chunk_tokens;
  pass.backward = false;
  pass.values = values;
  pass.replay_routing = replay;
  const int64_t vocabulary = model.config().vocabulary;
  for (const Distribution& d : distributions) {
    STRIDER_RETURN_IF_ERROR(model::ValidateSamplingSettings(d.settings, vocabulary));
  }
  ScoredPass out;
  out.logprobs.assign(positions.size(), 0.0f);
  std::vector<at::Tensor> value_chunks;
  const at::Tensor tokens = input.tokens[0];
  auto objective = [&](const ChunkView& chunk) -> Result<at::Tensor> {
    if (values) value_chunks.push_back(chunk.values[0].to(at::kFloat));
    // The logits at position p predict the token at p + 1.
    const int64_t end = chunk.begin + chunk.count;
    const at::Tensor logits = chunk.logits[0].to(at::kDouble);  // the sampler's precision
    for (const Distribution& d : distributions) {
      std::vector<int64_t> rows, targets, slots;
      for (int64_t action : d.actions) {
        const int64_t predicted_at = positions[action] - 1;
        if (predicted_at < chunk.begin || predicted_at >= end) continue;
        rows.push_back(predicted_at - chunk.begin);
        targets.push_back(positions[action]);
        slots.push_back(action);
      }
      if (rows.empty()) continue;
      const at::Tensor lp =
          model::SampledTokenLogProbs(logits.index_select(0, at::tensor(rows, at::kLong)),
                                      tokens.index_select(0, at::tensor(targets, at::kLong)),
                                      d.settings)
              .to(at::kFloat)
              .contiguous();
      const float* p = lp.data_ptr<float>();
      for (size_t i = 0; i < slots.size(); ++i) out.logprobs[slots[i]] = p[i];
    }
    return at::Tensor();
  };
  try {
    STRIDER_ASSIGN_OR_RETURN(ChunkedPassResult ignored,
                             RunChunkedPass(model, input, pass, objective));
    (void)ignored;
    if (values) out.values = at::cat(value_chunks).contiguous();
  } catch (const c10::Error& error) {
    return Status::Internal(std::string("scoring: ") + error.what_without_backtrace());
  }
  return out;
}

}  // namespace

std::string_view MismatchVerdictName(MismatchVerdict verdict) {
  switch (verdict) {
    case MismatchVerdict::kNotMeasured:
      return "not_measured";
    case MismatchVerdict::kWithinThreshold:
      return "within_threshold";
    case MismatchVerdict::kAboveThreshold:
      return "above_threshold";
  }
  return "unknown";
}

MismatchStats MeasureMismatch(std::span<const float> learner, std::span<const float> behaviour,
                              double threshold) {
  MismatchStats stats;
  const size_t n = std::min(learner.size(), behaviour.size());
  if (n == 0) return stats;
  std::vector<double> gaps(n);
  for (size_t i = 0; i < n; ++i) {
    const double gap =
        std::abs(static_cast<double>(learner[i]) - static_cast<double>(behaviour[i]));
    // -inf on one side only (a token outside the learner's support) is an infinite gap, and
    // -inf on both sides cannot happen for a sampled token; NaN counts as infinite too.
    gaps[i] = std::isnan(gap) ? std::numeric_limits<double>::infinity() : gap;
    if (gaps[i] > threshold) ++stats.above;
  }
  std::sort(gaps.begin(), gaps.end());
  stats.tokens = static_cast<int64_t>(n);
  stats.max = gaps.back();
  const size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n)));
  stats.p99 = gaps[std::max<size_t>(rank, 1) - 1];
  stats.verdict =
      stats.above > 0 ? MismatchVerdict::kAboveThreshold : MismatchVerdict::kWithinThreshold;
  return stats;
}

Result<TrajectoryScores> ScoreTrajectory(const Model& model,
                                         std::span<const schema::SegmentData> segments,
                                         const ScoringOptions& options,
                                         const Model* reference) {
  STRIDER_ASSIGN_OR_RETURN(reward::StoredTrajectory joined, reward::JoinSegments(segments));
  const std::vector<const schema::SegmentData*> ordered = Ordered(segments);
  TrajectoryScores scores;
  scores.id = joined.id;
  scores.length = static_cast<int64_t>(joined.tokens.size());

  std::vector<Distribution> distributions;
  for (const schema::SegmentData* s : ordered) {
    const model::SamplingSettings settings =
        model::RolloutSamplingSettings(s->temperature, s->top_k, s->top_p);
    auto it = std::find_if(distributions.begin(), distributions.end(),
                           [&](const Distribution& d) { return d.settings == settings; });
    if (it == distributions.end()) {
      distributions.push_back({settings, {}});
      it = distributions.end() - 1;
    }
    size_t run = 0;
    for (size_t offset = 0; offset < s->tokens.size(); ++offset) {
      while (run + 1 < s->policy_runs.size() && s->policy_runs[run + 1].begin <= offset) ++run;
      const int64_t position = static_cast<int64_t>(s->token_begin + offset);
      if (!schema::IsAction(s->roles[offset]) || position == 0) continue;
      it->actions.push_back(static_cast<int64_t>(scores.positions.size()));
      scores.positions.push_back(position);
      scores.behaviour_logprobs.push_back(s->behaviour_logprobs[offset]);
      scores.versions.push_back(s->policy_runs[run].version);
    }
  }

  ModelInput input;
  std::vector<int64_t> ids(joined.tokens.begin(), joined.tokens.end());
  input.tokens = at::tensor(ids, at::kLong).view({1, -1});
  for (const schema::Image& image : joined.images) {
    std::vector<uint8_t> bytes(image.pixels.begin(), image.pixels.end());
    input.images.push_back(
        {0, at::tensor(bytes, at::kByte)
                .view({image.height, image.width, image.channels})
                .to(at::kFloat)
                .div_(255.0)});
  }
  RoutingRecord replay;
  const bool replaying = options.replay_routing && ordered.front()->routing.layers > 0;
  if (replaying) {
    STRIDER_ASSIGN_OR_RETURN(replay, ReplayRecord(ordered, scores.length));
  }
  STRIDER_ASSIGN_OR_RETURN(
      ScoredPass own, Score(model, input, scores.positions, distributions,
                            replaying ? &replay : nullptr, options.values, options.chunk_tokens));
  scores.logprobs = std::move(own.logprobs);
  if (reference != nullptr) {
    STRIDER_ASSIGN_OR_RETURN(ScoredPass ref, Score(*reference, input, scores.positions,
                                                   distributions, nullptr, false,
                                                   options.chunk_tokens));
    scores.reference_logprobs = std::move(ref.logprobs);
  }
  if (options.values) {
    const float* v = own.values.data_ptr<float>();
    for (const reward::StoredStep& step : joined.steps) {
      uint64_t first = step.begin;
      while (first < step.end && !schema::IsAction(joined.roles[first])) ++first;
      const uint64_t at = first < step.end ? std::max<uint64_t>(first, 1) - 1 : step.end - 1;
      scores.step_values.push_back(v[at]);
    }
  }
  const bool single_version =
      !scores.versions.empty() &&
      std::all_of(scores.versions.begin(), scores.versions.end(),
                  [&](uint64_t v) { return v == scores.versions.front(); });
  if (single_version) {
    scores.mismatch =
        MeasureMismatch(scores.logprobs, scores.behaviour_logprobs, options.mismatch_threshold);
  }
  return scores;
}

}  // namespace strider::rl
