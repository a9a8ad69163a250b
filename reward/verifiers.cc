#include "reward/verifiers.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <string_view>

#include "common/tokenizer.h"
#include "common/transcript.h"
#include "envs/tools.h"

namespace strider::reward {
namespace {

constexpr std::string_view kOptionPrefix = "env_option.";

// The patch count of each image run in tokens[begin, end), in order: the number of
// placeholders the actor wrote, which depends on the model's vision settings, not on the
// environment, so the replay takes it from the stored stream.
std::vector<int64_t> ImagePatches(const schema::StoredTrajectory& t, uint64_t begin, uint64_t end,
                                  const transcript::Format* format) {
  std::vector<int64_t> patches;
  // A model format has no image runs: its ids at the byte format's image markers are text.
  if (format != nullptr) return patches;
  for (uint64_t i = begin; i < end; ++i) {
    if (t.tokens[i] != token::kImageStart) continue;
    int64_t count = 0;
    while (i + 1 < end && t.tokens[i + 1] == token::kImagePatch) {
      ++count;
      ++i;
    }
    patches.push_back(count);
  }
  return patches;
}

uint64_t NextAction(const schema::StoredTrajectory& t, uint64_t from) {
  while (from < t.tokens.size() && !schema::IsAction(t.roles[from])) ++from;
  return from;
}

class Replay {
 public:
  Replay(const schema::StoredTrajectory& t, std::unique_ptr<envs::Environment> env,
         std::shared_ptr<const transcript::Format> format)
      : t_(t), env_(std::move(env)), transcript_(format), format_(std::move(format)) {}
  ~Replay() { env_->Close(); }

  // Renders `observation` as the actor does and checks it against tokens[begin, end).
  Status Observe(const envs::Observation& observation, uint64_t begin, uint64_t end,
                 const std::string& what, bool first, bool done) {
    const std::vector<int64_t> patches = ImagePatches(t_, begin, end, format_.get());
    if (patches.size() != observation.images.size()) {
      return Diverged(what, begin,
                      "the environment shows " + std::to_string(observation.images.size()) +
                          " images, the stored stream has " + std::to_string(patches.size()));
    }
    const transcript::Role role = envs::TranscriptRole(observation.role);
    if (first) {
      const envs::EnvironmentSpec spec = env_->Describe();
      std::vector<transcript::Tool> tools;
      for (const envs::ToolSpec& tool : spec.tools) {
        tools.push_back({tool.name, tool.arguments, tool.description});
      }
      transcript_.AddSystem(spec.description, envs::RenderToolList(spec.tools), tools);
      transcript_.AddObservation(role, observation.text, patches);
      transcript_.BeginModelTurn();
    } else {
      transcript_.AddStepResult(role, observation.text, patches, done);
    }
    if (!transcript_.status().ok()) {
      return Diverged(what, begin, "the model's format does not render it: " +
                                       transcript_.status().ToString());
    }
    const std::vector<int32_t> tokens = transcript_.Tokens();
    const std::vector<transcript::Role> roles = transcript_.Roles();
    (void)transcript_.Take();
    for (uint64_t i = 0; i < std::max<uint64_t>(tokens.size(), end - begin); ++i) {
      if (i >= tokens.size() || begin + i >= end) {
        return Diverged(what, begin + i,
                        "the environment's turn renders to " + std::to_string(tokens.size()) +
                            " tokens, " + std::to_string(end - begin) + " are stored");
      }
      if (tokens[i] != t_.tokens[begin + i] ||
          static_cast<uint8_t>(roles[i]) != static_cast<uint8_t>(t_.roles[begin + i])) {
        return Diverged(what, begin + i,
                        "the environment's turn has " + Text(tokens[i]) + " where " +
                            Text(t_.tokens[begin + i]) + " is stored");
      }
    }
    size_t image = 0;
    for (const schema::Image& stored : t_.images) {
      if (stored.token_offset < begin || stored.token_offset >= end) continue;
      const envs::Image& shown = observation.images.at(image++);
      if (static_cast<int64_t>(stored.width) != shown.width ||
          static_cast<int64_t>(stored.height) != shown.height ||
          static_cast<int64_t>(stored.channels) != shown.channels ||
          stored.pixels != shown.pixels) {
        return Diverged(what, stored.token_offset, "the environment's image differs");
      }
    }
    return Status::Ok();
  }

