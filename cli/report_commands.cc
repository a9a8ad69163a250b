// `strider report RUN_DIR [RUN_DIR...] [--out FILE]` (docs/design.md#command-line): the HTML report
// with plots of a pretraining run, or of one or several RL runs overlaid.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "report/report.h"

namespace strider::cli {
namespace {

struct ReportFlags {
  std::vector<std::string> run_dirs;
  std::string out;
};

Result<std::string> WriteReport(const ReportFlags& flags) {
  size_t rl = 0;
  for (const std::string& dir : flags.run_dirs) rl += DetectRunKind(dir) == RunKind::kRl;
  if (rl == 0) {
    // A pretraining run's report always lives in its own directory, where the run rewrites it
    // after every stage.
    if (flags.run_dirs.size() > 1 || !flags.out.empty()) {
      return Status::InvalidArgument(
          "a pretraining run's report is written into its run directory: give one RUN_DIR and "
          "no --out (several run directories and --out are for RL runs)");
    }
    return WriteRunReport(flags.run_dirs[0]);
  }
  if (rl != flags.run_dirs.size()) {
    for (const std::string& dir : flags.run_dirs) {
      if (DetectRunKind(dir) != RunKind::kRl) {
        return Status::InvalidArgument(
            dir +
            " is not an RL run (no fleet.yaml or learner/metrics.jsonl); an RL report "
            "overlays RL runs only");
      }
    }
  }
  std::string out = flags.out;
  if (out.empty()) {
    if (flags.run_dirs.size() > 1) {
      return Status::InvalidArgument("several run directories need --out FILE for the report");
    }
    out = flags.run_dirs[0] + "/report.html";
  }
  return WriteRlReport(flags.run_dirs, out);
}

}  // namespace

void AddReportCommands(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<ReportFlags>();
  CLI::App* report = app.add_subcommand(
      "report",
      "Write a self-contained report.html: a pretraining run's loss, retrieval accuracy and "
      "routing balance, or one or several RL runs overlaid (evaluation, training, learner "
      "metrics, throughput)");
  report
      ->add_option("RUN_DIR", flags->run_dirs,
                   "Run directories: one pretraining run, or RL runs (fleet.yaml or "
                   "learner/metrics.jsonl) to overlay")
      ->required()
      ->check(CLI::ExistingDirectory);
  report->add_option("--out", flags->out,
                     "Report file for RL runs (default: RUN_DIR/report.html of a single run; "
                     "required with several)");
  report->callback([flags, &exit_code] {
    Result<std::string> path = WriteReport(*flags);
    if (!path.ok()) {
      exit_code = ReportError(path.status());
      return;
    }
    std::cout << nlohmann::json({{"report", *path}}).dump() << std::endl;
    exit_code = kExitOk;
  });
}

}  // namespace strider::cli
