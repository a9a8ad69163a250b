#include "launcher/child_commands.h"

#include <filesystem>

namespace strider::launcher {
namespace {

namespace fs = std::filesystem;

std::string Under(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

}  // namespace

std::string HostPort(const std::string& host, int64_t port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string TcpEndpoint(const std::string& host, int64_t port) {
  return "tcp://" + HostPort(host, port);
}

std::vector<std::string> ReplayServeCommand(const CommandBase& base, const std::string& bind,
                                            const std::string& sample_bind,
                                            const std::string& http) {
  std::vector<std::string> args = {
      base.binary, "replay",           "serve",  "--db", Under(base.run_dir, "replay"),
      "--config",  base.replay_config, "--bind", bind,   "--sample-bind",
      sample_bind};
  if (!http.empty()) args.insert(args.end(), {"--http", http});
  return args;
}

std::vector<std::string> LearnerCommand(const CommandBase& base,
                                        const LearnerCommandOptions& options) {
  std::vector<std::string> args = {base.binary, "learner",
                                   "--config",  base.learner_config,
                                   "--run-dir", Under(base.run_dir, "learner"),
                                   "--replay",  options.replay,
                                   "--publish", options.publish};
  // The initial weights stay the reference policy of a resumed run, so --init goes along.
  if (!base.weights.empty()) args.insert(args.end(), {"--init", base.weights});
  if (!options.http.empty()) args.insert(args.end(), {"--http", options.http});
  if (!options.resume.empty()) {
    args.insert(args.end(), {"--resume", options.resume});
  } else if (options.max_steps > 0) {
    args.insert(args.end(), {"--max-steps", std::to_string(options.max_steps)});
  }
  if (options.rank) {
    args.insert(args.end(), {"--rank", std::to_string(options.rank->rank), "--world-size",
                             std::to_string(options.rank->world_size), "--rendezvous",
                             options.rank->rendezvous});
  }
  return args;
}

std::vector<std::string> ActorCommand(const CommandBase& base, const std::string& id, uint64_t seed,
                                      const std::string& replay,
                                      const std::string& weights_endpoint,
                                      const std::string& http) {
  const std::string dir = Under(Under(base.run_dir, "actors"), id);
  std::vector<std::string> args = {base.binary,
                                   "actor",
                                   "--config",
                                   base.actor_config,
                                   "--id",
                                   id,
                                   "--seed",
                                   std::to_string(seed),
                                   "--episodes",
                                   "0",
                                   "--replay",
                                   replay,
                                   "--weights-endpoint",
                                   weights_endpoint,
                                   "--spill-dir",
                                   Under(dir, "spill"),
                                   "--metrics",
                                   Under(dir, "metrics.jsonl"),
                                   "--no-progress"};
  if (!base.weights.empty()) args.insert(args.end(), {"--weights", base.weights});
  if (base.actor_cache_mb > 0) {
    args.insert(args.end(), {"--cache-budget-mb", std::to_string(base.actor_cache_mb)});
  }
  if (!http.empty()) args.insert(args.end(), {"--http", http});
  return args;
}

}  // namespace strider::launcher
