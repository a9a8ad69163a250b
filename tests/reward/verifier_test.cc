// The verifier on trajectories stored as the actor stores them: episodes of the built-in
// environments played by their scripted policies, rendered through common/transcript.h and cut
// into segments; then replayed (reward/verifiers.h). A replay that agrees gives the
// environment's labels and outcome; one from another seed, other options or altered tokens
// fails and says where. Trajectories in a model's own chat format (tests/tokenizer/data/
// tiny_chat_model.yaml's tokenizer and template) replay through that format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "common/tokenizer.h"
#include "common/tokenizer/chat_format.h"
#include "common/transcript.h"
#include "envs/episode.h"
#include "envs/tools.h"
#include "reward/verifiers.h"

namespace strider::reward {
namespace {

using envs::StepLabel;

constexpr int64_t kPatchesPerImage = 4;  // any count: the verifier reads it from the stream

// Records the turns of the policy it wraps.
class Recording : public envs::ScriptedPolicy {
 public:
  explicit Recording(std::unique_ptr<envs::ScriptedPolicy> inner) : inner_(std::move(inner)) {}
  Result<std::string> NextTurn(const std::vector<envs::Observation>& observations) override {
    Result<std::string> turn = inner_->NextTurn(observations);
    if (turn.ok()) turns.push_back(*turn);
    return turn;
  }
  std::vector<std::string> turns;

