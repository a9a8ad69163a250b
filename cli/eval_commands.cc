// `strider eval --config ACTOR.yaml (--weights F | --weights-endpoint E)`: held-out evaluation
// of one policy on an environment (actors/evaluate.h, docs/actors.md "Evaluation").
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>
#include <optional>

#include "actors/actor.h"
#include "actors/evaluate.h"
#include "cli/commands.h"
#include "common/model/model.h"

namespace strider::cli {
namespace {

struct EvalArgs {
  std::string config;
  std::string weights;
  std::string weights_endpoint;
  std::string env;
  int64_t episodes = 100;
  int64_t samples = 1;
  std::optional<double> temperature;  // unset unless the flag was given
  double temperature_flag = 0;
  uint64_t seed = 0;
  int64_t threads = -1;
  std::string device;
  bool json = false;
  std::string out;
  std::string episodes_out;
};

Status RunEval(const EvalArgs& args) {
  // stdout carries the result alone; the actor's log goes to stderr, warnings and worse only.
  spdlog::set_default_logger(spdlog::stderr_color_mt("eval"));
  spdlog::set_level(spdlog::level::warn);
  STRIDER_ASSIGN_OR_RETURN(actors::ActorOptions actor, actors::LoadActorConfig(args.config));
  if (args.threads >= 0) actor.threads = args.threads;
  if (!args.device.empty()) actor.device = args.device;
  if (!actor.device.empty()) {
    STRIDER_RETURN_IF_ERROR(ResolveDevice(actor.device).status().WithContext(args.config));
  }
  actors::EvaluateOptions options;
  options.actor = std::move(actor);
  options.weights = args.weights;
  options.weights_endpoint = args.weights_endpoint;
  options.env = args.env;
  options.episodes = args.episodes;
  options.samples = args.samples;
  options.temperature = args.temperature;
  options.seed = args.seed;
  options.episodes_out = args.episodes_out;
  Result<actors::EvalResult> result = actors::Evaluate(options);
  if (!result.ok()) {
    const StatusCode code = result.status().code();
    const bool usage = code == StatusCode::kInvalidArgument || code == StatusCode::kNotFound;
    return usage ? result.status().WithContext(args.config) : result.status();
  }
  const std::string line = result->ToJson();
  if (!args.out.empty()) {
    std::ofstream out(args.out, std::ios::app);
    out << line << "\n";
    out.flush();
    if (!out) return Status::IoError("eval: cannot append to " + args.out);
  }
  if (args.json) {
    std::printf("%s\n", line.c_str());
  } else {
    const actors::EvalResult& r = *result;
    std::printf("%s, policy version %llu (%s): %lld problems x %lld samples, seed %llu\n",
                r.env.c_str(), static_cast<unsigned long long>(r.policy_version), r.weights.c_str(),
                static_cast<long long>(r.episodes), static_cast<long long>(r.samples),
                static_cast<unsigned long long>(r.seed));
    std::printf("  success %.3f (%lld), 95%% CI [%.3f, %.3f]\n", r.success_rate,
                static_cast<long long>(r.successes), r.ci.low, r.ci.high);
    if (r.pass_at_k) {
      std::printf("  pass@%lld %.3f\n", static_cast<long long>(r.samples), *r.pass_at_k);
    }
    std::printf("  reward mean %.3f, turns mean %.2f, %.1f s (%.2f episodes/s)\n", r.reward_mean,
                r.mean_turns, r.seconds,
                r.seconds > 0 ? static_cast<double>(r.episodes * r.samples) / r.seconds : 0.0);
    std::printf("  endings:");
    for (const auto& [status, count] : r.endings) {
      std::printf(" %s %lld", status.c_str(), static_cast<long long>(count));
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace

void AddEvalCommands(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* eval = app.add_subcommand(
      "eval", "Held-out evaluation of a policy: success rate, CI, pass@k on an environment");
  eval->add_option("--config", args->config, "Actor config (YAML: actor: and env:)")->required();
  CLI::Option* weights =
      eval->add_option("--weights", args->weights, "Weights to evaluate (safetensors)");
  CLI::Option* endpoint =
      eval->add_option("--weights-endpoint", args->weights_endpoint,
                       "Evaluate the newest version a learner's weight publisher holds");
  weights->excludes(endpoint);
  endpoint->excludes(weights);
  eval->add_option("--env", args->env,
                   "Environment; must match the config's, or picks a built-in when it has none");
  eval->add_option("--episodes", args->episodes, "Problems (default 100)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  eval->add_option("--samples", args->samples, "Samples per problem; K > 1 reports pass@K")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  CLI::Option* temperature = eval->add_option(
      "--temperature", args->temperature_flag,
      "Sampling temperature (default: 0, greedy; with --samples > 1 the config's)");
  eval->add_option("--seed", args->seed, "Evaluation seed: problem i uses EvaluationSeed(S, i)");
  eval->add_option("--threads", args->threads, "LibTorch threads (overrides actor.threads)")
      ->check(CLI::Range(int64_t{0}, int64_t{1024}));
  eval->add_option("--device", args->device,
                   "cpu, cuda or cuda:N for the model (overrides actor.device)");
  eval->add_flag("--json", args->json, "One JSON line on stdout instead of a summary");
  eval->add_option("--out", args->out, "Also append the JSON line to this file");
  eval->add_option("--episodes-out", args->episodes_out,
                   "Append every episode (status, reward, the exchange as text) to this file as "
                   "JSON lines");
  eval->callback([args, temperature, &exit_code] {
    if (temperature->count() > 0) args->temperature = args->temperature_flag;
    Status status = RunEval(*args);
    if (!status.ok()) exit_code = ReportError(status);
  });
}

}  // namespace strider::cli
