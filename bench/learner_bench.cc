// RL learner benchmark (issue "The RL learner", section 8; docs/design.md#benchmark-protocol).
//
//   1. One RL step on the small config, piece by piece, over a group of `retrieval` trajectories
//      that the model itself played as the actor would (real segments: tokens, roles, behaviour
//      log-probs of the sampling distribution, experts of every position, steps): the scoring
//      passes (current policy, current policy with the value head as the learner runs it, the
//      reference policy) as their own lines, the update pass (rl_step.h AccumulateGradients:
//      the chunked pass along the inference path with backward and the policy, KL and value
//      losses) against LibTorch's matmul peak measured in this run (target >= 35%) and against
//      a pretraining pass (learner/language_model_loss.h) over the same tokens along the same
//      path (target >= 0.8), then the AdamW step and the routing balance, and the whole step.
//   2. The small model's weights (Model::SaveToBytes) through a WeightPublisher to 4
//      WeightSubscribers on threads of this process, against a raw ZeroMQ copy of the same bytes
//      in the same chunks to 4 peers (target <= 1.5x).
//   3. With --long (or without --quick): a `retrieval` trajectory of --long-tokens tokens
//      (default 1,048,576) of configs/model/tiny_incremental.yaml through one learner step
//      (scoring pass, advantages, update pass with truncated backpropagation at chunk
//      boundaries, AdamW), at 1/4, 1/2 and all of the length, each in a fresh process (the
//      bench runs itself with --long-child N): time and peak resident memory, split into what
//      the learner holds of the trajectory (linear in its length by nature: tokens, the
//      routing record) and what the passes add on top (bounded by the chunk and the state).
//      With --long-store DIR instead: one step (no reference pass) over the one trajectory of
//      the replay store in DIR that actor_bench --long-keep left, played by --long-model with
//      its seed-0 weights (the hybrid tiny_1m's million-token episode): time of each pass per
//      token, peak memory against the latent cache it must hold (this alone, nothing else).
//   4. The busy fraction of the RL learner service (rl_learner.h) stepping over a replay group
//      table filled before it starts with the group of part 1: time outside the sample wait
//      over wall time, as the learner's metrics.jsonl reports it (target >= 90%).
//
//   learner_bench [--quick] [--model NAME|PATH] [--members N] [--turn-tokens N] [--repeats N]
//                 [--long] [--no-long] [--long-tokens N] [--long-chunk N] [--busy-steps N]
//                 [--long-model NAME|PATH --long-store DIR] [--device cuda[:N]]
//
// --device cuda: part 1 alone with the model on that GPU (playing, scoring, update, AdamW), its
// FLOP rates against the GPU's bf16 matrix peak measured in the same run (8192-cube products on
// random data) instead of the CPU's fp32 peak (docs/cuda.md, "Baseline figures").
//
// A model NAME is configs/model/NAME.yaml. --quick: the tiny config, 2 members, no long run
// unless --long asks for it.
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "actors/segmenter.h"
#include "bench/bench_json.h"
#include "bench/bench_util.h"
#include "bench/ceiling.h"
#include "common/clock.h"
#include "common/model/config.h"
#include "common/model/model.h"
#include "common/model/parameters.h"
#include "common/model/sampling_distribution.h"
#include "common/model/tensor_pool.h"
#include "common/process_memory.h"
#include "common/tokenizer.h"
#include "common/transport/weight_stream.h"
#include "envs/retrieval/retrieval.h"
#include "learner/language_model_loss.h"
#include "learner/learner.h"
#include "learner/pretrain/token_batch.h"
#include "learner/rl/rl_learner.h"
#include "learner/rl/rl_step.h"
#include "replay/client.h"
#include "replay/inspect.h"
#include "replay/replay.h"

namespace strider {
namespace {

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::string ModelPath(const std::string& name) {
  if (name.find('/') != std::string::npos || name.ends_with(".yaml")) return name;
  return std::string(STRIDER_SOURCE_DIR) + "/configs/model/" + name + ".yaml";
}

// ---------------------------------------------------------------------------------------------
// Trajectories played by the model as the actor plays them
// ---------------------------------------------------------------------------------------------

struct EpisodeSpec {
  int64_t document_tokens = 1024;  // retrieval's total_tokens
  int64_t parts = 2;
  int64_t turn_tokens = 64;        // tokens sampled per model turn
  int64_t prefill_chunk = 4096;    // context tokens per Append
  uint64_t env_seed = 1;
  uint64_t sample_seed = 1;
  schema::TrajectoryId group_id;
  uint32_t group_index = 0;
  uint32_t group_size = 0;
};

// The experts `output` recorded for its positions, position-major (layers x k per position), as
// the segmenter takes them.
std::vector<uint16_t> ExpertsOf(const RoutingRecord& routing) {
  if (routing.layers.empty()) return {};
  std::vector<at::Tensor> layers;
  for (const RoutingRecord::Layer& layer : routing.layers) layers.push_back(layer.experts[0]);
  const at::Tensor all = at::stack(layers, 1).to(at::kInt).contiguous();  // (T, layers, k)
  const int32_t* p = all.data_ptr<int32_t>();
  return std::vector<uint16_t>(p, p + all.numel());
}

// Feeds context tokens through the model chunk by chunk, giving their experts to the segmenter;
// returns the logits after the last one (1, V).
Result<at::Tensor> FeedContext(const Model& model, InferenceState* state,
                               const std::vector<int32_t>& tokens, schema::Role role,
                               int64_t chunk, actors::Segmenter* segmenter) {
  STRIDER_RETURN_IF_ERROR(segmenter->AddContext(tokens, role));
  at::Tensor last;
  for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const size_t end = std::min(tokens.size(), begin + static_cast<size_t>(chunk));
    std::vector<int64_t> ids(tokens.begin() + begin, tokens.begin() + end);
    const int64_t position = state->length();
    ModelInput input;
    input.tokens = at::tensor(ids, at::kLong).view({1, -1});
    ForwardOptions options;
    options.record_routing = true;
    options.last_position_only = true;
    STRIDER_ASSIGN_OR_RETURN(ForwardOutput out, model.Append(state, input, options));
    STRIDER_RETURN_IF_ERROR(segmenter->AddRouting(position, ExpertsOf(out.routing)));
    last = out.logits[0][-1];
  }
  return last;
}

// Plays one `retrieval` episode with `model` as the policy at temperature 1: the question and
// each revealed part as user context, turns of `turn_tokens` sampled tokens (behaviour log-prob
// from the shared sampling distribution, experts as the model routed them). A random model
// never answers, so the episode ends after the turn that follows the last part, cut at the turn
// limit as an actor cuts one (truncated: the learner bootstraps it from the value).
Result<std::vector<schema::SegmentData>> PlayRetrieval(const Model& model,
                                                       const EpisodeSpec& spec) {
  const ModelConfig& config = model.config();
  envs::Options env_options = {{"total_tokens", std::to_string(spec.document_tokens)},
                               {"parts", std::to_string(spec.parts)}};
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<envs::Environment> env,
                           envs::MakeRetrievalEnvironment(env_options));
  actors::SegmenterOptions options;
  options.env = "retrieval";
  options.routing_layers = config.layers - config.feed_forward.dense_layers;
  options.routing_top_k = config.feed_forward.experts_per_token;
  options.route_context = true;
  options.group_id = spec.group_id;
  options.group_index = spec.group_index;
  options.group_size = spec.group_size;
  actors::Segmenter segmenter(options, actors::NewTrajectoryId());
  std::vector<schema::SegmentData> segments;
  auto take = [&] {
    for (schema::SegmentData& s : segmenter.TakeReady()) segments.push_back(std::move(s));
  };

