// `strider actor --config F`: one actor service until its episodes are done or SIGINT/SIGTERM.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <stop_token>
#include <thread>

#include "actors/actor.h"
#include "cli/commands.h"
#include "cli/service_http.h"
#include "common/model/model.h"

namespace strider::cli {
namespace {

std::atomic<bool> g_actor_stop{false};
void OnActorSignal(int) { g_actor_stop = true; }

struct ActorArgs {
  std::string config;
  std::string replay;
  std::string spill_dir;
  std::string metrics;
  std::string weights;
  std::string weights_endpoint;
  std::string id;
  std::string http;
  std::string device;
  int64_t cache_budget_mb = 0;
  int64_t episodes = -1;
  int64_t seed = -1;
  bool no_progress = false;
};

Status RunActor(const ActorArgs& args) {
  // stdout carries JSON events; the log goes to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("actor"));
  STRIDER_ASSIGN_OR_RETURN(actors::ActorOptions options, actors::LoadActorConfig(args.config));
  // Flags win over the file.
  if (!args.replay.empty()) options.replay_endpoint = args.replay;
  if (!args.spill_dir.empty()) options.spill_dir = args.spill_dir;
  if (!args.metrics.empty()) options.metrics_path = args.metrics;
  if (!args.weights.empty()) options.weights = args.weights;
  if (!args.weights_endpoint.empty()) options.weights_endpoint = args.weights_endpoint;
  if (!args.id.empty()) options.actor_id = args.id;
  if (args.episodes >= 0) options.episodes = args.episodes;
  if (args.seed >= 0) options.seed = static_cast<uint64_t>(args.seed);
  if (args.no_progress) options.progress = false;
  if (!args.device.empty()) options.device = args.device;
  if (args.cache_budget_mb > 0) options.cache_budget_cap_bytes = args.cache_budget_mb << 20;
  Status valid = actors::ValidateActorOptions(options);
  if (!valid.ok()) return valid.WithContext(args.config);
  // Before the pages and the model: a device this host lacks is a usage error.
  if (!options.device.empty()) STRIDER_RETURN_IF_ERROR(ResolveDevice(options.device).status());
  // The pages first, so a bad or taken address fails before the model loads; until the actor
  // exists they show an empty metrics object.
  auto playing = std::make_shared<std::atomic<actors::Actor*>>(nullptr);
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<http::StatusServer> pages,
                           ServeStatusPages(args.http, "actor", options.actor_id, [playing] {
                             actors::Actor* actor = playing->load();
                             return actor ? actor->metrics().ToJson() : std::string("{}");
                           }));
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<actors::Actor> actor, actors::Actor::Create(options));
  playing->store(actor.get());
  // Handlers before the ready line, which a supervisor may answer with SIGTERM at once.
  std::signal(SIGINT, OnActorSignal);
  std::signal(SIGTERM, OnActorSignal);
  std::printf("{\"event\":\"ready\",\"actor\":\"%s\",\"env\":\"%s\",\"replay\":\"%s\"%s}\n",
              options.actor_id.c_str(), options.env.name.c_str(), options.replay_endpoint.c_str(),
              pages ? (",\"http\":\"" + pages->address() + "\"").c_str() : "");
  std::fflush(stdout);
  std::stop_source stop;
  std::jthread watcher([&stop](std::stop_token done) {
    while (!done.stop_requested()) {
      if (g_actor_stop) {
        stop.request_stop();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  Status status = actor->Run(stop.get_token());
  watcher.request_stop();
  pages.reset();  // before the actor it reads goes
  std::printf("{\"event\":\"finished\",\"ok\":%s,\"metrics\":%s}\n", status.ok() ? "true" : "false",
              actor->metrics().ToJson().c_str());
  std::fflush(stdout);
  return status;
}

}  // namespace

Result<uint64_t> CheckActorConfig(const std::string& path, bool read_keys) {
  STRIDER_ASSIGN_OR_RETURN(actors::ActorOptions options, actors::LoadActorConfig(path));
  // What the launcher gives on the command line; the endpoints are only checked for presence.
  options.replay_endpoint = "tcp://127.0.0.1:1";
  options.weights_endpoint = "tcp://127.0.0.1:1";
  options.spill_dir = "spill";
  options.episodes = 0;
  if (!read_keys) {
    options.replay_auth = {};
    options.weights_auth = {};
  }
  Status valid = actors::ValidateActorOptions(options);
  if (!valid.ok()) return valid.WithContext(path);
  return options.seed;
}

void AddActorCommands(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ActorArgs>();
  CLI::App* actor = app.add_subcommand(
      "actor", "One actor service: play episodes, stream segments to the replay server");
  actor->add_option("--config", args->config, "Actor config (YAML: actor: and env:)")->required();
  actor->add_option("--replay", args->replay, "Replay server actor endpoint (overrides the file)");
  actor->add_option("--spill-dir", args->spill_dir, "Spill directory (overrides the file)");
  actor->add_option("--metrics", args->metrics, "Metrics JSON-lines file (overrides the file)");
  actor->add_option("--weights", args->weights, "Initial weights, safetensors (overrides)");
  actor->add_option("--weights-endpoint", args->weights_endpoint,
                    "Weight publisher endpoint (overrides the file)");
  actor->add_option("--id", args->id, "Actor id (overrides the file)");
  actor->add_option("--device", args->device,
                    "cpu, cuda or cuda:N for the model and its cache (overrides actor.device)");
  actor->add_option("--cache-budget-mb", args->cache_budget_mb,
                    "Caps the engine's page pool (engine.cache_budget_mb) on a shared GPU")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  actor->add_option("--episodes", args->episodes, "Episodes to run, 0: until stopped (overrides)");
  actor->add_option("--seed", args->seed, "Episode seed (overrides)");
  actor->add_flag("--no-progress", args->no_progress, "No progress line on a terminal");
  actor->add_option("--http", args->http,
                    "Serve /metrics (Prometheus) and /status (JSON) on HOST:PORT (0: any port)");
  actor->callback([args, &exit_code] {
    Status status = RunActor(*args);
    if (!status.ok()) exit_code = ReportError(status);
  });
}

}  // namespace strider::cli
