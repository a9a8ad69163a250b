// The scoring pass and the mismatch check: MeasureMismatch on hand-made gaps (max, p99 by
// nearest rank, infinite and NaN gaps, the threshold's verdict); ScoreTrajectory's refusals
// (segments that do not join, routing replay without a record for every position, settings out
// of range); and trajectories the rollout engine sampled in this process, cut into segments by
// the actor's segmenter, which the pass must score to the engine's own stored log-probs at
// temperature 1 and under temperature, top-k and top-p.
#include "learner/rl/scoring.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>

#include "actors/segmenter.h"
#include "common/model/model.h"
#include "common/tokenizer.h"
#include "rollout_engine/engine.h"
#include "tests/shipped_config.h"

namespace strider::rl {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// --- MeasureMismatch ---

MismatchStats Measure(const std::vector<float>& learner, const std::vector<float>& behaviour,
                      double threshold) {
  return MeasureMismatch(learner, behaviour, threshold);
}

TEST(MeasureMismatch, NothingToMeasureIsNotMeasured) {
  const MismatchStats stats = Measure({}, {}, 1e-4);
  EXPECT_EQ(stats.verdict, MismatchVerdict::kNotMeasured);
  EXPECT_EQ(stats.tokens, 0);
  EXPECT_EQ(MismatchVerdictName(stats.verdict), "not_measured");
}

TEST(MeasureMismatch, MaxAndNearestRankP99OverShuffledGaps) {
  // Gaps k / 1024 for k = 1..200 (exact in float), in a shuffled order. Nearest rank:
  // ceil(0.99 * 200) = 198, so p99 is the 198th smallest gap.
  std::vector<int> ks(200);
  for (int i = 0; i < 200; ++i) ks[i] = i + 1;
  std::shuffle(ks.begin(), ks.end(), std::mt19937(3));
  std::vector<float> learner, behaviour;
  for (int k : ks) {
    behaviour.push_back(-2.0f);
    // Half the gaps with the learner below, half above: the check is on |difference|.
    learner.push_back(k % 2 ? -2.0f - k / 1024.0f : -2.0f + k / 1024.0f);
  }
  const MismatchStats stats = Measure(learner, behaviour, 150.5 / 1024);
  EXPECT_EQ(stats.tokens, 200);
  EXPECT_DOUBLE_EQ(stats.max, 200.0 / 1024);
  EXPECT_DOUBLE_EQ(stats.p99, 198.0 / 1024);
  EXPECT_EQ(stats.above, 50);  // k = 151..200
  EXPECT_EQ(stats.verdict, MismatchVerdict::kAboveThreshold);
}

TEST(MeasureMismatch, P99OfFewTokensIsTheirMax) {
  // ceil(0.99 * n) = n for n < 100: a single bad token among few is the p99.
  const MismatchStats ten = Measure({0, 0, 0, 0, 0, 0, 0, 0, 0, 0.5f},
                                    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 1.0);
  EXPECT_DOUBLE_EQ(ten.p99, 0.5);
  EXPECT_DOUBLE_EQ(ten.max, 0.5);
  const MismatchStats one = Measure({-1.25f}, {-1.0f}, 1.0);
  EXPECT_EQ(one.tokens, 1);
  EXPECT_DOUBLE_EQ(one.p99, 0.25);
  // ceil(0.99 * 101) = 100: the largest of 101 gaps is not the p99.
  std::vector<float> learner(101, 0.0f), behaviour(101, 0.0f);
  learner[40] = 0.75f;
  const MismatchStats many = Measure(learner, behaviour, 1.0);
  EXPECT_DOUBLE_EQ(many.max, 0.75);
  EXPECT_DOUBLE_EQ(many.p99, 0.0);
}

TEST(MeasureMismatch, ATokenOutsideOneSupportOrNaNIsAnInfiniteGap) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // The learner cut a token the actor sampled.
  MismatchStats cut = Measure({-1.0f, neg_inf, -3.0f}, {-1.0f, -2.0f, -3.0f}, 1e-4);
  EXPECT_EQ(cut.max, kInf);
  EXPECT_EQ(cut.above, 1);
  EXPECT_EQ(cut.verdict, MismatchVerdict::kAboveThreshold);
  // NaN on either side, and -inf on both (no sampled token has probability 0), count as
  // infinite rather than vanishing from the comparisons.
  MismatchStats bad = Measure({nan, -1.0f, neg_inf}, {-1.0f, nan, neg_inf}, 1e-4);
  EXPECT_EQ(bad.max, kInf);
  EXPECT_EQ(bad.p99, kInf);
  EXPECT_EQ(bad.above, 3);
  EXPECT_EQ(bad.verdict, MismatchVerdict::kAboveThreshold);
}

