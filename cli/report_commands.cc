// `strider report RUN_DIR` (DESIGN.md section 8): the HTML report with plots of a run.
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "learner/report.h"

namespace strider::cli {

void AddReportCommands(CLI::App& app, int& exit_code) {
  auto run_dir = std::make_shared<std::string>();
  CLI::App* report = app.add_subcommand(
      "report",
      "Write RUN_DIR/report.html (self-contained): loss, retrieval accuracy, routing balance");
  report->add_option("RUN_DIR", *run_dir, "Run directory holding metrics.jsonl (and eval.jsonl)")
      ->required()
      ->check(CLI::ExistingDirectory);
  report->callback([run_dir, &exit_code] {
    Result<std::string> path = WriteRunReport(*run_dir);
    if (!path.ok()) {
      exit_code = ReportError(path.status());
      return;
    }
    std::cout << nlohmann::json({{"report", *path}}).dump() << std::endl;
    exit_code = kExitOk;
  });
}

}  // namespace strider::cli
