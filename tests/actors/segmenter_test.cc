// Segmenter: cuts at turn boundaries where possible, never over segment_tokens, and the segments
// reassemble into exactly the trajectory that was fed (tokens, roles, log-probs, versions,
// experts of every position, steps with their labels and positions, group and sampling fields).
#include "actors/segmenter.h"

#include <gtest/gtest.h>

#include <random>

#include "common/tokenizer.h"

namespace strider::actors {
namespace {

using schema::Role;

struct Fed {
  std::vector<int32_t> tokens;
  std::vector<Role> roles;
  std::vector<float> log_probs;
  std::vector<uint64_t> versions;  // for actions only
  std::vector<uint16_t> experts;
  std::vector<std::pair<int64_t, float>> steps;
  std::vector<int64_t> boundaries;
};

// A random multi-turn episode: context turns and model turns of random lengths.
Fed FeedEpisode(Segmenter& segmenter, uint64_t seed, int64_t turns, int64_t layers, int64_t k) {
  std::mt19937_64 rng(seed);
  Fed fed;
  uint64_t version = 3;
  for (int64_t turn = 0; turn < turns; ++turn) {
    const int64_t context = 1 + rng() % 40;
    std::vector<int32_t> text;
    for (int64_t i = 0; i < context; ++i) text.push_back(static_cast<int32_t>(rng() % 256));
    const Role context_role = turn == 0 ? Role::kUser : Role::kToolResult;
    EXPECT_TRUE(segmenter.AddContext(text, context_role).ok());
    for (int32_t t : text) {
      fed.tokens.push_back(t);
      fed.roles.push_back(context_role);
      fed.log_probs.push_back(0);
    }
    if (rng() % 3 == 0) ++version;  // new weights arrive mid-episode
    const int64_t actions = 1 + rng() % 30;
    for (int64_t i = 0; i < actions; ++i) {
      const int32_t token = static_cast<int32_t>(rng() % token::kVocabularySize);
      const Role role = i > actions / 2 ? Role::kToolCall : Role::kModel;
      const float log_prob = -static_cast<float>(rng() % 1000) / 100.0f;
      std::vector<uint16_t> experts;
      for (int64_t e = 0; e < layers * k; ++e) experts.push_back(static_cast<uint16_t>(rng() % 8));
      EXPECT_TRUE(segmenter.AddAction(token, role, log_prob, version, experts).ok());
      fed.tokens.push_back(token);
      fed.roles.push_back(role);
      fed.log_probs.push_back(log_prob);
      fed.versions.push_back(version);
      fed.experts.insert(fed.experts.end(), experts.begin(), experts.end());
    }
    const float reward = static_cast<float>(turn) * 0.5f;
    EXPECT_TRUE(segmenter.EndStep(reward).ok());
    fed.steps.emplace_back(static_cast<int64_t>(fed.tokens.size()), reward);
    segmenter.MarkTurnBoundary(1000 + fed.tokens.size());
    fed.boundaries.push_back(static_cast<int64_t>(fed.tokens.size()));
  }
  return fed;
}

void CheckReassembly(const std::vector<schema::SegmentData>& segments, const Fed& fed,
                     int64_t segment_tokens, int64_t layers, int64_t k) {
  ASSERT_FALSE(segments.empty());
  std::vector<int32_t> tokens;
  std::vector<Role> roles;
  std::vector<float> log_probs;
  std::vector<uint64_t> versions;
  std::vector<uint16_t> experts;
  std::vector<std::pair<int64_t, float>> steps;
  for (size_t i = 0; i < segments.size(); ++i) {
    const schema::SegmentData& s = segments[i];
    ASSERT_TRUE(schema::ValidateSegment(s, {}).ok()) << schema::ValidateSegment(s, {}).ToString();
    EXPECT_EQ(s.segment_index, i);
    EXPECT_EQ(s.token_begin, tokens.size());
    EXPECT_EQ(s.is_last, i + 1 == segments.size());
    EXPECT_LE(static_cast<int64_t>(s.tokens.size()), segment_tokens);
    EXPECT_EQ(s.env, "calculator");
    EXPECT_EQ(s.routing.layers, layers);
    EXPECT_EQ(s.routing.top_k, k);
    // A digest is present exactly when the segment starts at a boundary the actor marked.
    const bool at_boundary = std::find(fed.boundaries.begin(), fed.boundaries.end(),
                                       static_cast<int64_t>(s.token_begin)) != fed.boundaries.end();
    EXPECT_EQ(!s.state_digest.empty(), at_boundary) << "segment " << i;
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      size_t run = 0;
      while (run + 1 < s.policy_runs.size() && s.policy_runs[run + 1].begin <= t) ++run;
      if (schema::IsAction(s.roles[t])) versions.push_back(s.policy_runs[run].version);
    }
    for (const schema::Step& step : s.steps) {
      steps.emplace_back(static_cast<int64_t>(s.token_begin + step.end), step.process_reward);
    }
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    roles.insert(roles.end(), s.roles.begin(), s.roles.end());
    log_probs.insert(log_probs.end(), s.behaviour_logprobs.begin(), s.behaviour_logprobs.end());
    experts.insert(experts.end(), s.routing.experts.begin(), s.routing.experts.end());
  }
  EXPECT_EQ(tokens, fed.tokens);
  EXPECT_EQ(roles, fed.roles);
  EXPECT_EQ(log_probs, fed.log_probs);
  EXPECT_EQ(versions, fed.versions);
  EXPECT_EQ(experts, fed.experts);
  EXPECT_EQ(steps, fed.steps);
}

TEST(Segmenter, ReassemblesIntoTheTrajectoryAcrossSegmentSizes) {
  for (int64_t segment_tokens : {1, 7, 50, 100, 4096}) {
    for (uint64_t seed = 0; seed < 5; ++seed) {
      SegmenterOptions options{segment_tokens, "calculator", "", 3, 2};
      Segmenter segmenter(options, NewTrajectoryId());
      Fed fed = FeedEpisode(segmenter, seed, 12, 3, 2);
      std::vector<schema::SegmentData> segments = segmenter.TakeReady();
      auto rest = segmenter.Finish(1.5f, schema::EndReason::kFinished, {{"status", "ok"}});
      ASSERT_TRUE(rest.ok()) << rest.status().ToString();
      segments.insert(segments.end(), rest->begin(), rest->end());
      CheckReassembly(segments, fed, segment_tokens, 3, 2);
      EXPECT_FLOAT_EQ(segments.back().outcome_reward, 1.5f);
      ASSERT_EQ(segments.back().metadata.size(), 1u);
      SCOPED_TRACE(segment_tokens);
    }
  }
}

TEST(Segmenter, CutsAtTheLastTurnBoundaryInTheWindow) {
  SegmenterOptions options{100, "calculator", "", 0, 0};
  Segmenter segmenter(options, NewTrajectoryId());
  std::vector<int32_t> sixty(60, 'a'), thirty(30, 'b'), twenty(20, 'c');
  ASSERT_TRUE(segmenter.AddContext(sixty, Role::kUser).ok());
  segmenter.MarkTurnBoundary(std::nullopt);  // at 60
  ASSERT_TRUE(segmenter.AddContext(thirty, Role::kToolResult).ok());
  segmenter.MarkTurnBoundary(77);                               // at 90
  ASSERT_TRUE(segmenter.AddContext(twenty, Role::kUser).ok());  // 110 waiting: cut at 90
  auto ready = segmenter.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].tokens.size(), 90u);
  auto rest = segmenter.Finish(0, schema::EndReason::kFinished, {});
  ASSERT_TRUE(rest.ok());
  ASSERT_EQ(rest->size(), 1u);
  EXPECT_EQ((*rest)[0].token_begin, 90u);
  EXPECT_EQ((*rest)[0].state_digest, "000000000000004d");
}

