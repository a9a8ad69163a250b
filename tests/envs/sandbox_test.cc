// The sandbox's limits, exercised for real with /bin/sh and python3 children.
#include "envs/sandbox.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tests/envs/processes.h"

namespace strider::envs {
namespace {

const char* kPython = "/usr/bin/python3";

SandboxRequest Python(const std::string& code) {
  SandboxRequest request;
  request.argv = {kPython, "-I", "main.py"};
  request.files = {{"main.py", code}};
  return request;
}

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kPython, X_OK) != 0) GTEST_SKIP() << "no " << kPython;
  }
};

TEST_F(SandboxTest, CapturesOutputAndExitCode) {
  Result<SandboxResult> run = RunSandboxed(Python("import sys\nprint(6*7)\nsys.exit(3)"));
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->exit_code, 3);
  EXPECT_EQ(run->stdout_text, "42\n");
  EXPECT_FALSE(run->timed_out);
}

TEST_F(SandboxTest, CpuLoopIsKilledByTheCpuLimit) {
  SandboxRequest request = Python("while True:\n    pass\n");
  request.limits.cpu_seconds = 1;
  request.limits.wall_ms = 20000;
  Result<SandboxResult> run = RunSandboxed(request);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_TRUE(run->cpu_limit) << run->Summary(request.limits);
  EXPECT_FALSE(run->timed_out);
  EXPECT_LT(run->wall_seconds, 10);
  EXPECT_NE(run->Summary(request.limits).find("CPU limit"), std::string::npos);
}

TEST_F(SandboxTest, SleeperIsKilledAtTheWallClockLimitWithItsChildren) {
  // The shell's background child must die with it: the whole process group is killed.
  SandboxRequest request;
  request.argv = {"/bin/sh", "-c", "sleep 30 & sleep 30"};
  request.limits.wall_ms = 300;
  Result<SandboxResult> run = RunSandboxed(request);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_TRUE(run->timed_out);
  EXPECT_EQ(run->signal, SIGKILL);
  EXPECT_LT(run->wall_seconds, 5);
}

