// `strider env list` and `strider env run` through the built binary.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/envs/processes.h"

namespace {

std::string Dir(const char* variable) {
  const char* dir = std::getenv(variable);
  return dir ? dir : ".";
}

struct CliRun {
  int exit_code = -1;
  std::string out;  // stdout and stderr
};

CliRun Strider(const std::string& arguments) {
  const std::string command = "cd " + Dir("STRIDER_SOURCE_DIR") + " && " +
                              Dir("STRIDER_BINARY_DIR") + "/cli/strider " + arguments + " 2>&1";
  CliRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.out.append(buffer, n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// The last line of the output, parsed as the JSON summary.
nlohmann::json Summary(const CliRun& run) {
  std::istringstream lines(run.out);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty()) last = line;
  }
  return nlohmann::json::parse(last, nullptr, false);
}

TEST(EnvCli, ListShowsEveryBuiltInWithItsTools) {
  CliRun run = Strider("env list");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  for (const char* expected :
       {"calculator", "retrieval", "vision_count", "- calc(expression: string)",
        "- search(query: string)", "- zoom(row: integer, col: integer)"}) {
    EXPECT_NE(run.out.find(expected), std::string::npos) << expected << "\n" << run.out;
  }
}

TEST(EnvCli, ScriptedPolicySolvesEachBuiltIn) {
  for (const char* name : {"retrieval", "vision_count"}) {
    CliRun run = Strider(std::string("env run ") + name + " --episodes 4 --seed 10 --json");
    ASSERT_EQ(run.exit_code, 0) << run.out;
    const nlohmann::json summary = Summary(run);
    EXPECT_EQ(summary["summary"], name);
    EXPECT_EQ(summary["episodes"], 4);
    EXPECT_EQ(summary["errors"], 0);
    EXPECT_EQ(summary["mean_outcome"], 1.0) << run.out;
  }
  // The dataset's policy answers each prompt with its reference, read from the same file.
  CliRun dataset =
      Strider("env run --config configs/envs/dataset_sample.yaml --episodes 50 --json");
  ASSERT_EQ(dataset.exit_code, 0) << dataset.out;
  EXPECT_EQ(Summary(dataset)["summary"], "dataset");
  EXPECT_EQ(Summary(dataset)["errors"], 0);
  EXPECT_EQ(Summary(dataset)["mean_outcome"], 1.0) << dataset.out;
  CliRun human = Strider("env run calculator --episodes 2 --options difficulty=4");
  ASSERT_EQ(human.exit_code, 0) << human.out;
  EXPECT_NE(human.out.find("episode 1 seed 1: done outcome 1.000000, 6 turns (steps: 6 correct"),
            std::string::npos)
      << human.out;
  EXPECT_NE(human.out.find("calculator, scripted policy: 2 episodes, 0 errors, mean outcome 1.000"),
            std::string::npos)
      << human.out;
}

TEST(EnvCli, RandomPolicyExercisesErrorPathsWithoutEpisodeErrors) {
  for (const char* name : {"calculator", "vision_count"}) {
    CliRun run = Strider(std::string("env run ") + name + " --episodes 10 --policy random --json");
    ASSERT_EQ(run.exit_code, 0) << run.out;
    EXPECT_EQ(Summary(run)["errors"], 0);
    EXPECT_NE(run.out.find("\"incorrect\":"), std::string::npos);
  }
}

TEST(EnvCli, PluginsByLibraryAndCommand) {
  CliRun library = Strider("env run --library " + Dir("STRIDER_BINARY_DIR") +
                           "/tests/envs/libstrider_template_env.so --episodes 3 --json");
  ASSERT_EQ(library.exit_code, 0) << library.out;
  EXPECT_EQ(Summary(library)["mean_outcome"], 1.0);
  if (::access("/usr/bin/python3", X_OK) != 0 ||
      std::system("/usr/bin/python3 -c 'import zmq' 2>/dev/null") != 0) {
    GTEST_SKIP() << "needs /usr/bin/python3 with python3-zmq";
  }
  CliRun external =
      Strider("env run --config configs/envs/external_python.yaml --episodes 2 --json");
  ASSERT_EQ(external.exit_code, 0) << external.out;
  EXPECT_EQ(Summary(external)["summary"], "guess_number");
  EXPECT_EQ(Summary(external)["mean_outcome"], 1.0);
  // Episodes that end in environment errors are reported, the next one runs, exit code 1.
  CliRun faulty = Strider(
      "env run --command '/usr/bin/python3 tests/envs/faulty_env.py' "
      "--policy random --options fault=crash --episodes 2");
  EXPECT_EQ(faulty.exit_code, 1) << faulty.out;
  EXPECT_NE(faulty.out.find("episode 1 seed 1: ERROR"), std::string::npos) << faulty.out;
  EXPECT_NE(faulty.out.find("exited with code 3"), std::string::npos) << faulty.out;
  EXPECT_NE(faulty.out.find("2 episodes, 2 errors"), std::string::npos) << faulty.out;
}

bool HavePythonZmq() {
  return ::access("/usr/bin/python3", X_OK) == 0 &&
         std::system("/usr/bin/python3 -c 'import zmq' 2>/dev/null") == 0;
}

// Python processes whose command line holds `marker` (the command running them names it too,
// so only the interpreter counts).
std::vector<pid_t> ProcessesWith(const std::string& marker) {
  return strider::testing::ProcessesWith(marker, "/usr/bin/python3");
}

TEST(EnvCli, BytesThatAreNotUtf8AreReportedAndTheEnvironmentStops) {
  if (!HavePythonZmq()) GTEST_SKIP() << "needs /usr/bin/python3 with python3-zmq";
  const std::string marker = "utf8-marker-" + std::to_string(::getpid());
  CliRun run = Strider("env run --command '/usr/bin/python3 tests/envs/faulty_env.py " + marker +
                       "' --policy random --options fault=bad_utf8 --episodes 2 --json");
  EXPECT_EQ(run.exit_code, 1) << run.out;
  std::istringstream lines(run.out);
  std::string line;
  int episodes = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json parsed = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << line;
    if (!parsed.contains("episode")) continue;
    ++episodes;
    EXPECT_TRUE(parsed["error"].get<bool>()) << line;
    EXPECT_NE(parsed["end"].get<std::string>().find("\\xFF\\xFE"), std::string::npos) << line;
  }
  EXPECT_EQ(episodes, 2) << run.out;
  EXPECT_EQ(Summary(run)["errors"], 2) << run.out;
  EXPECT_TRUE(ProcessesWith(marker).empty());
}