TEST(Segmenter, LongTurnWithoutBoundaryIsCutAtTheWindow) {
  SegmenterOptions options{64, "retrieval", "", 0, 0};
  Segmenter segmenter(options, NewTrajectoryId());
  segmenter.MarkTurnBoundary(std::nullopt);
  std::vector<int32_t> long_turn(1000, 'x');
  ASSERT_TRUE(segmenter.AddContext(long_turn, Role::kUser).ok());
  auto ready = segmenter.TakeReady();
  // A boundary near the window's start (here none) never makes a tiny segment.
  ASSERT_EQ(ready.size(), 15u);
  for (const auto& s : ready) EXPECT_EQ(s.tokens.size(), 64u);
  auto rest = segmenter.Finish(0, schema::EndReason::kFinished, {});
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(rest->back().tokens.size(), 1000u - 15 * 64);
}

TEST(Segmenter, ImagesTravelWithTheSegmentHoldingTheirRun) {
  SegmenterOptions options{10, "vision_count", "", 0, 0};
  Segmenter segmenter(options, NewTrajectoryId());
  const std::vector<int32_t> text(7, 'a');
  const std::vector<int32_t> run = {token::kImageStart, token::kImagePatch, token::kImagePatch,
                                    token::kImageEnd};
  ASSERT_TRUE(segmenter.AddContext(text, Role::kUser).ok());
  // Starts at position 7; the window of 10 cuts inside the run, after its start.
  ASSERT_TRUE(segmenter.AddImage({0, 2, 1, 3, std::string(6, '\x7f')}).ok());
  ASSERT_TRUE(segmenter.AddContext(run, Role::kImage).ok());
  ASSERT_TRUE(segmenter.AddContext(text, Role::kUser).ok());
  ASSERT_TRUE(segmenter.AddImage({0, 1, 1, 3, std::string(3, '\x01')}).ok());  // at 18
  ASSERT_TRUE(segmenter.AddContext(run, Role::kImage).ok());
  EXPECT_FALSE(segmenter.AddImage({0, 2, 2, 3, "short"}).ok()) << "pixel bytes must match";
  Result<std::vector<schema::SegmentData>> last = segmenter.Finish(0, schema::EndReason::kFinished, {});
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  std::vector<schema::SegmentData> segments = std::move(*last);
  ASSERT_EQ(segments.size(), 3u);  // 10 + 10 + 2
  ASSERT_EQ(segments[0].images.size(), 1u);
  EXPECT_EQ(segments[0].images[0].token_offset, 7u);
  EXPECT_EQ(segments[0].images[0].width, 2u);
  ASSERT_EQ(segments[1].images.size(), 1u);
  EXPECT_EQ(segments[1].images[0].token_offset, 8u);
  EXPECT_EQ(segments[1].tokens[8], token::kImageStart);
  EXPECT_TRUE(segments[2].images.empty());
}

