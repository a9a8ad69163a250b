// Strict reading of fleet files (launcher.h, docs/launcher.md).
#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <map>

#include "common/config.h"
#include "launcher/launcher.h"

namespace strider::launcher {
namespace {

namespace fs = std::filesystem;

// Resolves `*path` like every other config path and fails `key` when no file is there, so a
// typo is reported before any process starts.
void ResolveExisting(ConfigReader& section, const std::string& key, const std::string& origin,
                     std::string* path) {
  if (!section.status().ok()) return;
  if (path->empty()) {
    section.Fail(key, "must name a file");
    return;
  }
  const std::string resolved = ResolveConfigPath(*path, origin);
  std::error_code error;
  if (!fs::is_regular_file(resolved, error)) {
    section.Fail(key, "no such file: " + *path);
    return;
  }
  *path = resolved;
}

// Why `host` cannot name a machine in a command line, or "". Hosts end up inside endpoints
// (tcp://HOST:PORT) and shell commands, so only names and numeric addresses pass.
std::string HostProblem(const std::string& host) {
  if (host.empty()) return "must name a host";
  if (host.find("://") != std::string::npos) {
    return "'" + host + "' is a host name or address, without a scheme";
  }
  if (host.find(':') != std::string::npos) {
    in6_addr address;
    if (::inet_pton(AF_INET6, host.c_str(), &address) == 1) return "";
    return "'" + host + "' is no host name or IPv6 address (a port goes in its own key)";
  }
  for (char c : host) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') {
      return "'" + host + "' is no host name or address (letters, digits, '.', '-', '_')";
    }
  }
  return "";
}

void CheckHost(ConfigReader& section, const std::string& key, const std::string& host) {
  const std::string problem = HostProblem(host);
  if (!problem.empty()) section.Fail(key, problem);
}

void CheckPort(ConfigReader& section, const std::string& key, int64_t port) {
  section.Check(port >= 1 && port <= 65535, key, "must be a port between 1 and 65535");
}

// "HOST:PORT" or "[IPV6]:PORT".
bool SplitHostPort(const std::string& text, std::string* host, int64_t* port) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) return false;
  std::string name = text.substr(0, colon);
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  } else if (name.find(':') != std::string::npos) {
    return false;  // an IPv6 address needs its brackets to tell the port apart
  }
  const std::string digits = text.substr(colon + 1);
  if (digits.size() > 5 || !std::all_of(digits.begin(), digits.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    return false;
  }
  *host = name;
  *port = std::stoll(digits);
  return true;
}

// A port a service binds on a host, for the check that no two share one.
struct Binding {
  std::string host;
  int64_t port;
  ConfigReader* section;
  std::string key;  // in `section`
};