  // Feeds the stored model turn of `step` to the transcript (the actor's roles come from it)
  // and sets `action_text` to what the actor handed the environment for it.
  Status ModelTurn(const schema::StoredStep& step, const std::string& what,
                   std::string& action_text) {
    std::vector<int32_t> turn;
    bool started = false;
    for (uint64_t i = step.begin; i < step.end; ++i) {
      if (!schema::IsAction(t_.roles[i])) {
        if (started) return Diverged(what, i, "a context token inside the model's turn");
        continue;
      }
      started = true;
      turn.push_back(t_.tokens[i]);
      const transcript::Role role = transcript_.AddModelToken(t_.tokens[i]);
      if (static_cast<uint8_t>(role) != static_cast<uint8_t>(t_.roles[i])) {
        return Diverged(what, i, "the stored role of a sampled token is not the transcript's");
      }
    }
    (void)transcript_.Take();
    if (format_ == nullptr) {
      action_text = step.turn_text;
      return Status::Ok();
    }
    // As the actor does (actors/actor.cc OnTurnEnd): the turn without the token it stopped at,
    // its call in the environment's syntax.
    const std::vector<int32_t> stops = format_->stop_tokens();
    if (!turn.empty() && std::find(stops.begin(), stops.end(), turn.back()) != stops.end()) {
      turn.pop_back();
    }
    action_text = format_->ToEnvironmentText(format_->DecodeBytes(turn));
    return Status::Ok();
  }

  envs::Environment& env() { return *env_; }

 private:
  Status Diverged(const std::string& what, uint64_t position, const std::string& why) const {
    return Status::FailedPrecondition(
        "trajectory " + t_.id.Hex() + ": " + what + " does not replay at token " +
        std::to_string(position) + ": " + why +
        " (a seed or options other than the episode's, or a changed environment)");
  }

  std::string Text(int32_t token) const {
    return format_ ? "'" + format_->DecodeBytes(std::span<const int32_t>(&token, 1)) + "'"
                   : Tokenizer::Decode({&token, 1});
  }

  const schema::StoredTrajectory& t_;
  std::unique_ptr<envs::Environment> env_;
  transcript::Transcript transcript_;
  std::shared_ptr<const transcript::Format> format_;  // null: the byte format
};

}  // namespace

Result<Rescored> Rescore(const schema::StoredTrajectory& t, const envs::EnvironmentConfig& env,
                         std::shared_ptr<const transcript::Format> format) {
  const std::string name = "trajectory " + t.id.Hex();
  envs::EnvironmentConfig config = env;
  if (config.name.empty()) config.name = t.env;
  if (!t.env.empty() && config.name != t.env) {
    return Status::InvalidArgument(name + " was played on '" + t.env + "', not '" + config.name +
                                   "'");
  }
  envs::Options stored_options;
  for (const auto& [key, value] : t.metadata) {
    if (key.starts_with(kOptionPrefix)) stored_options[key.substr(kOptionPrefix.size())] = value;
  }
  if (!stored_options.empty()) config.options = stored_options;
  Rescored out;
  out.id = t.id;
  out.env = config.name;
  out.options = config.options;
  out.stored_outcome = t.outcome;
  out.stored_status = t.status;
  out.unanswered_action_tokens = t.unanswered_action_tokens;
  auto seed = t.metadata.find("seed");
  if (seed == t.metadata.end()) return Status::InvalidArgument(name + " has no seed metadata");
  const std::string& text = seed->second;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out.seed);
  if (error != std::errc() || end != text.data() + text.size()) {
    return Status::InvalidArgument(name + ": seed metadata '" + text + "' is not a number");
  }
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<envs::Environment> made, envs::MakeEnvironment(config));
  Replay replay(t, std::move(made), std::move(format));

  // Episode options stay empty: the actor resets with the config's options only.
  Result<envs::Observation> first = replay.env().Reset(out.seed, {});
  if (!first.ok()) return first.status().WithContext(name + ": reset").WithContext("verifier");
  STRIDER_RETURN_IF_ERROR(
      replay.Observe(*first, 0, NextAction(t, 0), "the prompt", /*first=*/true, false));
  bool done = false;
  for (size_t k = 0; k < t.steps.size(); ++k) {
    const schema::StoredStep& step = t.steps[k];
    const std::string what = "step " + std::to_string(k);
    if (done) {
      return Status::FailedPrecondition(name + ": the replayed episode ended before " + what);
    }
    StepVerdict verdict;
    STRIDER_RETURN_IF_ERROR(replay.ModelTurn(step, what, verdict.action_text));
    verdict.begin = step.begin;
    verdict.end = step.end;
    verdict.stored_reward = step.stored_reward;
    Result<envs::StepResult> result = replay.env().Step(envs::MakeAction(verdict.action_text));
    if (!result.ok()) {
      verdict.error = result.status().ToString();
      out.steps.push_back(std::move(verdict));
      break;
    }
    verdict.label = result->label;
    verdict.reward = result->reward;
    verdict.done = done = result->done;
    out.steps.push_back(std::move(verdict));
    if (done) out.outcome = result->outcome_reward;
    const uint64_t next = NextAction(t, step.end);
    // The actor writes nothing after a last step it cut (max_turns, max_tokens) or whose
    // observation it refused (an image the model cannot take).
    const bool cut = next == step.end && k + 1 == t.steps.size() && t.status != "done";
    if (!cut) {
      STRIDER_RETURN_IF_ERROR(replay.Observe(result->observation, step.end, next,
                                             "the observation after " + what, false, done));
    }
  }
  if (t.status == "done" && !done) {
    return Status::FailedPrecondition(name + ": stored as done, but the replayed episode goes on");
  }
  return out;
}