TEST(MeasureMismatch, AGapEqualToTheThresholdIsWithinIt) {
  MismatchStats at = Measure({-0.5f, -1.0f}, {-0.25f, -1.0f}, 0.25);
  EXPECT_EQ(at.above, 0);
  EXPECT_EQ(at.verdict, MismatchVerdict::kWithinThreshold);
  EXPECT_EQ(MismatchVerdictName(at.verdict), "within_threshold");
  MismatchStats over = Measure({-0.5f, -1.0f}, {-0.25f, -1.0f}, 0.2);
  EXPECT_EQ(over.above, 1);
  EXPECT_EQ(MismatchVerdictName(over.verdict), "above_threshold");
}

// --- Trajectories the rollout engine sampled ---

std::shared_ptr<const Model> TinyModel(uint64_t seed) {
  ConfigureRuntime(2);
  Result<std::unique_ptr<Model>> model =
      Model::Create(testing::ShippedModelConfig("tiny"), seed);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return std::shared_ptr<const Model>(std::move(model).value());
}

struct Sampling {
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  // The engine's reserved ids, stored as the actor stores them (`sampling.banned`); unset: the
  // engine's default and no metadata (the byte format).
  std::optional<std::vector<int64_t>> never_sampled;
};

// One episode of three model turns with observations between them, sampled by the engine and
// cut into segments of at most `segment_tokens` by the actor's segmenter, with the engine's
// experts for every position (context too) and its log-prob of every sampled token. With
// `done`, the environment ends the episode after the last turn with a verdict the actor stores
// as context but never feeds to the model, so its positions have no experts (as the actor
// does). With `images`, the prompt and each observation open with a 32x32 picture (64 patch
// placeholders, an image-start and an image-end token).
struct Episode {
  std::vector<schema::SegmentData> segments;
  std::map<int64_t, float> engine_log_probs;  // by position, as the actor stores them
};

