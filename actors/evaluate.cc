// Evaluation as an in-process actor run (actors/evaluate.h).
#include "actors/evaluate.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/model/model.h"
#include "common/transport/weight_stream.h"
#include "envs/environment.h"
#include "rollout_engine/sampling.h"

namespace strider::actors {
namespace {

// The newest version the publisher holds; waits up to `timeout` for one that is not there yet
// (a learner still starting), so a caller that starts both need not order them.
// `auth`: the actor config's `weight_stream.auth`, so a keyed publisher serves evaluation as it
// serves that config's actors.
Result<transport::WeightUpdate> FetchNewest(const std::string& endpoint,
                                            std::chrono::milliseconds timeout,
                                            const transport::ClientAuth& auth) {
  const auto deadline = Clock::now() + timeout;
  transport::WeightSubscriberOptions subscriber_options;
  subscriber_options.endpoint = endpoint;
  subscriber_options.auth = auth;
  subscriber_options.reply_timeout = std::min(timeout, std::chrono::milliseconds(5000));
  Status last = Status::Unavailable("weights: the publisher at " + endpoint + " did not answer");
  while (true) {
    Result<std::unique_ptr<transport::WeightSubscriber>> subscriber =
        transport::WeightSubscriber::Connect(subscriber_options);
    if (!subscriber.ok()) {
      // A malformed endpoint will not get better by waiting.
      if (subscriber.status().code() == StatusCode::kInvalidArgument) return subscriber.status();
      last = subscriber.status();
    } else {
      Result<std::optional<transport::WeightUpdate>> update = (*subscriber)->FetchNewer(0);
      if (update.ok() && update->has_value()) return std::move(**update);
      if (update.ok()) {
        last = Status::Unavailable("weights: the publisher at " + endpoint +
                                   " has published nothing yet");
      } else if (update.status().code() != StatusCode::kUnavailable) {
        return update.status().WithContext("weights from " + endpoint);
      } else {
        last = update.status();
      }
    }
    if (Clock::now() >= deadline) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// The environment to play: the config's, checked against `name`, or the built-in `name` with
// its default options when the config has none.
Status ResolveEnvironment(const std::string& name, envs::EnvironmentConfig& env) {
  const bool configured = !env.name.empty() || !env.library.empty() || !env.command.empty();
  if (!name.empty()) {
    if (configured && env.name != name) {
      return Status::InvalidArgument("--env " + name + " does not match the config's env '" +
                                     env.name + "'");
    }
    if (!configured) env.name = name;
  }
  if (env.name.empty() && env.library.empty() && env.command.empty()) {
    return Status::InvalidArgument("no environment: the config has no env: section and no --env");
  }
  // Built once here, so an unknown name is a usage error before the model loads.
  Result<std::unique_ptr<envs::Environment>> probe = envs::MakeEnvironment(env);
  if (!probe.ok()) {
    return Status::InvalidArgument("env: " + probe.status().message());
  }
  (*probe)->Close();
  return Status::Ok();
}

}  // namespace

Interval WilsonInterval(int64_t successes, int64_t trials, double z) {
  if (trials <= 0) return {0.0, 1.0};
  const double n = static_cast<double>(trials);
  const double p = static_cast<double>(successes) / n;
  const double z2 = z * z;
  const double denominator = 1.0 + z2 / n;
  const double centre = (p + z2 / (2 * n)) / denominator;
  const double half = z / denominator * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n));
  // At 0 or all successes the bound is exactly 0 or 1; rounding would leave it a hair off.
  return {successes <= 0 ? 0.0 : std::max(0.0, centre - half),
          successes >= trials ? 1.0 : std::min(1.0, centre + half)};
}

Result<double> PassAtK(int64_t n, int64_t correct, int64_t k) {
  if (n < 1 || k < 1 || k > n || correct < 0 || correct > n) {
    return Status::InvalidArgument("pass@k needs 0 <= c <= n and 1 <= k <= n (n " +
                                   std::to_string(n) + ", c " + std::to_string(correct) + ", k " +
                                   std::to_string(k) + ")");
  }
  // Fewer than k wrong samples: every draw of k holds a correct one.
  if (n - correct < k) return 1.0;
  // C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)  (Chen et al. 2021, Fig. 3).
  double all_wrong = 1.0;
  for (int64_t i = n - correct + 1; i <= n; ++i) {
    all_wrong *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  }
  return 1.0 - all_wrong;
}

Status WriteEpisodes(const std::vector<EpisodeSummary>& episodes, const std::string& path) {
  std::ofstream out(path, std::ios::app);
  for (const EpisodeSummary& e : episodes) {
    nlohmann::json j;
    j["event"] = "episode";
    j["problem"] = e.group;
    j["sample"] = e.member;
    j["seed"] = e.seed;
    j["status"] = e.status;
    j["outcome_reward"] = e.outcome_reward;
    j["turns"] = e.turns;
    // Model text is whatever was sampled: replace bytes that are not UTF-8 rather than fail.
    j["exchange"] = e.exchange;
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  out.flush();
  if (!out) return Status::IoError("eval: cannot append episodes to " + path);
  return Status::Ok();
}

Status SummariseEpisodes(std::vector<EpisodeSummary> ended, int64_t problems, int64_t samples,
                         EvalResult* result) {
  if (problems < 1 || samples < 1 || static_cast<int64_t>(ended.size()) != problems * samples) {
    return Status::Internal("evaluation: " + std::to_string(ended.size()) + " episodes reported, " +
                            std::to_string(problems) + " x " + std::to_string(samples) +
                            " expected");
  }
  // The sink sees episodes in the order they end, which depends on timing; the digest must not.
  std::sort(ended.begin(), ended.end(),
            [](const EpisodeSummary& a, const EpisodeSummary& b) { return a.index < b.index; });
  std::map<int64_t, int64_t> correct_by_problem;
  double reward = 0, turns = 0;
  uint64_t digest = 0;
  result->successes = 0;
  result->endings.clear();
  for (const EpisodeSummary& e : ended) {
    const bool success = IsSuccess(e);
    result->successes += success ? 1 : 0;
    correct_by_problem[e.group] += success ? 1 : 0;
    reward += e.outcome_reward;
    turns += static_cast<double>(e.turns);
    ++result->endings[e.status];
    digest = rollout::DeriveSeed(rollout::DeriveSeed(digest, e.seed), e.action_digest);
  }
  if (static_cast<int64_t>(correct_by_problem.size()) != problems) {
    return Status::Internal("evaluation: episodes of " + std::to_string(correct_by_problem.size()) +
                            " problems reported, " + std::to_string(problems) + " expected");
  }
  const double n = static_cast<double>(ended.size());
  result->success_rate = static_cast<double>(result->successes) / n;
  result->ci = WilsonInterval(result->successes, static_cast<int64_t>(ended.size()));
  result->reward_mean = reward / n;
  result->mean_turns = turns / n;
  result->digest = digest;
  result->pass_at_k.reset();
  if (samples > 1) {
    double pass = 0;
    for (const auto& [problem, correct] : correct_by_problem) {
      STRIDER_ASSIGN_OR_RETURN(double p, PassAtK(samples, correct, samples));
      pass += p;
    }
    result->pass_at_k = pass / static_cast<double>(problems);
  }
  return Status::Ok();
}

std::string EvalResult::ToJson() const {
  // In the contract's order (docs/actors.md), for people reading the file.
  nlohmann::ordered_json j = {
      {"event", "eval"},
      {"env", env},
      {"policy_version", policy_version},
      {"weights", weights},
      {"episodes", episodes},
      {"samples", samples},
      {"success_rate", success_rate},
      {"ci_low", ci.low},
      {"ci_high", ci.high},
      {"reward_mean", reward_mean},
  };
  if (pass_at_k) j["pass_at_k"] = *pass_at_k;
  j["mean_turns"] = mean_turns;
  j["seconds"] = seconds;
  j["seed"] = seed;
  j["temperature"] = temperature;
  j["endings"] = endings;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(digest));
  j["digest"] = hex;
  return j.dump();
}

Result<EvalResult> Evaluate(const EvaluateOptions& options) {
  if (options.episodes < 1) return Status::InvalidArgument("--episodes must be >= 1");
  if (options.samples < 1) return Status::InvalidArgument("--samples must be >= 1");
  if (options.weights.empty() == options.weights_endpoint.empty()) {
    return Status::InvalidArgument("exactly one of --weights and --weights-endpoint is required");
  }
  const double temperature =
      options.temperature.value_or(options.samples > 1 ? options.actor.sampling.temperature : 0.0);
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    return Status::InvalidArgument("--temperature must be finite and >= 0");
  }
  if (options.samples > 1 && temperature == 0) {
    return Status::InvalidArgument(
        "--samples " + std::to_string(options.samples) +
        " at temperature 0 would play each problem the same way every time: give --temperature "
        "(or a config with sampling.temperature > 0)");
  }

