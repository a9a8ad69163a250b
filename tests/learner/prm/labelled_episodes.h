// Labelled calculator steps as the actor stores them, for the process reward model's tests:
// episodes whose turns are the scripted solver's with some replaced by random ones, rendered
// through common/transcript.h and cut by the actor's own segmenter (steps span segment cuts),
// labelled by the environment as the actor labels them.
//
// The mistakes are random turns (a malformed or unknown call, a wrong result, a guessed answer):
// what a random model's states can tell apart from the solver's turns. A wrong operand in the
// solver's own format needs arithmetic no random model does, so it is not what these measure.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "actors/segmenter.h"
#include "common/transcript.h"
#include "envs/episode.h"
#include "envs/tools.h"
#include "replay/client.h"
#include "learner/prm/process_model.h"

namespace strider::testing {

inline constexpr double kRandomTurnRate = 0.35;

// An environment's scripted policy with some turns replaced by random ones
// (envs::MakeRandomPolicy). The solver is shown only the observations that answered its own
// turns, so after a random turn it goes on where it was.
class Distracted : public envs::ScriptedPolicy {
 public:
  Distracted(const envs::EnvironmentConfig& env, double rate, uint64_t seed,
             std::vector<envs::ToolSpec> tools)
      : solver_(envs::MakeScriptedPolicy(env).value()),
        random_(envs::MakeRandomPolicy(seed, std::move(tools))),
        rate_(rate),
        rng_(seed) {}

  Result<std::string> NextTurn(const std::vector<envs::Observation>& observations) override {
    // observations[0] is the task; observations[i] answered turn i - 1.
    std::vector<envs::Observation> seen = {observations.front()};
    for (size_t i = 1; i < observations.size(); ++i) {
      if (!random_turn_[i - 1]) seen.push_back(observations[i]);
    }
    const bool random = std::uniform_real_distribution<double>(0, 1)(rng_) < rate_;
    random_turn_.push_back(random);
    Result<std::string> turn = random ? random_->NextTurn(observations) : solver_->NextTurn(seen);
    if (turn.ok()) turns.push_back(*turn);
    return turn;
  }

  std::vector<std::string> turns;

