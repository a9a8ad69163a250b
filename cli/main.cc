// The `strider` binary: parses arguments and hands them to the components.
#include <cstdio>

#include "cli/commands.h"

namespace strider::cli {

int ReportError(const Status& status) {
  std::fprintf(stderr, "strider: %s\n", status.ToString().c_str());
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
      return kExitUsageError;
    default:
      return kExitRuntimeError;
  }
}

}  // namespace strider::cli

int main(int argc, char** argv) {
  CLI::App app{"Strider: agentic RL post-training and staged pretraining of sparse long-context models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strider 0.1.0");
  int exit_code = strider::cli::kExitOk;
  strider::cli::AddModelCommands(app, exit_code);
  strider::cli::AddReplayCommands(app, exit_code);
  strider::cli::AddPretrainCommands(app, exit_code);
  strider::cli::AddActorCommands(app, exit_code);
  strider::cli::AddEnvCommands(app, exit_code);
  strider::cli::AddReportCommands(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : strider::cli::kExitUsageError;
  }
  return exit_code;
}
