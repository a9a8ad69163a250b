// `strider pretrain` with stderr going to a file, as in `scripts/quickstart.sh > log 2>&1` or a
// CI log: no terminal bar (whose \r redraws would be one unreadable line), but plain progress
// lines a reader can follow, the first step and every stage's last among them.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/child_process.h"
#include "tests/integration/rl_fixture.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using std::chrono::milliseconds;
using strider::testing::ChildProcess;
using strider::testing::ReadFile;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;

TEST(PretrainProgress, PrintsPlainLinesWhenStderrIsNotATerminal) {
  TempDir dir;
  const std::string config = dir.Sub("run.yaml");
  std::ofstream(config) << "mode: pretrain\n"
                        << "model_config: " << SourceDir() << "/configs/model/tiny.yaml\n"
                        << "seed: 3\nthreads: 1\n"
                        << "optimizer: {learning_rate: 0.003, warmup_steps: 2}\n"
                        << "evaluation: {documents: 2, batch: 2, chunk_tokens: 64}\n"
                        << "stages:\n"
                        << "  - {name: a, context: 64, tokens: 1024, batch_tokens: 256,"
                        << " objective: modality_alignment}\n"
                        << "  - {name: b, context: 128, tokens: 1536, batch_tokens: 256,"
                        << " objective: modality_alignment}\n";
  ChildProcess pretrain;
  ASSERT_TRUE(
      pretrain.Start({StriderBinary(), "pretrain", "--config", config, "--run-dir", dir.Sub("run")},
                     dir.Sub("stderr.log")));
  pretrain.ReadAll(milliseconds(120 * 1000));
  ASSERT_EQ(pretrain.Wait(), 0) << ReadFile(dir.Sub("stderr.log"));

  const std::string log = ReadFile(dir.Sub("stderr.log"));
  EXPECT_EQ(log.find('\r'), std::string::npos) << "a terminal bar in a file:\n" << log;
  const std::regex line_format(
      R"(pretrain: stage (\w+) \| step (\d+)/(\d+) \| tokens (\d+)/(\d+) \(\d+%\) \| \d+ tok/s \| )"
      R"(loss \d+\.\d{4} \| elapsed \S+ \| stage left \S+)");
  std::vector<std::string> seen;  // "stage step/steps tokens/total"
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, line_format)) continue;
    seen.push_back(m[1].str() + " " + m[2].str() + "/" + m[3].str() + " " + m[4].str() + "/" +
                   m[5].str());
  }
  // Each stage runs in well under the line period: its first step and its last, no more.
  const std::vector<std::string> expected = {"a 1/4 256/1024", "a 4/4 1024/1024", "b 1/6 256/1536",
                                             "b 6/6 1536/1536"};
  EXPECT_EQ(seen, expected) << log;
}

}  // namespace
}  // namespace strider