TEST(Segmenter, StepsCarryLabelRewardFlagIndexAndPositionsAcrossCuts) {
  SegmenterOptions options{7, "calculator", "", 0, 0};
  Segmenter segmenter(options, NewTrajectoryId());
  const std::vector<int32_t> prompt(10, 'p'), answer(3, 'a');
  ASSERT_TRUE(segmenter.AddContext(prompt, Role::kUser).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(segmenter.AddAction('m', Role::kModel, -1, 1, {}).ok());
  ASSERT_TRUE(segmenter.EndStep(0.5f, schema::StepLabel::kCorrect).ok());  // [10, 15)
  ASSERT_TRUE(segmenter.AddContext(answer, Role::kToolResult).ok());
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(segmenter.AddAction('t', Role::kToolCall, -1, 1, {}).ok());
  }
  ASSERT_TRUE(segmenter.EndStep(std::nullopt, schema::StepLabel::kIncorrect).ok());  // [18, 22)
  std::vector<schema::SegmentData> segments = segmenter.TakeReady();
  auto rest = segmenter.Finish(0, schema::EndReason::kTruncatedTurns, {});
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  segments.insert(segments.end(), rest->begin(), rest->end());
  std::vector<std::pair<const schema::SegmentData*, schema::Step>> steps;
  for (const schema::SegmentData& s : segments) {
    EXPECT_TRUE(schema::ValidateSegment(s, {}).ok()) << schema::ValidateSegment(s, {}).ToString();
    for (const schema::Step& step : s.steps) steps.emplace_back(&s, step);
  }
  ASSERT_EQ(steps.size(), 2u);
  const schema::Step& first = steps[0].second;
  EXPECT_EQ(first.index, 0u);
  EXPECT_EQ(first.begin, 10u);
  EXPECT_EQ(steps[0].first->token_begin + first.end, 15u);
  EXPECT_EQ(first.label, schema::StepLabel::kCorrect);
  EXPECT_TRUE(first.has_reward);
  EXPECT_EQ(first.process_reward, 0.5f);
  const schema::Step& second = steps[1].second;
  EXPECT_EQ(second.index, 1u);
  EXPECT_EQ(second.begin, 18u) << "a step begins at its turn's first action";
  EXPECT_EQ(steps[1].first->token_begin + second.end, 22u);
  EXPECT_EQ(second.label, schema::StepLabel::kIncorrect);
  EXPECT_FALSE(second.has_reward) << "a missing reward is not stored as a reward of 0";
  EXPECT_EQ(second.process_reward, 0.0f);
}

