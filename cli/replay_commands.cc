// `strider replay serve` and `strider replay inspect DIR {stats,list,show,export,verify}`.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <thread>

#include "cli/commands.h"
#include "cli/service_http.h"
#include "replay/inspect.h"
#include "replay/replay.h"

namespace strider::cli {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

struct ServeArgs {
  std::string db;
  std::string bind;
  std::string sample_bind;
  std::string config;
  std::string http;
  bool accept_loss = false;
  bool verify = false;
  bool no_verify = false;
};

Status Serve(const ServeArgs& args) {
  // stdout carries the JSON events; the log goes to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("replay"));
  replay::ConfigureServerProcessMemory();
  replay::ServerOptions options;
  if (!args.config.empty()) {
    STRIDER_ASSIGN_OR_RETURN(options, replay::LoadServerConfig(args.config));
  }
  // Flags win over the file.
  if (!args.db.empty()) options.db_path = args.db;
  if (!args.bind.empty()) options.actor_endpoint = args.bind;
  if (!args.sample_bind.empty()) options.learner_endpoint = args.sample_bind;
  if (options.db_path.empty()) return Status::InvalidArgument("--db is required");
  options.accept_loss = options.accept_loss || args.accept_loss;
  if (args.verify && args.no_verify) {
    return Status::InvalidArgument("--verify and --no-verify: choose one");
  }
  if (args.verify) options.verify_on_start = replay::StartVerify::kAll;
  if (args.no_verify) options.verify_on_start = replay::StartVerify::kNone;
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<replay::ReplayServer> server,
                           replay::ReplayServer::Start(options));
  replay::ReplayServer* served = server.get();
  STRIDER_ASSIGN_OR_RETURN(
      std::unique_ptr<http::StatusServer> pages,
      ServeStatusPages(args.http, "replay", server->actor_endpoint(),
                       [served] { return served->StatsSnapshotJson(); }));
  // One JSON line with the resolved endpoints, so scripts can bind port 0 and connect.
  nlohmann::json ready = {{"event", "ready"},
                          {"actor_endpoint", server->actor_endpoint()},
                          {"learner_endpoint", server->learner_endpoint()},
                          {"db", options.db_path}};
  if (pages) ready["http"] = pages->address();
  // The handlers come before the ready line: a supervisor may stop the server as soon as it
  // reads it, and a SIGTERM before them would kill the process without its stopped line.
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::printf("%s\n", ready.dump().c_str());
  std::fflush(stdout);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string stats = server->StatsJson();
  pages.reset();
  server->Stop();
  std::printf("{\"event\":\"stopped\",\"stats\":%s}\n", stats.c_str());
  return Status::Ok();
}

struct InspectArgs {
  std::string dir;
  bool json = false;
  // list
  std::string env;
  std::optional<int64_t> policy_version;
  std::optional<double> min_reward;
  std::optional<double> max_reward;
  std::string trajectory;
  // show
  std::string id;
  // export
  std::string format = "jsonl";
  std::string out;
};

void PrintStatsTable(const nlohmann::json& stats) {
  std::printf("store          %s (schema %s)\n", stats["path"].get<std::string>().c_str(),
              stats["schema_version"].get<std::string>().c_str());
  std::printf("segments       %llu\n", stats["segments"].get<unsigned long long>());
  std::printf("trajectories   %llu (%llu complete)\n",
              stats["trajectories"].get<unsigned long long>(),
              stats["complete_trajectories"].get<unsigned long long>());
  std::printf("\n%-16s %-12s %10s %14s %12s %10s %10s\n", "table", "sampler", "segments",
              "bytes", "tokens", "inserts", "samples");
  for (const auto& table : stats["tables"]) {
    std::string sampler = "?";
    if (table.contains("definition") && table["definition"].is_object()) {
      sampler = table["definition"].value("sampler", "?");
    }
    std::printf("%-16s %-12s %10llu %14llu %12llu %10llu %10llu\n",
                table["name"].get<std::string>().c_str(), sampler.c_str(),
                table["segments"].get<unsigned long long>(),
                table["bytes"].get<unsigned long long>(),
                table["tokens"].get<unsigned long long>(),
                table["inserts"].get<unsigned long long>(),
                table["samples"].get<unsigned long long>());
  }
  if (!stats["trajectories_by_env"].empty()) {
    std::printf("\n%-24s %12s\n", "env", "trajectories");
    for (const auto& [env, count] : stats["trajectories_by_env"].items()) {
      std::printf("%-24s %12llu\n", env.c_str(), count.get<unsigned long long>());
    }
  }
}

Status InspectStats(replay::Inspector& inspector, const InspectArgs& args) {
  STRIDER_ASSIGN_OR_RETURN(std::string json, inspector.StatsJson());
  if (args.json) {
    std::printf("%s\n", json.c_str());
  } else {
    PrintStatsTable(nlohmann::json::parse(json));
  }
  return Status::Ok();
}