TEST_F(SandboxTest, AForkBombStopsAtTheProcessCapAndNothingOfItOutlivesTheRun) {
  const std::string marker = "strider-fork-bomb-" + std::to_string(::getpid());
  SandboxRequest request;
  // Every copy is a fork of this shell, so each carries the marker as its $0.
  request.argv = {"/bin/sh", "-c", "b() { b | b & }; b; wait", marker};
  request.limits.processes = 32;
  request.limits.wall_ms = 2000;
  Result<SandboxResult> run = RunSandboxed(request);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  if (!run->process_cap) GTEST_SKIP() << "no writable pids cgroup here (not root?)";
  EXPECT_TRUE(run->process_limit_hit) << run->Summary(request.limits);
  EXPECT_NE(run->Summary(request.limits).find("process limit of 32 reached"), std::string::npos);
  EXPECT_LT(run->wall_seconds, 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(strider::testing::ProcessesWith(marker).size(), 0u);
}

TEST_F(SandboxTest, AProcessThatLeavesTheGroupIsKilledWithTheRun) {
  // setsid takes the sleeper out of the tool's process group and session; killing the group
  // misses it, the cgroup does not.
  const std::string marker = "31.0" + std::to_string(::getpid());
  SandboxRequest request;
  request.argv = {"/bin/sh", "-c", "setsid sleep " + marker + " & exit 0"};
  Result<SandboxResult> run = RunSandboxed(request);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  if (!run->process_cap) GTEST_SKIP() << "no writable pids cgroup here (not root?)";
  EXPECT_EQ(run->exit_code, 0);
  EXPECT_FALSE(run->process_limit_hit);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(strider::testing::ProcessesWith(marker).size(), 0u) << "the escaped sleeper is still running";
}

TEST_F(SandboxTest, MemoryHogIsStopped) {
  SandboxRequest request = Python("x = bytearray(1 << 30)\nprint('allocated')\n");
  request.limits.memory_bytes = 256LL << 20;
  Result<SandboxResult> run = RunSandboxed(request);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_NE(run->exit_code, 0);
  EXPECT_EQ(run->stdout_text.find("allocated"), std::string::npos);
  EXPECT_NE(run->stderr_text.find("MemoryError"), std::string::npos) << run->stderr_text;
}

TEST_F(SandboxTest, WritesOutsideTheScratchDirectoryAreRefused) {
  if (!SandboxCanContainWrites()) GTEST_SKIP() << "kernel without Landlock";
  const std::string outside =
      ::testing::TempDir() + "/strider_sandbox_outside_" + std::to_string(::getpid());
  std::filesystem::remove(outside);
  SandboxRequest request = Python(
      "open('inside.txt', 'w').write('ok')\n"
      "print(open('inside.txt').read())\n"
      "try:\n"
      "    open('" +
      outside +
      "', 'w').write('escaped')\n"
      "    print('escaped')\n"
      "except OSError as e:\n"
      "    print('refused', e.errno)\n");
  Result<SandboxResult> run = RunSandboxed(request);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_TRUE(run->contained);
  EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
  EXPECT_NE(run->stdout_text.find("ok\nrefused"), std::string::npos) << run->stdout_text;
  EXPECT_FALSE(std::filesystem::exists(outside));
}

TEST_F(SandboxTest, LargeFilesAndLargeOutputAreBounded) {
  SandboxRequest request = Python(
      "import sys\n"
      "sys.stdout.write('y' * 1000000)\n"
      "sys.stdout.flush()\n"
      "try:\n"
      "    open('big', 'wb').write(b'z' * (4 << 20))\n"
      "except OSError as e:\n"
      "    sys.stderr.write('too big %d' % e.errno)\n");
  request.limits.file_bytes = 1 << 20;
  request.limits.output_bytes = 1000;
  Result<SandboxResult> run = RunSandboxed(request);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_TRUE(run->output_truncated);
  EXPECT_EQ(run->stdout_text.size(), 1000u);
  EXPECT_NE(run->stderr_text.find("too big 27"), std::string::npos) << run->stderr_text;  // EFBIG
}

TEST_F(SandboxTest, ParentDescriptorsDoNotLeakIntoTheTool) {
  std::vector<int> opened;
  for (int i = 0; i < 4; ++i) opened.push_back(::open("/dev/null", O_RDONLY));  // no O_CLOEXEC
  // One far above the tool's RLIMIT_NOFILE (64), which a limit-bounded close loop would miss.
  opened.push_back(::fcntl(opened[0], F_DUPFD, 200));
  ASSERT_GE(opened.back(), 200);
  SandboxRequest request;
  request.argv = {"/bin/sh", "-c", "ls /proc/self/fd"};
  Result<SandboxResult> run = RunSandboxed(request);
  for (int fd : opened) ::close(fd);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  // 0, 1, 2 and the directory ls is reading; none of the parent's.
  EXPECT_EQ(run->stdout_text.find("\n" + std::to_string(opened.back()) + "\n"), std::string::npos)
      << run->stdout_text;
  EXPECT_LE(std::count(run->stdout_text.begin(), run->stdout_text.end(), '\n'), 4)
      << run->stdout_text;
}

TEST_F(SandboxTest, FreshScratchDirectoryIsRemovedAndBadRequestsAreErrors) {
  SandboxRequest request;
  request.argv = {"/bin/sh", "-c", "pwd"};
  Result<SandboxResult> run = RunSandboxed(request);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  const std::string dir = run->stdout_text.substr(0, run->stdout_text.size() - 1);
  EXPECT_NE(dir.find("strider-sandbox-"), std::string::npos) << dir;
  EXPECT_FALSE(std::filesystem::exists(dir));

  EXPECT_FALSE(RunSandboxed(SandboxRequest{}).ok());
  request.files = {{"../escape", "x"}};
  EXPECT_TRUE(RunSandboxed(request).status().IsInvalidArgument());
  request.files.clear();
  request.argv = {"/nonexistent/tool"};
  Result<SandboxResult> missing = RunSandboxed(request);
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->exit_code, 127);
}

}  // namespace
}  // namespace strider::envs
