// `strider learner --config F` for mode: rl: the RL learner service until its steps are done or
// SIGINT/SIGTERM (then it checkpoints and exits 0). Prints a ready event with the weight
// endpoint on stdout (what actors' weights.endpoint names) and a finished event with the summary.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/device_flag.h"
#include "cli/service_http.h"
#include "common/model/model.h"
#include "common/model/torch_status.h"
#include "learner/rl/rl_config.h"
#include "learner/rl/rl_learner.h"
#include "learner/rl/step_dump.h"

namespace strider::cli {
namespace {

std::atomic<bool> g_learner_stop{false};

void OnLearnerSignal(int) { g_learner_stop.store(true); }

// Before anything loads: steps the run has, and a directory the dump can be written to.
Status CheckDumpFlags(const std::vector<int64_t>& steps, const std::string& dir,
                      int64_t run_steps) {
  if (steps.empty() != dir.empty()) {
    return Status::InvalidArgument(steps.empty() ? "--dump-dir needs --dump-step N"
                                                 : "--dump-step needs --dump-dir D");
  }
  if (steps.empty()) return Status::Ok();
  if (steps.back() > run_steps) {
    return Status::InvalidArgument("--dump-step " + std::to_string(steps.back()) +
                                   ": the run has " + std::to_string(run_steps) +
                                   " steps (train.steps)");
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0) {
    return Status::InvalidArgument("--dump-dir " + dir + ": not a writable directory" +
                                   (error ? " (" + error.message() + ")" : std::string()));
  }
  return Status::Ok();
}

}  // namespace

int RunRlLearnerCommand(const RlLearnerFlags& flags) {
  Result<rl::RlLearnerConfig> config = rl::LoadRlLearnerConfig(flags.config);
  if (!config.ok()) return ReportError(config.status());
  if (!flags.init.empty()) config->init = flags.init;
  // Before the pages and the rendezvous: a device this host lacks is a usage error.
  if (Status s = ApplyDeviceFlag(flags.device, flags.config, &config->model.device); !s.ok()) {
    return ReportError(s);
  }
  rl::RlDistributedConfig& dist = config->distributed;
  if (flags.world_size >= 0) dist.world_size = flags.world_size;
  if (flags.rank >= 0) dist.rank = flags.rank;
  if (!flags.rendezvous.empty()) dist.rendezvous = flags.rendezvous;
  if (dist.world_size < 1 || dist.rank < 0 || dist.rank >= dist.world_size) {
    return ReportError(Status::InvalidArgument(
        "--rank " + std::to_string(dist.rank) + " must be in [0, --world-size " +
        std::to_string(dist.world_size) + ")"));
  }
  if (Result<rl::Rendezvous> rendezvous = rl::ParseRendezvous(dist.rendezvous); !rendezvous.ok()) {
    return ReportError(rendezvous.status().WithContext("--rendezvous"));
  }
  Result<std::vector<int64_t>> dump_steps = rl::ParseDumpSteps(flags.dump_steps);
  if (!dump_steps.ok()) return ReportError(dump_steps.status());
  if (Status dump = CheckDumpFlags(*dump_steps, flags.dump_dir, config->train.steps); !dump.ok()) {
    return ReportError(dump);
  }
  rl::RlRunOptions options;
  options.dump_steps = *dump_steps;
  options.dump_dir = flags.dump_dir;
  options.run_dir = flags.run_dir.empty() ? "runs/rl" : flags.run_dir;
  options.resume = flags.resume;
  options.max_steps = flags.max_steps;
  options.replay_endpoint = flags.replay;
  options.publish_endpoint = flags.publish;
  options.stop = &g_learner_stop;
  // The last step's metrics line, for /metrics and /status; read on the HTTP thread.
  auto last_step = std::make_shared<std::pair<std::mutex, std::string>>();
  last_step->second = "{}";
  options.on_step = [last_step](const std::string& line) {
    std::lock_guard<std::mutex> lock(last_step->first);
    last_step->second = line;
  };
  // Served from the start (an empty object until the first step), so a bad address fails
  // before anything is loaded.
  Result<std::unique_ptr<http::StatusServer>> started =
      ServeStatusPages(flags.http, "learner", options.run_dir, [last_step] {
        std::lock_guard<std::mutex> lock(last_step->first);
        return last_step->second;
      });
  if (!started.ok()) return ReportError(started.status());
  std::unique_ptr<http::StatusServer> pages = std::move(*started);
  options.on_ready = [&](const std::string& endpoint) {
    nlohmann::ordered_json ready = {{"event", "ready"},
                                    {"mode", "rl"},
                                    {"weights", endpoint},
                                    {"run_dir", options.run_dir}};
    if (dist.world_size > 1) {
      ready["rank"] = dist.rank;
      ready["world_size"] = dist.world_size;
    }
    if (pages) ready["http"] = pages->address();
    std::cout << ready.dump() << std::endl;
  };
  std::signal(SIGINT, OnLearnerSignal);
  std::signal(SIGTERM, OnLearnerSignal);
  // The passes' activations grow with the chunk; the weights and optimiser state are fixed.
  model::OutOfMemoryAdvice advice("train.chunk_tokens of " + flags.config);
  Result<rl::RlRunSummary> summary = rl::RunRlLearner(*config, options);
  pages.reset();
  if (!summary.ok()) return ReportError(summary.status());
  nlohmann::ordered_json finished = {{"event", "finished"},
                                     {"steps", summary->steps},
                                     {"total_steps", summary->total_steps},
                                     {"policy_version", summary->policy_version},
                                     {"first_reward_mean", summary->first_reward_mean},
                                     {"last_reward_mean", summary->last_reward_mean},
                                     {"excluded_trajectories", summary->excluded_trajectories},
                                     {"seconds", summary->seconds}};
  std::cout << finished.dump() << std::endl;
  return kExitOk;
}

Status CheckRlLearnerConfig(const std::string& path) {
  return rl::LoadRlLearnerConfig(path).status();
}

Status WriteInitialRlWeights(const std::string& config_path, const std::string& out) {
  STRIDER_ASSIGN_OR_RETURN(rl::RlLearnerConfig config, rl::LoadRlLearnerConfig(config_path));
  // What the learner starts from: its init file, else a fresh model from init_seed.
  Result<std::unique_ptr<Model>> model =
      config.init.empty() ? Model::Create(config.model, static_cast<uint64_t>(config.init_seed))
                          : Model::Load(config.model, config.init);
  if (!model.ok()) return model.status();
  return (*model)->Save(out);
}

}  // namespace strider::cli