Episode Sample(std::shared_ptr<const Model> model, const Sampling& sampling, uint64_t seed,
               int64_t segment_tokens, bool done = false, bool images = false) {
  Episode episode;
  rollout::EngineOptions engine_options;
  engine_options.threads = 2;
  engine_options.block_tokens = 16;
  engine_options.prefill_chunk_tokens = 24;  // the prompt is fed over several calls
  if (sampling.never_sampled) engine_options.never_sampled = *sampling.never_sampled;
  Result<std::unique_ptr<rollout::Engine>> engine =
      rollout::Engine::Create(engine_options, model, /*policy_version=*/3);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return episode;

  std::vector<int32_t> tokens;
  std::vector<schema::Role> roles;
  std::map<int64_t, std::vector<uint16_t>> experts;  // by position
  int64_t layers = 0, k = 0;
  std::vector<std::pair<int64_t, schema::Image>> stored_images;  // by position
  // Context tokens of one request, and its images (their pixels as the actor stores them).
  auto context = [&](const std::string& text, schema::Role role,
                     std::vector<at::Tensor>* pixels) {
    std::vector<int64_t> ids;
    if (tokens.empty()) {
      ids.push_back(token::kBeginOfText);
      tokens.push_back(token::kBeginOfText);
      roles.push_back(role);
    }
    if (images) {
      schema::Image image;
      image.width = image.height = 32;
      image.channels = 3;
      for (int i = 0; i < 32 * 32 * 3; ++i) {
        image.pixels.push_back(static_cast<char>((i * 37 + seed) % 256));
      }
      const std::vector<uint8_t> bytes(image.pixels.begin(), image.pixels.end());
      pixels->push_back(at::tensor(bytes, at::kByte).view({32, 32, 3}).to(at::kFloat).div_(255.0));
      stored_images.push_back({static_cast<int64_t>(tokens.size()), image});
      ids.push_back(token::kImageStart);
      ids.insert(ids.end(), 64, token::kImagePatch);
      ids.push_back(token::kImageEnd);
      for (size_t i = ids.size() - 66; i < ids.size(); ++i) {
        tokens.push_back(static_cast<int32_t>(ids[i]));
        roles.push_back(schema::Role::kImage);
      }
    }
    const size_t text_begin = ids.size();
    for (int32_t id : Tokenizer::Encode(text)) ids.push_back(id);
    ids.push_back(token::kEndOfTurn);
    ids.push_back(token::kModel);
    for (size_t i = text_begin; i < ids.size(); ++i) {
      tokens.push_back(static_cast<int32_t>(ids[i]));
      roles.push_back(role);
    }
    return ids;
  };
  rollout::SamplingParams params;
  params.temperature = sampling.temperature;
  params.top_k = sampling.top_k;
  params.top_p = sampling.top_p;
  params.max_new_tokens = 30;
  params.seed = seed;
  rollout::Request request;
  request.tokens = context("Compute 12 + 30 and answer with the number.", schema::Role::kUser,
                           &request.images);
  request.sampling = params;
  Result<rollout::SequenceId> id = (*engine)->Submit(request);
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  if (!id.ok()) return episode;
  std::vector<int64_t> turn_ends;
  for (int turn = 0; turn < 3; ++turn) {
    bool finished = false;
    for (int i = 0; i < 200 && !finished; ++i) {
      Result<rollout::StepResult> step = (*engine)->Step();
      EXPECT_TRUE(step.ok()) << step.status().ToString();
      if (!step.ok()) return episode;
      for (const rollout::SequenceStep& s : step->sequences) {
        const rollout::CompactRouting& r = s.routing;
        layers = r.layers;
        k = r.experts_per_token;
        const size_t per_token = static_cast<size_t>(r.layers * r.experts_per_token);
        for (int64_t t = 0; t < r.tokens; ++t) {
          experts[r.first_position + t].assign(r.experts.begin() + t * per_token,
                                               r.experts.begin() + (t + 1) * per_token);
        }
        if (!s.sampled) continue;
        EXPECT_EQ(s.position, static_cast<int64_t>(tokens.size()));
        tokens.push_back(static_cast<int32_t>(s.token));
        roles.push_back(schema::Role::kModel);
        episode.engine_log_probs[s.position] = static_cast<float>(s.log_prob);
        finished = s.finish != rollout::FinishReason::kNone;
      }
    }
    EXPECT_TRUE(finished);
    turn_ends.push_back(static_cast<int64_t>(tokens.size()));
    if (turn == 2) break;
    rollout::Request observation;
    observation.tokens = context("The tool says: 42. Now explain it.", schema::Role::kToolResult,
                                 &observation.images);
    observation.sampling = params;
    EXPECT_TRUE((*engine)->Append(*id, observation).ok());
  }
  EXPECT_EQ(static_cast<int64_t>(experts.size()), static_cast<int64_t>(tokens.size()))
      << "every position was fed, so every one has experts";

  actors::SegmenterOptions options;
  options.segment_tokens = segment_tokens;
  options.env = "test";
  options.routing_layers = layers;
  options.routing_top_k = k;
  options.route_context = true;
  options.temperature = static_cast<float>(sampling.temperature);
  options.top_p = static_cast<float>(sampling.top_p);
  options.top_k = static_cast<uint32_t>(sampling.top_k);
  actors::Segmenter segmenter(options, actors::NewTrajectoryId());
  for (int64_t p = 0; p < static_cast<int64_t>(tokens.size()); ++p) {
    const std::vector<uint16_t>& e = experts[p];
    if (schema::IsAction(roles[p])) {
      EXPECT_TRUE(segmenter
                      .AddAction(tokens[p], roles[p], episode.engine_log_probs.at(p),
                                 /*policy_version=*/3, e)
                      .ok());
    } else {
      for (const auto& [position, image] : stored_images) {
        if (position == p) EXPECT_TRUE(segmenter.AddImage(image).ok());
      }
      EXPECT_TRUE(segmenter.AddContext(std::span<const int32_t>(&tokens[p], 1), roles[p]).ok());
      EXPECT_TRUE(segmenter.AddRouting(p, e).ok());
    }
    if (std::find(turn_ends.begin(), turn_ends.end(), p + 1) != turn_ends.end()) {
      segmenter.MarkTurnBoundary(std::nullopt);
      EXPECT_TRUE(segmenter.EndStep(0.5f, schema::StepLabel::kCorrect).ok());
    }
  }
  if (done) {
    const std::vector<int32_t> verdict = Tokenizer::Encode("Correct: the answer is 42.");
    EXPECT_TRUE(segmenter.AddContext(verdict, schema::Role::kUser).ok());
  }
  episode.segments = segmenter.TakeReady();
  std::vector<std::pair<std::string, std::string>> metadata;
  if (sampling.never_sampled) {
    std::string banned;
    for (int64_t id : *sampling.never_sampled) {
      banned += (banned.empty() ? "" : ",") + std::to_string(id);
    }
    metadata.emplace_back("sampling.banned", banned);
  }
  Result<std::vector<schema::SegmentData>> last = segmenter.Finish(
      1.0f, done ? schema::EndReason::kFinished : schema::EndReason::kTruncatedTurns,
      std::move(metadata));
  EXPECT_TRUE(last.ok()) << last.status().ToString();
  if (last.ok()) episode.segments.insert(episode.segments.end(), last->begin(), last->end());
  return episode;
}