Result<Rescored> Rescore(std::span<const schema::SegmentData> segments,
                         const envs::EnvironmentConfig& env,
                         std::shared_ptr<const transcript::Format> format) {
  STRIDER_ASSIGN_OR_RETURN(schema::StoredTrajectory trajectory, schema::JoinSegments(segments));
  return Rescore(trajectory, env, std::move(format));
}

TrajectoryRewards RescoredRewards(const Rescored& rescored,
                                  const schema::StoredTrajectory& trajectory) {
  TrajectoryRewards rewards;
  rewards.end = TrajectoryEndFromStatus(rescored.stored_status);
  if (rewards.end == TrajectoryEnd::kFinished) rewards.outcome = rescored.outcome;
  for (size_t k = 0; k < rescored.steps.size(); ++k) {
    StepRewards step;
    step.env_reward = rescored.steps[k].reward;
    step.label = rescored.steps[k].label;
    if (k < trajectory.steps.size()) step.key = StepKey(rescored.steps[k].action_text);
    rewards.steps.push_back(std::move(step));
  }
  return rewards;
}

Result<std::vector<StoreRescore>> RescoreStore(const std::string& store_path,
                                               const envs::EnvironmentConfig& env,
                                               const replay::ListFilter& filter,
                                               std::shared_ptr<const transcript::Format> format) {
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<replay::Inspector> inspector,
                           replay::Inspector::Open(store_path));
  STRIDER_ASSIGN_OR_RETURN(std::vector<schema::TrajectorySummary> summaries,
                           inspector->List(filter));
  std::vector<StoreRescore> out;
  for (const schema::TrajectorySummary& summary : summaries) {
    if (!summary.complete) continue;  // still being written, or its actor died
    STRIDER_ASSIGN_OR_RETURN(std::vector<replay::StoredSegment> stored,
                             inspector->Trajectory(summary.trajectory_id));
    std::vector<schema::SegmentData> segments;
    segments.reserve(stored.size());
    for (replay::StoredSegment& s : stored) segments.push_back(std::move(s.segment));
    StoreRescore entry;
    entry.id = summary.trajectory_id;
    Result<Rescored> rescored = Rescore(segments, env, format);
    if (rescored.ok()) {
      entry.rescored = std::move(*rescored);
    } else {
      entry.status = rescored.status();
    }
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace strider::reward
