// The `strider` binary: parses arguments and hands them to the components.
#include <cstdio>
#include <vector>

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

namespace {

// The deepest subcommand the arguments named: `env` for `strider env`, the app itself for
// `strider`.
const CLI::App& DeepestParsed(const CLI::App& app) {
  const std::vector<CLI::App*> parsed = app.get_subcommands();
  return parsed.empty() ? app : DeepestParsed(*parsed.front());
}

}  // namespace

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
  strider::cli::AddEvalCommands(app, exit_code);
  strider::cli::AddEnvCommands(app, exit_code);
  strider::cli::AddReportCommands(app, exit_code);
  strider::cli::AddRewardCommands(app, exit_code);
  strider::cli::AddLaunchCommands(app, exit_code);
  strider::cli::AddKeysCommands(app, exit_code);
  strider::cli::AddTokenizerCommands(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& error) {
    // A command that only groups others (`strider`, `strider env`) was given none: its command
    // list tells a newcomer more than "a subcommand is required". Still a usage error (exit 2),
    // so a script that forgot the subcommand fails.
    const CLI::App& named = strider::cli::DeepestParsed(app);
    if (named.get_require_subcommand_min() > 0 && named.get_subcommands().empty()) {
      std::fputs(app.help().c_str(), stdout);  // delegates to `named`, as --help does
      return strider::cli::kExitUsageError;
    }
    app.exit(error);
    return strider::cli::kExitUsageError;
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : strider::cli::kExitUsageError;
  } catch (const std::exception& error) {
    // Caught so the stack unwinds: the destructors stop child processes and close stores, which
    // std::terminate would skip.
    std::fprintf(stderr, "error: internal: %s\n", error.what());
    return strider::cli::kExitRuntimeError;
  }
  return exit_code;
}