// Largest |learner - engine| over the scored tokens, each matched to the engine's by position.
double MaxGapToTheEngine(const TrajectoryScores& scores, const Episode& episode) {
  EXPECT_EQ(scores.positions.size(), episode.engine_log_probs.size());
  double worst = 0;
  for (size_t i = 0; i < scores.positions.size(); ++i) {
    const float engine = episode.engine_log_probs.at(scores.positions[i]);
    EXPECT_EQ(scores.behaviour_logprobs[i], engine);
    worst = std::max(worst, std::abs(static_cast<double>(scores.logprobs[i]) - engine));
  }
  return worst;
}

class EngineTrajectory : public ::testing::TestWithParam<Sampling> {};

TEST_P(EngineTrajectory, ScoresToTheEnginesLogProbsAcrossSegmentsAndChunks) {
  std::shared_ptr<const Model> model = TinyModel(5);
  const Episode episode = Sample(model, GetParam(), 17, 40);
  ASSERT_GE(episode.segments.size(), 3u) << "the trajectory must span several segments";
  for (const schema::SegmentData& s : episode.segments) {
    EXPECT_EQ(s.routing.coverage, schema::RoutingCoverage::kAll) << s.key().ToString();
  }
  // Chunks that neither match the segments nor the engine's prefill calls; one chunk for all.
  for (int64_t chunk : {int64_t{13}, int64_t{4096}}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    ScoringOptions options;
    options.chunk_tokens = chunk;
    // Segments in reverse: the pass joins them by index.
    std::vector<schema::SegmentData> reversed(episode.segments.rbegin(), episode.segments.rend());
    Result<TrajectoryScores> scores = ScoreTrajectory(*model, reversed, options);
    ASSERT_TRUE(scores.ok()) << scores.status().ToString();
    EXPECT_LE(MaxGapToTheEngine(*scores, episode), 1e-5);
    EXPECT_EQ(scores->mismatch.verdict, MismatchVerdict::kWithinThreshold);
    EXPECT_EQ(scores->mismatch.tokens, static_cast<int64_t>(episode.engine_log_probs.size()));
    EXPECT_LE(scores->mismatch.max, 1e-5);
    EXPECT_EQ(scores->step_values.size(), 3u);
    for (float v : scores->step_values) EXPECT_TRUE(std::isfinite(v));
  }
}

INSTANTIATE_TEST_SUITE_P(Settings, EngineTrajectory,
                         ::testing::Values(Sampling{1.0, 0, 1.0}, Sampling{0.7, 50, 0.9}),
                         [](const auto& info) {
                           return info.param.temperature == 1.0 ? std::string("Temperature1")
                                                                : std::string("Truncated");
                         });

