// The commands of a fleet across its hosts (launcher.h, HostCommands; docs/fleet.md, "Multi-node
// launch"), built by the same functions as the supervisor's children.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "launcher/child_commands.h"
#include "launcher/launcher.h"

namespace strider::launcher {
namespace {

constexpr const char* kLoopback = "127.0.0.1";

// A fleet without hosts, placed on this machine: every role on the loopback address with the
// default ports, one learner rank.
FleetHosts Loopback(int64_t actor_count) {
  FleetHosts hosts;
  hosts.replay.host = kLoopback;
  hosts.replay.bind = kLoopback;
  hosts.learner.hosts = {kLoopback};
  hosts.learner.world_size = 1;
  hosts.learner.rendezvous_host = kLoopback;
  hosts.learner.bind = kLoopback;
  hosts.actors = {{kLoopback, actor_count}};
  return hosts;
}

// Characters a POSIX shell takes literally outside quotes.
bool ShellSafe(const std::string& word) {
  return !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("_@%+=:,./-").find(c) != std::string_view::npos;
  });
}

std::string ShellQuote(const std::string& word) {
  if (ShellSafe(word)) return word;
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

}  // namespace

std::vector<HostCommand> HostCommands(const FleetConfig& fleet, uint64_t actor_base_seed) {
  const bool loopback = !fleet.hosts.has_value();
  const FleetHosts hosts = loopback ? Loopback(fleet.actor_count) : *fleet.hosts;
  // Here the resolved paths are the ones that work from this directory; elsewhere only the
  // fleet file's own words mean anything.
  CommandBase base =
      loopback ? CommandBase{fleet.binary,         fleet.run_dir,      fleet.replay_config,
                             fleet.learner_config, fleet.actor_config, fleet.weights}
               : CommandBase{fleet.binary,
                             fleet.run_dir,
                             fleet.as_written.replay_config,
                             fleet.as_written.learner_config,
                             fleet.as_written.actor_config,
                             fleet.as_written.weights};
  if (fleet.gpu_budget) base.actor_cache_mb = fleet.gpu_budget->actor_cache_mb;
  std::map<std::string, int64_t> http_taken;  // pages already served on each host
  const auto http = [&](const std::string& host, const std::string& bind) -> std::string {
    if (!fleet.http) return "";
    return HostPort(bind, fleet.http_port + http_taken[host]++);
  };

  std::vector<HostCommand> commands;
  const ReplayHost& replay = hosts.replay;
  commands.push_back({replay.host, "replay", "replay",
                      ReplayServeCommand(base, TcpEndpoint(replay.bind, replay.port),
                                         TcpEndpoint(replay.bind, replay.sample_port),
                                         http(replay.host, replay.bind))});

  const LearnerHosts& learner = hosts.learner;
  const int64_t ranks_per_host = learner.world_size / static_cast<int64_t>(learner.hosts.size());
  for (int64_t rank = 0; rank < learner.world_size; ++rank) {
    const std::string& host = learner.hosts[static_cast<size_t>(rank / ranks_per_host)];
    LearnerCommandOptions options;
    options.replay = TcpEndpoint(replay.host, replay.sample_port);
    // Every rank gets the same flags but its rank, so one template (a StatefulSet, an srun
    // step) serves them all; only rank 0 publishes.
    options.publish = TcpEndpoint(learner.bind, learner.publish_port);
    options.http = http(host, learner.bind);
    options.max_steps = fleet.stop.learner_steps;
    if (learner.world_size > 1) {
      options.rank = LearnerRank{rank, learner.world_size,
                                 HostPort(learner.rendezvous_host, learner.rendezvous_port)};
    }
    commands.push_back({host, "learner",
                        learner.world_size > 1 ? "learner-" + std::to_string(rank) : "learner",
                        LearnerCommand(base, options)});
  }

  const std::string weights = TcpEndpoint(learner.hosts.front(), learner.publish_port);
  int64_t index = 0;
  for (const ActorHost& host : hosts.actors) {
    for (int64_t k = 0; k < host.count; ++k, ++index) {
      const std::string id = "actor-" + std::to_string(index);
      commands.push_back({host.host, "actor", id,
                          ActorCommand(base, id, actor_base_seed + static_cast<uint64_t>(index),
                                       TcpEndpoint(replay.host, replay.port), weights,
                                       http(host.host, loopback ? kLoopback : "0.0.0.0"))});
    }
  }

  // Grouped by host, hosts in the order they first appear, commands in start order.
  std::vector<std::string> order;
  for (const HostCommand& command : commands) {
    if (std::find(order.begin(), order.end(), command.host) == order.end()) {
      order.push_back(command.host);
    }
  }
  std::stable_sort(commands.begin(), commands.end(),
                   [&](const HostCommand& a, const HostCommand& b) {
                     return std::find(order.begin(), order.end(), a.host) <
                            std::find(order.begin(), order.end(), b.host);
                   });
  return commands;
}

std::string HostCommandsText(const std::vector<HostCommand>& commands) {
  std::string text;
  std::string host;
  for (const HostCommand& command : commands) {
    if (text.empty() || command.host != host) {
      if (!text.empty()) text += "\n";
      host = command.host;
      text += "# " + host + "\n";
    }
    for (size_t i = 0; i < command.argv.size(); ++i) {
      text += (i > 0 ? " " : "") + ShellQuote(command.argv[i]);
    }
    text += "\n";
  }
  return text;
}

std::string HostCommandsJsonLines(const std::vector<HostCommand>& commands) {
  std::string lines;
  for (const HostCommand& command : commands) {
    nlohmann::ordered_json line = {{"host", command.host},
                                   {"role", command.role},
                                   {"name", command.name},
                                   {"argv", command.argv}};
    lines += line.dump() + "\n";
  }
  return lines;
}

}  // namespace strider::launcher
