// The command lines of a fleet's services, written once: the supervisor builds its children's
// from them (launcher.cc) and HostCommands the ones a user runs on each host (host_commands.cc),
// so a flag added for one reaches the other. Internal to launcher/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strider::launcher {

// What every command of one fleet shares. The supervisor fills it with this machine's resolved
// paths and its own binary; commands for other hosts get the paths as the fleet file writes
// them.
struct CommandBase {
  std::string binary;
  std::string run_dir;
  std::string replay_config;
  std::string learner_config;
  std::string actor_config;
  std::string weights;  // empty: each config's own
  int64_t actor_cache_mb = 0;  // > 0: every actor's page pool capped to it (GpuBudget)
};

// tcp://HOST:PORT, an IPv6 address in brackets.
std::string TcpEndpoint(const std::string& host, int64_t port);

// `--http` takes HOST:PORT with the same brackets.
std::string HostPort(const std::string& host, int64_t port);

// `replay serve` on RUN_DIR/replay; `http` empty: no pages.
std::vector<std::string> ReplayServeCommand(const CommandBase& base, const std::string& bind,
                                            const std::string& sample_bind,
                                            const std::string& http);

struct LearnerRank {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::string rendezvous;  // HOST:PORT
};

struct LearnerCommandOptions {
  std::string replay;               // the replay server's learner (sample) endpoint
  std::string publish;              // the weight publisher's bind address
  std::string http;                 // empty: no pages
  std::string resume;               // a checkpoint directory; else a fresh learner
  int64_t max_steps = 0;            // with a fresh learner: stop after this many steps; 0: none
  std::optional<LearnerRank> rank;  // a learner group of more than one rank
};

// `learner` in mode rl on RUN_DIR/learner.
std::vector<std::string> LearnerCommand(const CommandBase& base,
                                        const LearnerCommandOptions& options);

// `actor` `id` (its files under RUN_DIR/actors/ID), playing until stopped.
std::vector<std::string> ActorCommand(const CommandBase& base, const std::string& id, uint64_t seed,
                                      const std::string& replay,
                                      const std::string& weights_endpoint, const std::string& http);

}  // namespace strider::launcher
