// Strict reading of fleet files (launcher.h, docs/launcher.md).
#include <filesystem>

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

}  // namespace

Result<FleetConfig> LoadFleetConfig(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromFile(path));
  FleetConfig fleet;
  fleet.origin = path;
  root.Optional("run_dir", &fleet.run_dir);
  root.Check(!fleet.run_dir.empty(), "run_dir", "must not be empty");
  root.Optional("weights", &fleet.weights);
  root.Optional("ready_timeout_s", &fleet.ready_timeout_s);
  root.Optional("http", &fleet.http);
  root.Check(fleet.ready_timeout_s > 0, "ready_timeout_s", "must be positive");
  if (!fleet.weights.empty()) ResolveExisting(root, "weights", path, &fleet.weights);

  ConfigReader replay = root.Section("replay");
  replay.Required("config", &fleet.replay_config);
  ResolveExisting(replay, "config", path, &fleet.replay_config);

  ConfigReader learner = root.Section("learner");
  learner.Required("config", &fleet.learner_config);
  ResolveExisting(learner, "config", path, &fleet.learner_config);

  ConfigReader actors = root.Section("actors");
  actors.Required("config", &fleet.actor_config);
  ResolveExisting(actors, "config", path, &fleet.actor_config);
  actors.Optional("count", &fleet.actor_count);
  actors.Check(fleet.actor_count >= 1 && fleet.actor_count <= 256, "count",
               "must be between 1 and 256");

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
                                       bool resume) {
  if (!resume) {
    if (fleet_path.empty()) return Status::InvalidArgument("a fleet file is required");
    STRIDER_ASSIGN_OR_RETURN(FleetConfig fleet, LoadFleetConfig(fleet_path));
    if (!run_dir.empty()) fleet.run_dir = run_dir;
    return fleet;
  }
  std::string dir = run_dir;
  if (dir.empty()) {
    if (fleet_path.empty()) {
      return Status::InvalidArgument("--resume needs --run-dir or the fleet file of the run");
    }
    STRIDER_ASSIGN_OR_RETURN(FleetConfig named, LoadFleetConfig(fleet_path));
    dir = named.run_dir;
  }
  const std::string recorded = (fs::path(dir) / "fleet.yaml").string();
  std::error_code error;
  if (!fs::is_regular_file(recorded, error)) {
    return Status::NotFound(recorded +
                            ": no fleet file recorded there; --resume continues a run "
                            "directory an earlier launch wrote");
  }
  STRIDER_ASSIGN_OR_RETURN(FleetConfig fleet, LoadFleetConfig(recorded));
  fleet.run_dir = dir;
  return fleet;
}

}  // namespace strider::launcher
