// Scoring pass: one no-gradient RunChunkedPass per model over the joined trajectory; the
// objective callback gathers each chunk's action-token log-probs (and values) instead of
// returning a loss.
#include "learner/rl/scoring.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "common/model/sampling_distribution.h"
#include "common/model/torch_status.h"
#include "common/tokenizer.h"
#include "learner/learner.h"

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

// The stored experts of every position as a replay record (1, N, k) per sparse layer, in int16
// (the wire's uint16 ids, a quarter of int64's bytes: at a million tokens and three sparse layers
// of top-2 that is 12 MB held through the step instead of 48, and no whole-length staging copy);
// the chunked pass widens one chunk's slice at a time. N is the trajectory's length, or less when
// its last positions have no record: the actor records a position's experts when the engine
// feeds the token through the model (every sampled token is fed in the step that samples it),
// and context the actor stores after the last turn (a finished episode's verdict) is never fed.
// Those positions predict nothing the learner scores, so the passes stop before them; a position
// without a record anywhere else is an error.
Result<RoutingRecord> ReplayRecord(const std::vector<const schema::SegmentData*>& ordered,
                                   int64_t length, int64_t* covered) {
  const schema::RoutingRecord& first = ordered.front()->routing;
  const int64_t layers = first.layers;
  const int64_t k = first.top_k;
  std::vector<at::Tensor> per_layer;
  std::vector<int16_t*> rows_of;
  for (int64_t layer = 0; layer < layers; ++layer) {
    per_layer.push_back(at::zeros({1, length, k}, at::kShort));
    rows_of.push_back(per_layer.back().data_ptr<int16_t>());
  }
  int64_t first_missing = -1;  // trajectory position
  std::string missing_in;
  for (const schema::SegmentData* s : ordered) {
    if (s->routing.layers != layers || s->routing.top_k != k) {
      return Status::InvalidArgument("scoring: " + s->key().ToString() +
                                     " has a routing record of another shape");
    }
    std::vector<bool> has_record;
    const std::vector<uint16_t> rows = schema::ExpertsByPosition(*s, &has_record);
    for (size_t offset = 0; offset < has_record.size(); ++offset) {
      const int64_t position = static_cast<int64_t>(s->token_begin + offset);
      if (!has_record[offset] && first_missing < 0) {
        first_missing = position;
        missing_in = s->key().ToString() + " has none at offset " + std::to_string(offset) +
                     " (coverage " + std::string(schema::RoutingCoverageName(s->routing.coverage)) +
                     ")";
      } else if (has_record[offset] && first_missing >= 0) {
        return Status::FailedPrecondition(
            "scoring: routing replay needs experts for every position; " + missing_in);
      }
      if (position >= length) {
        return Status::InvalidArgument("scoring: " + s->key().ToString() +
                                       " has routing past the trajectory's " +
                                       std::to_string(length) + " tokens");
      }
      const uint16_t* from = rows.data() + offset * layers * k;
      for (int64_t layer = 0; layer < layers; ++layer) {
        for (int64_t j = 0; j < k; ++j) {
          const uint16_t expert = from[layer * k + j];
          if (expert > std::numeric_limits<int16_t>::max()) {
            return Status::InvalidArgument("scoring: " + s->key().ToString() + " routes to expert " +
                                           std::to_string(expert) + ", beyond int16's range");
          }
          rows_of[layer][position * k + j] = static_cast<int16_t>(expert);
        }
      }
    }
  }
  *covered = first_missing < 0 ? length : first_missing;
  if (*covered < 2) {
    return Status::FailedPrecondition(
        "scoring: routing replay needs experts for every position; " + missing_in);
  }
  RoutingRecord record;
  for (at::Tensor& layer : per_layer) {
    record.layers.push_back({*covered < length ? layer.narrow(1, 0, *covered) : layer,
                             at::Tensor()});
  }
  return record;
}

struct ScoredPass {
  std::vector<float> logprobs;  // per action token
  std::vector<float> full_logprobs;  // per action token, when asked for
  at::Tensor values;            // (L) when asked for
};

