// The actor's decode loop and episode state machine (actors/actor.h has the picture).
//
// Episode phases:
//   resetting ──(all G resets answered)──> prompt (group source prefilling)
//   prompt ──(source idle: Fork into G)──> generating
//   generating ──(turn ended)──> stepping (env Step on its own thread)
//   stepping ──(observation appended)──> generating ... ──(done / limit / error)──> finished
//
// Only the main thread touches the engine, episodes and segmenters. Environment calls run on
// short-lived threads that own nothing but a shared box with the environment; a call past its
// time limit is abandoned (its episode ends with `env_timeout`) and its result dropped.
#include "actors/actor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>

#include "actors/actor_report.h"
#include "actors/env_calls.h"
#include "actors/observation_images.h"
#include "actors/segmenter.h"
#include "actors/sender.h"
#include "actors/weight_receiver.h"
#include "common/clock.h"
#include "common/model/model.h"
#include "common/model/sampling_distribution.h"
#include "common/tokenizer.h"
#include "common/tokenizer/chat_format.h"
#include "common/transcript.h"
#include "envs/tools.h"
#include "rollout_engine/engine.h"

namespace strider::actors {
namespace {

using schema::Role;
using std::chrono::milliseconds;

enum class Phase { kResetting, kPrompt, kGenerating, kStepping };

struct Episode {
  int64_t index = 0;
  int64_t group = 0;
  int64_t member = 0;  // index within the group
  uint64_t seed = 0;
  Phase phase = Phase::kResetting;
  std::shared_ptr<EnvBox> box = std::make_shared<EnvBox>();
  std::shared_ptr<EnvCall> call;
  bool reset_failed = false;
  bool reset_timed_out = false;  // env_timeout rather than env_reset
  std::string reset_error;
  std::optional<envs::Observation> first_observation;
  std::optional<rollout::SequenceId> sequence;
  std::unique_ptr<Segmenter> segmenter;
  std::vector<int32_t> turn_tokens;
  // Where the episode is in the turn structure; holds only the current step's tokens.
  transcript::Transcript transcript;
  int64_t turns = 0;
  int64_t tool_calls = 0;
  int64_t malformed_tool_calls = 0;
  int64_t max_turns = 0;
  int64_t generated_tokens = 0;
  uint64_t action_digest = 0;  // the sampled tokens, chained in order
  float outcome = 0;
  double step_reward_sum = 0;
  std::vector<std::string> exchange;  // EpisodeSummary::exchange; only with an episode sink
  std::map<std::string, std::string> info;
};

struct Group {
  int64_t id = 0;
  uint64_t seed = 0;
  std::vector<int64_t> members;  // episode indices
  std::optional<rollout::SequenceId> source;
  schema::TrajectoryId group_id;
  std::vector<PromptPiece> prompt;     // tokenized once, shared by the group's members
  transcript::Transcript after_prompt;  // the members continue the transcript from here
  std::vector<at::Tensor> prompt_pixels;  // the prompt's images, for the engine
  // The engine's experts for the prompt, fed once on the source: every member's record of it.
  rollout::CompactRouting prompt_routing;
};

uint64_t Mix(uint64_t a, uint64_t b) { return rollout::DeriveSeed(a, b); }

constexpr uint64_t kEvaluationBit = uint64_t{1} << 63;

schema::StepLabel SchemaLabel(envs::StepLabel label) {
  switch (label) {
    case envs::StepLabel::kCorrect: return schema::StepLabel::kCorrect;
    case envs::StepLabel::kIncorrect: return schema::StepLabel::kIncorrect;
    case envs::StepLabel::kUnknown: break;
  }
  return schema::StepLabel::kUnknown;
}

// An episode's status (metadata `status`) as the schema's end reason. A stopped actor gives up
// on its episodes as a dead one would: neither the model nor the environment ended them.
schema::EndReason EndReasonOf(const std::string& status) {
  if (status == "done") return schema::EndReason::kFinished;
  if (status == "max_turns") return schema::EndReason::kTruncatedTurns;
  if (status == "max_tokens") return schema::EndReason::kTruncatedLength;
  if (status == "stopped") return schema::EndReason::kAbandoned;
  return schema::EndReason::kFailed;
}

// The decode loop and the episodes' state machine. Everything here runs on the thread that
// calls Run; the environment calls, the weight subscriber and the sender have threads of their
// own and meet the loop only through their classes' locked hand-offs.
class ActorImpl final : public Actor {
 public:
  ActorImpl(ActorOptions options, ModelConfig config, std::shared_ptr<const Model> model,
            std::unique_ptr<rollout::Engine> engine, std::unique_ptr<Sender> sender,
            std::shared_ptr<const transcript::Format> format)
      : options_(std::move(options)),
        config_(std::move(config)),
        format_(std::move(format)),
        model_(std::move(model)),
        engine_(std::move(engine)),
        sender_(std::move(sender)),
        weights_(WeightReceiverOptions{options_.weights_endpoint,
                                       milliseconds(options_.weights_poll_ms),
                                       options_.weights_auth, options_.policy_version,
                                       options_.precision},
                 config_, [calls = &env_calls_] { calls->wake().Notify(); }),
        reporter_(options_) {
    const bool moe = config_.feed_forward.routed_experts > 0 &&
                     config_.feed_forward.dense_layers < config_.layers;
    routing_layers_ = moe ? config_.layers - config_.feed_forward.dense_layers : 0;
    routing_k_ = moe ? config_.feed_forward.experts_per_token : 0;
    metrics_.policy_version = options_.policy_version;
    if (options_.weights_sync) {
      round_groups_ = options_.round_groups > 0 ? options_.round_groups
                                                : options_.episodes_in_flight / options_.group_size;
      round_version_ = options_.policy_version;
      metrics_.sync = true;
      metrics_.round = 1;  // the first round plays the initial weights
    }
  }