// The keys that place the roles on machines (docs/launcher.md, "Hosts"). A fleet names hosts
// for all three roles or for none: half a placement would leave the rest on a loopback address
// the other machines cannot reach.
void ReadHosts(ConfigReader& root, ConfigReader& replay, ConfigReader& learner,
               ConfigReader& actors, FleetConfig* fleet) {
  FleetHosts hosts;
  replay.Optional("host", &hosts.replay.host);
  replay.Optional("bind", &hosts.replay.bind);
  replay.Optional("port", &hosts.replay.port);
  replay.Optional("sample_port", &hosts.replay.sample_port);
  learner.Optional("hosts", &hosts.learner.hosts);
  learner.Optional("world_size", &hosts.learner.world_size);
  std::string rendezvous;
  learner.Optional("rendezvous", &rendezvous);
  learner.Optional("bind", &hosts.learner.bind);
  learner.Optional("publish_port", &hosts.learner.publish_port);
  std::vector<ConfigReader> actor_hosts = actors.List("hosts");
  for (ConfigReader& entry : actor_hosts) {
    ActorHost host;
    entry.Required("host", &host.host);
    CheckHost(entry, "host", host.host);
    entry.Optional("count", &host.count);
    entry.Check(host.count >= 1, "count", "must be at least 1");
    hosts.actors.push_back(host);
  }
  if (!root.status().ok()) return;

  const bool named[] = {replay.Has("host"), learner.Has("hosts"), actors.Has("hosts")};
  if (!named[0] && !named[1] && !named[2]) {
    const std::string why =
        "is for a fleet with hosts (replay.host, learner.hosts, actors.hosts); without them "
        "every role runs on this machine on free ports";
    for (const char* key : {"bind", "port", "sample_port"}) {
      if (replay.Has(key)) replay.Fail(key, why);
    }
    for (const char* key : {"world_size", "rendezvous", "bind", "publish_port"}) {
      if (learner.Has(key)) learner.Fail(key, why);
    }
    return;
  }
  std::string which;
  for (int i = 0; i < 3; ++i) {
    if (!named[i]) continue;
    if (!which.empty()) which += " and ";
    which += std::array{"replay.host", "learner.hosts", "actors.hosts"}[i];
  }
  const std::string why =
      "is required: the fleet names hosts for " + which + ", and every role needs them";
  if (!named[0]) replay.Fail("host", why);
  if (!named[1]) learner.Fail("hosts", why);
  if (!named[2]) actors.Fail("hosts", why);

  CheckHost(replay, "host", hosts.replay.host);
  CheckHost(replay, "bind", hosts.replay.bind);
  CheckPort(replay, "port", hosts.replay.port);
  CheckPort(replay, "sample_port", hosts.replay.sample_port);

  LearnerHosts& ranks = hosts.learner;
  learner.Check(!ranks.hosts.empty(), "hosts", "must name at least one host");
  for (size_t i = 0; i < ranks.hosts.size(); ++i) {
    const std::string problem = HostProblem(ranks.hosts[i]);
    if (!problem.empty()) learner.Fail("hosts", "element " + std::to_string(i) + ": " + problem);
  }
  const int64_t host_count = static_cast<int64_t>(ranks.hosts.size());
  if (!learner.Has("world_size")) ranks.world_size = host_count;
  learner.Check(ranks.world_size >= 1, "world_size", "must be at least 1");
  if (host_count > 0 && ranks.world_size >= 1 && ranks.world_size % host_count != 0) {
    learner.Fail("world_size", std::to_string(ranks.world_size) +
                                   " ranks do not spread evenly over " +
                                   std::to_string(host_count) + " hosts");
  }
  if (rendezvous.empty() && !ranks.hosts.empty()) {
    ranks.rendezvous_host = ranks.hosts.front();
  } else if (!SplitHostPort(rendezvous, &ranks.rendezvous_host, &ranks.rendezvous_port)) {
    learner.Fail("rendezvous", "'" + rendezvous + "' must be HOST:PORT ([ADDRESS]:PORT for IPv6)");
  } else {
    CheckHost(learner, "rendezvous", ranks.rendezvous_host);
  }
  CheckPort(learner, "rendezvous", ranks.rendezvous_port);
  CheckHost(learner, "bind", ranks.bind);
  CheckPort(learner, "publish_port", ranks.publish_port);

  int64_t actor_total = 0;
  for (const ActorHost& host : hosts.actors) actor_total += host.count;
  actors.Check(!hosts.actors.empty(), "hosts", "must name at least one host");
  if (actors.Has("count") && actor_total != fleet->actor_count) {
    actors.Fail("count", std::to_string(fleet->actor_count) + " differs from the " +
                             std::to_string(actor_total) +
                             " actors actors.hosts places; leave count out with hosts");
  }
  actors.Check(actor_total <= 256, "hosts", "places more than 256 actors");
  CheckPort(root, "http_port", fleet->http_port);
  if (!root.status().ok()) return;

  // No two services on one machine may bind the same port. Rank 0 alone binds the weight
  // publisher and serves the rendezvous.
  std::vector<Binding> bindings = {
      {hosts.replay.host, hosts.replay.port, &replay, "port"},
      {hosts.replay.host, hosts.replay.sample_port, &replay, "sample_port"},
      {ranks.hosts.front(), ranks.publish_port, &learner, "publish_port"},
      {ranks.rendezvous_host, ranks.rendezvous_port, &learner, "rendezvous"}};
  if (fleet->http) {
    // Each host's services take http_port, http_port + 1, ... (HostCommands).
    std::vector<std::pair<std::string, int64_t>> services = {{hosts.replay.host, 1}};
    for (const std::string& host : ranks.hosts) {
      services.emplace_back(host, ranks.world_size / host_count);
    }
    for (const ActorHost& host : hosts.actors) services.emplace_back(host.host, host.count);
    std::map<std::string, int64_t> on_host;
    for (const auto& [host, count] : services) on_host[host] += count;
    for (const auto& [host, count] : on_host) {
      for (int64_t k = 0; k < count; ++k) {
        bindings.push_back({host, fleet->http_port + k, &root, "http_port"});
      }
    }
  }
  for (size_t i = 0; i < bindings.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const Binding& a = bindings[j];
      const Binding& b = bindings[i];
      if (a.host != b.host || a.port != b.port || (a.section == b.section && a.key == b.key)) {
        continue;
      }
      const std::string other =
          a.section->path().empty() ? a.key : a.section->path() + "." + a.key;
      b.section->Fail(b.key, "port " + std::to_string(b.port) + " on " + b.host + " is " +
                                 other + "'s too");
      return;
    }
  }
  fleet->actor_count = actor_total;
  fleet->hosts = std::move(hosts);
}

}  // namespace