  const model::SamplingSettings settings = model::RolloutSamplingSettings(1.0, 0, 1.0);
  std::mt19937_64 random(spec.sample_seed);
  STRIDER_ASSIGN_OR_RETURN(InferenceState state, model.NewState(1));
  STRIDER_ASSIGN_OR_RETURN(envs::Observation observation, env->Reset(spec.env_seed, {}));
  std::vector<int32_t> context = {token::kBeginOfText, token::kUser};
  for (int64_t turn = 0;; ++turn) {
    const std::vector<int32_t> text = Tokenizer::Encode(observation.text);
    context.insert(context.end(), text.begin(), text.end());
    context.push_back(token::kEndOfTurn);
    context.push_back(token::kModel);
    STRIDER_ASSIGN_OR_RETURN(at::Tensor logits,
                             FeedContext(model, &state, context, schema::Role::kUser,
                                         spec.prefill_chunk, &segmenter));
    segmenter.MarkTurnBoundary(std::nullopt);
    std::vector<int32_t> sampled;
    for (int64_t i = 0; i < spec.turn_tokens; ++i) {
      const at::Tensor lp =
          model::SamplingLogProbs(logits.to(at::kDouble), settings).contiguous();
      const double* p = lp.data_ptr<double>();
      std::uniform_real_distribution<double> uniform(0.0, 1.0);
      double u = uniform(random), mass = 0;
      int64_t id = 0;
      for (; id + 1 < lp.numel(); ++id) {
        mass += std::exp(p[id]);
        if (u < mass) break;
      }
      while (!std::isfinite(p[id])) --id;  // rounding at the top end: the last kept id
      ModelInput input;
      input.tokens = at::full({1, 1}, id, at::kLong);
      ForwardOptions forward;
      forward.record_routing = true;
      STRIDER_ASSIGN_OR_RETURN(ForwardOutput out, model.Append(&state, input, forward));
      STRIDER_RETURN_IF_ERROR(segmenter.AddAction(static_cast<int32_t>(id), schema::Role::kModel,
                                                  static_cast<float>(p[id]), 0,
                                                  ExpertsOf(out.routing)));
      sampled.push_back(static_cast<int32_t>(id));
      logits = out.logits[0][-1];
    }
    envs::Action action;
    action.text = Tokenizer::Decode(sampled);
    STRIDER_ASSIGN_OR_RETURN(envs::StepResult result, env->Step(action));
    std::optional<float> reward;
    if (result.reward) reward = static_cast<float>(*result.reward);
    const schema::StepLabel label = result.label == envs::StepLabel::kCorrect
                                        ? schema::StepLabel::kCorrect
                                    : result.label == envs::StepLabel::kIncorrect
                                        ? schema::StepLabel::kIncorrect
                                        : schema::StepLabel::kUnknown;
    STRIDER_RETURN_IF_ERROR(segmenter.EndStep(reward, label));
    take();
    if (result.done || turn + 1 >= spec.parts) {
      const schema::EndReason end =
          result.done ? schema::EndReason::kFinished : schema::EndReason::kTruncatedTurns;
      STRIDER_ASSIGN_OR_RETURN(
          std::vector<schema::SegmentData> last,
          segmenter.Finish(static_cast<float>(result.outcome_reward.value_or(0.0)), end,
                           {{"status", result.done ? "done" : "max_turns"}}));
      for (schema::SegmentData& s : last) segments.push_back(std::move(s));
      return segments;
    }
    observation = result.observation;
    context = {token::kEndOfTurn, token::kUser};
  }
}

// One group of `members` episodes of the same question (GRPO-style), sampled independently.
Result<std::vector<rl::SampledGroup>> PlayGroup(const Model& model, EpisodeSpec spec,
                                                int64_t members) {
  std::vector<schema::SegmentData> all;
  spec.group_id = actors::NewTrajectoryId();
  spec.group_size = static_cast<uint32_t>(members);
  for (int64_t m = 0; m < members; ++m) {
    spec.group_index = static_cast<uint32_t>(m);
    spec.sample_seed = 1000 + m;
    STRIDER_ASSIGN_OR_RETURN(std::vector<schema::SegmentData> segments,
                             PlayRetrieval(model, spec));
    for (schema::SegmentData& s : segments) all.push_back(std::move(s));
  }
  return rl::SplitBatch(std::move(all));
}

// The step settings of the benchmark: the learner's defaults with every scoring pass in use (a
// KL term needs the reference, the value loss the value head) and process GAE, whose advantages
// are not zero on trajectories without an outcome.
rl::StepSettings BenchStepSettings(int64_t chunk_tokens) {
  rl::StepSettings settings;
  settings.scoring.chunk_tokens = chunk_tokens;
  settings.truncated_backprop = true;
  settings.weights_version = 0;
  settings.objective.advantages.estimator = "process_gae";
  settings.objective.loss.kl_coef = 0.01;
  settings.objective.loss.value_coef = 0.5;
  return settings;
}

std::vector<const rl::TrainingTrajectory*> Kept(const rl::PreparedBatch& batch) {
  std::vector<const rl::TrainingTrajectory*> kept;
  for (const rl::TrainingTrajectory& t : batch.trajectories) {
    if (!t.excluded) kept.push_back(&t);
  }
  return kept;
}

// ---------------------------------------------------------------------------------------------
// 1. The RL step on the small config
// ---------------------------------------------------------------------------------------------

struct StepBenchOptions {
  std::string model = "small";
  int64_t members = 4;
  int64_t turn_tokens = 64;
  int64_t repeats = 1;
  int64_t chunk_tokens = 512;
  std::string device;  // empty: the config's
};

// Model FLOPs of a pass over a sequence of `length` tokens: 2 x active parameters per token
// forward (6 with backward), plus the latent layers' causal attention over the cache.
double PassFlops(const ModelConfig& m, int64_t length, bool backward) {
  const double active = static_cast<double>(CountParameters(m).active);
  const double factor = backward ? 3 : 1;
  const double attention = static_cast<double>(m.CountLayers('G')) * factor * 2 *
                           m.latent.heads * (2.0 * m.latent.kv_rank + m.latent.rope_dim) *
                           static_cast<double>(length) / 2;
  return static_cast<double>(length) * (2 * factor * active + attention);
}

