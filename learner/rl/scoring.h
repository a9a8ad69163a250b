// Scoring a stored trajectory before an update: the learner's log-prob of every action token,
// the reference policy's, the value at each step's start, and the mismatch check that decides
// whether the trajectory may be trained on at all.
//
// The pass runs without gradient along the inference path (Model::Append chunk by chunk, the
// rollout engine's path) with each position's stored experts forced (routing replay), and
// evaluates the sampling distribution the actor drew from (model::SampledTokenLogProbs under
// each segment's temperature, top-k and top-p, the image-patch placeholder never sampled). With
// the actor's weights this reproduces the stored behaviour log-probs; what is left is the
// rounding of two evaluations of the same fp32 model (docs/learner.md has measured figures).
//
// Mismatch check: on a trajectory whose action tokens all carry one policy version, max and p99
// of |learner - behaviour| over its action tokens. A trajectory above the threshold is reported
// (kAboveThreshold) and the caller excludes it: a learner that trains on it would compute its
// ratio against a distribution the actor did not sample from (wrong settings, lost routing, a
// mislabelled version). Trajectories of several versions are not measured here; the truncated
// importance weights of the loss correct for them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "common/model/sampling_distribution.h"
#include "common/schema/messages.h"
#include "common/schema/trajectory.h"
#include "common/status.h"
#include "learner/rl/scoring_options.h"

namespace strider::rl {

enum class MismatchVerdict {
  kNotMeasured,     // action tokens of several policy versions, or none at all
  kWithinThreshold,
  kAboveThreshold,  // excluded from training
};
std::string_view MismatchVerdictName(MismatchVerdict verdict);  // "not_measured", ...

struct MismatchStats {
  MismatchVerdict verdict = MismatchVerdict::kNotMeasured;
  int64_t tokens = 0;  // action tokens measured
  double max = 0;      // |learner - behaviour|, inf when a token fell outside one support
  double p99 = 0;      // nearest rank
  int64_t above = 0;   // tokens above the threshold
};

// A stored trajectory made ready for passes over it (scoring, then the update): its segments
// joined, the model input, its action tokens with the distribution each was sampled from, and
// the routing record that replays the stored experts.
struct PreparedTrajectory {
  schema::StoredTrajectory joined;
  // Tokens (1, N) and the images. N is the trajectory's length, or less under routing replay
  // when its last positions are context the actor never fed (so no experts were recorded), such
  // as a finished episode's verdict: their logits would predict nothing, and every step ends
  // before them.
  ModelInput input;
  RoutingRecord replay;   // (1, L, k) int16 per sparse layer when `replaying`
  bool replaying = false;
  // One entry per action token, in order. Token 0 has no prediction and is never an action.
  std::vector<int64_t> positions;  // trajectory positions
  std::vector<float> behaviour_logprobs;
  std::vector<uint64_t> versions;  // policy version each was sampled under
  // Each distinct sampling distribution and its action tokens (indices into `positions`);
  // segments usually all share one.
  struct Distribution {
    model::SamplingSettings settings;
    std::vector<int64_t> actions;
  };
  std::vector<Distribution> distributions;

  int64_t length() const { return input.tokens.defined() ? input.tokens.size(1) : 0; }
};

// Joins and checks the segments (any order) and builds the above. Errors: the segments do not
// join (schema::JoinSegments), a segment's sampling settings (with the reserved ids the
// trajectory stored as `sampling.banned`, the byte format's when absent) are out of range for
// `vocabulary` or not a list of ids, routing replay asked for on segments lacking a position's
// record (the message names it).
Result<PreparedTrajectory> PrepareTrajectory(std::span<const schema::SegmentData> segments,
                                             bool replay_routing, int64_t vocabulary);

// The action tokens one chunk of a pass over `trajectory` predicts: their log-probs under their
// sampling distributions, from the chunk's logits (1, count, V), in the logits' graph; and the
// entropy of each of those distributions when `entropy` is not null. `slots` gets the index
// (into trajectory.positions) of each entry. Computed in fp64, the sampler's precision.
// `full_distribution` drops the top-k/top-p truncation and keeps the temperature (1 for a
// greedy turn) and the never-sampled ids: the reference policy's view (FullDistribution).
at::Tensor ChunkActionLogProbs(const at::Tensor& logits, int64_t chunk_begin,
                               const PreparedTrajectory& trajectory, std::vector<int64_t>* slots,
                               at::Tensor* entropy = nullptr, bool full_distribution = false);

// `settings` without its top-k and top-p truncation, at its temperature (1 when greedy).
model::SamplingSettings FullDistribution(const model::SamplingSettings& settings);

struct TrajectoryScores {
  schema::TrajectoryId id;
  int64_t length = 0;  // tokens
  // One entry per action token, in order. Token 0 has no prediction and is never an action.
  std::vector<int64_t> positions;  // trajectory positions
  std::vector<float> logprobs;     // the learner's, under the stored sampling settings
  // The learner's under the full temperature-scaled distribution, as the reference's, when
  // ScoringOptions::full_logprobs asked for them.
  std::vector<float> full_logprobs;
  std::vector<float> behaviour_logprobs;
  // When a reference model was given: under the full temperature-scaled distribution, not the
  // actor's top-k/top-p truncation (the learner's own log-probs keep it: they are compared with
  // the behaviour policy's), so every sampled token has a finite reference log-prob.
  std::vector<float> reference_logprobs;
  std::vector<uint64_t> versions;         // policy version each was sampled under
  // One entry per stored step when values were asked for: the value-head estimate at the
  // position the step's first action token was sampled from (what the policy saw before
  // acting). A step without action tokens takes the value at its last position.
  std::vector<float> step_values;
  // When values were asked for: per action token, the value at the position it was sampled
  // from (what the policy saw before acting); and the value of the state after the last step,
  // at its last token (the bootstrap at a truncation), whether routing is replayed or not.
  // Without steps, the value after the last token passed.
  std::vector<float> action_values;
  float final_value = 0;
  MismatchStats mismatch;
};

// Scores one trajectory given as all of its segments (any order). Errors: the segments do not
// join (schema::JoinSegments: gaps, overlaps, a missing last segment), a segment's sampling
// settings are out of range, routing replay asked for on segments lacking a position's record,
// or the model fails. `reference`, when not null, is scored on the same tokens with its own
// routing (the reference is a fixed policy; forcing the actor's experts on it would make the KL
// depend on the current policy's routing). The models are only read.
Result<TrajectoryScores> ScoreTrajectory(const Model& model,
                                         std::span<const schema::SegmentData> segments,
                                         const ScoringOptions& options,
                                         const Model* reference = nullptr);

// The same on a prepared trajectory (the update pass reuses its input and replay record).
Result<TrajectoryScores> ScorePrepared(const Model& model, const PreparedTrajectory& trajectory,
                                       const ScoringOptions& options,
                                       const Model* reference = nullptr);

// The mismatch statistics of learner against behaviour log-probs of one version's tokens.
MismatchStats MeasureMismatch(std::span<const float> learner, std::span<const float> behaviour,
                              double threshold);

}  // namespace strider::rl
