// `strider launch FLEET.yaml [--run-dir DIR] [--resume]`: replay server, learner and actors as
// child processes of one supervisor (launcher/launcher.h, docs/launcher.md).
#include <cstdio>

#include "cli/commands.h"
#include "launcher/launcher.h"
#include "replay/replay.h"

namespace strider::cli {
namespace {

struct LaunchArgs {
  std::string fleet;
  std::string run_dir;
  bool resume = false;
};

// Every child's config through its own loader, so a broken one fails here, before anything
// starts, naming the fleet key that points at it and its own file, line and key.
Result<uint64_t> CheckChildConfigs(const launcher::FleetConfig& fleet) {
  const auto in_fleet = [&](const std::string& key) { return fleet.origin + ": " + key; };
  Status replay = replay::LoadServerConfig(fleet.replay_config).status();
  if (!replay.ok()) return replay.WithContext(in_fleet("replay.config"));
  Status learner = CheckRlLearnerConfig(fleet.learner_config);
  if (!learner.ok()) return learner.WithContext(in_fleet("learner.config"));
  Result<uint64_t> seed = CheckActorConfig(fleet.actor_config);
  if (!seed.ok()) return seed.status().WithContext(in_fleet("actors.config"));
  if (fleet.evaluation) {
    Result<uint64_t> eval = CheckActorConfig(fleet.evaluation->config);
    if (!eval.ok()) return eval.status().WithContext(in_fleet("evaluation.config"));
  }
  return *seed;
}

Status RunLaunch(const LaunchArgs& args) {
  STRIDER_ASSIGN_OR_RETURN(launcher::FleetConfig fleet,
                           launcher::LoadFleetForLaunch(args.fleet, args.run_dir, args.resume));
  launcher::LaunchOptions options;
  STRIDER_ASSIGN_OR_RETURN(options.actor_base_seed, CheckChildConfigs(fleet));
  options.resume = args.resume;
  const std::string learner_config = fleet.learner_config;
  options.write_initial_weights = [learner_config](const std::string& out) {
    return WriteInitialRlWeights(learner_config, out);
  };
  options.on_event = [](const std::string& line) {
    std::fputs(line.c_str(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  };
  return launcher::Launch(fleet, options).status();
}

}  // namespace

void AddLaunchCommands(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* launch = app.add_subcommand(
      "launch",
      "Run a fleet on this machine: replay server, RL learner, actors and evaluations as child "
      "processes, restarted when they crash, until a stop rule or SIGINT/SIGTERM");
  launch->add_option("fleet", args->fleet, "Fleet file (YAML, configs/fleet/)");
  launch->add_option("--run-dir", args->run_dir, "Run directory (overrides the file's run_dir)");
  launch->add_flag("--resume", args->resume,
                   "Continue the run in the run directory with the fleet file it recorded");
  launch->callback([args, &exit_code] {
    Status status = RunLaunch(*args);
    if (!status.ok()) exit_code = ReportError(status);
  });
}

}  // namespace strider::cli