// `full` scores each token under the whole temperature-scaled distribution instead of the
// actor's top-k/top-p truncation (ChunkActionLogProbs).
Result<ScoredPass> Score(const Model& model, const PreparedTrajectory& trajectory,
                         bool replay, bool values, bool full, int64_t chunk_tokens,
                         ChunkRounds* rounds, bool also_full = false) {
  ChunkedPassOptions pass;
  pass.rounds = rounds;
  pass.path = TrainingPath::kInference;
  pass.chunk_tokens = chunk_tokens;
  pass.backward = false;
  pass.values = values;
  pass.replay_routing = replay && trajectory.replaying ? &trajectory.replay : nullptr;
  // The policy's pass feeds every action token alone, as the actor's engine decoded it, so that
  // its log-probs are the behaviour's arithmetic and not the chunked forms' rounding of it; the
  // reference is another model, compared with nothing the actor computed.
  if (!full) pass.fed_alone = &trajectory.positions;
  ScoredPass out;
  out.logprobs.assign(trajectory.positions.size(), 0.0f);
  if (also_full) out.full_logprobs.assign(trajectory.positions.size(), 0.0f);
  std::vector<at::Tensor> value_chunks;
  auto objective = [&](const ChunkView& chunk) -> Result<at::Tensor> {
    if (values) value_chunks.push_back(chunk.values[0].to(at::kFloat));
    std::vector<int64_t> slots;
    // The scored log-probs come to the host, one copy per chunk (docs/cuda.md).
    const at::Tensor lp = ChunkActionLogProbs(chunk.logits, chunk.begin, trajectory, &slots,
                                              /*entropy=*/nullptr, full)
                              .to(at::kCPU, at::kFloat)
                              .contiguous();
    const float* p = lp.data_ptr<float>();
    for (size_t i = 0; i < slots.size(); ++i) out.logprobs[slots[i]] = p[i];
    if (also_full) {
      const at::Tensor full_lp = ChunkActionLogProbs(chunk.logits, chunk.begin, trajectory,
                                                     &slots, /*entropy=*/nullptr, true)
                                     .to(at::kCPU, at::kFloat)
                                     .contiguous();
      const float* f = full_lp.data_ptr<float>();
      for (size_t i = 0; i < slots.size(); ++i) out.full_logprobs[slots[i]] = f[i];
    }
    return at::Tensor();
  };
  STRIDER_RETURN_IF_ERROR(model::Guarded("scoring", [&]() -> Status {
    // Only the objective's log-probs and values are wanted, not the pass's own result.
    STRIDER_RETURN_IF_ERROR(RunChunkedPass(model, trajectory.input, pass, objective).status());
    if (values) out.values = at::cat(value_chunks).to(at::kCPU).contiguous();
    return Status::Ok();
  }));
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

namespace {

// The ids the actor's engine never sampled (`sampling.banned`, comma-separated: none for a model
// with its own tokenizer); trajectories stored without it are the byte format's.
Result<std::vector<int64_t>> NeverSampled(const schema::StoredTrajectory& joined) {
  auto found = joined.metadata.find("sampling.banned");
  if (found == joined.metadata.end()) return model::ByteFormatNeverSampled();
  std::vector<int64_t> ids;
  std::string_view rest = found->second;
  while (!rest.empty()) {
    const std::string_view item = rest.substr(0, rest.find(','));
    rest.remove_prefix(std::min(rest.size(), item.size() + 1));
    int64_t id = 0;
    auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (error != std::errc() || end != item.data() + item.size()) {
      return Status::InvalidArgument("scoring: trajectory " + joined.id.Hex() +
                                     ": sampling.banned '" + found->second +
                                     "' is not a list of ids");
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

Result<PreparedTrajectory> PrepareTrajectory(std::span<const schema::SegmentData> segments,
                                             bool replay_routing, int64_t vocabulary) {
  PreparedTrajectory prepared;
  STRIDER_ASSIGN_OR_RETURN(prepared.joined, schema::JoinSegments(segments));
  STRIDER_ASSIGN_OR_RETURN(const std::vector<int64_t> never_sampled,
                           NeverSampled(prepared.joined));
  const std::vector<const schema::SegmentData*> ordered = Ordered(segments);
  for (const schema::SegmentData* s : ordered) {
    const model::SamplingSettings settings =
        model::RolloutSamplingSettings(s->temperature, s->top_k, s->top_p, never_sampled);
    Status valid = model::ValidateSamplingSettings(settings, vocabulary);
    if (!valid.ok()) {
      return Status::InvalidArgument("scoring: " + s->key().ToString() + ": " + valid.message());
    }
    auto it = std::find_if(prepared.distributions.begin(), prepared.distributions.end(),
                           [&](const auto& d) { return d.settings == settings; });
    if (it == prepared.distributions.end()) {
      prepared.distributions.push_back({settings, {}});
      it = prepared.distributions.end() - 1;
    }
    size_t run = 0;
    for (size_t offset = 0; offset < s->tokens.size(); ++offset) {
      while (run + 1 < s->policy_runs.size() && s->policy_runs[run + 1].begin <= offset) ++run;
      const int64_t position = static_cast<int64_t>(s->token_begin + offset);
      if (!schema::IsAction(s->roles[offset]) || position == 0) continue;
      it->actions.push_back(static_cast<int64_t>(prepared.positions.size()));
      prepared.positions.push_back(position);
      prepared.behaviour_logprobs.push_back(s->behaviour_logprobs[offset]);
      prepared.versions.push_back(s->policy_runs[run].version);
    }
  }
  const schema::StoredTrajectory& joined = prepared.joined;
  prepared.input.tokens = at::empty({1, static_cast<int64_t>(joined.tokens.size())}, at::kLong);
  std::copy(joined.tokens.begin(), joined.tokens.end(), prepared.input.tokens.data_ptr<int64_t>());
  for (const schema::Image& image : joined.images) {
    std::vector<uint8_t> bytes(image.pixels.begin(), image.pixels.end());
    prepared.input.images.push_back(
        {0, at::tensor(bytes, at::kByte)
                .view({image.height, image.width, image.channels})
                .to(at::kFloat)
                .div_(255.0)});
  }
  prepared.replaying = replay_routing && ordered.front()->routing.layers > 0;
  if (prepared.replaying) {
    int64_t covered = 0;
    STRIDER_ASSIGN_OR_RETURN(
        prepared.replay,
        ReplayRecord(ordered, static_cast<int64_t>(joined.tokens.size()), &covered));
    if (covered < prepared.length()) {
      if (!prepared.positions.empty() && prepared.positions.back() > covered) {
        return Status::FailedPrecondition(
            "scoring: routing replay needs experts for every position before the last action; " +
            joined.id.Hex() + " has records for its first " + std::to_string(covered) +
            " positions only");
      }
      // The value after the last step is the bootstrap at a truncation (ScorePrepared): it needs
      // every token of that step fed, as replay would route them. Every action token carries its
      // experts, so only a record cut inside a step's last tokens lands here.
      if (!joined.steps.empty() && joined.steps.back().end > static_cast<uint64_t>(covered)) {
        return Status::FailedPrecondition(
            "scoring: routing replay needs experts for every position of the last step; " +
            joined.id.Hex() + " has records for its first " + std::to_string(covered) +
            " positions only, and its last step ends at " +
            std::to_string(joined.steps.back().end));
      }
      prepared.input.tokens = prepared.input.tokens.narrow(1, 0, covered).contiguous();
      // The images of the unfed tail (an observation's) go with it.
      size_t runs = 0;
      for (int64_t i = 0; i < covered; ++i) {
        if (joined.tokens[i] == token::kImagePatch &&
            (i == 0 || joined.tokens[i - 1] != token::kImagePatch)) {
          ++runs;
        }
      }
      if (covered < static_cast<int64_t>(joined.tokens.size()) &&
          joined.tokens[covered] == token::kImagePatch && covered > 0 &&
          joined.tokens[covered - 1] == token::kImagePatch) {
        return Status::FailedPrecondition("scoring: " + joined.id.Hex() +
                                          ": the routing record ends inside an image");
      }
      prepared.input.images.resize(std::min(runs, prepared.input.images.size()));
    }
  }
  return prepared;
}

model::SamplingSettings FullDistribution(const model::SamplingSettings& settings) {
  model::SamplingSettings full = settings;
  full.top_k = 0;
  full.top_p = 1.0;
  // Greedy turns have no temperature to scale by: the reference is scored at 1.
  if (!(full.temperature > 0)) full.temperature = 1.0;
  return full;
}

at::Tensor ChunkActionLogProbs(const at::Tensor& logits, int64_t chunk_begin,
                               const PreparedTrajectory& trajectory, std::vector<int64_t>* slots,
                               at::Tensor* entropy, bool full_distribution) {
  slots->clear();
  // The logits at position p predict the token at p + 1.
  const int64_t end = chunk_begin + logits.size(1);
  // Only the action rows go to float64: a chunk's whole (T, V) in float64 would be the
  // largest tensor of a no-gradient chunk, and its gradient as large again.
  const at::Tensor rows_logits = logits[0];
  const at::TensorOptions double_options = logits.options().dtype(at::kDouble);
  const at::Tensor tokens = trajectory.input.tokens[0];
  std::vector<at::Tensor> parts, entropies;
  for (const PreparedTrajectory::Distribution& d : trajectory.distributions) {
    std::vector<int64_t> rows, targets;
    // A distribution's actions are in position order: only those the chunk predicts are
    // visited, so a long trajectory's passes stay linear in its actions, not actions x chunks.
    auto first = std::lower_bound(d.actions.begin(), d.actions.end(), chunk_begin,
                                  [&](int64_t action, int64_t begin) {
                                    return trajectory.positions[action] - 1 < begin;
                                  });
    for (auto it = first; it != d.actions.end(); ++it) {
      const int64_t action = *it;
      const int64_t predicted_at = trajectory.positions[action] - 1;
      if (predicted_at >= end) break;
      rows.push_back(predicted_at - chunk_begin);
      targets.push_back(trajectory.positions[action]);
      slots->push_back(action);
    }
    if (rows.empty()) continue;
    // Positions are chosen on the host; the rows are picked where the logits are.
    const at::Tensor chosen =
        rows_logits.index_select(0, at::tensor(rows, at::kLong).to(logits.device()))
            .to(at::kDouble);
    const at::Tensor target =
        tokens.index_select(0, at::tensor(targets, at::kLong).to(tokens.device()))
            .to(logits.device());
    const model::SamplingSettings settings =
        full_distribution ? FullDistribution(d.settings) : d.settings;
    if (entropy != nullptr) {
      const at::Tensor all = model::SamplingLogProbs(chosen, settings);
      parts.push_back(all.gather(1, target.unsqueeze(1)).squeeze(1));
      entropies.push_back(model::SamplingEntropy(all));
    } else {
      parts.push_back(model::SampledTokenLogProbs(chosen, target, settings));
    }
  }
  if (parts.empty()) {
    if (entropy != nullptr) *entropy = at::zeros({0}, double_options);
    return at::zeros({0}, double_options);
  }
  if (entropy != nullptr) *entropy = entropies.size() == 1 ? entropies[0] : at::cat(entropies);
  return parts.size() == 1 ? parts[0] : at::cat(parts);
}

Result<TrajectoryScores> ScorePrepared(const Model& model, const PreparedTrajectory& trajectory,
                                       const ScoringOptions& options, const Model* reference) {
  const schema::StoredTrajectory& joined = trajectory.joined;
  TrajectoryScores scores;
  scores.id = joined.id;
  scores.length = static_cast<int64_t>(joined.tokens.size());
  scores.positions = trajectory.positions;
  scores.behaviour_logprobs = trajectory.behaviour_logprobs;
  scores.versions = trajectory.versions;
  STRIDER_ASSIGN_OR_RETURN(ScoredPass own, Score(model, trajectory, options.replay_routing,
                                                 options.values, /*full=*/false,
                                                 options.chunk_tokens, options.rounds,
                                                 options.full_logprobs));
  scores.logprobs = std::move(own.logprobs);
  scores.full_logprobs = std::move(own.full_logprobs);
  if (reference != nullptr) {
    // The reference is a distribution over the whole vocabulary, not the actor's sampler: under
    // the actor's truncation a sampled token outside the reference's own nucleus scored -inf,
    // and the KL with it (veRL and TRL score the reference untruncated too).
    STRIDER_ASSIGN_OR_RETURN(ScoredPass ref,
                             Score(*reference, trajectory, false, false, /*full=*/true,
                                   options.chunk_tokens, options.rounds));
    scores.reference_logprobs = std::move(ref.logprobs);
  }
  if (options.values) {
    const float* v = own.values.data_ptr<float>();
    const uint64_t passed = static_cast<uint64_t>(trajectory.length());  // values computed
    for (const schema::StoredStep& step : joined.steps) {
      uint64_t first = step.begin;
      while (first < step.end && !schema::IsAction(joined.roles[first])) ++first;
      const uint64_t at = first < step.end ? std::max<uint64_t>(first, 1) - 1 : step.end - 1;
      scores.step_values.push_back(v[std::min(at, passed - 1)]);
    }
    for (int64_t position : trajectory.positions) scores.action_values.push_back(v[position - 1]);
    // The bootstrap V_{K+1} is the value of the state after the last step: every token through
    // its end seen, the same position with routing replay or without. Tokens after it belong to
    // no step (a turn a stopped actor left unanswered, an observation or verdict after the last
    // turn) and are not part of that state; and a position inside the step would count the
    // step's own reward again in what the bootstrap stands for.
    const uint64_t after = joined.steps.empty() ? passed : joined.steps.back().end;
    scores.final_value = after > 0 ? v[std::min(after, passed) - 1] : 0.0f;
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

Result<TrajectoryScores> ScoreTrajectory(const Model& model,
                                         std::span<const schema::SegmentData> segments,
                                         const ScoringOptions& options,
                                         const Model* reference) {
  STRIDER_ASSIGN_OR_RETURN(
      PreparedTrajectory prepared,
      PrepareTrajectory(segments, options.replay_routing, model.config().vocabulary));
  return ScorePrepared(model, prepared, options, reference);
}

}  // namespace strider::rl