  ~ActorImpl() override { weights_.Stop(); }

  Status Run(std::stop_token stop) override;
  ActorMetrics metrics() const override { return reporter_.snapshot(); }

 private:
  // One engine step and its results. False when the engine failed as a whole: `failure` says
  // why, and every episode has ended with it.
  bool Step(Status* failure);
  void FinishAll(const std::string& status, const std::string& message);
  void ApplyWeights();
  void AdvanceRound();
  void StartGroups();
  void PollCalls();
  void OnResetsDone(Group& group);
  void PollGroups();
  void StartMember(Episode& e, const Group& group, rollout::SequenceId sequence);
  // Logs an error of an engine call whose sequence is known to be live, which only an engine
  // bug could fail.
  void CheckEngineCall(const Status& status, const char* what);
  // Each sequence's tokens and routing into its episode; an episode they do not fit ends.
  void ProcessStep(const rollout::StepResult& step);
  Status RouteContext(Episode& e, const rollout::CompactRouting& routing, int64_t tokens);
  void OnTurnEnd(Episode& episode);
  void OnStepResult(Episode& episode, Result<envs::StepResult> result);
  void FinishEpisode(int64_t index, const std::string& status, const std::string& message);
  void Summarize(Episode& e, const std::string& status, const std::string& message);
  void SendLast(Episode& e, const std::string& status, const std::string& message);
  void LogEnvironmentFailure(const Episode& e, const std::string& status,
                             const std::string& message);
  void PushReady(Episode& episode);
  void EndGroupIfEmpty(int64_t group);
  void Snapshot();
  rollout::SamplingParams TurnSampling(const Episode& episode) const;
  int64_t EngineActive() const;

  ActorOptions options_;
  ModelConfig config_;
  // The model's own transcript format when its config names a tokenizer; null: the byte format.
  std::shared_ptr<const transcript::Format> format_;
  std::shared_ptr<const Model> model_;
  std::unique_ptr<rollout::Engine> engine_;
  std::unique_ptr<Sender> sender_;
  int64_t routing_layers_ = 0;
  int64_t routing_k_ = 0;

  std::map<int64_t, std::unique_ptr<Episode>> episodes_;
  std::map<int64_t, Group> groups_;
  std::unordered_map<rollout::SequenceId, int64_t> by_sequence_;
  int64_t next_episode_ = 0;
  int64_t next_group_ = 0;
  EnvCalls env_calls_;
  Clock::time_point env_log_window_{};
  int env_logged_ = 0;
  int64_t env_log_suppressed_ = 0;

  // Declared after env_calls_, whose wake its thread notifies; stopped before either goes.
  WeightReceiver weights_;

  // Synchronous rounds (options_.weights_sync).
  int64_t round_groups_ = 0;          // groups per round
  int64_t round_groups_started_ = 0;  // in the current round
  uint64_t round_version_ = 0;        // the version every episode of the current round plays
  std::optional<Clock::time_point> waiting_since_;  // the round ended, no newer version yet
  double weights_waited_s_ = 0;                     // in earlier waits