 private:
  std::unique_ptr<envs::ScriptedPolicy> inner_;
};

struct Played {
  std::vector<schema::SegmentData> segments;
  std::vector<envs::StepResult> results;
};

struct PlayOptions {
  envs::EnvironmentConfig env;
  uint64_t seed = 7;
  int max_turns = 64;           // stop after this many steps, as the actor's max_turns does
  int64_t segment_tokens = 64;  // small: steps span segment cuts
  std::string unanswered_turn;  // a last model turn no environment answered
  bool store_options = true;    // env_option.* metadata, as the actor writes it
  std::shared_ptr<const transcript::Format> format;  // null: the byte format
};

// Plays one episode with the environment's scripted policy and stores it as the actor would.
Played PlayAndStore(const PlayOptions& options) {
  Played played;
  Result<std::unique_ptr<envs::Environment>> env = envs::MakeEnvironment(options.env);
  EXPECT_TRUE(env.ok()) << env.status().ToString();
  Result<std::unique_ptr<envs::ScriptedPolicy>> policy = envs::MakeScriptedPolicy(options.env);
  EXPECT_TRUE(policy.ok());
  if (!env.ok() || !policy.ok()) return played;
  Recording recording(std::move(*policy));
  const envs::EpisodeReport report =
      envs::PlayEpisode(**env, recording, options.seed, options.max_turns, {},
                        [&](const envs::StepResult& result) { played.results.push_back(result); });
  EXPECT_FALSE(report.error) << report.end;
  const bool done = !played.results.empty() && played.results.back().done;

  const envs::EnvironmentSpec spec = (*env)->Describe();
  auto patches = [](const envs::Observation& o) {
    return std::vector<int64_t>(o.images.size(), kPatchesPerImage);
  };
  transcript::Transcript t(options.format);
  std::vector<transcript::Tool> tools;
  for (const envs::ToolSpec& tool : spec.tools) {
    tools.push_back({tool.name, tool.arguments, tool.description});
  }
  std::vector<int32_t> tokens;
  std::vector<schema::Role> roles;
  std::vector<const envs::Image*> images;  // in stream order
  auto take = [&](const envs::Observation* observation) {
    for (const transcript::Run& run : t.Take()) {
      for (int32_t token : run.tokens) {
        tokens.push_back(token);
        roles.push_back(static_cast<schema::Role>(run.role));
      }
    }
    if (observation) {
      for (const envs::Image& image : observation->images) images.push_back(&image);
    }
  };
  t.AddSystem(spec.description, envs::RenderToolList(spec.tools), tools);
  const envs::Observation& first = report.observations.front();
  t.AddObservation(envs::TranscriptRole(first.role), first.text, patches(first));
  t.BeginModelTurn();
  take(&first);
  std::vector<uint64_t> step_ends;
  for (size_t k = 0; k < played.results.size(); ++k) {
    t.AddModelTurn(recording.turns[k]);
    take(nullptr);
    step_ends.push_back(tokens.size());
    const envs::StepResult& r = played.results[k];
    // A cut after this step: the actor writes nothing more (unless a turn follows unanswered).
    if (k + 1 == played.results.size() && !r.done && options.unanswered_turn.empty()) break;
    t.AddStepResult(envs::TranscriptRole(r.observation.role), r.observation.text,
                    patches(r.observation), r.done);
    take(&r.observation);
  }
  if (!options.unanswered_turn.empty()) {
    t.AddModelTurn(options.unanswered_turn);
    take(nullptr);
  }
  EXPECT_TRUE(t.status().ok()) << t.status().ToString();

  // Cut every segment_tokens tokens; a step belongs to the segment where it ends.
  size_t step = 0, image = 0, image_start = 0;
  for (uint64_t begin = 0; begin < tokens.size(); begin += options.segment_tokens) {
    const uint64_t end = std::min<uint64_t>(tokens.size(), begin + options.segment_tokens);
    schema::SegmentData s;
    s.trajectory_id.bytes[0] = 0x5e;
    s.segment_index = static_cast<uint32_t>(played.segments.size());
    s.token_begin = begin;
    s.env = options.env.name;
    s.tokens.assign(tokens.begin() + begin, tokens.begin() + end);
    s.roles.assign(roles.begin() + begin, roles.begin() + end);
    for (schema::Role role : s.roles)
      s.behaviour_logprobs.push_back(schema::IsAction(role) ? -1 : 0);
    s.policy_runs = {{0, 0}};
    for (; step < step_ends.size() && step_ends[step] <= end; ++step) {
      s.steps.push_back({static_cast<uint32_t>(step_ends[step] - begin),
                         static_cast<float>(played.results[step].reward.value_or(0.0))});
    }
    for (; image_start < end; ++image_start) {
      // A model format has no image runs (its id at kImageStart is text).
      if (image_start < begin || options.format || tokens[image_start] != token::kImageStart) {
        continue;
      }
      const envs::Image& shown = *images.at(image++);
      s.images.push_back({static_cast<uint32_t>(image_start - begin),
                          static_cast<uint32_t>(shown.width), static_cast<uint32_t>(shown.height),
                          static_cast<uint8_t>(shown.channels), shown.pixels});
    }
    played.segments.push_back(std::move(s));
  }
  schema::SegmentData& last = played.segments.back();
  last.is_last = true;
  if (done)
    last.outcome_reward = static_cast<float>(played.results.back().outcome_reward.value_or(0));
  const std::string status = !options.unanswered_turn.empty() ? "env_timeout"
                             : done                           ? "done"
                                                              : "max_turns";
  last.metadata = {{"status", status}, {"seed", std::to_string(options.seed)}};
  if (options.store_options) {
    for (const auto& [key, value] : options.env.options) {
      last.metadata.emplace_back("env_option." + key, value);
    }
  }
  return played;
}

envs::EnvironmentConfig Named(const std::string& name, envs::Options options = {}) {
  envs::EnvironmentConfig config;
  config.name = name;
  config.options = std::move(options);
  return config;
}

std::string& Metadata(schema::SegmentData& last, const std::string& key) {
  for (auto& [k, v] : last.metadata) {
    if (k == key) return v;
  }
  ADD_FAILURE() << "no metadata " << key;
  static std::string none;
  return none;
}

TEST(Rescore, ACalculatorEpisodeReplaysToItsLabelsAndOutcome) {
  PlayOptions options;
  options.env = Named("calculator", {{"difficulty", "3"}});
  Played played = PlayAndStore(options);
  ASSERT_GT(played.segments.size(), 3u) << "the test wants steps across segment cuts";
  std::reverse(played.segments.begin(), played.segments.end());  // any order joins
  // No options in the config: the stored ones (difficulty 3) make the episode.
  Result<Rescored> rescored = Rescore(played.segments, Named(""));
  ASSERT_TRUE(rescored.ok()) << rescored.status().ToString();
  EXPECT_EQ(rescored->env, "calculator");
  EXPECT_EQ(rescored->seed, 7u);
  EXPECT_EQ(rescored->options, (envs::Options{{"difficulty", "3"}}));
  ASSERT_EQ(rescored->steps.size(), played.results.size());
  ASSERT_EQ(rescored->steps.size(), 5u) << "four calc calls and the answer";
  for (size_t k = 0; k < rescored->steps.size(); ++k) {
    const StepVerdict& v = rescored->steps[k];
    EXPECT_EQ(v.label, StepLabel::kCorrect) << "step " << k;
    EXPECT_EQ(v.reward, 1.0) << "step " << k;
    EXPECT_EQ(v.stored_reward, 1.0f);
    EXPECT_EQ(v.done, k + 1 == rescored->steps.size());
    EXPECT_TRUE(v.error.empty());
    EXPECT_LT(v.begin, v.end);
    if (k > 0) EXPECT_EQ(v.begin, rescored->steps[k - 1].end);
  }
  EXPECT_EQ(rescored->outcome, 1.0);
  EXPECT_EQ(rescored->stored_outcome, 1.0f);
  EXPECT_EQ(rescored->stored_status, "done");
  EXPECT_EQ(rescored->unanswered_action_tokens, 0u);
}

TEST(Rescore, RescoredAndStoredRewardsShapeAlike) {
  PlayOptions options;
  options.env = Named("calculator", {{"difficulty", "1"}});
  Played played = PlayAndStore(options);
  Result<schema::StoredTrajectory> joined = schema::JoinSegments(played.segments);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  Result<Rescored> rescored = Rescore(*joined, Named("calculator"));
  ASSERT_TRUE(rescored.ok()) << rescored.status().ToString();
  ShapingConfig config;
  config.step_weight = 0.1;
  // Two correct calls, then the answer carrying the outcome: 0.1, 0.1, 1.
  for (const TrajectoryRewards& input :
       {RescoredRewards(*rescored, *joined), StoredRewards(*joined)}) {
    Result<ShapedRewards> shaped = Shape(input, config);
    ASSERT_TRUE(shaped.ok()) << shaped.status().ToString();
    ASSERT_EQ(shaped->rewards.size(), 3u);
    EXPECT_NEAR(shaped->rewards[0], 0.1, 1e-12);
    EXPECT_NEAR(shaped->rewards[1], 0.1, 1e-12);
    EXPECT_NEAR(shaped->rewards[2], 1.0, 1e-12);
    EXPECT_TRUE(shaped->outcome_in_answer_step);
  }
  EXPECT_EQ(RescoredRewards(*rescored, *joined).steps[0].label, StepLabel::kCorrect);
  EXPECT_EQ(StoredRewards(*joined).steps[2].key,
            "text:Answer:" + played.results[2].info.at("answer"));
}

TEST(Rescore, AnotherSeedOrOtherOptionsDoNotReplay) {
  PlayOptions options;
  options.env = Named("calculator", {{"difficulty", "3"}});
  Played played = PlayAndStore(options);
  Metadata(played.segments.back(), "seed") = "8";
  Result<Rescored> seed = Rescore(played.segments, Named("calculator"));
  ASSERT_EQ(seed.status().code(), StatusCode::kFailedPrecondition) << seed.status().ToString();
  EXPECT_NE(seed.status().message().find("the prompt"), std::string::npos);

  options.store_options = false;  // a store from before options were recorded
  played = PlayAndStore(options);
  Result<Rescored> defaults = Rescore(played.segments, Named("calculator"));
  EXPECT_EQ(defaults.status().code(), StatusCode::kFailedPrecondition)
      << "difficulty 2, the default, is another problem";
  EXPECT_TRUE(Rescore(played.segments, Named("calculator", {{"difficulty", "3"}})).ok())
      << "the config's options stand in for missing stored ones";

  Result<Rescored> other = Rescore(played.segments, Named("retrieval"));
  EXPECT_TRUE(other.status().IsInvalidArgument());
  Metadata(played.segments.back(), "seed") = "seven";
  EXPECT_TRUE(Rescore(played.segments, Named("calculator")).status().IsInvalidArgument());
}

TEST(Rescore, AnAlteredObservationIsFoundAtItsStep) {
  PlayOptions options;
  options.env = Named("calculator", {{"difficulty", "2"}});
  options.segment_tokens = 4096;  // one segment, easy to edit
  Played played = PlayAndStore(options);
  ASSERT_EQ(played.segments.size(), 1u);
  schema::SegmentData& s = played.segments[0];
  // The first token of the tool result after step 1 (past its <|tool_result|> marker).
  const uint32_t at = s.steps[1].end + 1;
  ASSERT_EQ(s.roles[at], schema::Role::kToolResult);
  s.tokens[at] = s.tokens[at] == '9' ? '8' : '9';
  Result<Rescored> rescored = Rescore(played.segments, Named("calculator"));
  ASSERT_EQ(rescored.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(rescored.status().message().find("the observation after step 1"), std::string::npos)
      << rescored.status().message();
  EXPECT_NE(rescored.status().message().find("token " + std::to_string(at)), std::string::npos)
      << rescored.status().message();
}

TEST(Rescore, ImagesAreComparedWithTheStoredPixels) {
  PlayOptions options;
  options.env = Named("vision_count", {{"grid", "3"}, {"cell", "8"}});
  options.segment_tokens = 96;
  Played played;
  size_t stored_images = 0;
  // The scripted policy zooms only when a cell matches the question: find a seed where it does.
  for (options.seed = 1; options.seed < 50 && stored_images < 2; ++options.seed) {
    played = PlayAndStore(options);
    stored_images = 0;
    for (const schema::SegmentData& s : played.segments) stored_images += s.images.size();
  }
  ASSERT_GE(stored_images, 2u) << "the prompt's image and at least one zoom";
  Result<Rescored> rescored = Rescore(played.segments, Named("vision_count"));
  ASSERT_TRUE(rescored.ok()) << rescored.status().ToString();
  EXPECT_EQ(rescored->outcome, 1.0);
  EXPECT_EQ(rescored->steps.back().label, StepLabel::kCorrect);
  for (schema::SegmentData& s : played.segments) {
    if (s.images.empty()) continue;
    s.images.back().pixels[0] ^= 1;
    break;
  }
  Result<Rescored> altered = Rescore(played.segments, Named("vision_count"));
  ASSERT_EQ(altered.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(altered.status().message().find("image differs"), std::string::npos)
      << altered.status().message();
}

TEST(Rescore, ACutEpisodeReplaysItsStepsWithoutAnOutcome) {
  PlayOptions options;
  options.env = Named("retrieval", {{"total_tokens", "2048"}, {"parts", "2"}});
  options.max_turns = 2;  // cut before the answer, as an actor's max_turns does
  Played played = PlayAndStore(options);
  Result<schema::StoredTrajectory> joined = schema::JoinSegments(played.segments);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->status, "max_turns");
  Result<Rescored> rescored = Rescore(*joined, Named("retrieval"));
  ASSERT_TRUE(rescored.ok()) << rescored.status().ToString();
  ASSERT_EQ(rescored->steps.size(), 2u);
  EXPECT_FALSE(rescored->outcome.has_value());
  EXPECT_FALSE(rescored->steps.back().done);
  Result<ShapedRewards> shaped = Shape(RescoredRewards(*rescored, *joined), ShapingConfig());
  ASSERT_TRUE(shaped.ok());
  EXPECT_TRUE(shaped->bootstrap);

  // Stored as done, but the environment has more to say: not the episode stored.
  Metadata(played.segments.back(), "status") = "done";
  EXPECT_EQ(Rescore(played.segments, Named("retrieval")).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(Rescore, ATurnNoEnvironmentAnsweredIsNotReplayed) {
  PlayOptions options;
  options.env = Named("calculator", {{"difficulty", "1"}});
  options.max_turns = 1;
  options.unanswered_turn = "Let me see." + envs::FormatToolCall("calc", "1+1");
  Played played = PlayAndStore(options);
  Result<Rescored> rescored = Rescore(played.segments, Named("calculator"));
  ASSERT_TRUE(rescored.ok()) << rescored.status().ToString();
  EXPECT_EQ(rescored->steps.size(), 1u);
  EXPECT_EQ(rescored->stored_status, "env_timeout");
  // The turn's text, its call and the end-of-turn it was closed with.
  EXPECT_EQ(rescored->unanswered_action_tokens,
            Tokenizer::Encode("Let me see.calc(1+1)").size() + 3);
}

// The tiny model's own format: the committed byte-level BPE and Qwen 2.5's template.
std::shared_ptr<const transcript::Format> TinyChatFormat() {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  const std::string data = std::string(source ? source : ".") + "/tests/tokenizer/data/";
  tokenizer::TokenizerConfig config;
  config.file = data + "bpe_gpt2.json";
  config.chat_template = data + "chat/qwen2_5.jinja";
  Result<std::shared_ptr<const transcript::Format>> format = tokenizer::LoadChatFormat(config);
  EXPECT_TRUE(format.ok()) << format.status().ToString();
  return format.ok() ? *format : nullptr;
}

TEST(Rescore, AnEpisodeInTheModelsFormatReplaysThroughThatFormat) {
  PlayOptions options;
  options.env = Named("calculator", {{"difficulty", "3"}});
  options.format = TinyChatFormat();
  ASSERT_NE(options.format, nullptr);
  Played played = PlayAndStore(options);
  ASSERT_GT(played.segments.size(), 3u) << "the test wants steps across segment cuts";
  Result<Rescored> rescored = Rescore(played.segments, Named(""), options.format);
  ASSERT_TRUE(rescored.ok()) << rescored.status().ToString();
  ASSERT_EQ(rescored->steps.size(), 5u) << "four calc calls and the answer";
  for (size_t k = 0; k < rescored->steps.size(); ++k) {
    const StepVerdict& v = rescored->steps[k];
    EXPECT_EQ(v.label, StepLabel::kCorrect) << "step " << k;
    EXPECT_EQ(v.reward, 1.0) << "step " << k;
    EXPECT_TRUE(v.error.empty()) << v.error;
    // The environment got the call in its own syntax, read from the template's.
    EXPECT_EQ(envs::MakeAction(v.action_text).tool_call.has_value(), k + 1 < 5) << v.action_text;
  }
  EXPECT_EQ(rescored->outcome, 1.0);
  EXPECT_EQ(rescored->stored_status, "done");

  // Read as the byte format, the same tokens are not the episode.
  EXPECT_EQ(Rescore(played.segments, Named("")).status().code(), StatusCode::kFailedPrecondition);
  // An altered observation token is found in the model's format too.
  Result<schema::StoredTrajectory> joined = schema::JoinSegments(played.segments);
  ASSERT_TRUE(joined.ok());
  const uint64_t at = rescored->steps[1].end + 2;
  ASSERT_FALSE(schema::IsAction(joined->roles[at]));
  joined->tokens[at] = joined->tokens[at] == 100 ? 101 : 100;
  Result<Rescored> altered = Rescore(*joined, Named(""), options.format);
  EXPECT_EQ(altered.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(altered.status().message().find("after step 1"), std::string::npos)
      << altered.status().ToString();
}

}  // namespace
}  // namespace strider::reward