Status InspectList(replay::Inspector& inspector, const InspectArgs& args) {
  replay::ListFilter filter;
  filter.env = args.env;
  if (args.policy_version) filter.policy_version = static_cast<uint64_t>(*args.policy_version);
  filter.min_reward = args.min_reward;
  filter.max_reward = args.max_reward;
  filter.trajectory_id = args.trajectory;
  STRIDER_ASSIGN_OR_RETURN(std::vector<schema::TrajectorySummary> list, inspector.List(filter));
  if (args.json) {
    for (const auto& summary : list) {
      std::printf("%s\n", replay::TrajectorySummaryJson(summary).c_str());
    }
    return Status::Ok();
  }
  std::printf("%-32s  %-14s %-8s %-9s %8s %9s %8s %9s\n", "trajectory", "env", "table", "status",
              "segments", "tokens", "reward", "policy");
  for (const auto& s : list) {
    std::printf("%-32s  %-14s %-8s %-9s %8u %9llu %8.3f %4llu-%llu\n", s.trajectory_id.Hex().c_str(),
                s.env.c_str(), s.table.c_str(), s.complete ? "complete" : "open",
                s.segments_stored, static_cast<unsigned long long>(s.tokens),
                static_cast<double>(s.outcome_reward),
                static_cast<unsigned long long>(s.min_policy_version),
                static_cast<unsigned long long>(s.max_policy_version));
  }
  std::printf("%zu trajectories\n", list.size());
  return Status::Ok();
}

Status InspectShow(replay::Inspector& inspector, const InspectArgs& args) {
  // ID is a trajectory (32 hex digits) or a segment (hex/index).
  std::vector<replay::StoredSegment> segments;
  const size_t slash = args.id.find('/');
  STRIDER_ASSIGN_OR_RETURN(schema::TrajectoryId trajectory,
                           schema::TrajectoryId::FromHex(args.id.substr(0, slash)));
  if (slash != std::string::npos) {
    uint32_t index = 0;
    try {
      index = static_cast<uint32_t>(std::stoul(args.id.substr(slash + 1)));
    } catch (...) {
      return Status::InvalidArgument("'" + args.id + "': the segment index must be a number");
    }
    STRIDER_ASSIGN_OR_RETURN(replay::StoredSegment one, inspector.Segment({trajectory, index}));
    segments.push_back(std::move(one));
  } else {
    STRIDER_ASSIGN_OR_RETURN(segments, inspector.Trajectory(trajectory));
  }
  for (const replay::StoredSegment& stored : segments) {
    if (args.json) {
      std::printf("%s\n", replay::StoredSegmentJson(stored).c_str());
      continue;
    }
    const schema::SegmentData& s = stored.segment;
    std::printf("== segment %s  sequence %llu  table %s  env %s  tokens %zu (from %llu)%s\n",
                s.key().ToString().c_str(), static_cast<unsigned long long>(stored.sequence),
                s.table.empty() ? "-" : s.table.c_str(), s.env.c_str(), s.tokens.size(),
                static_cast<unsigned long long>(s.token_begin), s.is_last ? "  last" : "");
    std::printf("   policy versions %llu..%llu, %zu steps, %zu images",
                static_cast<unsigned long long>(s.MinPolicyVersion()),
                static_cast<unsigned long long>(s.MaxPolicyVersion()), s.steps.size(),
                s.images.size());
    if (s.is_last) std::printf(", outcome reward %.4f", static_cast<double>(s.outcome_reward));
    std::printf("\n%s%s\n", replay::RenderSegmentFields(s).c_str(),
                replay::RenderSegmentText(s).c_str());
  }
  return Status::Ok();
}

Status InspectExport(replay::Inspector& inspector, const InspectArgs& args) {
  if (args.format != "jsonl") {
    return Status::InvalidArgument("--format " + args.format + ": only jsonl is supported");
  }
  if (args.out.empty() || args.out == "-") {
    STRIDER_ASSIGN_OR_RETURN(uint64_t count, inspector.ExportJsonl(std::cout));
    std::cout.flush();
    std::fprintf(stderr, "exported %llu segments\n", static_cast<unsigned long long>(count));
    return Status::Ok();
  }
  std::ofstream file(args.out, std::ios::binary);
  if (!file) return Status::IoError(args.out + ": cannot open for writing");
  STRIDER_ASSIGN_OR_RETURN(uint64_t count, inspector.ExportJsonl(file));
  std::fprintf(stderr, "exported %llu segments to %s\n", static_cast<unsigned long long>(count),
               args.out.c_str());
  return Status::Ok();
}