Result<FleetConfig> LoadFleetConfig(const std::string& path, FleetUse use) {
  STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromFile(path));
  FleetConfig fleet;
  fleet.origin = path;
  root.Optional("run_dir", &fleet.run_dir);
  root.Check(!fleet.run_dir.empty(), "run_dir", "must not be empty");
  root.Optional("weights", &fleet.weights);
  root.Optional("ready_timeout_s", &fleet.ready_timeout_s);
  root.Optional("http", &fleet.http);
  root.Check(fleet.ready_timeout_s > 0, "ready_timeout_s", "must be positive");
  root.Optional("http_port", &fleet.http_port);
  root.Optional("status_page", &fleet.status_page);
  if (root.Has("status_page")) {
    std::string host;
    int64_t port = 0;
    in_addr v4;
    in6_addr v6;
    if (!fleet.http) {
      root.Fail("status_page", "needs http: true (the page shows what the children's pages serve)");
    } else if (!SplitHostPort(fleet.status_page, &host, &port) || port > 65535 ||
               (::inet_pton(AF_INET, host.c_str(), &v4) != 1 &&
                ::inet_pton(AF_INET6, host.c_str(), &v6) != 1)) {
      root.Fail("status_page", "'" + fleet.status_page +
                                   "' is no numeric HOST:PORT (127.0.0.1:8080, 0.0.0.0:0, "
                                   "[::1]:8080; port 0: a free one)");
    }
  }
  root.Optional("binary", &fleet.binary);
  root.Check(!fleet.binary.empty(), "binary", "must name the strider the hosts run");

  ConfigReader replay = root.Section("replay");
  replay.Required("config", &fleet.replay_config);
  fleet.as_written.replay_config = fleet.replay_config;
  ResolveExisting(replay, "config", path, &fleet.replay_config);

  ConfigReader learner = root.Section("learner");
  learner.Required("config", &fleet.learner_config);
  fleet.as_written.learner_config = fleet.learner_config;
  ResolveExisting(learner, "config", path, &fleet.learner_config);

  ConfigReader actors = root.Section("actors");
  actors.Required("config", &fleet.actor_config);
  fleet.as_written.actor_config = fleet.actor_config;
  ResolveExisting(actors, "config", path, &fleet.actor_config);
  actors.Optional("count", &fleet.actor_count);
  actors.Check(fleet.actor_count >= 1 && fleet.actor_count <= 256, "count",
               "must be between 1 and 256");
  ReadHosts(root, replay, learner, actors, &fleet);

  // The children's configs are read here (their loaders check them before anything starts);
  // weights are only read by the learner and actors, which on other hosts find them there, and
  // here only once launched.
  fleet.as_written.weights = fleet.weights;
  if (!fleet.weights.empty() && !fleet.hosts) {
    if (use == FleetUse::kLaunch) {
      ResolveExisting(root, "weights", path, &fleet.weights);
    } else {
      fleet.weights = ResolveConfigPath(fleet.weights, path);
    }
  }

  if (root.Has("evaluation")) {
    ConfigReader evaluation = root.Section("evaluation");
    EvaluationConfig eval;
    evaluation.Required("config", &eval.config);
    ResolveExisting(evaluation, "config", path, &eval.config);
    evaluation.Optional("episodes", &eval.episodes);
    evaluation.Check(eval.episodes >= 1, "episodes", "must be at least 1");
    evaluation.Optional("every_versions", &eval.every_versions);
    evaluation.Check(eval.every_versions >= 0, "every_versions",
                     "must not be negative (0: only the start and the end)");
    evaluation.Optional("final", &eval.final);
    fleet.evaluation = eval;
  }

  if (root.Has("gpu_budget")) {
    ConfigReader section = root.Section("gpu_budget");
    GpuBudget budget;
    section.Required("actor_cache_mb", &budget.actor_cache_mb);
    section.Optional("device_mb", &budget.device_mb);
    section.Optional("reserved_mb", &budget.reserved_mb);
    section.Check(budget.actor_cache_mb >= 1, "actor_cache_mb", "must be at least 1");
    section.Check(budget.device_mb >= 0, "device_mb", "must not be negative (0: not stated)");
    section.Check(budget.reserved_mb >= 0, "reserved_mb", "must not be negative");
    if (section.status().ok() && budget.device_mb > 0) {
      // The actors that share one device: all of them on this machine, the most any one host
      // runs in a fleet with hosts.
      int64_t sharing = fleet.actor_count;
      if (fleet.hosts) {
        std::map<std::string, int64_t> per_host;
        sharing = 0;
        for (const ActorHost& host : fleet.hosts->actors) {
          sharing = std::max(sharing, per_host[host.host] += host.count);
        }
      }
      const int64_t needed = sharing * budget.actor_cache_mb + budget.reserved_mb;
      if (needed > budget.device_mb) {
        section.Fail("actor_cache_mb",
                     std::to_string(sharing) + " actors x " +
                         std::to_string(budget.actor_cache_mb) + " MiB + reserved_mb " +
                         std::to_string(budget.reserved_mb) + " MiB = " + std::to_string(needed) +
                         " MiB exceeds device_mb " + std::to_string(budget.device_mb) +
                         " MiB; lower actor_cache_mb or actors.count");
      }
    }
    fleet.gpu_budget = budget;
  }

  ConfigReader stop = root.Section("stop");
  stop.Optional("learner_steps", &fleet.stop.learner_steps);
  stop.Check(fleet.stop.learner_steps >= 0, "learner_steps", "must not be negative");
  stop.Optional("samples", &fleet.stop.samples);
  stop.Check(fleet.stop.samples >= 0, "samples", "must not be negative");
  stop.Optional("wall_time_s", &fleet.stop.wall_time_s);
  stop.Check(fleet.stop.wall_time_s >= 0, "wall_time_s", "must not be negative");
  stop.Optional("grace_s", &fleet.stop.grace_s);
  stop.Check(fleet.stop.grace_s > 0, "grace_s", "must be positive");
  stop.Optional("success_rate", &fleet.stop.success_rate);
  stop.Check(fleet.stop.success_rate >= 0 && fleet.stop.success_rate <= 1, "success_rate",
             "must be between 0 and 1");
  if (fleet.stop.success_rate > 0 && !fleet.evaluation) {
    stop.Fail("success_rate", "needs an evaluation: section (the rule reads its success_rate)");
  }
  if (root.status().ok() && fleet.stop.learner_steps == 0 && fleet.stop.samples == 0 &&
      fleet.stop.wall_time_s == 0 && fleet.stop.success_rate == 0) {
    if (root.Has("stop")) {
      root.Fail("stop",
                "needs at least one rule above 0 (learner_steps, samples, wall_time_s, "
                "success_rate)");
    } else {
      root.Fail("stop",
                "is required: at least one rule (learner_steps, samples, wall_time_s, "
                "success_rate)");
    }
  }

  ConfigReader restart = root.Section("restart");
  restart.Optional("max_restarts", &fleet.restart.max_restarts);
  restart.Check(fleet.restart.max_restarts >= 0, "max_restarts", "must not be negative");
  restart.Optional("backoff_s", &fleet.restart.backoff_s);
  restart.Check(!fleet.restart.backoff_s.empty(), "backoff_s", "must not be empty");
  for (int64_t seconds : fleet.restart.backoff_s) {
    restart.Check(seconds >= 0, "backoff_s", "must not hold a negative delay");
  }

  STRIDER_RETURN_IF_ERROR(root.Finish());
  return fleet;
}

