// `strider env list` and `strider env run`: environments for their authors
// (docs/design.md#command-line).
//
// `env run` plays episodes with a scripted policy (the environment's own solver, the default)
// or a random one (random text with tool calls, often malformed, to exercise error paths), and
// prints one line per episode and a summary. An episode that ends in an environment error is
// reported and counted, and the next episode runs; the exit code is then 1.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "envs/environment.h"
#include "envs/episode.h"
#include "envs/registry.h"
#include "envs/tools.h"

namespace strider::cli {
namespace {

using Json = nlohmann::ordered_json;

// Text from a plug-in (its name, an error it caused) may hold bytes that are not UTF-8; they
// print as U+FFFD rather than abort the command with its environment's processes running.
std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

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
    if (args.policy == "random") random = envs::MakeRandomPolicy(seed, spec.tools);
    const envs::EpisodeReport report =
        envs::PlayEpisode(*env, random ? *random : *scripted, seed, spec.max_turns);
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
      std::cout << Dump(line) << "\n";
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
    std::cout << Dump(summary) << std::endl;
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

struct ListArgs {
  std::string config;
  bool json = false;
};

// Built-ins are described by making each without options; a config's environment is made as
// `env run` makes it, so a plug-in is started (or loaded) once to ask.
Status List(const ListArgs& args) {
  std::vector<envs::EnvironmentConfig> configs;
  if (args.config.empty()) {
    for (const std::string& name : envs::RegisteredEnvironments()) {
      configs.push_back({.name = name});
    }
  } else {
    STRIDER_ASSIGN_OR_RETURN(envs::EnvironmentConfig config,
                             envs::LoadEnvironmentConfig(args.config));
    configs.push_back(std::move(config));
  }
  for (const envs::EnvironmentConfig& config : configs) {
    STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<envs::Environment> made,
                             envs::MakeEnvironment(config));
    const envs::EnvironmentSpec spec = made->Describe();
    made->Close();
    if (args.json) {
      std::cout << Dump(SpecJson(spec)) << "\n";
      continue;
    }
    std::string options;
    for (const std::string& option : spec.options) {
      options += (options.empty() ? "" : ", ") + option;
    }
    std::printf("%-14s %s\n  options: %s\n%s", spec.name.c_str(), spec.description.c_str(),
                options.empty() ? "none" : options.c_str(),
                envs::RenderToolList(spec.tools).c_str());
  }
  std::cout.flush();
  return Status::Ok();
}

}  // namespace

void AddEnvCommands(CLI::App& app, int& exit_code) {
  CLI::App* env = app.add_subcommand("env", "Environments: list them, play episodes");
  env->require_subcommand(1);

  auto list_args = std::make_shared<ListArgs>();
  CLI::App* list = env->add_subcommand(
      "list", "Built-in environments, or a config's, with their tools and options");
  list->add_option("--config", list_args->config,
                   "List the environment of this env config file (a built-in or a plug-in)");
  list->add_flag("--json", list_args->json, "One JSON object per environment");
  list->callback([list_args, &exit_code] {
    const Status status = List(*list_args);
    if (!status.ok()) exit_code = ReportError(status);
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
  run->add_option("--policy", args->policy, "Policy: scripted (the environment's solver) or random")
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
