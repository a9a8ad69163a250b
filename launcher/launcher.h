// The fleet launcher (`strider launch FLEET.yaml`): one replay server, one RL learner, N actors
// and, optionally, evaluations, as child processes of one supervisor on one machine.
//
//   launcher (Boost.Asio, one thread)
//     ├─ replay  `strider replay serve`   ports bound once, kept across restarts
//     ├─ learner `strider learner`        restarted from its newest checkpoint
//     ├─ actor-i `strider actor`          restarted on the same spill directory
//     └─ eval    `strider eval`           one at a time, for the versions due
//
// Children are started in that order, each once the one before printed its ready line; the
// launcher reads every child's stdout (ready and result lines) and appends its stdout and
// stderr to RUN_DIR/logs/<role>.log. A child that dies is restarted with backoff until its role
// exceeds restart.max_restarts. Stop (a stop rule, SIGINT or SIGTERM): SIGTERM to the actors and
// the learner (which checkpoints), then the replay server; SIGKILL for whatever is left after
// 10 s. Each child leads its own process group, so a terminal's Ctrl-C reaches the launcher
// only, and that ordered stop runs for it too. docs/launcher.md describes the fleet file, the run
// directory and the events.
//
// A fleet file may instead place its roles on hosts (FleetHosts). The launcher does not start
// such a fleet; HostCommands gives the commands to run on each host (`strider launch
// --print-commands`), built by the same functions as the children's command lines.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace strider::launcher {

struct EvaluationConfig {
  std::string config;  // actor config for `strider eval`; resolved, exists
  int64_t episodes = 100;
  int64_t every_versions = 10;  // version at the start, then every N-th published after
  bool final = true;            // evaluate the final checkpoint once the learner stopped
};

// The first rule met stops the run; 0 disables a rule, at least one is set.
struct StopRules {
  int64_t learner_steps = 0;  // the learner's step counter (its metrics "step")
  int64_t samples = 0;        // trajectories the learner sampled (its metrics "trajectories")
  double wall_time_s = 0;
  double success_rate = 0;  // an evaluation's success_rate at or above this; needs evaluation
  // Seconds a child has after SIGTERM before SIGKILL. The learner finishes the step it is in
  // and writes its checkpoint first, which on 2 cores can take half a minute or more.
  double grace_s = 60;
};

struct RestartPolicy {
  int64_t max_restarts = 5;  // per role within one launch; then the run fails
  // The n-th restart of a role waits backoff_s[n-1] seconds; the last value repeats.
  std::vector<int64_t> backoff_s = {1, 2, 4, 8, 16};
};

// Where each role runs when the fleet spans machines (docs/launcher.md, "Hosts"). Nothing here
// starts anything: `strider launch --print-commands` turns it into the commands to run on each
// host, and the deploy examples (configs/deploy/) carry the same commands.
struct ReplayHost {
  std::string host;              // the name or address actors and learner ranks connect to
  std::string bind = "0.0.0.0";  // the address the server binds on its host
  int64_t port = 5555;           // actor endpoint (`replay serve --bind`)
  int64_t sample_port = 5556;    // learner endpoint (`--sample-bind`)
};

struct LearnerHosts {
  std::vector<std::string> hosts;  // rank r runs on hosts[r / (world_size / hosts.size())]
  int64_t world_size = 0;          // learner ranks; a multiple of hosts.size()
  // c10d rendezvous (TCPStore) that rank 0 serves; HOST should name hosts[0]'s machine.
  std::string rendezvous_host;
  int64_t rendezvous_port = 29500;
  std::string bind = "0.0.0.0";  // where rank 0 binds its weight publisher
  int64_t publish_port = 5557;   // rank 0's weight stream, which every actor subscribes to
};

struct ActorHost {
  std::string host;
  int64_t count = 1;  // actors on this host
};

struct FleetHosts {
  ReplayHost replay;
  LearnerHosts learner;
  std::vector<ActorHost> actors;  // in order: actor ids count up through them
};

// Memory of a GPU that actors share with the learner or with each other (docs/fleet.md, "A
// shared GPU"). Each actor's engine sizes its page pool of latent cache blocks from its
// budget; on a shared device the fleet caps it, so the actors' pools and the learner fit
// together. MiB throughout.
struct GpuBudget {
  int64_t actor_cache_mb = 0;  // each actor's page pool at most (`actor --cache-budget-mb`)
  // The shared device's memory (nvidia-smi's memory.total); 0: not stated, nothing checked.
  int64_t device_mb = 0;
  // What else lives on that device: the learner's weights, fp32 masters, AdamW moments and
  // activations, the actors' weights, LibTorch's CUDA context per process.
  int64_t reserved_mb = 0;
};

struct FleetConfig {
  std::string origin;  // the fleet file read
  std::string run_dir = "runs/fleet";
  std::string weights;        // starting safetensors for learner and actors; empty: their own
  std::string replay_config;  // every path resolved (ResolveConfigPath) and checked to exist
                              // (the weights only as the FleetUse needs)
  std::string learner_config;
  std::string actor_config;
  int64_t actor_count = 1;
  std::optional<EvaluationConfig> evaluation;
  std::optional<GpuBudget> gpu_budget;
  StopRules stop;
  RestartPolicy restart;
  double ready_timeout_s = 120;  // a child that prints no ready line this long has failed
  // Replay server, learner and actors serve /metrics and /status on free loopback ports
  // (`--http 127.0.0.1:0`); their addresses are in the ready line and RUN_DIR/http.json.
  bool http = false;
  // With `http`, where the launcher serves its own status page (/, /fleet.json, /metrics):
  // numeric HOST:PORT, port 0 a free one. Its address joins the others in the ready line and
  // RUN_DIR/http.json under "launcher".
  std::string status_page = "127.0.0.1:0";