TEST(ScoreTrajectory, ScoredWithAnotherTemperatureTheMismatchIsAboveThreshold) {
  std::shared_ptr<const Model> model = TinyModel(5);
  Episode episode = Sample(model, {0.7, 50, 0.9}, 23, 40);
  ASSERT_FALSE(episode.segments.empty());
  // Stored settings that are not those the engine sampled with: the check must notice.
  for (schema::SegmentData& s : episode.segments) {
    s.temperature = 1.0f;
    s.top_k = 0;
    s.top_p = 1.0f;
  }
  Result<TrajectoryScores> scores = ScoreTrajectory(*model, episode.segments, {});
  ASSERT_TRUE(scores.ok()) << scores.status().ToString();
  EXPECT_GT(scores->mismatch.max, 1e-2);
  EXPECT_EQ(scores->mismatch.verdict, MismatchVerdict::kAboveThreshold);
}

TEST(ScoreTrajectory, SeveralPolicyVersionsAreNotMeasuredButStillScored) {
  std::shared_ptr<const Model> model = TinyModel(5);
  Episode episode = Sample(model, {}, 29, 40);
  ASSERT_GE(episode.segments.size(), 2u);
  schema::SegmentData& last = episode.segments.back();
  last.policy_runs.push_back({static_cast<uint32_t>(last.tokens.size() / 2), 4});
  Result<TrajectoryScores> scores = ScoreTrajectory(*model, episode.segments, {});
  ASSERT_TRUE(scores.ok()) << scores.status().ToString();
  EXPECT_EQ(scores->mismatch.verdict, MismatchVerdict::kNotMeasured);
  EXPECT_EQ(std::count(scores->versions.begin(), scores->versions.end(), 3u) +
                std::count(scores->versions.begin(), scores->versions.end(), 4u),
            static_cast<int64_t>(scores->versions.size()));
  EXPECT_GT(std::count(scores->versions.begin(), scores->versions.end(), 4u), 0);
  EXPECT_LE(MaxGapToTheEngine(*scores, episode), 1e-5);
}

TEST(ScoreTrajectory, ImagesAreNeverCutByAChunkBoundary) {
  std::shared_ptr<const Model> model = TinyModel(5);
  const Episode episode = Sample(model, {}, 53, 64, /*done=*/false, /*images=*/true);
  int64_t images = 0;
  for (const schema::SegmentData& s : episode.segments) images += s.images.size();
  ASSERT_EQ(images, 3);
  // 13: every image is longer than a chunk; 50 and 100: boundaries fall inside images, which
  // the pass moves to the image's start; 4096: one chunk.
  for (int64_t chunk : {int64_t{13}, int64_t{50}, int64_t{100}, int64_t{4096}}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    ScoringOptions options;
    options.chunk_tokens = chunk;
    Result<TrajectoryScores> scores = ScoreTrajectory(*model, episode.segments, options);
    ASSERT_TRUE(scores.ok()) << scores.status().ToString();
    EXPECT_LE(MaxGapToTheEngine(*scores, episode), 1e-5);
    EXPECT_EQ(scores->step_values.size(), 3u);
  }
}

TEST(ScoreTrajectory, AFinishedEpisodesUnfedVerdictNeedsNoExperts) {
  std::shared_ptr<const Model> model = TinyModel(5);
  const Episode episode = Sample(model, {}, 43, 40, /*done=*/true);
  ASSERT_GE(episode.segments.size(), 2u);
  const schema::SegmentData& last = episode.segments.back();
  ASSERT_EQ(last.routing.coverage, schema::RoutingCoverage::kMasked)
      << "the verdict's positions have no record";
  // Nothing scored depends on the positions after the last action token, and the actor never
  // fed them: the pass stops before them instead of asking for their experts (refusing would
  // refuse every episode an environment ended, the ones carrying an outcome).
  Result<TrajectoryScores> scores = ScoreTrajectory(*model, episode.segments, {});
  ASSERT_TRUE(scores.ok()) << scores.status().ToString();
  EXPECT_EQ(scores->length, static_cast<int64_t>(last.token_begin + last.tokens.size()));
  EXPECT_LE(MaxGapToTheEngine(*scores, episode), 1e-5);
  EXPECT_EQ(scores->mismatch.verdict, MismatchVerdict::kWithinThreshold);
  EXPECT_EQ(scores->step_values.size(), 3u);
}