// `played` gets the group the step ran on (the busy-fraction run fills a table with it).
int RunStepBench(const StepBenchOptions& o, const bench::Ceiling& ceiling,
                 std::vector<rl::SampledGroup>* played_groups) {
  ModelConfig config = bench::Unwrap(LoadModelConfig(ModelPath(o.model)), "model config");
  if (!o.device.empty()) config.device = o.device;
  const std::string bench = "learner_" + config.name;
  const double peak = ceiling.value * 1e9;
  const TrainerOptions trainer_options = MakeTrainerOptions({.seed = 1}, {});
  std::unique_ptr<Trainer> trainer =
      bench::Unwrap(Trainer::Create(config, trainer_options), "trainer");
  // The reference policy is the initial one (configs/rl "reference: initial").
  std::unique_ptr<Model> reference = bench::Unwrap(Model::Create(config, 1), "reference");
  const Model& model = trainer->model();

  EpisodeSpec spec;
  spec.turn_tokens = o.turn_tokens;
  const auto played = Clock::now();
  const std::vector<rl::SampledGroup> groups =
      bench::Unwrap(PlayGroup(model, spec, o.members), "playing the episodes");
  std::fprintf(stderr, "learner_bench: played %lld episodes in %.1f s\n",
               static_cast<long long>(o.members), Seconds(played));
  rl::StepSettings settings = BenchStepSettings(o.chunk_tokens);

  // The trajectories as the passes take them, and their token and FLOP counts.
  std::vector<rl::PreparedTrajectory> prepared;
  std::vector<TokenBatch> token_batches;
  int64_t tokens = 0, action_tokens = 0;
  double forward_flops = 0, backward_flops = 0;
  for (const auto& members : groups.front().members) {
    prepared.push_back(bench::Unwrap(rl::PrepareTrajectory(members, true, config.vocabulary),
                                     "preparing a trajectory"));
    const rl::PreparedTrajectory& p = prepared.back();
    tokens += p.length();
    action_tokens += static_cast<int64_t>(p.positions.size());
    forward_flops += PassFlops(config, p.length(), false);
    backward_flops += PassFlops(config, p.length(), true);
    token_batches.push_back(
        bench::Unwrap(MakeTokenBatch({p.joined.tokens}, config), "token batch"));
  }
  const bench::JsonFields shape = {
      {"trajectories", bench::JsonNumber(static_cast<double>(prepared.size()))},
      {"tokens", bench::JsonNumber(static_cast<double>(tokens))},
      {"action_tokens", bench::JsonNumber(static_cast<double>(action_tokens))},
      {"chunk_tokens", bench::JsonNumber(static_cast<double>(o.chunk_tokens))}};
  auto with = [&](bench::JsonFields fields) {
    fields.insert(fields.begin(), shape.begin(), shape.end());
    return fields;
  };

  // Scoring passes, each on its own: the current policy with routing replay, the same with the
  // value head (the pass the learner runs), and the reference with its own routing.
  auto score = [&](const Model& scorer, bool values, bool replay) {
    rl::ScoringOptions scoring = settings.scoring;
    scoring.chunk_tokens = o.chunk_tokens;
    scoring.values = values;
    scoring.replay_routing = replay;
    for (const rl::PreparedTrajectory& p : prepared) {  // warm-up on the first
      (void)bench::Unwrap(rl::ScorePrepared(scorer, p, scoring), "scoring");
      break;
    }
    double seconds = 0;
    for (int64_t r = 0; r < o.repeats; ++r) {
      for (const rl::PreparedTrajectory& p : prepared) {
        const auto started = Clock::now();
        (void)bench::Unwrap(rl::ScorePrepared(scorer, p, scoring), "scoring");
        seconds += Seconds(started);
      }
    }
    return seconds / o.repeats;
  };
  const double score_policy = score(model, false, true);
  const double score_values = score(model, true, true);
  const double score_reference = score(*reference, false, false);
  auto print_score = [&](const std::string& name, double seconds, const std::string& what) {
    bench::PrintResult(bench, name + "_tokens_per_second", tokens / seconds, "tokens/s",
                       std::nullopt,
                       with({{"seconds", bench::JsonNumber(seconds)},
                             {"pass", bench::JsonString(what)}}));
    bench::PrintResult(bench, name + "_flops", forward_flops / seconds / 1e9, "GFLOP/s",
                       peak / 1e9, bench::CeilingFields(ceiling));
  };
  print_score("score_policy", score_policy, "current policy, routing replay, no value head");
  print_score("score_policy_values", score_values,
              "current policy, routing replay, value head (the learner's scoring pass)");
  print_score("score_reference", score_reference, "reference policy, its own routing");

  // The step as the learner runs it: PrepareBatch (scoring and advantages), the update pass,
  // AdamW, routing balance; the pretraining pass on the same tokens beside the update pass.
  LossOptions pretrain;
  pretrain.path = TrainingPath::kInference;
  pretrain.chunk_tokens = o.chunk_tokens;
  pretrain.truncated = settings.truncated_backprop;
  pretrain.record_routing = true;
  double prepare_seconds = 0, update_seconds = 0, pretrain_seconds = 0, optimizer_seconds = 0,
         balance_seconds = 0, mismatch_max = 0;
  rl::UpdateMetrics last_update;
  for (int64_t r = -1; r < o.repeats; ++r) {  // r = -1: untimed warm-up
    const bool timed = r >= 0;
    auto started = Clock::now();
    const rl::PreparedBatch batch = bench::Unwrap(
        rl::PrepareBatch(model, reference.get(), groups, settings), "preparing the batch");
    if (timed) prepare_seconds += Seconds(started);
    if (!timed) mismatch_max = batch.mismatch_max;
    const std::vector<const rl::TrainingTrajectory*> kept = Kept(batch);
    // The rates count every played token, so a step that drops one would misreport them; and
    // an exclusion of a trajectory the same weights just played is itself the finding.
    for (const rl::TrainingTrajectory& t : batch.trajectories) {
      if (!t.excluded) continue;
      std::fprintf(stderr, "learner_bench: a played trajectory was excluded: %s\n",
                   t.excluded_reason.c_str());
      return 1;
    }

    trainer->ZeroGrad();
    started = Clock::now();
    for (const TokenBatch& b : token_batches) {
      (void)bench::Unwrap(LanguageModelLoss(model, b, pretrain), "pretraining pass");
    }
    if (timed) pretrain_seconds += Seconds(started);

    trainer->ZeroGrad();
    RoutingRecord routing;
    started = Clock::now();
    last_update = bench::Unwrap(rl::AccumulateGradients(model, kept, settings, &routing),
                                "update pass");
    if (timed) update_seconds += Seconds(started);
    started = Clock::now();
    (void)bench::Unwrap(trainer->Step(r + 1), "optimiser step");
    if (timed) optimizer_seconds += Seconds(started);
    // The weights are no longer the ones that played the episodes: later steps see them as
    // an asynchronous learner sees older trajectories (no mismatch check, importance weights).
    settings.weights_version.reset();
    started = Clock::now();
    (void)bench::Unwrap(trainer->BalanceRouting(std::move(routing)), "routing balance");
    if (timed) balance_seconds += Seconds(started);
  }
  const double n = static_cast<double>(o.repeats);
  prepare_seconds /= n, update_seconds /= n, pretrain_seconds /= n, optimizer_seconds /= n,
      balance_seconds /= n;
  const double update_rate = tokens / update_seconds;
  const double pretrain_rate = tokens / pretrain_seconds;
  bench::PrintResult(bench, "pretrain_pass_tokens_per_second", pretrain_rate, "tokens/s",
                     std::nullopt,
                     with({{"seconds", bench::JsonNumber(pretrain_seconds)},
                           {"pass", bench::JsonString("next-token loss, inference path, "
                                                      "truncated backprop, same tokens")}}));
  bench::JsonFields versus_pretrain =
      with({{"seconds", bench::JsonNumber(update_seconds)},
            {"baseline_is", bench::JsonString("pretrain_pass_tokens_per_second")},
            {"target_ratio", bench::JsonNumber(0.8)}});
  bench::PrintResult(bench, "rl_update_tokens_per_second", update_rate, "tokens/s",
                     pretrain_rate, versus_pretrain);
  bench::JsonFields versus_peak = bench::CeilingFields(ceiling);
  versus_peak.push_back({"target_ratio", bench::JsonNumber(0.35)});
  bench::PrintResult(bench, "rl_update_flops", backward_flops / update_seconds / 1e9, "GFLOP/s",
                     peak / 1e9, versus_peak);
  bench::PrintResult(bench, "optimizer_step_seconds", optimizer_seconds, "s");
  bench::PrintResult(bench, "routing_balance_seconds", balance_seconds, "s");
  const double step = prepare_seconds + update_seconds + optimizer_seconds + balance_seconds;
  bench::PrintResult(
      bench, "rl_step_seconds", step, "s", std::nullopt,
      with({{"prepare_seconds", bench::JsonNumber(prepare_seconds)},
            {"update_seconds", bench::JsonNumber(update_seconds)},
            {"optimizer_seconds", bench::JsonNumber(optimizer_seconds)},
            {"balance_seconds", bench::JsonNumber(balance_seconds)},
            {"update_fraction", bench::JsonNumber(update_seconds / step)},
            {"logprob_mismatch_max", bench::JsonNumber(mismatch_max)},
            {"clip_fraction", bench::JsonNumber(last_update.metrics.clip_fraction())}}));
  *played_groups = groups;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// 2. Weight publish against a raw ZeroMQ copy
// ---------------------------------------------------------------------------------------------

constexpr int kSubscribers = 4;

// Seconds from Publish until all 4 subscribers hold the verified bytes.
Result<double> PublishToSubscribers(const std::string& bytes, uint64_t version) {
  transport::WeightPublisherOptions options;
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<transport::WeightPublisher> publisher,
                           transport::WeightPublisher::Start(options));
  std::vector<std::unique_ptr<transport::WeightSubscriber>> subscribers;
  for (int s = 0; s < kSubscribers; ++s) {
    transport::WeightSubscriberOptions o;
    o.endpoint = publisher->endpoint();
    STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<transport::WeightSubscriber> subscriber,
                             transport::WeightSubscriber::Connect(o));
    subscribers.push_back(std::move(subscriber));
  }
  const auto started = Clock::now();
  STRIDER_RETURN_IF_ERROR(publisher->Publish(version, bytes));
  std::vector<Status> results(kSubscribers);
  std::vector<std::thread> threads;
  for (int s = 0; s < kSubscribers; ++s) {
    threads.emplace_back([&, s] {
      Result<std::optional<transport::WeightUpdate>> update = subscribers[s]->FetchNewer(0);
      if (!update.ok()) {
        results[s] = update.status();
      } else if (!update->has_value() || (*update)->bytes.size() != bytes.size()) {
        results[s] = Status::Internal("subscriber " + std::to_string(s) + " got no update");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = Seconds(started);
  for (const Status& status : results) STRIDER_RETURN_IF_ERROR(status);
  return seconds;
}

// The same bytes in the same chunk size from one ROUTER to 4 DEALER peers on threads, each
// assembling them into one buffer: the transport's cost without versions, windows or checksums.
Result<double> RawZmqCopy(const std::string& bytes, size_t chunk) {
  zmq::context_t context(2);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::sndhwm, 0);  // never drop: a ROUTER drops what exceeds its HWM
  router.bind("tcp://127.0.0.1:*");
  const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
  std::vector<size_t> received(kSubscribers, 0);
  const auto started = Clock::now();
  std::vector<std::thread> peers;
  for (int s = 0; s < kSubscribers; ++s) {
    peers.emplace_back([&, s] {
      zmq::socket_t dealer(context, zmq::socket_type::dealer);
      dealer.set(zmq::sockopt::linger, 0);
      dealer.set(zmq::sockopt::rcvhwm, 0);
      dealer.connect(endpoint);
      dealer.send(zmq::buffer("get", 3), zmq::send_flags::none);
      std::string assembled;
      assembled.reserve(bytes.size());
      while (assembled.size() < bytes.size()) {
        zmq::message_t message;
        if (!dealer.recv(message)) break;
        assembled.append(static_cast<const char*>(message.data()), message.size());
      }
      received[s] = assembled.size();
    });
  }
  std::vector<zmq::message_t> identities;
  for (int s = 0; s < kSubscribers; ++s) {
    zmq::message_t identity, request;
    if (!router.recv(identity) || !router.recv(request)) {
      return Status::Internal("raw copy: a peer's request did not arrive");
    }
    identities.push_back(std::move(identity));
  }
  for (size_t offset = 0; offset < bytes.size(); offset += chunk) {
    const size_t length = std::min(chunk, bytes.size() - offset);
    for (const zmq::message_t& identity : identities) {
      router.send(zmq::buffer(identity.data(), identity.size()), zmq::send_flags::sndmore);
      router.send(zmq::buffer(bytes.data() + offset, length), zmq::send_flags::none);
    }
  }
  for (std::thread& t : peers) t.join();
  const double seconds = Seconds(started);
  for (size_t r : received) {
    if (r != bytes.size()) return Status::Internal("raw copy: a peer got short bytes");
  }
  return seconds;
}

int RunPublishBench(const std::string& model_name) {
  const ModelConfig config = bench::Unwrap(LoadModelConfig(ModelPath(model_name)), "model config");
  const std::string bench = "learner_" + config.name;
  std::unique_ptr<Model> model = bench::Unwrap(Model::Create(config, 1), "model");
  auto started = Clock::now();
  const std::string bytes = bench::Unwrap(model->SaveToBytes(), "SaveToBytes");
  const double save_seconds = Seconds(started);
  const bench::JsonFields size = {
      {"bytes", bench::JsonNumber(static_cast<double>(bytes.size()))},
      {"peers", bench::JsonNumber(kSubscribers)}};
  bench::PrintResult(bench, "save_to_bytes_seconds", save_seconds, "s", std::nullopt, size);
  // Best of 3 each, alternating, so neither side alone meets a busy moment of the machine.
  const transport::WeightPublisherOptions defaults;
  double publish = 1e300, raw = 1e300;
  for (int r = 0; r < 3; ++r) {
    publish = std::min(publish, bench::Unwrap(PublishToSubscribers(bytes, r + 1), "publish"));
    raw = std::min(raw, bench::Unwrap(RawZmqCopy(bytes, defaults.chunk_bytes), "raw copy"));
  }
  bench::JsonFields fields = size;
  fields.push_back({"baseline_is", bench::JsonString("raw_zmq_copy_seconds")});
  fields.push_back({"target_ratio_at_most", bench::JsonNumber(1.5)});
  bench::PrintResult(bench, "raw_zmq_copy_seconds", raw, "s", std::nullopt, size);
  bench::PrintResult(bench, "weight_publish_seconds", publish, "s", raw, fields);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// 3. One learner step on a long trajectory
// ---------------------------------------------------------------------------------------------

int64_t Bytes(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

// What the learner holds of a trajectory during its step, in bytes: the joined arrays, the model
// input, the routing replay record, the per-action scores and the routing balance's record. All
// of it grows with the length by nature; the passes' own memory is what comes on top.
int64_t HeldBytes(const rl::TrainingTrajectory& t, const RoutingRecord& balance) {
  const rl::PreparedTrajectory& p = t.prepared;
  int64_t held = static_cast<int64_t>(p.joined.tokens.size() * sizeof(int32_t) +
                                      p.joined.roles.size() * sizeof(schema::Role));
  held += Bytes(p.input.tokens);
  for (const RoutingRecord::Layer& layer : p.replay.layers) held += Bytes(layer.experts);
  for (const RoutingRecord::Layer& layer : balance.layers) {
    held += Bytes(layer.experts) + Bytes(layer.scores);
  }
  held += static_cast<int64_t>(p.positions.size() * (sizeof(int64_t) + 3 * sizeof(float)));
  return held;
}

// The sampled segments the step reads from (the learner keeps its sample through the step):
// their per-token arrays and routing records.
int64_t SampledBytes(const std::vector<rl::SampledGroup>& groups) {
  int64_t bytes = 0;
  for (const rl::SampledGroup& group : groups) {
    for (const std::vector<schema::SegmentData>& member : group.members) {
      for (const schema::SegmentData& s : member) {
        bytes += static_cast<int64_t>(
            s.tokens.size() * sizeof(int32_t) + s.roles.size() * sizeof(schema::Role) +
            s.behaviour_logprobs.size() * sizeof(float) +
            (s.routing.experts.size() + s.routing.context_experts.size()) * sizeof(uint16_t) +
            s.routing.mask.size());
      }
    }
  }
  return bytes;
}

// One learner step on `groups` as the service runs it, each part timed, and the process's
// resident memory around it: scoring (PrepareBatch), the update pass, the AdamW step and the
// routing balance. Fails naming the reason when the trajectories are all excluded.
struct TimedStep {
  double prepare_seconds = 0, update_seconds = 0, optimizer_seconds = 0;
  int64_t before = 0, after_scoring = 0, peak = 0;  // resident bytes; peaks since `before`
  int64_t held = 0;     // HeldBytes of the first kept trajectory, plus `sampled`
  int64_t sampled = 0;  // SampledBytes of the groups
  int64_t chunk_activations = 0;  // UpdateMetrics::chunk_activation_bytes
  int64_t tokens = 0, action_tokens = 0;
  double mismatch_max = 0;
};

Result<TimedStep> TimeOneStep(Trainer& trainer, const Model* reference,
                              const std::vector<rl::SampledGroup>& groups,
                              const rl::StepSettings& settings) {
  const Model& model = trainer.model();
  TimedStep t;
  t.before = ResidentBytes();
  ResetPeakResident();
  auto started = Clock::now();
  STRIDER_ASSIGN_OR_RETURN(const rl::PreparedBatch batch,
                           rl::PrepareBatch(model, reference, groups, settings));
  t.prepare_seconds = Seconds(started);
  t.after_scoring = PeakResidentBytes();
  const std::vector<const rl::TrainingTrajectory*> kept = Kept(batch);
  if (kept.empty()) {
    return Status::FailedPrecondition("the trajectory was excluded: " +
                                      batch.trajectories.front().excluded_reason);
  }
  trainer.ZeroGrad();
  RoutingRecord routing;
  started = Clock::now();
  STRIDER_ASSIGN_OR_RETURN(const rl::UpdateMetrics update,
                           rl::AccumulateGradients(model, kept, settings, &routing));
  t.chunk_activations = update.chunk_activation_bytes;
  t.update_seconds = Seconds(started);
  // Counted before the optimiser's clock starts; the balance takes the routing record.
  t.sampled = SampledBytes(groups);
  t.held = HeldBytes(*kept.front(), routing) + t.sampled;
  started = Clock::now();
  STRIDER_RETURN_IF_ERROR(trainer.Step(0).status());
  STRIDER_RETURN_IF_ERROR(trainer.BalanceRouting(std::move(routing)).status());
  t.optimizer_seconds = Seconds(started);
  t.peak = PeakResidentBytes();
  t.tokens = batch.tokens;
  t.action_tokens = batch.action_tokens;
  t.mismatch_max = batch.mismatch_max;
  return t;
}

// The child's side: plays one trajectory of about `length` tokens, then runs one step on it.
int RunLongChild(const std::string& model_name, int64_t length, int64_t chunk) {
  const ModelConfig config = bench::Unwrap(LoadModelConfig(ModelPath(model_name)), "model config");
  ConfigureRuntime(config.threads);
  const std::string bench = "learner_" + config.name;
  const TrainerOptions trainer_options = MakeTrainerOptions({}, {});
  std::unique_ptr<Trainer> trainer =
      bench::Unwrap(Trainer::Create(config, trainer_options), "trainer");
  std::unique_ptr<Model> reference = bench::Unwrap(Model::Create(config, 1), "reference");
  const Model& model = trainer->model();

  EpisodeSpec spec;
  spec.parts = 4;
  spec.turn_tokens = 32;
  // The whole episode fits the model's context: the document, plus per part the environment's
  // framing and a turn (a generous 4096 tokens in all).
  spec.document_tokens = std::min<int64_t>(length, config.context - 4096);
  auto started = Clock::now();
  const std::vector<rl::SampledGroup> groups =
      bench::Unwrap(PlayGroup(model, spec, 1), "playing the long episode");
  const double play_seconds = Seconds(started);
  int64_t segments = 0;
  for (const auto& s : groups.front().members) segments += static_cast<int64_t>(s.size());

  rl::StepSettings settings = BenchStepSettings(chunk);
  settings.objective.advantages.estimator = "process_gae";
  const TimedStep step = bench::Unwrap(TimeOneStep(*trainer, reference.get(), groups, settings),
                                       "the long trajectory's step");
  const double prepare_seconds = step.prepare_seconds, update_seconds = step.update_seconds,
               optimizer_seconds = step.optimizer_seconds;
  const int64_t before = step.before, after_scoring = step.after_scoring, peak = step.peak,
                held = step.held, tokens = step.tokens;
  const double mismatch_max = step.mismatch_max;

  const std::string suffix = "_" + std::to_string(length);
  const double mib = 1 << 20;
  const bench::JsonFields fields = {
      {"tokens", bench::JsonNumber(static_cast<double>(tokens))},
      {"segments", bench::JsonNumber(static_cast<double>(segments))},
      {"chunk_tokens", bench::JsonNumber(static_cast<double>(chunk))},
      {"play_seconds", bench::JsonNumber(play_seconds)},
      {"prepare_seconds", bench::JsonNumber(prepare_seconds)},
      {"update_seconds", bench::JsonNumber(update_seconds)},
      {"optimizer_and_balance_seconds", bench::JsonNumber(optimizer_seconds)},
      {"logprob_mismatch_max", bench::JsonNumber(mismatch_max)}};
  bench::PrintResult(bench, "long_step_seconds" + suffix,
                     prepare_seconds + update_seconds + optimizer_seconds, "s", std::nullopt,
                     fields);
  bench::PrintResult(bench, "long_peak_memory" + suffix, (peak - before) / mib, "MiB",
                     std::nullopt,
                     {{"scoring_peak_mib", bench::JsonNumber((after_scoring - before) / mib)},
                      {"resident_before_mib", bench::JsonNumber(before / mib)},
                      {"peak_resident_mib", bench::JsonNumber(peak / mib)}});
  bench::PrintResult(bench, "long_held_memory" + suffix, held / mib, "MiB");
  bench::PrintResult(bench, "long_pass_memory" + suffix, (peak - before - held) / mib, "MiB");
  return 0;
}

// One learner step over a trajectory an actor stored: the only trajectory of the replay store
// in `store` (actor_bench --long-tokens N --long-keep DIR keeps one), with the weights the actor
// played it with (model_seed 0: Model::Create(config, 0)), so the log-prob mismatch check sees
// the same policy. No reference pass (kl_coef 0): it would be one more forward of the scoring
// pass's cost. Peak memory is split into what the passes must hold (the latent cache of the
// whole trajectory, what the learner keeps of the trajectory) and the rest, one chunk's
// activations and the optimiser's state; a shorter stored trajectory, run the same way, shows
// that the rest does not grow with the length.
int RunStoredLong(const std::string& model_name, const std::string& store, int64_t chunk) {
  const ModelConfig config = bench::Unwrap(LoadModelConfig(ModelPath(model_name)), "model config");
  ConfigureRuntime(config.threads);
  const std::string bench = "learner_" + config.name;
  std::unique_ptr<replay::Inspector> inspector =
      bench::Unwrap(replay::Inspector::Open(store), "opening the replay store " + store);
  const std::vector<schema::TrajectorySummary> listed =
      bench::Unwrap(inspector->List({}), "listing the store");
  if (listed.size() != 1) {
    std::fprintf(stderr, "learner_bench: --long-store wants a store of one trajectory, %s has %zu\n",
                 store.c_str(), listed.size());
    return 1;
  }
  rl::SampledGroup group;
  group.group_id = listed.front().trajectory_id;
  group.members.emplace_back();
  for (replay::StoredSegment& stored :
       bench::Unwrap(inspector->Trajectory(listed.front().trajectory_id), "reading it")) {
    group.members.back().push_back(std::move(stored.segment));
  }
  inspector.reset();
  const int64_t segments = static_cast<int64_t>(group.members.back().size());

  // A fresh model from the actor's model_seed.
  const TrainerOptions trainer_options = MakeTrainerOptions({}, {}, {.init_seed = 0});
  std::unique_ptr<Trainer> trainer =
      bench::Unwrap(Trainer::Create(config, trainer_options), "trainer");
  rl::StepSettings settings = BenchStepSettings(chunk);
  settings.objective.loss.kl_coef = 0;
  const TimedStep step =
      bench::Unwrap(TimeOneStep(*trainer, nullptr, {group}, settings), "the stored trajectory's step");
  const double prepare_seconds = step.prepare_seconds, update_seconds = step.update_seconds,
               optimizer_seconds = step.optimizer_seconds;
  const int64_t before = step.before, after_scoring = step.after_scoring, peak = step.peak,
                held = step.held, tokens = step.tokens;
  const CacheAccounting caches = AccountCaches(config);
  const double cache = static_cast<double>(caches.kv_cache_bytes_per_token) * tokens;
  const double mib = 1 << 20;
  const std::string at = " tokens=" + std::to_string(tokens);
  const bench::JsonFields fields = {
      {"tokens", bench::JsonNumber(static_cast<double>(tokens))},
      {"action_tokens", bench::JsonNumber(static_cast<double>(step.action_tokens))},
      {"segments", bench::JsonNumber(static_cast<double>(segments))},
      {"chunk_tokens", bench::JsonNumber(static_cast<double>(chunk))},
      {"prepare_seconds", bench::JsonNumber(prepare_seconds)},
      {"update_seconds", bench::JsonNumber(update_seconds)},
      {"optimizer_and_balance_seconds", bench::JsonNumber(optimizer_seconds)},
      {"logprob_mismatch_max", bench::JsonNumber(step.mismatch_max)}};
  bench::PrintResult(bench, "stored_step_seconds" + at,
                     prepare_seconds + update_seconds + optimizer_seconds, "s", std::nullopt,
                     fields);
  // Time per token of each pass; the scoring pass is a no-gradient forward along the inference
  // path, the prefill's work in chunks of `chunk`.
  bench::PrintResult(bench, "stored_scoring_us_per_token" + at, 1e6 * prepare_seconds / tokens,
                     "us");
  bench::PrintResult(bench, "stored_update_us_per_token" + at, 1e6 * update_seconds / tokens,
                     "us", 1e6 * prepare_seconds / tokens,
                     {{"baseline_is", bench::JsonString("the scoring pass per token")}});
  const TensorPoolStats pool = GetTensorPoolStats();  // the process's tensors (tensor_pool.h)
  // The bound: the latent cache, what the learner holds of the trajectory, and one chunk's
  // activations as the pool measured them (its largest recording chunk's live tensors).
  const double chunk_activations = static_cast<double>(step.chunk_activations);
  bench::PrintResult(bench, "stored_peak_memory" + at, (peak - before) / mib, "MiB",
                     (cache + held + chunk_activations) / mib,
                     {{"baseline_is", bench::JsonString("latent cache + held + one chunk's "
                                                        "activations")},
                      {"scoring_peak_mib", bench::JsonNumber((after_scoring - before) / mib)},
                      {"latent_cache_mib", bench::JsonNumber(cache / mib)},
                      {"held_mib", bench::JsonNumber(held / mib)},
                      {"of_which_sampled_segments_mib", bench::JsonNumber(step.sampled / mib)},
                      {"chunk_activations_mib", bench::JsonNumber(chunk_activations / mib)},
                      {"rest_mib", bench::JsonNumber((peak - before - held - cache) / mib)},
                      {"resident_before_mib", bench::JsonNumber(before / mib)},
                      {"tensor_pool_peak_mapped_mib",
                       bench::JsonNumber(pool.peak_mapped_bytes / mib)},
                      {"tensor_pool_peak_in_use_mib",
                       bench::JsonNumber(pool.peak_in_use_bytes / mib)},
                      {"tensor_pool_misses", std::to_string(pool.misses)}});
  return 0;
}

// Runs the long step at 1/4, 1/2 and all of `length`, each in a fresh process (memory freed
// by one stays in the heap and would read as the next one's), passes their lines through and
// prints how the passes' memory changed from a quarter of the length to all of it.
int RunLong(const std::string& model_name, int64_t length, int64_t chunk) {
  const ModelConfig config = bench::Unwrap(LoadModelConfig(ModelPath(model_name)), "model config");
  std::vector<std::pair<int64_t, double>> pass_memory;
  for (const int64_t part : {length / 4, length / 2, length}) {
    const int status = bench::RunSelf(
        "--long-model '" + model_name + "' --long-chunk " + std::to_string(chunk) +
            " --long-child " + std::to_string(part),
        [&](const std::string& line) {
          std::fputs(line.c_str(), stdout);
          if (line.find("\"metric\":\"long_pass_memory_") != std::string::npos) {
            pass_memory.emplace_back(part,
                                     std::atof(line.c_str() + line.find("\"value\":") + 8));
          }
        });
    std::fflush(stdout);
    if (status != 0) {
      std::fprintf(stderr, "learner_bench: the long step at %lld tokens failed\n",
                   static_cast<long long>(part));
      return 1;
    }
  }
  if (pass_memory.size() == 3 && pass_memory.front().second > 0) {
    // 1 would mean the passes' memory does not grow with the length; 4 that it is linear.
    bench::PrintResult("learner_" + config.name, "long_pass_memory_ratio_full_to_quarter",
                       pass_memory.back().second / pass_memory.front().second, "ratio", 1.0,
                       {{"linear_would_be", bench::JsonNumber(4.0)}});
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// 4. The learner service's busy fraction on a pre-filled table
// ---------------------------------------------------------------------------------------------

// A replay server with one group table holding `groups`, then the RL learner service for
// `steps` steps over it (one group per step, weights published every step). The busy fraction is
// the learner's own (metrics.jsonl): time outside the sample wait over the step's wall time,
// summed over the steps.
int RunBusyBench(const std::string& model_name, const std::vector<rl::SampledGroup>& groups,
                 int64_t steps) {
  const ModelConfig config = bench::Unwrap(LoadModelConfig(ModelPath(model_name)), "model config");
  const std::string bench = "learner_" + config.name;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("strider-learner-bench-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  replay::ServerOptions server_options;
  server_options.db_path = (dir / "replay").string();
  server_options.actor_endpoint = "tcp://127.0.0.1:0";
  server_options.stats_interval_s = 0;
  replay::TableConfig table;
  table.name = "groups";
  table.unit = replay::SampleUnit::kGroup;
  table.sampler.kind = replay::SamplerKind::kUniform;  // with replacement: every step finds one
  server_options.tables.push_back(table);
  std::unique_ptr<replay::ReplayServer> server =
      bench::Unwrap(replay::ReplayServer::Start(server_options), "replay server");
  {
    replay::ActorClientOptions client;
    client.endpoint = server->actor_endpoint();
    std::unique_ptr<replay::ActorClient> actor =
        bench::Unwrap(replay::ActorClient::Connect(client), "actor client");
    for (const rl::SampledGroup& group : groups) {
      for (const auto& member : group.members) {
        for (const schema::SegmentData& segment : member) {
          bench::Check(actor->Send(segment), "sending a segment");
        }
      }
    }
    bench::Check(actor->Flush(std::chrono::milliseconds(60000)), "flushing the segments");
  }

  rl::RlLearnerConfig learner;
  learner.model = config;
  learner.init_seed = 1;  // the weights that played the episodes
  learner.replay.endpoint = server->learner_endpoint();
  learner.replay.table = "groups";
  learner.replay.units_per_step = 1;
  learner.replay.sample_timeout_s = 60;
  learner.publish.endpoint = "tcp://127.0.0.1:0";
  learner.train.steps = steps;
  learner.train.chunk_tokens = 512;
  learner.objective = BenchStepSettings(512).objective;
  rl::RlRunOptions run;
  run.run_dir = (dir / "run").string();
  const rl::RlRunSummary summary = bench::Unwrap(rl::RunRlLearner(learner, run), "RL learner");

  double compute = 0, wall = 0;
  std::ifstream metrics(run.run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto field = [&](const std::string& key) {
      const size_t at = line.find("\"" + key + "\":");
      return at == std::string::npos ? 0.0 : std::atof(line.c_str() + at + key.size() + 3);
    };
    const double step = field("step_seconds");
    wall += step;
    compute += field("busy_fraction") * step;
  }
  server.reset();
  std::filesystem::remove_all(dir);
  if (wall <= 0) {
    std::fprintf(stderr, "learner_bench: the learner wrote no step metrics\n");
    return 1;
  }
  bench::PrintResult(bench, "busy_fraction_prefilled", compute / wall, "fraction", 0.9,
                     {{"steps", bench::JsonNumber(static_cast<double>(summary.steps))},
                      {"step_seconds_total", bench::JsonNumber(wall)},
                      {"run_seconds", bench::JsonNumber(summary.seconds)},
                      {"baseline_is", bench::JsonString("target")}});
  return 0;
}

struct Arguments {
  bool quick = false;
  std::optional<bool> long_run;
  std::string model;
  std::string long_model = "tiny_incremental";
  int64_t members = 0;
  int64_t turn_tokens = 0;
  int64_t repeats = 1;
  int64_t long_tokens = 1 << 20;
  int64_t long_chunk = 512;  // configs/rl chunk_tokens
  int64_t long_child = 0;
  std::string long_store;  // a replay store of one long trajectory (actor_bench --long-keep)
  int64_t busy_steps = 0;
  std::string only;    // step | publish | busy | long; empty: all of them
  std::string device;  // cuda[:N]: the step alone, on that GPU
};

// The GPU's bf16 matrix peak (GFLOP/s): median of 10 products of random 8192 x 8192 matrices.
bench::Ceiling GpuBf16Peak(const std::string& device) {
  const at::Device where = bench::Unwrap(ResolveDevice(device), "device");
  const int64_t n = 8192;
  const auto options = at::TensorOptions().device(where).dtype(at::kBFloat16);
  at::Tensor a = at::randn({n, n}, options);
  at::Tensor b = at::randn({n, n}, options);
  at::Tensor out = at::empty({n, n}, options);
  std::vector<double> times;
  for (int i = 0; i < 12; ++i) {
    torch::cuda::synchronize();
    const auto started = Clock::now();
    at::mm_out(out, a, b);
    torch::cuda::synchronize();
    if (i >= 2) times.push_back(Seconds(started));
  }
  std::sort(times.begin(), times.end());
  bench::Ceiling ceiling;
  ceiling.value = 2.0 * n * n * n / times[times.size() / 2] / 1e9;
  ceiling.policy = "gpu";
  ceiling.in_process = ceiling.value;
  return ceiling;
}

int Run(const Arguments& a) {
  if (a.long_child > 0) return RunLongChild(a.long_model, a.long_child, a.long_chunk);
  if (!a.long_store.empty()) return RunStoredLong(a.long_model, a.long_store, a.long_chunk);
  StepBenchOptions step;
  step.model = !a.model.empty() ? a.model : a.quick ? "tiny" : "small";
  step.members = a.members > 0 ? a.members : a.quick ? 2 : 4;
  step.turn_tokens = a.turn_tokens > 0 ? a.turn_tokens : a.quick ? 16 : 64;
  step.repeats = a.repeats;
  step.device = a.device;
  if (!a.device.empty() && a.device != "cpu") {
    if (!torch::cuda::is_available()) {
      std::fprintf(stderr, "learner_bench: no CUDA device (torch::cuda::is_available())\n");
      return 2;
    }
    const ModelConfig config =
        bench::Unwrap(LoadModelConfig(ModelPath(step.model)), "model config");
    ConfigureRuntime(config.threads);
    bench::EveryLineFields().clear();  // the CPU's OpenMP wait policy says nothing here
    const bench::Ceiling peak = GpuBf16Peak(a.device);
    bench::PrintResult("learner_" + config.name, "matmul_peak_bf16_gpu", peak.value, "GFLOP/s",
                       std::nullopt, {{"note", bench::JsonString("8192-cube, random data")}});
    std::vector<rl::SampledGroup> played;
    return RunStepBench(step, peak, &played);
  }
  const ModelConfig config =
      bench::Unwrap(LoadModelConfig(ModelPath(step.model)), "model config");
  ConfigureRuntime(config.threads);
  bench::CeilingSpec spec;  // 2048^2 fp32 products, best of 5, at the better wait policy
  spec.threads = config.threads;
  const bench::Ceiling ceiling = bench::Unwrap(bench::MeasureCeiling(spec), "matmul peak");
  bench::PrintResult("learner_" + config.name, "matmul_peak_fp32", ceiling.value, "GFLOP/s",
                     std::nullopt, bench::CeilingFields(ceiling));
  auto wanted = [&](const char* part) { return a.only.empty() || a.only == part; };
  std::vector<rl::SampledGroup> played;
  // The busy run trains on the step's played group.
  if (wanted("step") || wanted("busy")) {
    if (int rc = RunStepBench(step, ceiling, &played); rc != 0) return rc;
  }
  if (wanted("publish")) {
    if (int rc = RunPublishBench(step.model); rc != 0) return rc;
  }
  const int64_t busy_steps = a.busy_steps > 0 ? a.busy_steps : a.quick ? 2 : 4;
  if (wanted("busy")) {
    if (int rc = RunBusyBench(step.model, played, busy_steps); rc != 0) return rc;
  }
  if (a.only == "long" || (a.only.empty() && a.long_run.value_or(!a.quick))) {
    if (int rc = RunLong(a.long_model, a.long_tokens, a.long_chunk); rc != 0) return rc;
  }
  return 0;
}

}  // namespace
}  // namespace strider

int main(int argc, char** argv) {
  if (std::optional<int> child = strider::bench::RunCeilingChild(argc, argv)) return *child;
  strider::bench::EveryLineFields() = strider::bench::RunPolicyFields();
  spdlog::set_level(spdlog::level::warn);  // the replay server's and learner's progress lines
  strider::Arguments a;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--quick")) {
      a.quick = true;
    } else if (!std::strcmp(argv[i], "--long")) {
      a.long_run = true;
    } else if (!std::strcmp(argv[i], "--no-long")) {
      a.long_run = false;
    } else if (!std::strcmp(argv[i], "--model") && has_value) {
      a.model = argv[++i];
    } else if (!std::strcmp(argv[i], "--long-model") && has_value) {
      a.long_model = argv[++i];
    } else if (!std::strcmp(argv[i], "--members") && has_value) {
      a.members = std::stoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--turn-tokens") && has_value) {
      a.turn_tokens = std::stoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--repeats") && has_value) {
      a.repeats = std::max<int64_t>(1, std::stoll(argv[++i]));
    } else if (!std::strcmp(argv[i], "--long-tokens") && has_value) {
      a.long_tokens = std::stoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--long-chunk") && has_value) {
      a.long_chunk = std::stoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--long-store") && has_value) {
      a.long_store = argv[++i];
    } else if (!std::strcmp(argv[i], "--long-child") && has_value) {
      a.long_child = std::stoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--busy-steps") && has_value) {
      a.busy_steps = std::stoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--only") && has_value) {
      a.only = argv[++i];
    } else if (!std::strcmp(argv[i], "--device") && has_value) {
      a.device = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: learner_bench [--quick] [--model NAME|PATH] [--members N] "
                   "[--turn-tokens N] [--repeats N] [--long] [--no-long] [--long-tokens N] "
                   "[--long-chunk N] [--long-model NAME|PATH] [--long-store DIR] [--busy-steps N] "
                   "[--only step|publish|busy|long] [--device cuda[:N]]\n");
      return 2;
    }
  }
  return strider::Run(a);
}