Result<FleetConfig> LoadFleetForLaunch(const std::string& fleet_path, const std::string& run_dir,
                                       bool resume, FleetUse use) {
  if (!resume) {
    if (fleet_path.empty()) return Status::InvalidArgument("a fleet file is required");
    STRIDER_ASSIGN_OR_RETURN(FleetConfig fleet, LoadFleetConfig(fleet_path, use));
    if (!run_dir.empty()) fleet.run_dir = run_dir;
    return fleet;
  }
  std::string dir = run_dir;
  if (dir.empty()) {
    if (fleet_path.empty()) {
      return Status::InvalidArgument("--resume needs --run-dir or the fleet file of the run");
    }
    STRIDER_ASSIGN_OR_RETURN(FleetConfig named, LoadFleetConfig(fleet_path, use));
    dir = named.run_dir;
  }
  const std::string recorded = (fs::path(dir) / "fleet.yaml").string();
  std::error_code error;
  if (!fs::is_regular_file(recorded, error)) {
    return Status::NotFound(recorded +
                            ": no fleet file recorded there; --resume continues a run "
                            "directory an earlier launch wrote");
  }
  STRIDER_ASSIGN_OR_RETURN(FleetConfig fleet, LoadFleetConfig(recorded, use));
  fleet.run_dir = dir;
  return fleet;
}

}  // namespace strider::launcher