  ActorMetrics metrics_;
  ActorReporter reporter_;
  Clock::time_point started_;
};

rollout::SamplingParams ActorImpl::TurnSampling(const Episode& episode) const {
  rollout::SamplingParams sampling = options_.sampling;
  if (format_) {
    const std::vector<int32_t> stops = format_->stop_tokens();
    sampling.stop_tokens.assign(stops.begin(), stops.end());
  } else {
    sampling.stop_tokens = {token::kEndOfTurn, token::kEndOfText};
  }
  // A fresh stream per turn: the engine restarts the counter on every request.
  sampling.seed = Mix(Mix(Mix(options_.sampling.seed, episode.seed), episode.member),
                      static_cast<uint64_t>(episode.turns));
  return sampling;
}

void ActorImpl::ApplyWeights() {
  std::optional<WeightReceiver::Update> update = weights_.Take();
  if (!update) return;
  // Between engine steps: every token reports the version that computed its distribution, and
  // segments carry those versions as policy runs, so no segment needs to end here.
  Status swapped = engine_->SwapWeights(update->model, update->version);
  if (!swapped.ok()) {
    ++metrics_.errors["weights"];
    spdlog::error("weights: version {} refused by the engine: {}", update->version,
                  swapped.ToString());
    return;
  }
  model_ = std::move(update->model);
  metrics_.policy_version = update->version;
  ++metrics_.weight_updates;
}

// A round ends when its groups have all been started and every episode of them has ended, its
// segments handed to the sender. The next one starts once a version newer than the round's has
// been loaded; that is the only place a synchronous actor swaps weights, so the learner that
// takes turns with it gets trajectories of one version each round.
void ActorImpl::AdvanceRound() {
  if (round_groups_started_ < round_groups_ || !episodes_.empty()) return;
  if (options_.episodes > 0 && next_episode_ >= options_.episodes) return;  // the run is over
  if (!waiting_since_) {
    waiting_since_ = Clock::now();
    spdlog::info("round {} ended (weights version {}): waiting for a newer version", metrics_.round,
                 round_version_);
  }
  ApplyWeights();
  if (metrics_.policy_version == round_version_) return;  // none yet, or the engine refused it
  const double waited = std::chrono::duration<double>(Clock::now() - *waiting_since_).count();
  weights_waited_s_ += waited;
  waiting_since_.reset();
  round_version_ = metrics_.policy_version;
  round_groups_started_ = 0;
  ++metrics_.round;
  spdlog::info("round {} starts with weights version {} (waited {:.2f} s)", metrics_.round,
               round_version_, waited);
}

void ActorImpl::StartGroups() {
  const int64_t g = options_.group_size;
  while (static_cast<int64_t>(episodes_.size()) + g <= options_.episodes_in_flight &&
         (options_.episodes == 0 || next_episode_ + g <= options_.episodes) &&
         (!options_.weights_sync || round_groups_started_ < round_groups_) &&
         !(sender_ && sender_->Backlogged())) {
    ++round_groups_started_;
    Group group;
    group.id = next_group_++;
    group.seed = options_.seed_stream == SeedStream::kEvaluation
                     ? EvaluationSeed(options_.seed, group.id)
                     : TrainingSeed(options_.seed, group.id);
    group.group_id = NewTrajectoryId();
    for (int64_t member = 0; member < g; ++member) {
      auto episode = std::make_unique<Episode>();
      episode->index = next_episode_++;
      episode->group = group.id;
      episode->member = member;
      episode->seed = group.seed;  // the same problem for the whole group
      episode->call = env_calls_.Reset(episode->box, options_.env, episode->seed);
      group.members.push_back(episode->index);
      episodes_[episode->index] = std::move(episode);
      ++metrics_.episodes_started;
    }
    groups_[group.id] = std::move(group);
  }
}

void ActorImpl::PollCalls() {
  const auto now = Clock::now();
  // One timer decides. An out-of-process environment's client times its own requests and
  // answers DeadlineExceeded (env_timeout below); this timer is then only a backstop for a call
  // that never returns, 2 s later. In-process environments have no timer but this one.
  const bool client_timed = !options_.env.command.empty();
  const auto limit = milliseconds(options_.env.step_timeout_ms) +
                     (client_timed ? milliseconds(2000) : milliseconds(0));
  const std::string limit_text =
      client_timed ? std::to_string(options_.env.step_timeout_ms) +
                         " ms (step_timeout_ms) and its client's 2 s grace; timed by the actor"
                   : std::to_string(options_.env.step_timeout_ms) +
                         " ms (step_timeout_ms, timed by the actor)";
  std::vector<int64_t> indices;
  for (const auto& [index, episode] : episodes_) {
    if (episode->call) indices.push_back(index);
  }
  for (int64_t index : indices) {
    auto it = episodes_.find(index);
    if (it == episodes_.end()) continue;
    Episode& episode = *it->second;
    std::shared_ptr<EnvCall> call = episode.call;
    if (!call->done()) {
      if (now - call->started() > limit) {
        const std::string what = episode.phase == Phase::kResetting ? "reset" : "step";
        const std::string message = "environment " + what + " did not return within " + limit_text;
        if (episode.phase == Phase::kResetting) {
          episode.call.reset();
          episode.reset_failed = true;
          episode.reset_timed_out = true;
          episode.reset_error = message;
          episode.box = nullptr;
          OnResetsDone(groups_[episode.group]);
        } else {
          FinishEpisode(index, "env_timeout", message);
        }
      }
      continue;
    }
    episode.call.reset();
    if (episode.phase == Phase::kResetting) {
      Result<envs::Observation> reset = call->TakeReset();
      if (!reset.ok()) {
        episode.reset_failed = true;
        episode.reset_timed_out = reset.status().code() == StatusCode::kDeadlineExceeded;
        episode.reset_error = reset.status().ToString();
      } else {
        if (options_.episode_sink) episode.exchange.push_back(reset->text);
        episode.first_observation = std::move(*reset);
        episode.max_turns =
            options_.max_turns > 0 ? options_.max_turns : episode.box->spec.max_turns;
      }
      OnResetsDone(groups_[episode.group]);
    } else {
      OnStepResult(episode, call->TakeStep());
    }
  }
}

// When every member of the group has answered its reset: build the prompt once, submit it.
void ActorImpl::OnResetsDone(Group& group) {
  for (int64_t index : group.members) {
    auto it = episodes_.find(index);
    if (it == episodes_.end()) continue;
    Episode& e = *it->second;
    if (e.phase != Phase::kResetting) return;
    if (!e.reset_failed && !e.first_observation) return;  // still running
    if (e.call) return;
  }
  // Members whose reset failed end now, with their error.
  std::optional<int64_t> leader;
  for (int64_t index : std::vector<int64_t>(group.members)) {
    auto it = episodes_.find(index);
    if (it == episodes_.end()) continue;
    if (it->second->reset_failed) {
      const std::string error = it->second->reset_error;
      FinishEpisode(index, it->second->reset_timed_out ? "env_timeout" : "env_reset", error);
    } else if (!leader) {
      leader = index;
    }
  }
  if (!leader) return;
  Episode& first = *episodes_[*leader];
  const envs::Observation& observation = *first.first_observation;
  const int64_t group_id = group.id;
  auto fail_group = [&](const std::string& status, const std::string& message) {
    for (int64_t index : std::vector<int64_t>(groups_[group_id].members)) {
      if (episodes_.count(index)) FinishEpisode(index, status, message);
    }
  };
  // The prompt, tokenized once: system turn (description and tools), the first observation
  // (its images, then its text), and the header of the model's turn.
  const envs::EnvironmentSpec& spec = first.box->spec;
  Result<ObservationImages> images = ReadImages(config_.vision, observation.images);
  if (!images.ok()) {
    fail_group("bad_image", images.status().ToString());
    return;
  }
  transcript::Transcript prompt(format_);
  std::vector<transcript::Tool> tools;
  for (const envs::ToolSpec& tool : spec.tools) {
    tools.push_back({tool.name, tool.arguments, tool.description});
  }
  prompt.AddSystem(spec.description, envs::RenderToolList(spec.tools), tools);
  prompt.AddObservation(envs::TranscriptRole(observation.role), observation.text,
                        images->patches);
  prompt.BeginModelTurn();
  if (!prompt.status().ok()) {
    fail_group("transcript", prompt.status().ToString());
    return;
  }
  group.prompt = ToPieces(prompt.Take(), images->stored);
  group.after_prompt = prompt;
  group.prompt_pixels = std::move(images->pixels);
  const std::vector<int64_t> tokens = Concatenate(group.prompt);
  if (static_cast<int64_t>(tokens.size()) + options_.sampling.max_new_tokens >
      options_.max_episode_tokens) {
    fail_group("prompt_too_long", "the prompt has " + std::to_string(tokens.size()) +
                                      " tokens; with max_new_tokens it exceeds max_episode_tokens");
    return;
  }
  rollout::Request request{tokens, std::nullopt, false};
  request.images = group.prompt_pixels;
  Result<rollout::SequenceId> source = engine_->Submit(request);
  if (!source.ok()) {
    fail_group("engine", source.status().ToString());
    return;
  }
  group.source = *source;
  for (int64_t index : group.members) {
    if (episodes_.count(index)) episodes_[index]->phase = Phase::kPrompt;
  }
}

// Prefilled prompts fork into their groups.
void ActorImpl::PollGroups() {
  std::vector<int64_t> prompting;
  for (const auto& [id, group] : groups_) {
    if (group.source) prompting.push_back(id);
  }
  // By id: ending a group's episodes below may erase the group.
  for (int64_t id : prompting) {
    auto found_group = groups_.find(id);
    if (found_group == groups_.end() || !found_group->second.source) continue;
    Group& group = found_group->second;
    Result<rollout::SequenceInfo> info = engine_->Info(*group.source);
    if (!info.ok() || info->status != rollout::SequenceStatus::kIdle) continue;
    std::vector<int64_t> members;
    for (int64_t index : group.members) {
      if (episodes_.count(index)) members.push_back(index);
    }
    const rollout::SequenceId source = *group.source;
    group.source.reset();
    if (members.empty()) {
      CheckEngineCall(engine_->Release(source), "release a prompt");  // idle, checked above
      continue;
    }
    // Each member then samples with DeriveSeed(seed, i): the group shares the prompt's state
    // and next-token distribution and differs only in its random stream.
    rollout::SamplingParams sampling = TurnSampling(*episodes_[members[0]]);
    Result<std::vector<rollout::SequenceId>> forked =
        engine_->Fork(source, static_cast<int64_t>(members.size()), sampling);
    CheckEngineCall(engine_->Release(source), "release a prompt");  // idle, checked above
    if (!forked.ok()) {
      for (int64_t index : members) FinishEpisode(index, "engine", forked.status().ToString());
      continue;  // the group is gone now
    }
    for (size_t i = 0; i < members.size(); ++i) {
      StartMember(*episodes_[members[i]], group, (*forked)[i]);
    }
    // The members' segmenters and the engine's forked states hold the prompt now; the group's
    // pieces and routing (16 bytes per prompt token) would otherwise stay until its episodes end.
    auto still = groups_.find(id);
    if (still != groups_.end()) {
      still->second.prompt = {};
      still->second.prompt_routing = {};
    }
  }
}

// A member of a group whose prompt was forked: its trajectory starts with the prompt.
void ActorImpl::StartMember(Episode& e, const Group& group, rollout::SequenceId sequence) {
  e.sequence = sequence;
  by_sequence_[sequence] = e.index;
  SegmenterOptions segmenter_options;
  segmenter_options.segment_tokens = options_.segment_tokens;
  segmenter_options.env = options_.env.name;
  segmenter_options.table = options_.table;
  segmenter_options.routing_layers = routing_layers_;
  segmenter_options.routing_top_k = routing_k_;
  segmenter_options.route_context = true;
  segmenter_options.group_id = group.group_id;
  segmenter_options.group_index = static_cast<uint32_t>(e.member);
  segmenter_options.group_size = static_cast<uint32_t>(options_.group_size);
  segmenter_options.temperature = static_cast<float>(options_.sampling.temperature);
  segmenter_options.top_p = static_cast<float>(options_.sampling.top_p);
  segmenter_options.top_k = static_cast<uint32_t>(options_.sampling.top_k);
  segmenter_options.policy_version = engine_->policy_version();  // the prompt's
  e.segmenter = std::make_unique<Segmenter>(segmenter_options, NewTrajectoryId());
  e.transcript = group.after_prompt;
  Result<int64_t> added = AddPieces(*e.segmenter, group.prompt);
  if (!added.ok()) {
    FinishEpisode(e.index, "internal", added.status().ToString());
    return;
  }
  metrics_.context_tokens += *added;
  Status routed = RouteContext(e, group.prompt_routing, group.prompt_routing.tokens);
  if (!routed.ok()) {
    FinishEpisode(e.index, "routing", routed.ToString());
    return;
  }
  e.phase = Phase::kGenerating;
  PushReady(e);
}

void ActorImpl::CheckEngineCall(const Status& status, const char* what) {
  if (!status.ok()) spdlog::error("rollout engine: cannot {}: {}", what, status.ToString());
}

// The first `tokens` positions of `routing` are context the episode's segmenter holds.
Status ActorImpl::RouteContext(Episode& e, const rollout::CompactRouting& routing,
                               int64_t tokens) {
  const size_t per_token = static_cast<size_t>(routing_layers_ * routing_k_);
  if (per_token == 0 || tokens <= 0) return Status::Ok();
  if (routing.layers != routing_layers_ || routing.experts_per_token != routing_k_ ||
      tokens > routing.tokens ||
      routing.experts.size() < static_cast<size_t>(tokens) * per_token) {
    return Status::Internal("the engine's routing record from position " +
                            std::to_string(routing.first_position) + " does not cover " +
                            std::to_string(tokens) + " tokens");
  }
  return e.segmenter->AddRouting(
      routing.first_position,
      std::span<const uint16_t>(routing.experts.data(), static_cast<size_t>(tokens) * per_token));
}

void ActorImpl::ProcessStep(const rollout::StepResult& step) {
  const size_t per_token = static_cast<size_t>(routing_layers_ * routing_k_);
  for (const rollout::SequenceStep& s : step.sequences) {
    if (!s.sampled) {
      // A prefill without a sample: a group's prompt (kept for its members) or context fed
      // before a turn.
      if (per_token == 0 || s.routing.tokens == 0) continue;
      bool source = false;
      for (auto& [id, group] : groups_) {
        if (group.source != s.id) continue;
        source = true;
        Result<rollout::CompactRouting> joined =
            rollout::CompactRouting::Concatenate({group.prompt_routing, s.routing});
        if (joined.ok()) group.prompt_routing = std::move(*joined);
        break;
      }
      auto fed = by_sequence_.find(s.id);
      if (source || fed == by_sequence_.end()) continue;
      Episode& e = *episodes_[fed->second];
      Status routed = RouteContext(e, s.routing, s.routing.tokens);
      if (!routed.ok()) {
        FinishEpisode(e.index, "routing", routed.ToString());
        continue;
      }
      // A long observation is fed over several steps; the segments its routing completed go
      // now, not in a burst with the step that samples (three 65,536-token segments and their
      // encodings at once, at the end of a quarter-million-token part).
      PushReady(e);
      continue;
    }
    auto found = by_sequence_.find(s.id);
    if (found == by_sequence_.end()) continue;
    const int64_t index = found->second;
    Episode& e = *episodes_[index];
    // The context fed in this step before the sample (an appended observation).
    Status routed = RouteContext(e, s.routing, s.position - s.routing.first_position);
    if (!routed.ok()) {
      FinishEpisode(index, "routing", routed.ToString());
      continue;
    }
    const Role role = SchemaRole(e.transcript.AddModelToken(static_cast<int32_t>(s.token)));
    std::span<const uint16_t> experts;
    if (per_token > 0) {
      const int64_t offset = s.position - s.routing.first_position;
      if (s.routing.layers != routing_layers_ || s.routing.experts_per_token != routing_k_ ||
          offset < 0 || offset >= s.routing.tokens ||
          s.routing.experts.size() < static_cast<size_t>(s.routing.tokens) * per_token) {
        FinishEpisode(
            index, "routing",
            "the engine's routing record does not cover position " + std::to_string(s.position));
        continue;
      }
      experts = std::span<const uint16_t>(s.routing.experts.data() + offset * per_token, per_token);
    }
    Status added =
        e.segmenter->AddAction(static_cast<int32_t>(s.token), role, static_cast<float>(s.log_prob),
                               s.policy_version, experts);
    if (!added.ok()) {
      FinishEpisode(index, "internal", added.ToString());
      continue;
    }
    e.turn_tokens.push_back(static_cast<int32_t>(s.token));
    ++e.generated_tokens;
    e.action_digest = Mix(e.action_digest, static_cast<uint64_t>(s.token));
    ++metrics_.generated_tokens;
    PushReady(e);
    if (s.finish != rollout::FinishReason::kNone) OnTurnEnd(e);
  }
}

void ActorImpl::OnTurnEnd(Episode& e) {
  // The sequence is idle: its state covers every token so far, a clean place for a cut.
  std::optional<uint64_t> digest;
  Result<uint64_t> state = engine_->StateDigest(*e.sequence);
  if (state.ok()) digest = *state;
  e.segmenter->MarkTurnBoundary(digest);
  std::vector<int32_t> text_tokens = e.turn_tokens;
  const std::vector<int64_t>& stops = TurnSampling(e).stop_tokens;
  if (!text_tokens.empty() &&
      std::find(stops.begin(), stops.end(), text_tokens.back()) != stops.end()) {
    text_tokens.pop_back();
  }
  // A model format's call goes to the environment in the environment's syntax.
  envs::Action action =
      envs::MakeAction(format_ ? format_->ToEnvironmentText(format_->DecodeBytes(text_tokens))
                               : Tokenizer::Decode(text_tokens));
  if (options_.episode_sink) e.exchange.push_back(action.text);
  ++e.turns;
  ++metrics_.turns;
  if (action.tool_call) {
    ++e.tool_calls;
    ++metrics_.tool_calls;
  }
  if (!action.tool_call_error.empty()) {
    ++e.malformed_tool_calls;
    ++metrics_.malformed_tool_calls;
  }
  e.phase = Phase::kStepping;
  e.call = env_calls_.Step(e.box, std::move(action));
}

void ActorImpl::OnStepResult(Episode& e, Result<envs::StepResult> result) {
  const int64_t index = e.index;
  if (!result.ok()) {
    // The turn sampled at least one token after the last step ended, so the step can end here;
    // were it refused, the episode ends below all the same.
    Status ended = e.segmenter->EndStep(std::nullopt);
    if (!ended.ok()) spdlog::debug("episode {}: {}", index, ended.ToString());
    const bool timed_out = result.status().code() == StatusCode::kDeadlineExceeded;
    FinishEpisode(index, timed_out ? "env_timeout" : "env_error", result.status().ToString());
    return;
  }
  envs::StepResult& r = *result;
  if (options_.episode_sink) e.exchange.push_back(r.observation.text);
  std::optional<float> reward;
  if (r.reward) reward = static_cast<float>(*r.reward);
  e.step_reward_sum += r.reward.value_or(0.0);
  Status ended = e.segmenter->EndStep(reward, SchemaLabel(r.label));
  if (!ended.ok()) {
    FinishEpisode(index, "internal", ended.ToString());
    return;
  }
  for (const auto& [key, value] : r.info) e.info[key] = value;
  // What the actor writes: a closing marker when the turn hit max_new_tokens, the observation
  // as one turn (its images, then its text), and (unless done) the header of the next model
  // turn. The model's turn itself went to the segmenter token by token, with its log-probs.
  Result<ObservationImages> images = ReadImages(config_.vision, r.observation.images);
  if (!images.ok()) {
    FinishEpisode(index, "bad_image", images.status().ToString());
    return;
  }
  e.transcript.Take();
  e.transcript.AddStepResult(envs::TranscriptRole(r.observation.role), r.observation.text,
                             images->patches, r.done);
  if (!e.transcript.status().ok()) {
    FinishEpisode(index, "transcript", e.transcript.status().ToString());
    return;
  }
  const std::vector<PromptPiece> pieces = ToPieces(e.transcript.Take(), images->stored);
  if (r.done) {
    // The final observation (a verdict) is context after the last action; no turn follows.
    e.outcome = static_cast<float>(r.outcome_reward.value_or(0.0));
    Result<int64_t> added = AddPieces(*e.segmenter, pieces);
    if (!added.ok()) {
      FinishEpisode(index, "internal", added.status().ToString());
      return;
    }
    metrics_.context_tokens += *added;
    FinishEpisode(index, "done", "");
    return;
  }
  if (e.turns >= e.max_turns) {
    FinishEpisode(index, "max_turns", "no answer after " + std::to_string(e.turns) + " turns");
    return;
  }
  const std::vector<int64_t> tokens = Concatenate(pieces);
  if (e.segmenter->length() + static_cast<int64_t>(tokens.size()) +
          options_.sampling.max_new_tokens >
      options_.max_episode_tokens) {
    FinishEpisode(index, "max_tokens",
                  "the next turn could exceed max_episode_tokens (" +
                      std::to_string(options_.max_episode_tokens) + ")");
    return;
  }
  Result<int64_t> added = AddPieces(*e.segmenter, pieces);
  if (!added.ok()) {
    FinishEpisode(index, "internal", added.status().ToString());
    return;
  }
  metrics_.context_tokens += *added;
  e.turn_tokens.clear();
  rollout::Request request{tokens, TurnSampling(e), false};
  request.images = std::move(images->pixels);
  Status appended = engine_->Append(*e.sequence, request);
  if (!appended.ok()) {
    FinishEpisode(index, "engine", appended.ToString());
    return;
  }
  e.phase = Phase::kGenerating;
  PushReady(e);
}

void ActorImpl::PushReady(Episode& e) {
  // With an episode sink nothing is streamed: cut segments are dropped as they come, so an
  // evaluation holds no more than a streaming actor does.
  std::vector<schema::SegmentData> ready = e.segmenter->TakeReady();
  if (!sender_) return;
  for (schema::SegmentData& segment : ready) {
    Status pushed = sender_->Push(segment);
    if (!pushed.ok()) {
      ++metrics_.errors["segment"];
      spdlog::error("segment {} not sent: {}", segment.key().ToString(), pushed.ToString());
      continue;
    }
    ++metrics_.segments;
  }
}

// Environment failures are the operator's to see while the actor runs, not only in stored
// metadata; a broken environment fails every episode, so at most 5 lines per 10 s, and the next
// line says how many were left out.
void ActorImpl::LogEnvironmentFailure(const Episode& e, const std::string& status,
                                      const std::string& message) {
  const auto now = Clock::now();
  if (now - env_log_window_ >= std::chrono::seconds(10)) {
    env_log_window_ = now;
    env_logged_ = 0;
  }
  if (env_logged_ >= 5) {
    ++env_log_suppressed_;
    return;
  }
  ++env_logged_;
  const std::string& env = !options_.env.name.empty()      ? options_.env.name
                           : !options_.env.command.empty() ? options_.env.command
                                                           : options_.env.library;
  std::string left_out;
  if (env_log_suppressed_ > 0) {
    left_out = fmt::format(" ({} more environment failures not shown)", env_log_suppressed_);
    env_log_suppressed_ = 0;
  }
  spdlog::warn("environment {}: episode {} (seed {}) ended {}: {}{}", env, e.index, e.seed, status,
               message, left_out);
}

void ActorImpl::FinishEpisode(int64_t index, const std::string& status,
                              const std::string& message) {
  auto it = episodes_.find(index);
  if (it == episodes_.end()) return;
  Episode& e = *it->second;
  if (e.sequence) {
    // Live until here: this is the one place an episode's sequence ends.
    CheckEngineCall(engine_->Cancel(*e.sequence), "cancel an episode's sequence");
    by_sequence_.erase(*e.sequence);
  }
  if (status == "done") {
    ++metrics_.episodes_ok;
  } else {
    ++metrics_.errors[status];
    if (status.rfind("env_", 0) == 0) {
      LogEnvironmentFailure(e, status, message);
    } else {
      spdlog::debug("episode {} ended: {}: {}", e.index, status, message);
    }
  }
  if (options_.episode_sink) {
    Summarize(e, status, message);
  } else if (e.segmenter && e.segmenter->length() > 0) {
    SendLast(e, status, message);
  }
  // Close the environment off the loop (a process may take a while to go), unless a call is
  // still running in it: then the box dies with that call.
  if (!e.call && e.box && e.box->env) env_calls_.Close(e.box);
  const int64_t group = e.group;
  episodes_.erase(it);
  ++metrics_.episodes_finished;
  EndGroupIfEmpty(group);
}

void ActorImpl::Summarize(Episode& e, const std::string& status, const std::string& message) {
  EpisodeSummary summary;
  summary.index = e.index;
  summary.group = e.group;
  summary.member = e.member;
  summary.seed = e.seed;
  summary.status = status;
  summary.error = message;
  summary.outcome_reward = status == "done" ? e.outcome : 0.0;
  summary.step_reward_sum = e.step_reward_sum;
  summary.turns = e.turns;
  summary.tokens = e.segmenter ? e.segmenter->length() : 0;
  summary.generated_tokens = e.generated_tokens;
  summary.action_digest = e.action_digest;
  summary.tool_calls = e.tool_calls;
  summary.malformed_tool_calls = e.malformed_tool_calls;
  summary.policy_version = engine_->policy_version();
  summary.exchange = std::move(e.exchange);
  options_.episode_sink(summary);
}

// The episode's last segments, with its metadata, to the sender.
void ActorImpl::SendLast(Episode& e, const std::string& status, const std::string& message) {
  const Group& group = groups_[e.group];
  std::vector<std::pair<std::string, std::string>> metadata = {
      {"status", status},
      {"actor", options_.actor_id},
      {"episode", std::to_string(e.index)},
      {"seed", std::to_string(e.seed)},
      {"group", group.group_id.Hex()},
      {"group_index", std::to_string(e.member)},
      {"group_size", std::to_string(options_.group_size)},
      {"turns", std::to_string(e.turns)},
      {"tool_calls", std::to_string(e.tool_calls)},
      {"malformed_tool_calls", std::to_string(e.malformed_tool_calls)},
  };
  // The behaviour log-probs are those of the sampling distribution; these say what it was
  // (`banned`: the ids the engine never samples, comma-separated, as a learner reads them).
  metadata.emplace_back("sampling.temperature", std::to_string(options_.sampling.temperature));
  metadata.emplace_back("sampling.top_k", std::to_string(options_.sampling.top_k));
  metadata.emplace_back("sampling.top_p", std::to_string(options_.sampling.top_p));
  std::string banned;
  for (int64_t id : format_ ? std::vector<int64_t>() : model::ByteFormatNeverSampled()) {
    banned += (banned.empty() ? "" : ",") + std::to_string(id);
  }
  metadata.emplace_back("sampling.banned", banned);
  if (!message.empty()) metadata.emplace_back("error", message);
  for (const auto& [key, value] : e.info) metadata.emplace_back("info." + key, value);
  // With the seed, the options replay the episode offline (reward/verifiers.h).
  for (const auto& [key, value] : options_.env.options) {
    metadata.emplace_back("env_option." + key, value);
  }
  Result<std::vector<schema::SegmentData>> last =
      e.segmenter->Finish(e.outcome, EndReasonOf(status), std::move(metadata));
  if (!last.ok()) {
    ++metrics_.errors["segment"];
    spdlog::error("episode {}: last segments not cut: {}", e.index, last.status().ToString());
    return;
  }
  for (const schema::SegmentData& segment : *last) {
    Status pushed = sender_->Push(segment);
    if (pushed.ok()) {
      ++metrics_.segments;
    } else {
      ++metrics_.errors["segment"];
      spdlog::error("segment {} not sent: {}", segment.key().ToString(), pushed.ToString());
    }
  }
}

void ActorImpl::EndGroupIfEmpty(int64_t id) {
  auto it = groups_.find(id);
  if (it == groups_.end()) return;
  for (int64_t index : it->second.members) {
    if (episodes_.count(index)) return;
  }
  if (it->second.source) {
    // A source is live until its group forks, which resets it.
    CheckEngineCall(engine_->Cancel(*it->second.source), "cancel a prompt");
  }
  groups_.erase(it);
}

int64_t ActorImpl::EngineActive() const {
  int64_t active = 0;
  for (const auto& [id, group] : groups_) active += group.source ? 1 : 0;
  for (const auto& [index, e] : episodes_) active += e->phase == Phase::kGenerating ? 1 : 0;
  return active;
}

void ActorImpl::Snapshot() {
  const SenderStats sent = sender_ ? sender_->stats() : SenderStats{};
  metrics_.elapsed_s = std::chrono::duration<double>(Clock::now() - started_).count();
  metrics_.live_episodes = static_cast<int64_t>(episodes_.size());
  metrics_.env_calls_running = env_calls_.running();
  metrics_.env_call_seconds = env_calls_.seconds();
  metrics_.engine_sequences = engine_->Stats().live_sequences;
  metrics_.send_queue_segments = sent.queued_segments;
  metrics_.send_queue_bytes = sent.queued_bytes;
  metrics_.in_flight_segments = sent.in_flight;
  metrics_.acked_segments = sent.acked;
  metrics_.refused_segments = sent.rejected;
  metrics_.spill_files = sent.spill_files;
  metrics_.spill_bytes = sent.spill_bytes;
  metrics_.replay_connected = sent.connected;
  if (const int64_t errors = weights_.errors(); errors > 0) metrics_.errors["weights"] = errors;
  metrics_.waiting_for_weights = waiting_since_.has_value();
  metrics_.weights_wait_s =
      weights_waited_s_ +
      (waiting_since_ ? std::chrono::duration<double>(Clock::now() - *waiting_since_).count() : 0);
  reporter_.Publish(metrics_);
}

void ActorImpl::FinishAll(const std::string& status, const std::string& message) {
  std::vector<int64_t> live;
  for (const auto& [index, e] : episodes_) live.push_back(index);
  for (int64_t index : live) FinishEpisode(index, status, message);
}

bool ActorImpl::Step(Status* failure) {
  const auto step_start = Clock::now();
  Result<rollout::StepResult> step = engine_->Step();
  ++metrics_.engine_steps;
  const double step_seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
  metrics_.engine_step_seconds += step_seconds;
  if (!step.ok()) {
    *failure = step.status().WithContext("rollout engine");
    FinishAll("engine", failure->ToString());
    return false;
  }
  metrics_.prefill_steps += step->prefill_tokens > 0 ? 1 : 0;
  (step->prefill_tokens > 0 ? metrics_.prefill_step_seconds : metrics_.decode_step_seconds) +=
      step_seconds;
  metrics_.prefill_tokens += step->prefill_tokens;
  metrics_.decode_tokens += step->decode_tokens;
  ProcessStep(*step);
  return true;
}

Status ActorImpl::Run(std::stop_token stop) {
  started_ = Clock::now();
  STRIDER_RETURN_IF_ERROR(reporter_.Start(started_));
  weights_.Start();
  Status failure;
  bool stopped = false;
  while (true) {
    if (stop.stop_requested() && !stopped) {
      stopped = true;
      FinishAll("stopped", "the actor was stopped");
    }
    if (!options_.weights_sync) {
      ApplyWeights();
    } else if (!stopped) {
      AdvanceRound();
    }
    if (!stopped) StartGroups();
    PollCalls();
    PollGroups();
    if (EngineActive() > 0) {
      if (!Step(&failure)) break;
    } else if (episodes_.empty() &&
               (stopped || (options_.episodes > 0 && next_episode_ >= options_.episodes))) {
      break;
    } else {
      // Waiting for weights, the subscriber's Notify ends the wait as soon as they are loaded.
      env_calls_.wake().WaitFor(
          milliseconds((sender_ && sender_->Backlogged()) || waiting_since_ ? 50 : 2));
    }
    Snapshot();
    reporter_.Report(metrics_, false);
  }
  // Every segment handed over: wait for the server, spill what it does not take in time.
  Status closed;
  if (sender_) {
    closed = sender_->Close(milliseconds(std::max<int64_t>(10000, 4 * options_.spill_after_ms)));
    if (!closed.ok()) spdlog::error("{}", closed.ToString());
  }
  // Environment threads still closing get a moment, so they do not outlive the process state.
  env_calls_.WaitIdle(milliseconds(2000));
  weights_.Stop();
  Snapshot();
  reporter_.Report(metrics_, true);
  if (!failure.ok()) return failure;
  return closed;
}

// Stop strings are matched on the text of the model's own tokens when it has a tokenizer, and
// every id of its vocabulary may be sampled (the byte format's image-patch id is its own token).
rollout::EngineOptions EngineOptionsWith(const ActorOptions& options,
                                         std::shared_ptr<const transcript::Format> format) {
  rollout::EngineOptions engine_options = EngineOptionsFor(options);
  if (format) {
    engine_options.never_sampled.clear();
    engine_options.token_bytes = [format = std::move(format)](int64_t id) {
      const int32_t token = static_cast<int32_t>(id);
      return format->DecodeBytes(std::span<const int32_t>(&token, 1));
    };
  }
  return engine_options;
}

}  // namespace

Result<std::unique_ptr<Actor>> Actor::Create(const ActorOptions& options) {
  STRIDER_RETURN_IF_ERROR(ValidateActorOptions(options));
  STRIDER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_config));
  if (!options.device.empty()) config.device = options.device;
  STRIDER_ASSIGN_OR_RETURN(std::shared_ptr<const transcript::Format> format,
                           tokenizer::ModelFormat(config.tokenizer));
  if (format && format->vocabulary_size() > config.vocabulary) {
    return Status::InvalidArgument(
        options.model_config + ": the tokenizer has " + std::to_string(format->vocabulary_size()) +
        " ids, more than the model's vocabulary of " + std::to_string(config.vocabulary));
  }
  ConfigurePrecision(options.precision);
  std::shared_ptr<const Model> shared = options.model;
  if (!shared) {
    std::unique_ptr<Model> model;
    if (options.weights.empty()) {
      STRIDER_ASSIGN_OR_RETURN(model, Model::Create(config, options.model_seed));
    } else {
      STRIDER_ASSIGN_OR_RETURN(model, Model::Load(config, options.weights));
    }
    STRIDER_RETURN_IF_ERROR(ApplyWeightPrecision(model.get(), options.precision));
    shared = std::move(model);
  }
  STRIDER_ASSIGN_OR_RETURN(
      std::unique_ptr<rollout::Engine> engine,
      rollout::Engine::Create(EngineOptionsWith(options, format), shared,
                              options.policy_version));
  std::unique_ptr<Sender> sender;
  if (!options.episode_sink) {
    SenderOptions sender_options;
    sender_options.endpoint = options.replay_endpoint;
    sender_options.client_id = options.actor_id;
    sender_options.spill_dir = options.spill_dir;
    sender_options.spill_max_bytes = static_cast<uint64_t>(options.spill_max_bytes);
    sender_options.queue_max_bytes = static_cast<uint64_t>(options.send_queue_max_bytes);
    sender_options.spill_after = milliseconds(options.spill_after_ms);
    sender_options.auth = options.replay_auth;
    STRIDER_ASSIGN_OR_RETURN(sender, Sender::Start(sender_options));
  }
  return std::unique_ptr<Actor>(new ActorImpl(options, std::move(config), std::move(shared),
                                              std::move(engine), std::move(sender),
                                              std::move(format)));
}

