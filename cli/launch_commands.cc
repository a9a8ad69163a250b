// `strider launch FLEET.yaml [--run-dir DIR] [--resume]`: replay server, learner and actors as
// child processes of one supervisor (launcher/launcher.h, docs/launcher.md).
// `strider launch FLEET.yaml --print-commands [--json]`: the commands that run the same fleet
// across its hosts, started nowhere (docs/fleet.md, "Multi-node launch").
#include <cstdio>

#include "cli/commands.h"
#include "common/transport/curve.h"
#include "launcher/launcher.h"
#include "learner/rl/rl_config.h"
#include "replay/replay.h"

namespace strider::cli {
namespace {

struct LaunchArgs {
  std::string fleet;
  std::string run_dir;
  bool resume = false;
  bool print_commands = false;
  bool json = false;
};

// Every child's config through its own loader, so a broken one fails here, before anything
// starts, naming the fleet key that points at it and its own file, line and key. `read_keys`
// false leaves the actors' key files unread, for commands that read them when they run.
Result<uint64_t> CheckChildConfigs(const launcher::FleetConfig& fleet, bool read_keys) {
  const auto in_fleet = [&](const std::string& key) { return fleet.origin + ": " + key; };
  Status replay = replay::LoadServerConfig(fleet.replay_config).status();
  if (!replay.ok()) return replay.WithContext(in_fleet("replay.config"));
  Status learner = CheckRlLearnerConfig(fleet.learner_config);
  if (!learner.ok()) return learner.WithContext(in_fleet("learner.config"));
  Result<uint64_t> seed = CheckActorConfig(fleet.actor_config, read_keys);
  if (!seed.ok()) return seed.status().WithContext(in_fleet("actors.config"));
  if (fleet.evaluation) {
    Result<uint64_t> eval = CheckActorConfig(fleet.evaluation->config, read_keys);
    if (!eval.ok()) return eval.status().WithContext(in_fleet("evaluation.config"));
  }
  return *seed;
}

std::string Endpoint(const std::string& host, int64_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// What the commands leave to the operator, on stderr so stdout stays the commands alone.
void NoteWhatIsNotPrinted(const launcher::FleetConfig& fleet) {
  const launcher::StopRules& stop = fleet.stop;
  if (stop.samples > 0 || stop.wall_time_s > 0 || stop.success_rate > 0) {
    std::fprintf(stderr,
                 "launch: the stop rules samples, wall_time_s and success_rate are the "
                 "launcher's; these commands stop at learner_steps (--max-steps) or when "
                 "stopped\n");
  }
  if (fleet.hosts) {
    // Caught here rather than by a server that exits 2 on a machine far away.
    const launcher::ReplayHost& replay = fleet.hosts->replay;
    Result<replay::ServerOptions> server = replay::LoadServerConfig(fleet.replay_config);
    if (server.ok()) {
      const Status allowed = transport::CheckBindAllowed(
          Endpoint(replay.bind, replay.port), server->auth,
          "replay server on " + replay.host);
      if (!allowed.ok()) {
        std::fprintf(stderr, "launch: %s: %s\n", fleet.replay_config.c_str(),
                     allowed.message().c_str());
      }
    }
    const launcher::LearnerHosts& learner = fleet.hosts->learner;
    Result<rl::RlLearnerConfig> rl = rl::LoadRlLearnerConfig(fleet.learner_config);
    if (rl.ok()) {
      const Status allowed = transport::CheckBindAllowed(
          Endpoint(learner.bind, learner.publish_port),
          rl->publish.auth, "weight publisher of learner rank 0 on " + learner.hosts.front());
      if (!allowed.ok()) {
        std::fprintf(stderr, "launch: %s: %s\n", fleet.learner_config.c_str(),
                     allowed.message().c_str());
      }
    }
  }
  if (fleet.evaluation) {
    std::fprintf(stderr,
                 "launch: evaluation is the launcher's; run `strider eval --config %s "
                 "--weights-endpoint ENDPOINT` against the learner's weight stream instead\n",
                 fleet.evaluation->config.c_str());
  }
}

Status PrintCommands(const LaunchArgs& args) {
  if (args.resume) {
    return Status::InvalidArgument(
        "--print-commands prints a fresh fleet's commands; a rank or actor restarted by its "
        "scheduler continues from its own files (docs/fleet.md)");
  }
  // Printed commands read their files when they run, on their hosts (this one too for a fleet
  // without hosts): the weights and the actors' key files need not exist yet. The replay
  // server's and the learner's key files their loaders leave unread as well.
  STRIDER_ASSIGN_OR_RETURN(
      launcher::FleetConfig fleet,
      launcher::LoadFleetForLaunch(args.fleet, args.run_dir, false,
                                   launcher::FleetUse::kPrintCommands));
  STRIDER_ASSIGN_OR_RETURN(const uint64_t actor_seed,
                           CheckChildConfigs(fleet, /*read_keys=*/false));
  const std::vector<launcher::HostCommand> commands = launcher::HostCommands(fleet, actor_seed);
  const std::string out = args.json ? launcher::HostCommandsJsonLines(commands)
                                    : launcher::HostCommandsText(commands);
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  NoteWhatIsNotPrinted(fleet);
  return Status::Ok();
}

Status RunLaunch(const LaunchArgs& args) {
  if (args.print_commands) return PrintCommands(args);
  if (args.json) return Status::InvalidArgument("--json goes with --print-commands");
  STRIDER_ASSIGN_OR_RETURN(launcher::FleetConfig fleet,
                           launcher::LoadFleetForLaunch(args.fleet, args.run_dir, args.resume));
  launcher::LaunchOptions options;
  // A fleet with hosts is refused by Launch below, its key files being on those hosts.
  STRIDER_ASSIGN_OR_RETURN(options.actor_base_seed,
                           CheckChildConfigs(fleet, /*read_keys=*/!fleet.hosts.has_value()));
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
      "processes, restarted when they crash, until a stop rule or SIGINT/SIGTERM; or print "
      "the commands that run it across its hosts (--print-commands)");
  launch->add_option("fleet", args->fleet, "Fleet file (YAML, configs/fleet/)");
  launch->add_option("--run-dir", args->run_dir, "Run directory (overrides the file's run_dir)");
  launch->add_flag("--resume", args->resume,
                   "Continue the run in the run directory with the fleet file it recorded");
  launch->add_flag("--print-commands", args->print_commands,
                   "Start nothing: print the commands that run this fleet, grouped by host "
                   "(the fleet's hosts, else 127.0.0.1)");
  launch->add_flag("--json", args->json,
                   "With --print-commands: one JSON object a line, {host, role, name, argv}");
  launch->callback([args, &exit_code] {
    Status status = RunLaunch(*args);
    if (!status.ok()) exit_code = ReportError(status);
  });
}

}  // namespace strider::cli