// Context tokens wait for the engine's records of them, so every fed position's experts travel
// with its segment; the last observation, never fed, is left out of the mask.
TEST(Segmenter, ContextWaitsForItsRoutingAndEveryFedPositionIsCovered) {
  SegmenterOptions options{8, "calculator", "", 2, 1};
  options.route_context = true;
  Segmenter segmenter(options, NewTrajectoryId());
  std::vector<uint16_t> fed;  // per position, 2 ids
  const std::vector<int32_t> prompt(20, 'p');
  ASSERT_TRUE(segmenter.AddContext(prompt, Role::kUser).ok());
  EXPECT_TRUE(segmenter.TakeReady().empty()) << "no cut before the prompt's routing arrives";
  std::vector<uint16_t> prompt_experts;
  for (uint16_t i = 0; i < 40; ++i) prompt_experts.push_back(i % 7);
  ASSERT_TRUE(segmenter.AddRouting(0, prompt_experts).ok());
  fed = prompt_experts;
  std::vector<schema::SegmentData> segments = segmenter.TakeReady();
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_FALSE(segmenter.AddRouting(0, std::vector<uint16_t>{1, 2}).ok())
      << "position 0 is already cut";
  for (uint16_t i = 0; i < 3; ++i) {
    const std::vector<uint16_t> experts = {static_cast<uint16_t>(10 + i), 3};
    ASSERT_TRUE(segmenter.AddAction('m', Role::kModel, -1, 1, experts).ok());
    fed.insert(fed.end(), experts.begin(), experts.end());
  }
  ASSERT_TRUE(segmenter.EndStep(1.0f).ok());
  const std::vector<int32_t> verdict(6, 'v');
  ASSERT_TRUE(segmenter.AddContext(verdict, Role::kUser).ok());
  auto rest = segmenter.Finish(1.0f, schema::EndReason::kFinished, {});
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  segments.insert(segments.end(), rest->begin(), rest->end());
  std::vector<uint16_t> experts;
  std::vector<bool> covered;
  for (const schema::SegmentData& s : segments) {
    ASSERT_TRUE(schema::ValidateSegment(s, {}).ok()) << schema::ValidateSegment(s, {}).ToString();
    Result<std::string> frame = schema::EncodeSegment(s);
    ASSERT_TRUE(frame.ok());
    Result<schema::Message> back = schema::Decode(*frame);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    std::vector<bool> has_record;
    const std::vector<uint16_t> rows = schema::ExpertsByPosition(back->segment, &has_record);
    experts.insert(experts.end(), rows.begin(), rows.end());
    covered.insert(covered.end(), has_record.begin(), has_record.end());
    const bool holds_verdict = s.token_begin + s.tokens.size() > 23;
    EXPECT_EQ(s.routing.coverage, holds_verdict ? schema::RoutingCoverage::kMasked
                                                : schema::RoutingCoverage::kAll)
        << s.token_begin;
  }
  ASSERT_EQ(covered.size(), 29u);
  for (size_t i = 0; i < 29; ++i) EXPECT_EQ(covered[i], i < 23) << i;
  EXPECT_EQ(std::vector<uint16_t>(experts.begin(), experts.begin() + 46), fed);
}