TEST(EnvCli, AKilledCommandTakesItsEnvironmentProcessesWithIt) {
  if (!HavePythonZmq()) GTEST_SKIP() << "needs /usr/bin/python3 with python3-zmq";
  const std::string marker = "lifeline-marker-" + std::to_string(::getpid());
  const std::string binary = Dir("STRIDER_BINARY_DIR") + "/cli/strider";
  const std::string command =
      "/usr/bin/python3 " + Dir("STRIDER_SOURCE_DIR") + "/tests/envs/faulty_env.py " + marker;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int null_fd = ::open("/dev/null", O_WRONLY);
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(null_fd, STDERR_FILENO);
    ::execl(binary.c_str(), binary.c_str(), "env", "run", "--command", command.c_str(), "--policy",
            "random", "--options", "fault=hang", "--step-timeout-ms", "60000",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // The environment is up once its process exists and has had time to answer `describe`.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ProcessesWith(marker).empty() && std::chrono::steady_clock::now() < deadline) {
    ::usleep(50000);
  }
  ASSERT_FALSE(ProcessesWith(marker).empty()) << "the environment never started";
  ::usleep(500000);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!ProcessesWith(marker).empty() && std::chrono::steady_clock::now() < gone_by) {
    ::usleep(50000);
  }
  const std::vector<pid_t> left = ProcessesWith(marker);
  for (pid_t pid : left) ::kill(pid, SIGKILL);
  EXPECT_TRUE(left.empty()) << left.size() << " environment processes outlived the command";
}

TEST(EnvCli, ListWithAConfigDescribesThatEnvironment) {
  CliRun built_in = Strider("env list --config configs/envs/calculator.yaml");
  ASSERT_EQ(built_in.exit_code, 0) << built_in.out;
  EXPECT_NE(built_in.out.find("calculator"), std::string::npos) << built_in.out;
  EXPECT_EQ(built_in.out.find("retrieval"), std::string::npos) << built_in.out;

  const std::string config = ::testing::TempDir() + "/strider_env_list_library.yaml";
  std::ofstream(config) << "env:\n  library: " << Dir("STRIDER_BINARY_DIR")
                        << "/tests/envs/libstrider_template_env.so\n";
  CliRun library = Strider("env list --json --config " + config);
  ASSERT_EQ(library.exit_code, 0) << library.out;
  const nlohmann::json spec = Summary(library);
  EXPECT_EQ(spec["name"], "template_counter") << library.out;
  EXPECT_EQ(spec["options"], nlohmann::json::array({"target_max"})) << library.out;
  EXPECT_EQ(spec["tools"][0]["name"], "add") << library.out;

  if (::access("/usr/bin/python3", X_OK) != 0 ||
      std::system("/usr/bin/python3 -c 'import zmq' 2>/dev/null") != 0) {
    GTEST_SKIP() << "needs /usr/bin/python3 with python3-zmq";
  }
  CliRun external = Strider("env list --config configs/envs/external_python.yaml");
  ASSERT_EQ(external.exit_code, 0) << external.out;
  for (const char* expected : {"guess_number", "options: high", "- guess(n: integer)"}) {
    EXPECT_NE(external.out.find(expected), std::string::npos) << expected << "\n" << external.out;
  }
  // A bad option key for a plug-in is bad usage found before the first episode.
  CliRun bad = Strider(
      "env run --command '/usr/bin/python3 tests/envs/faulty_env.py' --options faults=crash");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("option 'faults': unknown option (known: fault)"), std::string::npos)
      << bad.out;
  EXPECT_EQ(bad.out.find("episode 0"), std::string::npos) << bad.out;
}

TEST(EnvCli, NoSubcommandPrintsTheCommandList) {
  CliRun top = Strider("");
  EXPECT_EQ(top.exit_code, 2) << top.out;
  for (const char* expected : {"Subcommands:", "env", "pretrain", "replay", "actor"}) {
    EXPECT_NE(top.out.find(expected), std::string::npos) << expected << "\n" << top.out;
  }
  CliRun env = Strider("env");
  EXPECT_EQ(env.exit_code, 2) << env.out;
  EXPECT_NE(env.out.find("Play episodes with a scripted or random policy"), std::string::npos)
      << env.out;
}

// Each strider start loads LibTorch (seconds on a busy machine): few, telling cases.
TEST(EnvCli, BadUsageExitsTwo) {
  CliRun run = Strider("env run nope");
  EXPECT_EQ(run.exit_code, 2) << run.out;
  EXPECT_NE(
      run.out.find("unknown environment 'nope' (built-in: calculator, dataset, retrieval, vision_count"),
      std::string::npos)
      << run.out;
  run = Strider("env run calculator --options dificulty=2");
  EXPECT_EQ(run.exit_code, 2) << run.out;
  EXPECT_NE(run.out.find("option 'dificulty': unknown option"), std::string::npos) << run.out;
}

}  // namespace