  // With hosts, `http: true` serves each command's pages on http_port, http_port + 1, ... in the
  // order the commands run on their host: ports are known in advance, as scrapers need.
  int64_t http_port = 9100;
  // The strider that printed commands run (a name on the hosts' PATH, or a path there); the
  // launcher's own children run the launcher's binary instead.
  std::string binary = "strider";
  // Absent: every role on this machine, as `strider launch` runs it.
  std::optional<FleetHosts> hosts;
  // The paths above as the fleet file writes them, before this machine resolved them: commands
  // for other hosts carry these, to be resolved there (from the directory they run in).
  struct {
    std::string weights;
    std::string replay_config;
    std::string learner_config;
    std::string actor_config;
  } as_written;
};

// What a fleet is read for, which decides the files it needs.
enum class FleetUse {
  // Run here (Launch): the children's configs and, for a fleet without hosts, the starting
  // weights must be on this machine.
  kLaunch,
  // Its commands printed (HostCommands): only the children's configs are read. The weights are
  // read by the commands when they run, after whatever writes them (a warm start).
  kPrintCommands,
};

// Reads a fleet file strictly: unknown keys, wrong types, missing files and impossible values are
// InvalidArgument naming the file, line and key. Nothing is started.
Result<FleetConfig> LoadFleetConfig(const std::string& path, FleetUse use = FleetUse::kLaunch);

// The fleet a launch runs: `fleet_path` (may be empty with `resume`), or with `resume` the copy
// RUN_DIR/fleet.yaml an earlier launch recorded, where RUN_DIR is `run_dir` when given, else the
// fleet file's. `run_dir`, when given, replaces the file's.
Result<FleetConfig> LoadFleetForLaunch(const std::string& fleet_path, const std::string& run_dir,
                                       bool resume, FleetUse use = FleetUse::kLaunch);

// One command of a fleet, for the host it runs on.
struct HostCommand {
  std::string host;
  std::string role;  // replay | learner | actor
  std::string name;  // replay, learner-R (rank R), actor-i
  std::vector<std::string> argv;
};

// The commands that run `fleet` across its hosts, grouped by host (hosts in the order they first
// appear: replay, learner ranks, actors) and in start order within a host: `strider replay serve`
// binding its ports, each learner rank (with --rank, --world-size and --rendezvous when the world
// is larger than one) and each actor, connected to the replay host and rank 0's weight stream.
// Actor i plays with seed actor_base_seed + i. Paths are as the fleet file writes them. A fleet
// without hosts gives the same commands on 127.0.0.1 with the default ports (nothing else is
// bound there) and one learner. Evaluations and the stop rules other than learner_steps (each
// rank's --max-steps) are the launcher's own and have no command here.
std::vector<HostCommand> HostCommands(const FleetConfig& fleet, uint64_t actor_base_seed);

// `commands` for a terminal: each host's commands under a "# host" line, one shell-quoted
// command a line.
std::string HostCommandsText(const std::vector<HostCommand>& commands);
// One JSON object a line: {"host", "role", "name", "argv"}.
std::string HostCommandsJsonLines(const std::vector<HostCommand>& commands);

struct LaunchOptions {
  bool resume = false;  // the learner continues from its newest checkpoint in RUN_DIR
  std::string binary = "/proc/self/exe";  // the `strider` the children run
  uint64_t actor_base_seed = 0;           // actor i plays with seed base + i
  double tick_s = 2;                      // merged metrics line and stop-rule check period
  // Each JSON event line for stdout ("ready", "started", "exited", "finished"), without newline.
  std::function<void(const std::string& line)> on_event;
  // Saves the weights a fresh learner starts from at the given path. A fresh learner publishes
  // nothing before its first step, so the start evaluation of a fleet without `weights:` reads
  // them from this file (RUN_DIR/initial.safetensors); unset: that evaluation waits for the
  // first published version.
  std::function<Status(const std::string& path)> write_initial_weights;
};

struct LaunchSummary {
  // learner_steps | samples | wall_time | success_rate | signal | learner_finished
  std::string reason;
  int64_t learner_step = 0;
  std::optional<double> eval_success_rate;
  double elapsed_s = 0;
};

// Runs the fleet until a stop rule, SIGINT/SIGTERM or the learner finishing its steps; every
// child has been reaped when it returns. Errors: InvalidArgument for a run directory that cannot
// hold this launch (nothing started), Unavailable when a child did not become ready or a role
// exceeded its restarts (the message quotes the end of the child's log); InvalidArgument for a
// fleet with hosts, whose commands run elsewhere (HostCommands). Installs handlers for
// SIGINT, SIGTERM and SIGCHLD for its duration; not to be called from two threads at once.
Result<LaunchSummary> Launch(const FleetConfig& fleet, const LaunchOptions& options);

}  // namespace strider::launcher