TEST(Segmenter, EverySegmentCarriesGroupAndSamplingAndTheLastItsEndReason) {
  SegmenterOptions options{50, "calculator", "", 3, 2};
  options.group_id = NewTrajectoryId();
  options.group_index = 2;
  options.group_size = 4;
  options.temperature = 0.7f;
  options.top_p = 0.9f;
  options.top_k = 20;
  Segmenter segmenter(options, NewTrajectoryId());
  FeedEpisode(segmenter, 3, 12, 3, 2);
  std::vector<schema::SegmentData> segments = segmenter.TakeReady();
  EXPECT_TRUE(segmenter.Finish(0, schema::EndReason::kNone, {}).status().IsInvalidArgument());
  auto rest = segmenter.Finish(0, schema::EndReason::kFailed, {});
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  segments.insert(segments.end(), rest->begin(), rest->end());
  ASSERT_GT(segments.size(), 2u);
  for (const schema::SegmentData& s : segments) {
    EXPECT_EQ(s.group_id, options.group_id);
    EXPECT_EQ(s.group_index, 2u);
    EXPECT_EQ(s.group_size, 4u);
    EXPECT_EQ(s.temperature, 0.7f);
    EXPECT_EQ(s.top_p, 0.9f);
    EXPECT_EQ(s.top_k, 20u);
    EXPECT_EQ(s.end_reason, s.is_last ? schema::EndReason::kFailed : schema::EndReason::kNone);
    EXPECT_TRUE(schema::EncodeSegment(s).ok());
  }
}

// A trajectory begun after a weight swap: its prompt is of the version in force, not of 0, so
// a learner's staleness bound (the oldest version in a unit) sees it as fresh. Here the prompt
// fills one segment of its own before any action.
TEST(Segmenter, ContextBeforeTheFirstActionCarriesTheVersionInForce) {
  SegmenterOptions options{16, "calculator", "", 0, 0};
  options.policy_version = 6;
  Segmenter segmenter(options, NewTrajectoryId());
  std::vector<int32_t> prompt(20, 'p'), result(4, 'r');
  ASSERT_TRUE(segmenter.AddContext(prompt, Role::kUser).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(segmenter.AddAction('a', Role::kModel, -1, 6, {}).ok());
  ASSERT_TRUE(segmenter.EndStep(0).ok());
  ASSERT_TRUE(segmenter.AddContext(result, Role::kToolResult).ok());
  ASSERT_TRUE(segmenter.AddAction('b', Role::kModel, -1, 7, {}).ok());
  ASSERT_TRUE(segmenter.EndStep(0).ok());
  std::vector<schema::SegmentData> segments = segmenter.TakeReady();
  auto rest = segmenter.Finish(0, schema::EndReason::kFinished, {});
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  segments.insert(segments.end(), rest->begin(), rest->end());
  ASSERT_EQ(segments.size(), 2u);
  ASSERT_EQ(segments[0].policy_runs.size(), 1u);
  EXPECT_EQ(segments[0].policy_runs[0].version, 6u) << "the prompt alone";
  std::vector<std::pair<uint32_t, uint64_t>> runs;
  for (const schema::PolicyRun& run : segments[1].policy_runs) {
    runs.emplace_back(run.begin, run.version);
  }
  // Positions 16..27 of 28: the rest of the prompt, 3 actions and the result at 6, then 7.
  EXPECT_EQ(runs, (std::vector<std::pair<uint32_t, uint64_t>>{{0, 6}, {11, 7}}));
}

TEST(Segmenter, RejectsMisuse) {
  SegmenterOptions options{64, "calculator", "", 2, 1};
  Segmenter segmenter(options, NewTrajectoryId());
  std::vector<int32_t> one{1};
  EXPECT_TRUE(segmenter.AddContext(one, Role::kModel).IsInvalidArgument());
  std::vector<uint16_t> wrong_experts{1};
  EXPECT_TRUE(segmenter.AddAction(5, Role::kModel, -1, 0, wrong_experts).IsInvalidArgument());
  EXPECT_FALSE(segmenter.EndStep(0).ok());  // no tokens yet
  EXPECT_FALSE(segmenter.Finish(0, schema::EndReason::kFinished, {}).ok());
}

}  // namespace
}  // namespace strider::actors