uint64_t TrainingSeed(uint64_t seed, int64_t group) {
  return Mix(seed, static_cast<uint64_t>(group)) & ~kEvaluationBit;
}

uint64_t EvaluationSeed(uint64_t seed, int64_t problem) {
  return Mix(Mix(kEvalSeedDomain, seed), static_cast<uint64_t>(problem)) | kEvaluationBit;
}

rollout::EngineOptions EngineOptionsFor(const ActorOptions& options) {
  rollout::EngineOptions engine_options;
  engine_options.cache_budget_bytes =
      options.cache_budget_cap_bytes > 0
          ? std::min(options.cache_budget_bytes, options.cache_budget_cap_bytes)
          : options.cache_budget_bytes;
  engine_options.block_tokens = options.block_tokens;
  engine_options.max_batch = options.max_batch;
  engine_options.prefill_chunk_tokens = options.prefill_chunk_tokens;
  engine_options.prefill_tokens_per_step = options.prefill_tokens_per_step;
  engine_options.threads = options.threads;
  engine_options.max_sequences = std::max<int64_t>(options.episodes_in_flight * 2 + 8, 64);
  // Episodes whose turn does not fit the cache wait for others to end rather than fail.
  engine_options.admission = rollout::AdmissionPolicy::kQueue;
  engine_options.record_routing = true;
  return engine_options;
}

}  // namespace strider::actors