  ActorOptions actor = options.actor;
  STRIDER_RETURN_IF_ERROR(ResolveEnvironment(options.env, actor.env));
  actor.sampling.temperature = temperature;
  actor.group_size = options.samples;
  actor.episodes = options.episodes * options.samples;
  // As many live episodes as the config allows, in whole groups of K.
  actor.episodes_in_flight =
      std::max(options.samples, actor.episodes_in_flight / options.samples * options.samples);
  actor.seed = options.seed;
  actor.seed_stream = SeedStream::kEvaluation;
  actor.replay_endpoint.clear();
  actor.spill_dir.clear();
  actor.weights_endpoint.clear();
  actor.weights_sync = false;
  actor.round_groups = 0;
  actor.metrics_path.clear();
  actor.progress = false;

  std::vector<EpisodeSummary> ended;
  ended.reserve(static_cast<size_t>(actor.episodes));
  actor.episode_sink = [&ended](const EpisodeSummary& e) { ended.push_back(e); };
  // Checked before any weights are fetched, so a bad config never waits on a publisher.
  STRIDER_RETURN_IF_ERROR(ValidateActorOptions(actor));

  EvalResult result;
  result.env = actor.env.name;
  result.episodes = options.episodes;
  result.samples = options.samples;
  result.seed = options.seed;
  result.temperature = temperature;
  if (!options.weights.empty()) {
    actor.weights = options.weights;
    result.weights = options.weights;
    result.policy_version = actor.policy_version;
  } else {
    STRIDER_ASSIGN_OR_RETURN(transport::WeightUpdate update,
                             FetchNewest(options.weights_endpoint, options.weights_timeout,
                                         options.actor.weights_auth));
    STRIDER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(actor.model_config));
    if (!actor.device.empty()) config.device = actor.device;
    Result<std::unique_ptr<Model>> model = Model::LoadFromBytes(
        config, update.bytes, "weights version " + std::to_string(update.version));
    // Bytes that do not fit the config are the publisher's fault, not a usage error.
    if (!model.ok()) {
      return Status::Internal(model.status().message())
          .WithContext("weights from " + options.weights_endpoint);
    }
    STRIDER_RETURN_IF_ERROR(ApplyWeightPrecision(model->get(), actor.precision));
    actor.model = std::shared_ptr<const Model>(std::move(*model));
    actor.policy_version = update.version;
    result.weights = options.weights_endpoint;
    result.policy_version = update.version;
  }

  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Actor> runner, Actor::Create(actor));
  const auto started = Clock::now();
  STRIDER_RETURN_IF_ERROR(runner->Run(std::stop_token{}));
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  if (!options.episodes_out.empty()) {
    // The sink sees episodes in the order they end; the file lists them in episode order.
    std::sort(ended.begin(), ended.end(),
              [](const EpisodeSummary& a, const EpisodeSummary& b) { return a.index < b.index; });
    STRIDER_RETURN_IF_ERROR(WriteEpisodes(ended, options.episodes_out));
  }
  STRIDER_RETURN_IF_ERROR(
      SummariseEpisodes(std::move(ended), options.episodes, options.samples, &result));
  result.seconds = seconds;
  return result;
}

}  // namespace strider::actors
