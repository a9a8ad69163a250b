// Each component's subcommands are registered on the one `strider` CLI::App by a function here.
// Callbacks store the process exit code in `exit_code`: 0 success, 1 runtime failure, 2 bad
// usage or config (docs/design.md#command-line).
#pragma once

#include <CLI/CLI.hpp>

#include "common/status.h"

namespace strider::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntimeError = 1;
inline constexpr int kExitUsageError = 2;

// Prints "strider: <status>" to stderr and returns the exit code for its kind of error.
int ReportError(const Status& status);

void AddModelCommands(CLI::App& app, int& exit_code);
void AddReplayCommands(CLI::App& app, int& exit_code);
void AddPretrainCommands(CLI::App& app, int& exit_code);
void AddActorCommands(CLI::App& app, int& exit_code);
void AddEvalCommands(CLI::App& app, int& exit_code);
void AddEnvCommands(CLI::App& app, int& exit_code);
void AddReportCommands(CLI::App& app, int& exit_code);
void AddRewardCommands(CLI::App& app, int& exit_code);
void AddLaunchCommands(CLI::App& app, int& exit_code);
void AddKeysCommands(CLI::App& app, int& exit_code);
void AddTokenizerCommands(CLI::App& app, int& exit_code);

// Checks `strider launch` runs on the children's configs before it starts anything. They live
// beside the commands that load those configs, whose loaders pull in LibTorch headers.
// The actor config as `strider actor` would run it under the launcher; returns its episode seed.
// `read_keys` false leaves its `auth:` key files unread: they are on the actor hosts.
Result<uint64_t> CheckActorConfig(const std::string& path, bool read_keys = true);
// A mode: rl learner config, as `strider learner` reads it.
Status CheckRlLearnerConfig(const std::string& path);
// The weights a fresh learner of this config starts from (version 0, which it does not
// publish), saved as safetensors at `out`, so they can be evaluated before its first step.
Status WriteInitialRlWeights(const std::string& config_path, const std::string& out);

// `strider learner` with mode: rl (rl_commands.cc), called by the learner subcommand once the
// config's mode is known.
struct RlLearnerFlags {
  std::string config;
  std::string run_dir;  // empty: runs/rl
  std::string resume;
  int64_t max_steps = -1;
  std::string replay;
  std::string publish;
  std::string init;  // overrides the config's init (starting weights, also the reference policy)
  std::string http;  // HOST:PORT for /metrics and /status; empty: none
  // --dump-step (each N or N,M,...) and --dump-dir: the step dump (learner/rl/step_dump.h).
  std::vector<std::string> dump_steps;
  std::string dump_dir;
  // Data-parallel ranks (override the config's distributed block; -1 / empty: the config's).
  int64_t rank = -1;
  int64_t world_size = -1;
  std::string rendezvous;
  std::string device;  // cpu, cuda or cuda:N (overrides the config's device:); empty: the config's
};
int RunRlLearnerCommand(const RlLearnerFlags& flags);

}  // namespace strider::cli
