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
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include <ATen/ATen.h>

#include "actors/segmenter.h"
#include "actors/sender.h"
#include "common/model/model.h"
#include "common/model/vision.h"
#include "common/tokenizer.h"
#include "common/transcript.h"
#include "common/transport/weight_stream.h"
#include "envs/tools.h"
#include "rollout_engine/engine.h"

namespace strider::actors {
namespace {

using Clock = std::chrono::steady_clock;
using schema::Role;
using std::chrono::milliseconds;

struct Wake {
  std::mutex mutex;
  std::condition_variable cv;
  bool flag = false;
  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      flag = true;
    }
    cv.notify_one();
  }
  void WaitFor(milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait_for(lock, timeout, [&] { return flag; });
    flag = false;
  }
};

// The environment of one episode, shared with the thread of a call in progress.
struct EnvBox {
  std::unique_ptr<envs::Environment> env;
  envs::EnvironmentSpec spec;
};

struct EnvCall {
  std::mutex mutex;
  bool done = false;
  std::optional<Result<envs::Observation>> reset;
  std::optional<Result<envs::StepResult>> step;
  Clock::time_point started = Clock::now();
};

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

// A run of context tokens with one role; an image run also carries the image it stands for.
struct PromptPiece {
  std::vector<int32_t> tokens;
  Role role = Role::kUser;
  std::optional<schema::Image> image;
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

// The replay schema stores the transcript's roles by value.
constexpr bool SameValue(Role stored, transcript::Role role) {
  return static_cast<uint8_t>(stored) == static_cast<uint8_t>(role);
}
static_assert(SameValue(Role::kSystem, transcript::Role::kSystem) &&
              SameValue(Role::kUser, transcript::Role::kUser) &&
              SameValue(Role::kModel, transcript::Role::kModel) &&
              SameValue(Role::kToolCall, transcript::Role::kToolCall) &&
              SameValue(Role::kToolResult, transcript::Role::kToolResult) &&
              SameValue(Role::kImage, transcript::Role::kImage));
Role SchemaRole(transcript::Role role) { return static_cast<Role>(role); }

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

// An observation's images (envs/environment.h) as the transcript, the segmenter and the engine
// take them: per image the number of patches (its placeholder run in the transcript), the image
// as stored with the trajectory, and the pixels as (H, W, C) floats in [0, 1].
struct ObservationImages {
  std::vector<int64_t> patches;
  std::vector<schema::Image> stored;
  std::vector<at::Tensor> pixels;
};

Result<ObservationImages> ReadImages(const VisionConfig& vision,
                                     const std::vector<envs::Image>& images) {
  ObservationImages out;
  for (size_t i = 0; i < images.size(); ++i) {
    const envs::Image& image = images[i];
    const std::string what = "observation image " + std::to_string(i);
    if (image.width <= 0 || image.height <= 0 || image.channels <= 0 || image.channels > 255 ||
        image.pixels.size() !=
            static_cast<size_t>(image.width) * image.height * image.channels) {
      return Status::InvalidArgument(what + ": " + std::to_string(image.pixels.size()) +
                                     " pixel bytes for " + std::to_string(image.width) + "x" +
                                     std::to_string(image.height) + "x" +
                                     std::to_string(image.channels));
    }
    try {
      at::Tensor pixels =
          at::from_blob(const_cast<char*>(image.pixels.data()),
                        {image.height, image.width, image.channels}, at::kByte)
              .to(at::kFloat)
              .div_(255.0);
      STRIDER_RETURN_IF_ERROR(model::ValidateImage(vision, pixels).WithContext(what));
      out.patches.push_back(model::PatchCount(vision, pixels));
      out.stored.push_back(schema::Image{0, static_cast<uint32_t>(image.width),
                                         static_cast<uint32_t>(image.height),
                                         static_cast<uint8_t>(image.channels), image.pixels});
      out.pixels.push_back(std::move(pixels));
    } catch (const c10::Error& error) {
      return Status::InvalidArgument(what + ": " + error.what_without_backtrace());
    }
  }
  return out;
}

// Transcript runs as pieces; each image run carries the next of `images`, in order.
std::vector<PromptPiece> ToPieces(std::vector<transcript::Run> runs,
                                  const std::vector<schema::Image>& images) {
  std::vector<PromptPiece> pieces;
  size_t image = 0;
  for (transcript::Run& run : runs) {
    PromptPiece piece;
    piece.tokens = std::move(run.tokens);
    piece.role = SchemaRole(run.role);
    if (run.role == transcript::Role::kImage && image < images.size()) {
      piece.image = images[image++];
    }
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

// Adds pieces to a trajectory (each image just before its run); returns the tokens added.
int64_t AddPieces(Segmenter& segmenter, const std::vector<PromptPiece>& pieces) {
  int64_t added = 0;
  for (const PromptPiece& piece : pieces) {
    if (piece.image) (void)segmenter.AddImage(*piece.image);
    (void)segmenter.AddContext(piece.tokens, piece.role);
    added += static_cast<int64_t>(piece.tokens.size());
  }
  return added;
}

std::vector<int64_t> Concatenate(const std::vector<PromptPiece>& pieces) {
  std::vector<int64_t> tokens;
  for (const PromptPiece& piece : pieces) tokens.insert(tokens.end(), piece.tokens.begin(), piece.tokens.end());
  return tokens;
}

class ActorImpl final : public Actor {
 public:
  ActorImpl(ActorOptions options, ModelConfig config, std::shared_ptr<const Model> model,
            std::unique_ptr<rollout::Engine> engine, std::unique_ptr<Sender> sender)
      : options_(std::move(options)),
        config_(std::move(config)),
        model_(std::move(model)),
        engine_(std::move(engine)),
        sender_(std::move(sender)) {
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

  ~ActorImpl() override {
    if (weights_thread_.joinable()) {
      weights_thread_.request_stop();
      weights_thread_.join();
    }
  }

  void StartWeightSubscriber() {
    if (options_.weights_endpoint.empty()) return;
    weights_thread_ = std::jthread([this](std::stop_token stop) { WeightLoop(stop); });
  }

  Status Run(std::stop_token stop) override;
  ActorMetrics metrics() const override {
    std::lock_guard<std::mutex> lock(metrics_mutex_);
    return snapshot_;
  }

 private:
  void WeightLoop(std::stop_token stop);
  void ApplyWeights();
  void AdvanceRound();
  void StartGroups();
  void LaunchReset(Episode& episode);
  void LaunchStep(Episode& episode, envs::Action action);
  void PollCalls();
  void OnResetsDone(Group& group);
  void PollGroups();
  Status ProcessStep(const rollout::StepResult& step);
  Status RouteContext(Episode& e, const rollout::CompactRouting& routing, int64_t tokens);
  void OnTurnEnd(Episode& episode);
  void OnStepResult(Episode& episode, Result<envs::StepResult> result);
  void FinishEpisode(int64_t index, const std::string& status, const std::string& message);
  void LogEnvironmentFailure(const Episode& e, const std::string& status,
                             const std::string& message);
  void PushReady(Episode& episode);
  void EndGroupIfEmpty(int64_t group);
  void Report(bool final_report);
  void Snapshot();
  rollout::SamplingParams TurnSampling(const Episode& episode) const;
  int64_t EngineActive() const;

  ActorOptions options_;
  ModelConfig config_;
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
  std::shared_ptr<Wake> wake_ = std::make_shared<Wake>();
  std::shared_ptr<std::atomic<int64_t>> calls_running_ = std::make_shared<std::atomic<int64_t>>(0);
  // Nanoseconds inside environment calls, added by the call threads.
  std::shared_ptr<std::atomic<int64_t>> env_call_ns_ = std::make_shared<std::atomic<int64_t>>(0);
  Clock::time_point env_log_window_{};
  int env_logged_ = 0;
  int64_t env_log_suppressed_ = 0;

  // Weights: the subscriber thread leaves a loaded model here; the loop swaps it in.
  std::jthread weights_thread_;
  std::mutex weights_mutex_;
  std::shared_ptr<const Model> pending_model_;
  uint64_t pending_version_ = 0;
  std::atomic<int64_t> weight_errors_{0};

  // Synchronous rounds (options_.weights_sync); main thread.
  int64_t round_groups_ = 0;          // groups per round
  int64_t round_groups_started_ = 0;  // in the current round
  uint64_t round_version_ = 0;        // the version every episode of the current round plays
  std::optional<Clock::time_point> waiting_since_;  // the round ended, no newer version yet
  double weights_waited_s_ = 0;                     // in earlier waits

  ActorMetrics metrics_;  // main thread
  mutable std::mutex metrics_mutex_;
  ActorMetrics snapshot_;
  Clock::time_point started_;
  Clock::time_point next_report_;
  Clock::time_point next_progress_;
  std::ofstream metrics_file_;
  bool terminal_ = false;
};

rollout::SamplingParams ActorImpl::TurnSampling(const Episode& episode) const {
  rollout::SamplingParams sampling = options_.sampling;
  sampling.stop_tokens = {token::kEndOfTurn, token::kEndOfText};
  // A fresh stream per turn: the engine restarts the counter on every request.
  sampling.seed = Mix(Mix(Mix(options_.sampling.seed, episode.seed), episode.member),
                      static_cast<uint64_t>(episode.turns));
  return sampling;
}

void ActorImpl::WeightLoop(std::stop_token stop) {
  transport::WeightSubscriberOptions subscriber_options;
  subscriber_options.endpoint = options_.weights_endpoint;
  subscriber_options.reply_timeout =
      milliseconds(std::max<int64_t>(2000, options_.weights_poll_ms));
  subscriber_options.auth = options_.weights_auth;
  std::unique_ptr<transport::WeightSubscriber> subscriber;
  uint64_t have = options_.policy_version;
  while (!stop.stop_requested()) {
    if (!subscriber) {
      auto connected = transport::WeightSubscriber::Connect(subscriber_options);
      if (connected.ok()) subscriber = std::move(*connected);
    }
    if (subscriber) {
      Result<std::optional<transport::WeightUpdate>> update = subscriber->FetchNewer(have);
      if (!update.ok()) {
        if (update.status().code() != StatusCode::kUnavailable) {
          ++weight_errors_;
          spdlog::warn("weights: {}", update.status().ToString());
        }
      } else if (update->has_value()) {
        // Loaded straight from the checked bytes: no file per update.
        Result<std::unique_ptr<Model>> loaded = Model::LoadFromBytes(
            config_, (*update)->bytes, "weights version " + std::to_string((*update)->version));
        if (!loaded.ok()) {
          ++weight_errors_;
          spdlog::error("weights: version {} does not load into model '{}': {}", (*update)->version,
                        config_.name, loaded.status().ToString());
          have = (*update)->version;  // do not fetch the same bad bytes again and again
        } else {
          std::lock_guard<std::mutex> lock(weights_mutex_);
          pending_model_ = std::shared_ptr<const Model>(std::move(*loaded));
          pending_version_ = (*update)->version;
          have = pending_version_;
          spdlog::info("weights: version {} received ({} bytes)", have, (*update)->bytes.size());
        }
        wake_->Notify();  // an idle loop (a synchronous round waiting for it) takes it now
      }
    }
    const auto until = Clock::now() + milliseconds(options_.weights_poll_ms);
    while (!stop.stop_requested() && Clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
}

void ActorImpl::ApplyWeights() {
  std::shared_ptr<const Model> model;
  uint64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(weights_mutex_);
    if (!pending_model_) return;
    model = std::move(pending_model_);
    version = pending_version_;
  }
  // Between engine steps: every token reports the version that computed its distribution, and
  // segments carry those versions as policy runs, so no segment needs to end here.
  Status swapped = engine_->SwapWeights(model, version);
  if (!swapped.ok()) {
    ++metrics_.errors["weights"];
    spdlog::error("weights: version {} refused by the engine: {}", version, swapped.ToString());
    return;
  }
  model_ = std::move(model);
  metrics_.policy_version = version;
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
      LaunchReset(*episode);
      group.members.push_back(episode->index);
      episodes_[episode->index] = std::move(episode);
      ++metrics_.episodes_started;
    }
    groups_[group.id] = std::move(group);
  }
}

void ActorImpl::LaunchReset(Episode& episode) {
  auto call = std::make_shared<EnvCall>();
  episode.call = call;
  ++*calls_running_;
  std::thread([call, box = episode.box, config = options_.env, seed = episode.seed, wake = wake_,
               running = calls_running_, spent = env_call_ns_] {
    std::optional<Result<envs::Observation>> result;
    const auto start = Clock::now();
    try {
      Result<std::unique_ptr<envs::Environment>> made = envs::MakeEnvironment(config);
      if (!made.ok()) {
        result = made.status();
      } else {
        box->env = std::move(*made);
        box->spec = box->env->Describe();
        result = box->env->Reset(seed, {});
      }
    } catch (const std::exception& e) {
      result = Status::Internal(std::string("environment threw: ") + e.what());
    }
    *spent += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    {
      std::lock_guard<std::mutex> lock(call->mutex);
      call->reset = std::move(result);
      call->done = true;
    }
    --*running;
    wake->Notify();
  }).detach();
}

void ActorImpl::LaunchStep(Episode& episode, envs::Action action) {
  auto call = std::make_shared<EnvCall>();
  episode.call = call;
  ++*calls_running_;
  std::thread([call, box = episode.box, action = std::move(action), wake = wake_,
               running = calls_running_, spent = env_call_ns_] {
    std::optional<Result<envs::StepResult>> result;
    const auto start = Clock::now();
    try {
      result = box->env->Step(action);
    } catch (const std::exception& e) {
      result = Status::Internal(std::string("environment threw: ") + e.what());
    }
    *spent += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    {
      std::lock_guard<std::mutex> lock(call->mutex);
      call->step = std::move(result);
      call->done = true;
    }
    --*running;
    wake->Notify();
  }).detach();
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
    bool done = false;
    {
      std::lock_guard<std::mutex> lock(call->mutex);
      done = call->done;
    }
    if (!done) {
      if (now - call->started > limit) {
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
      Result<envs::Observation> reset = std::move(*call->reset);
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
      OnStepResult(episode, std::move(*call->step));
    }
  }
}

// When every member of the group has answered its reset: build the prompt once, submit it.
void ActorImpl::OnResetsDone(Group& group) {
  std::vector<int64_t> waiting;
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
  transcript::Transcript prompt;
  prompt.AddSystem(spec.description, envs::RenderToolList(spec.tools));
  prompt.AddObservation(envs::TranscriptRole(observation.role), observation.text,
                        images->patches);
  prompt.BeginModelTurn();
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
      (void)engine_->Release(source);
      continue;
    }
    // Each member then samples with DeriveSeed(seed, i): the group shares the prompt's state
    // and next-token distribution and differs only in its random stream.
    rollout::SamplingParams sampling = TurnSampling(*episodes_[members[0]]);
    Result<std::vector<rollout::SequenceId>> forked =
        engine_->Fork(source, static_cast<int64_t>(members.size()), sampling);
    (void)engine_->Release(source);
    if (!forked.ok()) {
      for (int64_t index : members) FinishEpisode(index, "engine", forked.status().ToString());
      continue;  // the group is gone now
    }
    for (size_t i = 0; i < members.size(); ++i) {
      Episode& e = *episodes_[members[i]];
      e.sequence = (*forked)[i];
      by_sequence_[e.sequence.value()] = e.index;
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
      metrics_.context_tokens += AddPieces(*e.segmenter, group.prompt);
      Status routed = RouteContext(e, group.prompt_routing, group.prompt_routing.tokens);
      if (!routed.ok()) {
        FinishEpisode(e.index, "routing", routed.ToString());
        continue;
      }
      e.phase = Phase::kGenerating;
      PushReady(e);
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

Status ActorImpl::ProcessStep(const rollout::StepResult& step) {
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
  return Status::Ok();
}

void ActorImpl::OnTurnEnd(Episode& e) {
  // The sequence is idle: its state covers every token so far, a clean place for a cut.
  std::optional<uint64_t> digest;
  Result<uint64_t> state = engine_->StateDigest(*e.sequence);
  if (state.ok()) digest = *state;
  e.segmenter->MarkTurnBoundary(digest);
  std::vector<int32_t> text_tokens = e.turn_tokens;
  if (!text_tokens.empty() &&
      (text_tokens.back() == token::kEndOfTurn || text_tokens.back() == token::kEndOfText)) {
    text_tokens.pop_back();
  }
  envs::Action action = envs::MakeAction(Tokenizer::Decode(text_tokens));
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
  LaunchStep(e, std::move(action));
}

void ActorImpl::OnStepResult(Episode& e, Result<envs::StepResult> result) {
  const int64_t index = e.index;
  if (!result.ok()) {
    (void)e.segmenter->EndStep(std::nullopt);
    const bool timed_out = result.status().code() == StatusCode::kDeadlineExceeded;
    FinishEpisode(index, timed_out ? "env_timeout" : "env_error", result.status().ToString());
    return;
  }
  envs::StepResult& r = *result;
  if (options_.episode_sink) e.exchange.push_back(r.observation.text);
  std::optional<float> reward;
  if (r.reward) reward = static_cast<float>(*r.reward);
  e.step_reward_sum += r.reward.value_or(0.0);
  (void)e.segmenter->EndStep(reward, SchemaLabel(r.label));
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
  const std::vector<PromptPiece> pieces = ToPieces(e.transcript.Take(), images->stored);
  if (r.done) {
    // The final observation (a verdict) is context after the last action; no turn follows.
    e.outcome = static_cast<float>(r.outcome_reward.value_or(0.0));
    metrics_.context_tokens += AddPieces(*e.segmenter, pieces);
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
  metrics_.context_tokens += AddPieces(*e.segmenter, pieces);
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
    (void)engine_->Cancel(*e.sequence);
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
  } else if (e.segmenter && e.segmenter->length() > 0) {
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
    // (the engine also never samples the image-patch placeholder).
    metadata.emplace_back("sampling.temperature", std::to_string(options_.sampling.temperature));
    metadata.emplace_back("sampling.top_k", std::to_string(options_.sampling.top_k));
    metadata.emplace_back("sampling.top_p", std::to_string(options_.sampling.top_p));
    metadata.emplace_back("sampling.banned", std::to_string(token::kImagePatch));
    if (!message.empty()) metadata.emplace_back("error", message);
    for (const auto& [key, value] : e.info) metadata.emplace_back("info." + key, value);
    // With the seed, the options replay the episode offline (reward/verifiers.h).
    for (const auto& [key, value] : options_.env.options) {
      metadata.emplace_back("env_option." + key, value);
    }
    Result<std::vector<schema::SegmentData>> last =
        e.segmenter->Finish(e.outcome, EndReasonOf(status), std::move(metadata));
    if (last.ok()) {
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
  }
  // Close the environment off the loop (a process may take a while to go), unless a call is
  // still running in it: then the box dies with that call.
  if (!e.call && e.box && e.box->env) {
    ++*calls_running_;
    std::thread([box = e.box, running = calls_running_] {
      box->env->Close();
      --*running;
    }).detach();
  }
  const int64_t group = e.group;
  episodes_.erase(it);
  ++metrics_.episodes_finished;
  EndGroupIfEmpty(group);
}

void ActorImpl::EndGroupIfEmpty(int64_t id) {
  auto it = groups_.find(id);
  if (it == groups_.end()) return;
  for (int64_t index : it->second.members) {
    if (episodes_.count(index)) return;
  }
  if (it->second.source) (void)engine_->Cancel(*it->second.source);
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
  metrics_.env_calls_running = *calls_running_;
  metrics_.env_call_seconds = static_cast<double>(env_call_ns_->load()) * 1e-9;
  metrics_.engine_sequences = engine_->Stats().live_sequences;
  metrics_.send_queue_segments = sent.queued_segments;
  metrics_.send_queue_bytes = sent.queued_bytes;
  metrics_.in_flight_segments = sent.in_flight;
  metrics_.acked_segments = sent.acked;
  metrics_.refused_segments = sent.rejected;
  metrics_.spill_files = sent.spill_files;
  metrics_.spill_bytes = sent.spill_bytes;
  metrics_.replay_connected = sent.connected;
  if (weight_errors_ > 0) metrics_.errors["weights"] = weight_errors_;
  metrics_.waiting_for_weights = waiting_since_.has_value();
  metrics_.weights_wait_s =
      weights_waited_s_ +
      (waiting_since_ ? std::chrono::duration<double>(Clock::now() - *waiting_since_).count() : 0);
  std::lock_guard<std::mutex> lock(metrics_mutex_);
  snapshot_ = metrics_;
}

void ActorImpl::Report(bool final_report) {
  const auto now = Clock::now();
  if (terminal_ && (now >= next_progress_ || final_report)) {
    next_progress_ = now + milliseconds(500);
    int64_t errors = 0;
    for (const auto& [kind, n] : metrics_.errors) errors += n;
    const double elapsed = std::max(1e-9, metrics_.elapsed_s);
    char round[96] = "";
    if (metrics_.sync) {
      std::snprintf(round, sizeof(round), "  round %lld%s (waited %.1f s)",
                    static_cast<long long>(metrics_.round),
                    metrics_.waiting_for_weights ? " waiting for weights" : "",
                    metrics_.weights_wait_s);
    }
    std::fprintf(stderr,
                 "\r[%s] episodes %lld%s  tokens/s %.0f  tool calls %lld  errors %lld  "
                 "segments %lld (acked %llu, spilled %llu)  v%llu%s   %s",
                 options_.actor_id.c_str(), static_cast<long long>(metrics_.episodes_finished),
                 options_.episodes > 0 ? ("/" + std::to_string(options_.episodes)).c_str() : "",
                 (metrics_.generated_tokens + metrics_.context_tokens) / elapsed,
                 static_cast<long long>(metrics_.tool_calls), static_cast<long long>(errors),
                 static_cast<long long>(metrics_.segments),
                 static_cast<unsigned long long>(metrics_.acked_segments),
                 static_cast<unsigned long long>(metrics_.spill_files),
                 static_cast<unsigned long long>(metrics_.policy_version), round,
                 final_report ? "\n" : "");
    std::fflush(stderr);
  }
  if (now < next_report_ && !final_report) return;
  next_report_ = now + milliseconds(static_cast<int64_t>(options_.metrics_interval_s * 1000));
  const std::string line = metrics_.ToJson();
  if (metrics_file_.is_open()) {
    metrics_file_ << line << "\n";
    metrics_file_.flush();
  }
  if (!terminal_) spdlog::info("metrics {}", line);
}

Status ActorImpl::Run(std::stop_token stop) {
  started_ = Clock::now();
  next_report_ = started_ + milliseconds(static_cast<int64_t>(options_.metrics_interval_s * 1000));
  terminal_ = options_.progress && ::isatty(STDERR_FILENO);
  if (!options_.metrics_path.empty()) {
    metrics_file_.open(options_.metrics_path, std::ios::app);
    if (!metrics_file_) {
      return Status::IoError("actor: cannot open the metrics file " + options_.metrics_path);
    }
  }
  StartWeightSubscriber();
  Status failure;
  bool stopped = false;
  while (true) {
    if (stop.stop_requested() && !stopped) {
      stopped = true;
      std::vector<int64_t> live;
      for (const auto& [index, e] : episodes_) live.push_back(index);
      for (int64_t index : live) FinishEpisode(index, "stopped", "the actor was stopped");
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
      const auto step_start = Clock::now();
      Result<rollout::StepResult> step = engine_->Step();
      ++metrics_.engine_steps;
      const double step_seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
      metrics_.engine_step_seconds += step_seconds;
      if (step.ok()) {
        metrics_.prefill_steps += step->prefill_tokens > 0 ? 1 : 0;
        (step->prefill_tokens > 0 ? metrics_.prefill_step_seconds
                                  : metrics_.decode_step_seconds) += step_seconds;
        metrics_.prefill_tokens += step->prefill_tokens;
        metrics_.decode_tokens += step->decode_tokens;
      }
      if (!step.ok()) {
        failure = step.status().WithContext("rollout engine");
        std::vector<int64_t> live;
        for (const auto& [index, e] : episodes_) live.push_back(index);
        for (int64_t index : live) FinishEpisode(index, "engine", failure.ToString());
        break;
      }
      Status processed = ProcessStep(*step);
      if (!processed.ok()) return processed;
    } else if (episodes_.empty() &&
               (stopped || (options_.episodes > 0 && next_episode_ >= options_.episodes))) {
      break;
    } else {
      // Waiting for weights, the subscriber's Notify ends the wait as soon as they are loaded.
      wake_->WaitFor(
          milliseconds((sender_ && sender_->Backlogged()) || waiting_since_ ? 50 : 2));
    }
    Snapshot();
    Report(false);
  }
  // Every segment handed over: wait for the server, spill what it does not take in time.
  Status closed;
  if (sender_) {
    closed = sender_->Close(milliseconds(std::max<int64_t>(10000, 4 * options_.spill_after_ms)));
    if (!closed.ok()) spdlog::error("{}", closed.ToString());
  }
  // Environment threads still closing get a moment, so they do not outlive the process state.
  const auto deadline = Clock::now() + milliseconds(2000);
  while (*calls_running_ > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(5));
  if (weights_thread_.joinable()) {
    weights_thread_.request_stop();
    weights_thread_.join();
  }
  Snapshot();
  Report(true);
  if (!failure.ok()) return failure;
  return closed;
}

}  // namespace

Result<std::unique_ptr<Actor>> Actor::Create(const ActorOptions& options) {
  STRIDER_RETURN_IF_ERROR(ValidateActorOptions(options));
  STRIDER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_config));
  std::shared_ptr<const Model> shared = options.model;
  if (!shared) {
    std::unique_ptr<Model> model;
    if (options.weights.empty()) {
      STRIDER_ASSIGN_OR_RETURN(model, Model::Create(config, options.model_seed));
    } else {
      STRIDER_ASSIGN_OR_RETURN(model, Model::Load(config, options.weights));
    }
    shared = std::move(model);
  }
  STRIDER_ASSIGN_OR_RETURN(
      std::unique_ptr<rollout::Engine> engine,
      rollout::Engine::Create(EngineOptionsFor(options), shared, options.policy_version));
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
                                              std::move(engine), std::move(sender)));
}

uint64_t TrainingSeed(uint64_t seed, int64_t group) {
  return Mix(seed, static_cast<uint64_t>(group)) & ~kEvaluationBit;
}

uint64_t EvaluationSeed(uint64_t seed, int64_t problem) {
  return Mix(Mix(kEvalSeedDomain, seed), static_cast<uint64_t>(problem)) | kEvaluationBit;
}

rollout::EngineOptions EngineOptionsFor(const ActorOptions& options) {
  rollout::EngineOptions engine_options;
  engine_options.cache_budget_bytes = options.cache_budget_bytes;
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
