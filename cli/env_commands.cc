// `strider env list` and `strider env run`: environments for their authors (DESIGN.md s.8).
//
// `env run` plays episodes with a scripted policy (the environment's own solver, the default)
// or a random one (random text with tool calls, often malformed, to exercise error paths), and
// prints one line per episode and a summary. An episode that ends in an environment error is
// reported and counted, and the next episode runs; the exit code is then 1.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "envs/environment.h"
#include "envs/registry.h"
#include "envs/tools.h"

namespace strider::cli {
namespace {

using Json = nlohmann::ordered_json;

// Random turns: words, sometimes a tool call (often malformed), sometimes an answer.
class RandomPolicy : public envs::ScriptedPolicy {
 public:
  RandomPolicy(uint64_t seed, std::vector<envs::ToolSpec> tools)
      : rng_(seed ^ 0x7a3dULL), tools_(std::move(tools)) {}

  Result<std::string> NextTurn(const std::vector<envs::Observation>&) override {
    static const char* const kWords[] = {"let",   "me",   "think", "the",   "value", "is",
                                         "maybe", "next", "so",    "check", "part",  "cell"};
    std::string text;
    const int words = 1 + static_cast<int>(rng_() % 8);
    for (int i = 0; i < words; ++i) text += std::string(i ? " " : "") + kWords[rng_() % 12];
    const uint64_t roll = rng_() % 10;
    if (roll == 0) return text + " Answer: " + std::to_string(rng_() % 100);
    if (roll < 6) {
      const std::string name =
          tools_.empty() || rng_() % 5 == 0 ? "nosuchtool" : tools_[rng_() % tools_.size()].name;
      std::string arguments;
      static const char kChars[] = "0123456789+-*/(), abcxyz\"";
      const int length = static_cast<int>(rng_() % 12);
      for (int i = 0; i < length; ++i) arguments += kChars[rng_() % (sizeof(kChars) - 1)];
      switch (rng_() % 4) {
        case 0:  // missing closing marker
          return text + std::string(envs::kToolCallOpen) + name + "(" + arguments + ")";
        case 1:  // missing parenthesis
          return text + std::string(envs::kToolCallOpen) + name + " " + arguments +
                 std::string(envs::kToolCallClose);
        default:
          return text + envs::FormatToolCall(name, arguments);
      }
    }
    return text;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<envs::ToolSpec> tools_;
};

struct RunArgs {
  std::string name;
  std::string config;
  std::string library;
  std::string command;
  int64_t step_timeout_ms = 0;
  int64_t episodes = 1;
  std::string policy = "scripted";
  uint64_t seed = 0;
  std::vector<std::string> options;
  bool json = false;
};

struct EpisodeReport {
  uint64_t seed = 0;
  int turns = 0;
  int correct = 0, incorrect = 0, unknown = 0;
  std::optional<double> outcome;
  std::string end;  // "done", "turn limit", or the error
  bool error = false;
  double seconds = 0;
  size_t observation_bytes = 0;
  size_t images = 0;
};

EpisodeReport PlayEpisode(envs::Environment& env, envs::ScriptedPolicy& policy, uint64_t seed,
                          int max_turns) {
  EpisodeReport report;
  report.seed = seed;
  const auto start = std::chrono::steady_clock::now();
  auto finish = [&](std::string end, bool error) {
    report.end = std::move(end);
    report.error = error;
    report.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report;
  };
  Result<envs::Observation> first = env.Reset(seed, {});
  if (!first.ok()) return finish("reset: " + first.status().ToString(), true);
  std::vector<envs::Observation> observations = {*first};
  report.observation_bytes += first->text.size();
  report.images += first->images.size();
  while (report.turns < max_turns) {
    Result<std::string> text = policy.NextTurn(observations);
    if (!text.ok()) return finish("policy: " + text.status().ToString(), true);
    Result<envs::StepResult> step = env.Step(envs::MakeAction(*text));
    ++report.turns;
    if (!step.ok()) return finish("step: " + step.status().ToString(), true);
    switch (step->label) {
      case envs::StepLabel::kCorrect:
        ++report.correct;
        break;
      case envs::StepLabel::kIncorrect:
        ++report.incorrect;
        break;
      case envs::StepLabel::kUnknown:
        ++report.unknown;
        break;
    }
    report.observation_bytes += step->observation.text.size();
    report.images += step->observation.images.size();
    if (step->done) {
      report.outcome = step->outcome_reward;
      auto reason = step->info.find("reason");
      return finish(reason == step->info.end() ? "done" : reason->second, false);
    }
    observations.push_back(std::move(step->observation));
  }
  return finish("turn limit", false);
}

Status Run(const RunArgs& args, bool* had_errors) {
  envs::EnvironmentConfig config;
  if (!args.config.empty()) {
    STRIDER_ASSIGN_OR_RETURN(config, envs::LoadEnvironmentConfig(args.config));
  }
  // Flags win over the file.
  if (!args.name.empty()) config.name = args.name;
  if (!args.library.empty()) config.library = args.library;
  if (!args.command.empty()) config.command = args.command;
  if (args.step_timeout_ms > 0) config.step_timeout_ms = args.step_timeout_ms;
  for (const std::string& option : args.options) {
    const size_t eq = option.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Status::InvalidArgument("--options: expected key=value, got '" + option + "'");
    }
    config.options[option.substr(0, eq)] = option.substr(eq + 1);
  }
  if (config.name.empty() && config.library.empty() && config.command.empty()) {
    return Status::InvalidArgument(
        "name an environment (see `strider env list`), or give --config, --library or --command");
  }
  if (args.episodes < 1) return Status::InvalidArgument("--episodes must be at least 1");
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<envs::Environment> env, envs::MakeEnvironment(config));
  const envs::EnvironmentSpec spec = env->Describe();
  std::unique_ptr<envs::ScriptedPolicy> scripted;
  if (args.policy == "scripted") {
    STRIDER_ASSIGN_OR_RETURN(scripted, envs::MakeScriptedPolicy(config));
  }
  int64_t errors = 0, finished = 0, turns = 0;
  double outcome_sum = 0, seconds = 0;
  for (int64_t i = 0; i < args.episodes; ++i) {
    const uint64_t seed = args.seed + static_cast<uint64_t>(i);
    std::unique_ptr<envs::ScriptedPolicy> random;
    if (args.policy == "random") random = std::make_unique<RandomPolicy>(seed, spec.tools);
    EpisodeReport report = PlayEpisode(*env, random ? *random : *scripted, seed, spec.max_turns);
    errors += report.error ? 1 : 0;
    finished += report.error ? 0 : 1;
    outcome_sum += report.outcome.value_or(0.0);
    turns += report.turns;
    seconds += report.seconds;
    if (args.json) {
      Json line = {{"episode", i},
                   {"seed", report.seed},
                   {"turns", report.turns},
                   {"outcome", report.outcome ? Json(*report.outcome) : Json(nullptr)},
                   {"steps",
                    {{"correct", report.correct},
                     {"incorrect", report.incorrect},
                     {"unknown", report.unknown}}},
                   {"end", report.end},
                   {"error", report.error},
                   {"observation_bytes", report.observation_bytes},
                   {"images", report.images},
                   {"seconds", report.seconds}};
      std::cout << line.dump() << "\n";
    } else {
      std::printf(
          "episode %lld seed %llu: %s outcome %s, %d turns (steps: %d correct, %d "
          "incorrect, %d unknown), %zu observation bytes, %.3f s\n",
          static_cast<long long>(i), static_cast<unsigned long long>(report.seed),
          report.error ? "ERROR" : report.end.c_str(),
          report.outcome ? std::to_string(*report.outcome).c_str() : "-", report.turns,
          report.correct, report.incorrect, report.unknown, report.observation_bytes,
          report.seconds);
      if (report.error) std::printf("  %s\n", report.end.c_str());
    }
  }
  env->Close();
  const double mean_outcome = outcome_sum / static_cast<double>(args.episodes);
  if (args.json) {
    Json summary = {{"summary", spec.name},
                    {"policy", args.policy},
                    {"episodes", args.episodes},
                    {"errors", errors},
                    {"mean_outcome", mean_outcome},
                    {"mean_turns", static_cast<double>(turns) / args.episodes},
                    {"seconds", seconds}};
    std::cout << summary.dump() << std::endl;
  } else {
    std::printf(
        "%s, %s policy: %lld episodes, %lld errors, mean outcome %.3f, mean turns %.2f, "
        "%.3f s\n",
        spec.name.c_str(), args.policy.c_str(), static_cast<long long>(args.episodes),
        static_cast<long long>(errors), mean_outcome, static_cast<double>(turns) / args.episodes,
        seconds);
  }
  *had_errors = errors > 0;
  return Status::Ok();
}

Json SpecJson(const envs::EnvironmentSpec& spec) {
  Json tools = Json::array();
  for (const envs::ToolSpec& tool : spec.tools) {
    tools.push_back(
        {{"name", tool.name}, {"arguments", tool.arguments}, {"description", tool.description}});
  }
  return {{"name", spec.name},
          {"description", spec.description},
          {"tools", tools},
          {"options", spec.options},
          {"max_turns", spec.max_turns}};
}

}  // namespace