TEST(ScoreTrajectory, ReplayedExpertsAreTheStoredOnes) {
  std::shared_ptr<const Model> model = TinyModel(5);
  Episode episode = Sample(model, {}, 47, 40);
  ASSERT_FALSE(episode.segments.empty());
  // Every stored choice moved to the next expert: a pass that forced the stored experts now
  // computes another function and the check refuses the trajectory; one that ignored them
  // would still agree with the engine.
  const int64_t experts = testing::ShippedModelConfig("tiny").feed_forward.routed_experts;
  for (schema::SegmentData& s : episode.segments) {
    for (uint16_t& e : s.routing.experts) e = static_cast<uint16_t>((e + 1) % experts);
    for (uint16_t& e : s.routing.context_experts) e = static_cast<uint16_t>((e + 1) % experts);
  }
  Result<TrajectoryScores> scores = ScoreTrajectory(*model, episode.segments, {});
  ASSERT_TRUE(scores.ok()) << scores.status().ToString();
  EXPECT_GT(scores->mismatch.max, 1e-3);
  EXPECT_EQ(scores->mismatch.verdict, MismatchVerdict::kAboveThreshold);
}

// The byte format's image-patch id is an ordinary token of a model with its own tokenizer: an
// engine that reserves nothing samples it, and the learner, reading the reserved ids the
// trajectory stored, scores it as sampled. The byte format never samples it.
TEST(ScoreTrajectory, ReservedIdsArePerModel) {
  // Without vision, as a model with its own tokenizer is: the id is no image placeholder to it.
  ModelConfig config = testing::ShippedModelConfig("tiny");
  config.vision.enabled = false;
  Result<std::unique_ptr<Model>> made = Model::Create(config, 5);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  std::shared_ptr<const Model> model(std::move(made).value());
  auto patch_sampled = [](const Episode& episode) {
    for (const schema::SegmentData& s : episode.segments) {
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        if (schema::IsAction(s.roles[i]) && s.tokens[i] == token::kImagePatch) return true;
      }
    }
    return false;
  };
  Sampling own;
  own.temperature = 50.0;  // close to uniform over the vocabulary
  own.never_sampled = std::vector<int64_t>();
  Sampling bytes = own;
  bytes.never_sampled.reset();
  std::optional<Episode> found;
  for (uint64_t seed = 1; seed <= 40 && !found; ++seed) {
    EXPECT_FALSE(patch_sampled(Sample(model, bytes, seed, 40))) << "seed " << seed;
    Episode episode = Sample(model, own, seed, 40);
    if (patch_sampled(episode)) found = std::move(episode);
  }
  ASSERT_TRUE(found.has_value()) << "no episode sampled the id";
  Result<TrajectoryScores> scores = ScoreTrajectory(*model, found->segments, {});
  ASSERT_TRUE(scores.ok()) << scores.status().ToString();
  EXPECT_LE(MaxGapToTheEngine(*scores, *found), 1e-5);
  EXPECT_EQ(scores->mismatch.verdict, MismatchVerdict::kWithinThreshold);

  // Read as the byte format (no `sampling.banned`), the sampled id is outside the support.
  for (schema::SegmentData& s : found->segments) s.metadata.clear();
  Result<TrajectoryScores> as_bytes = ScoreTrajectory(*model, found->segments, {});
  ASSERT_TRUE(as_bytes.ok()) << as_bytes.status().ToString();
  EXPECT_EQ(as_bytes->mismatch.verdict, MismatchVerdict::kAboveThreshold);

  // A list that is not ids is refused.
  found->segments.back().metadata = {{"sampling.banned", "268,x"}};
  EXPECT_TRUE(ScoreTrajectory(*model, found->segments, {}).status().IsInvalidArgument());
}