 private:
  std::unique_ptr<envs::ScriptedPolicy> solver_;
  std::unique_ptr<envs::ScriptedPolicy> random_;
  double rate_;
  std::mt19937_64 rng_;
  std::vector<bool> random_turn_;
};

inline schema::StepLabel SchemaLabel(envs::StepLabel label) {
  switch (label) {
    case envs::StepLabel::kCorrect:
      return schema::StepLabel::kCorrect;
    case envs::StepLabel::kIncorrect:
      return schema::StepLabel::kIncorrect;
    case envs::StepLabel::kUnknown:
      break;
  }
  return schema::StepLabel::kUnknown;
}

inline const envs::EnvironmentConfig kCalculator{.name = "calculator",
                                                 .options = {{"difficulty", "1"}}};

// Plays one episode and cuts it into segments as the actor does. Images get as many patch
// placeholders as a model with `patch_size` gives them.
inline std::vector<schema::SegmentData> PlayAndSegment(
    uint64_t seed, reward::LabelCounts* counts,
    const envs::EnvironmentConfig& env_config = kCalculator,
    double random_turn_rate = kRandomTurnRate, int64_t patch_size = 4) {
  std::unique_ptr<envs::Environment> env = envs::MakeEnvironment(env_config).value();
  const envs::EnvironmentSpec spec = env->Describe();
  Distracted policy(env_config, random_turn_rate, seed, spec.tools);
  std::vector<envs::StepResult> results;
  const envs::EpisodeReport report = envs::PlayEpisode(
      *env, policy, seed, 10, {}, [&](const envs::StepResult& r) { results.push_back(r); });
  EXPECT_FALSE(report.error) << report.end;
  counts->correct += report.correct;
  counts->incorrect += report.incorrect;
  counts->unknown += report.unknown;

  actors::SegmenterOptions options;
  options.segment_tokens = 96;  // a few turns each: steps span cuts
  options.env = env_config.name;
  schema::TrajectoryId id;
  std::mt19937_64 id_rng(seed * 7919 + 1);
  for (uint8_t& b : id.bytes) b = static_cast<uint8_t>(id_rng());
  actors::Segmenter segmenter(options, id);
  std::vector<schema::SegmentData> segments;
  transcript::Transcript t;
  std::vector<const envs::Image*> shown;  // images added and not yet fed, in stream order
  auto patches = [&](const envs::Observation& o) {
    std::vector<int64_t> counts;
    for (const envs::Image& image : o.images) {
      counts.push_back((image.height / patch_size) * (image.width / patch_size));
      shown.push_back(&image);
    }
    return counts;
  };
  auto feed = [&] {
    size_t image = 0;
    for (const transcript::Run& run : t.Take()) {
      const auto role = static_cast<schema::Role>(run.role);
      if (role == schema::Role::kImage) {
        const envs::Image& picture = *shown.at(image++);
        EXPECT_TRUE(segmenter
                        .AddImage({0, static_cast<uint32_t>(picture.width),
                                   static_cast<uint32_t>(picture.height),
                                   static_cast<uint8_t>(picture.channels), picture.pixels})
                        .ok());
      }
      if (schema::IsAction(role)) {
        for (int32_t token : run.tokens) {
          EXPECT_TRUE(segmenter.AddAction(token, role, -1.0f, 1, {}).ok());
        }
      } else {
        EXPECT_TRUE(segmenter.AddContext(run.tokens, role).ok());
      }
    }
    shown.clear();
    for (schema::SegmentData& s : segmenter.TakeReady()) segments.push_back(std::move(s));
  };
  t.AddSystem(spec.description, envs::RenderToolList(spec.tools));
  const envs::Observation& first = report.observations.front();
  t.AddObservation(envs::TranscriptRole(first.role), first.text, patches(first));
  t.BeginModelTurn();
  feed();
  for (size_t k = 0; k < results.size(); ++k) {
    const envs::StepResult& r = results[k];
    t.AddModelTurn(policy.turns[k]);
    feed();
    std::optional<float> reward;
    if (r.reward) reward = static_cast<float>(*r.reward);
    EXPECT_TRUE(segmenter.EndStep(reward, SchemaLabel(r.label)).ok());
    if (k + 1 == results.size() && !r.done) break;  // cut: the actor writes nothing more
    t.AddStepResult(envs::TranscriptRole(r.observation.role), r.observation.text,
                    patches(r.observation), r.done);
    feed();
    segmenter.MarkTurnBoundary(std::nullopt);
  }
  const bool done = !results.empty() && results.back().done;
  Result<std::vector<schema::SegmentData>> rest =
      segmenter.Finish(static_cast<float>(report.outcome.value_or(0.0)),
                       done ? schema::EndReason::kFinished : schema::EndReason::kTruncatedTurns,
                       {{"status", done ? "done" : "max_turns"}, {"seed", std::to_string(seed)}});
  EXPECT_TRUE(rest.ok()) << rest.status().ToString();
  if (rest.ok()) {
    for (schema::SegmentData& s : *rest) segments.push_back(std::move(s));
  }
  return segments;
}

// Plays episodes of seeds first_seed .. first_seed + episodes - 1 and sends their segments
// through an ActorClient to the server at `endpoint`, waiting for every acknowledgement. Adds
// the labels the environment gave to `counts`; returns the segments sent, or -1 on a failure.
inline int StoreEpisodes(const std::string& endpoint, uint64_t first_seed, int episodes,
                         reward::LabelCounts* counts) {
  replay::ActorClientOptions options;
  options.endpoint = endpoint;
  Result<std::unique_ptr<replay::ActorClient>> client = replay::ActorClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  if (!client.ok()) return -1;
  int sent = 0;
  for (int e = 0; e < episodes; ++e) {
    for (const schema::SegmentData& s : PlayAndSegment(first_seed + e, counts)) {
      const Status status = (*client)->Send(s);
      EXPECT_TRUE(status.ok()) << status.ToString();
      if (!status.ok()) return -1;
      ++sent;
    }
  }
  const Status flushed = (*client)->Flush(std::chrono::milliseconds(20000));
  EXPECT_TRUE(flushed.ok()) << flushed.ToString();
  EXPECT_TRUE((*client)->TakeErrors().empty());
  return flushed.ok() ? sent : -1;
}

}  // namespace strider::testing