Status InspectVerify(replay::Inspector& inspector, const InspectArgs& args) {
  STRIDER_ASSIGN_OR_RETURN(replay::VerifyReport report, inspector.Verify());
  nlohmann::json j = {{"ok", report.ok()},
                      {"segments", report.segments},
                      {"index_entries", report.index_entries},
                      {"trajectories", report.trajectories},
                      {"problems", report.problems}};
  if (args.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s: %llu segments, %llu index entries, %llu trajectories\n",
                report.ok() ? "OK" : "PROBLEMS", static_cast<unsigned long long>(report.segments),
                static_cast<unsigned long long>(report.index_entries),
                static_cast<unsigned long long>(report.trajectories));
    for (const std::string& problem : report.problems) std::printf("  %s\n", problem.c_str());
  }
  if (!report.ok()) {
    return Status::Corruption(std::to_string(report.problems.size()) +
                              " consistency problem(s) in " + args.dir);
  }
  return Status::Ok();
}

}  // namespace

void AddReplayCommands(CLI::App& app, int& exit_code) {
  CLI::App* replay = app.add_subcommand("replay", "The replay service: serve and inspect stores");
  replay->require_subcommand(1);

  auto serve_args = std::make_shared<ServeArgs>();
  CLI::App* serve = replay->add_subcommand("serve", "Run the replay server until SIGINT/SIGTERM");
  serve->add_option("--db", serve_args->db, "Store directory (created when absent)");
  serve->add_option("--bind", serve_args->bind,
                    "Actor endpoint, tcp://host:port (0: any port) or ipc://path");
  serve->add_option("--sample-bind", serve_args->sample_bind,
                    "Learner endpoint (default: the actor port + 1, or <ipc path>.sample)");
  serve->add_flag("--accept-loss", serve_args->accept_loss,
                  "Serve a store whose log lost acknowledged segments (the loss is recorded)");
  serve->add_flag("--verify", serve_args->verify,
                  "Check every table file's checksums before serving (reads the whole store). "
                  "By default only the files no earlier start checked are read, and a damaged "
                  "one stops the start (config: server.verify_on_start: new|all|none)");
  serve->add_flag("--no-verify", serve_args->no_verify,
                  "Serve without checking any table file's checksums, even a store that failed "
                  "its check (a damaged block is then found when it is read)");
  serve->add_option("--config", serve_args->config, "Server and table config (YAML)")
      ->check(CLI::ExistingFile);
  serve->add_option("--http", serve_args->http,
                    "Serve /metrics (Prometheus) and /status (JSON) on HOST:PORT (0: any port)");
  serve->callback([serve_args, &exit_code] {
    Status status = Serve(*serve_args);
    if (!status.ok()) exit_code = ReportError(status);
  });

  auto args = std::make_shared<InspectArgs>();
  CLI::App* inspect = replay->add_subcommand(
      "inspect", "Look into a store (read-only; safe while a server runs)");
  inspect->add_option("dir", args->dir, "Store directory")->required();
  inspect->require_subcommand(1);
  using Command = Status (*)(replay::Inspector&, const InspectArgs&);
  auto run = [args, &exit_code](Command command) {
    return [args, &exit_code, command] {
      Result<std::unique_ptr<replay::Inspector>> inspector = replay::Inspector::Open(args->dir);
      Status status = inspector.ok() ? command(**inspector, *args) : inspector.status();
      if (!status.ok()) exit_code = ReportError(status);
    };
  };
  CLI::App* stats = inspect->add_subcommand("stats", "Counts, bytes and tables");
  stats->add_flag("--json", args->json, "JSON instead of a table");
  stats->callback(run(InspectStats));

  CLI::App* list = inspect->add_subcommand("list", "Trajectories, filtered");
  list->add_option("--env", args->env, "Only this environment");
  list->add_option("--policy-version", args->policy_version,
                   "Only trajectories with tokens from this policy version");
  list->add_option("--min-reward", args->min_reward, "Complete trajectories with reward >= this");
  list->add_option("--max-reward", args->max_reward, "Complete trajectories with reward <= this");
  list->add_option("--id", args->trajectory, "Trajectory id (hex prefix)");
  list->add_flag("--json", args->json, "JSON lines instead of a table");
  list->callback(run(InspectList));

  CLI::App* show = inspect->add_subcommand("show", "A trajectory (HEX) or segment (HEX/INDEX)");
  show->add_option("id", args->id, "Trajectory id, or trajectory id/segment index")->required();
  show->add_flag("--json", args->json, "Every field as JSON");
  show->callback(run(InspectShow));

  CLI::App* export_command = inspect->add_subcommand("export", "Every segment as JSON lines");
  export_command->add_option("--format", args->format, "Output format (jsonl)");
  export_command->add_option("--out", args->out, "Output file (default: stdout)");
  export_command->callback(run(InspectExport));

  CLI::App* verify = inspect->add_subcommand(
      "verify", "Checksums; every index entry points to a segment and back; summaries agree");
  verify->add_flag("--json", args->json, "JSON report");
  verify->callback(run(InspectVerify));
}

}  // namespace strider::cli