TEST(PrepareTrajectory, TheReplayRecordHoldsTheStoredExpertsInInt16) {
  std::shared_ptr<const Model> model = TinyModel(5);
  Episode episode = Sample(model, {}, 47, 40);
  ASSERT_GE(episode.segments.size(), 2u);
  Result<PreparedTrajectory> prepared =
      PrepareTrajectory(episode.segments, true, model->config().vocabulary);
  ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
  ASSERT_TRUE(prepared->replaying);
  const schema::RoutingRecord& stored = episode.segments.front().routing;
  ASSERT_EQ(prepared->replay.layers.size(), stored.layers);
  // A quarter of int64's bytes for a record held through the whole step.
  for (const RoutingRecord::Layer& layer : prepared->replay.layers) {
    EXPECT_EQ(layer.experts.scalar_type(), at::kShort);
    EXPECT_EQ(layer.experts.size(1), prepared->input.tokens.size(1));
    EXPECT_EQ(layer.experts.size(2), stored.top_k);
  }
  // Position by position, the ids the segments stored.
  for (const schema::SegmentData& s : episode.segments) {
    std::vector<bool> has;
    const std::vector<uint16_t> rows = schema::ExpertsByPosition(s, &has);
    for (size_t offset = 0; offset < has.size(); ++offset) {
      const int64_t position = static_cast<int64_t>(s.token_begin + offset);
      if (!has[offset] || position >= prepared->input.tokens.size(1)) continue;
      for (int64_t layer = 0; layer < stored.layers; ++layer) {
        for (int64_t j = 0; j < stored.top_k; ++j) {
          ASSERT_EQ(prepared->replay.layers[layer].experts[0][position][j].item<int64_t>(),
                    rows[(offset * stored.layers + layer) * stored.top_k + j])
              << "position " << position << " layer " << layer;
        }
      }
    }
  }
  // An id int16 cannot hold is refused, naming the segment, not wrapped to a negative index.
  schema::SegmentData& second = episode.segments[1];
  ASSERT_FALSE(second.routing.context_experts.empty());
  second.routing.context_experts.front() = 40000;
  Result<PreparedTrajectory> refused =
      PrepareTrajectory(episode.segments, true, model->config().vocabulary);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().IsInvalidArgument()) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find(second.key().ToString()), std::string::npos)
      << refused.status().ToString();
}

TEST(ScoreTrajectory, RefusesSegmentsThatDoNotJoin) {
  std::shared_ptr<const Model> model = TinyModel(5);
  const Episode episode = Sample(model, {}, 31, 40);
  ASSERT_GE(episode.segments.size(), 3u);
  std::vector<schema::SegmentData> gap = episode.segments;
  gap.erase(gap.begin() + 1);
  EXPECT_TRUE(ScoreTrajectory(*model, gap, {}).status().IsInvalidArgument());
  std::vector<schema::SegmentData> overlap = episode.segments;
  overlap[1].token_begin -= 1;
  EXPECT_TRUE(ScoreTrajectory(*model, overlap, {}).status().IsInvalidArgument());
  std::vector<schema::SegmentData> open(episode.segments.begin(), episode.segments.end() - 1);
  EXPECT_TRUE(ScoreTrajectory(*model, open, {}).status().IsInvalidArgument());
  EXPECT_TRUE(ScoreTrajectory(*model, {}, {}).status().IsInvalidArgument());
}

TEST(ScoreTrajectory, RoutingReplayWithoutEveryPositionsExpertsNamesTheSegment) {
  std::shared_ptr<const Model> model = TinyModel(5);
  Episode episode = Sample(model, {}, 37, 40);
  ASSERT_GE(episode.segments.size(), 2u);
  // A 1.1-style record: only the action tokens' experts.
  schema::SegmentData& second = episode.segments[1];
  second.routing.coverage = schema::RoutingCoverage::kActions;
  second.routing.context_experts.clear();
  ASSERT_LT(second.ActionTokens(), second.tokens.size()) << "the segment holds context";
  Result<TrajectoryScores> refused = ScoreTrajectory(*model, episode.segments, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(second.key().ToString()), std::string::npos)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("actions"), std::string::npos);
  // Without replay the learner routes by itself and scores the trajectory.
  ScoringOptions own_routing;
  own_routing.replay_routing = false;
  EXPECT_TRUE(ScoreTrajectory(*model, episode.segments, own_routing).ok());
}

TEST(ScoreTrajectory, RefusesSamplingSettingsOutOfRange) {
  std::shared_ptr<const Model> model = TinyModel(5);
  Episode episode = Sample(model, {}, 41, 40);
  ASSERT_FALSE(episode.segments.empty());
  episode.segments.back().top_p = 0.0f;
  Result<TrajectoryScores> refused = ScoreTrajectory(*model, episode.segments, {});
  EXPECT_TRUE(refused.status().IsInvalidArgument()) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace strider::rl