void AddEnvCommands(CLI::App& app, int& exit_code) {
  CLI::App* env = app.add_subcommand("env", "Environments: list them, play episodes");
  env->require_subcommand(1);

  auto list_json = std::make_shared<bool>(false);
  CLI::App* list =
      env->add_subcommand("list", "Built-in environments with their tools and options");
  list->add_flag("--json", *list_json, "One JSON object per environment");
  list->callback([list_json, &exit_code] {
    for (const std::string& name : envs::RegisteredEnvironments()) {
      Result<std::unique_ptr<envs::Environment>> made = envs::MakeEnvironment({.name = name});
      if (!made.ok()) {
        exit_code = ReportError(made.status());
        return;
      }
      const envs::EnvironmentSpec spec = (*made)->Describe();
      if (*list_json) {
        std::cout << SpecJson(spec).dump() << "\n";
        continue;
      }
      std::string options;
      for (const std::string& option : spec.options)
        options += (options.empty() ? "" : ", ") + option;
      std::printf("%-14s %s\n  options: %s\n%s", spec.name.c_str(), spec.description.c_str(),
                  options.empty() ? "none" : options.c_str(),
                  envs::RenderToolList(spec.tools).c_str());
    }
    std::cout.flush();
  });

  auto args = std::make_shared<RunArgs>();
  CLI::App* run = env->add_subcommand("run", "Play episodes with a scripted or random policy");
  run->add_option("name", args->name, "A built-in environment (or the name a plug-in reports)");
  run->add_option("--config", args->config, "A YAML file with an `env:` section");
  run->add_option("--library", args->library, "A shared-library plug-in (envs/plugin.h)");
  run->add_option("--command", args->command, "An out-of-process environment's command line");
  run->add_option("--step-timeout-ms", args->step_timeout_ms,
                  "Reply limit of an out-of-process environment");
  run->add_option("--episodes", args->episodes, "Episodes to play (default 1)");
  run->add_option("--policy", args->policy, "scripted (the environment's solver) or random")
      ->check(CLI::IsMember({"scripted", "random"}));
  run->add_option("--seed", args->seed, "Seed of the first episode; episode i uses seed + i");
  run->add_option("--options", args->options, "Environment options as key=value")->expected(1, -1);
  run->add_flag("--json", args->json, "One JSON line per episode and a summary line");
  run->callback([args, &exit_code] {
    bool had_errors = false;
    const Status status = Run(*args, &had_errors);
    if (!status.ok()) {
      exit_code = ReportError(status);
    } else if (had_errors) {
      exit_code = kExitRuntimeError;
    }
  });
}

}  // namespace strider::cli
