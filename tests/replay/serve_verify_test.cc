// `strider replay serve` on a store whose table file was damaged after a start had checked it:
// the default start reads the changed file again and refuses, naming it; `--no-verify` serves
// the store as it is and takes new segments; `inspect verify` confirms the damage is real.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "replay/client.h"
#include "tests/integration/child_process.h"
#include "tests/replay/table_files.h"
#include "tests/replay/test_segments.h"
#include "tests/scratch_dir.h"

namespace strider::replay {
namespace {

using std::chrono::milliseconds;
using strider::testing::ChildProcess;
using strider::testing::FlipByte;
using strider::testing::LargestTableFile;
using strider::testing::MakeSegment;
using strider::testing::RunCommand;
using strider::testing::StriderBinary;
using strider::testing::TempDir;
using strider::testing::WaitEvent;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class Serve {
 public:
  explicit Serve(const TempDir& dir) : dir_(dir) {
    std::ofstream(dir.Sub("replay.yaml")) << "server:\n  stats_interval_s: 0\n";
  }

  // Starts `replay serve` with `flags`; its ready line, or null when it exited instead.
  nlohmann::json Start(const std::vector<std::string>& flags, const std::string& log) {
    std::vector<std::string> argv = {StriderBinary(), "replay",        "serve",
                                     "--db",          dir_.Sub("db"),  "--config",
                                     dir_.Sub("replay.yaml"), "--bind", "tcp://127.0.0.1:0",
                                     "--sample-bind", "tcp://127.0.0.1:0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    process_ = std::make_unique<ChildProcess>();
    if (!process_->Start(argv, dir_.Sub(log))) return nlohmann::json();
    return WaitEvent(*process_, "ready", 60000);
  }

  int Stop() {
    process_->Signal(SIGTERM);
    WaitEvent(*process_, "stopped", 60000);
    return process_->Wait();
  }

  int WaitExit() { return process_->Wait(); }

 private:
  const TempDir& dir_;
  std::unique_ptr<ChildProcess> process_;
};

// Sends `count` segments of new trajectories from `seed` on and waits for their acks.
void Send(const std::string& endpoint, uint64_t seed, int count) {
  ActorClientOptions options;
  options.endpoint = endpoint;
  options.client_id = "verify-test";
  Result<std::unique_ptr<ActorClient>> client = ActorClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  for (int i = 0; i < count; ++i) {
    ASSERT_TRUE((*client)->Send(MakeSegment(seed + i, 0, 4096, 1, /*is_last=*/true)).ok());
  }
  ASSERT_TRUE((*client)->Flush(milliseconds(30000)).ok());
  EXPECT_EQ((*client)->acked_count(), static_cast<uint64_t>(count));
}

TEST(ServeVerify, ATableFileDamagedAfterItsCheckIsRefusedAtStart) {
  TempDir dir;
  Serve serve(dir);
  // A first run stores segments (in the log); the second start writes them into table files
  // and checks those, listing them in CHECKED_TABLES.
  nlohmann::json ready = serve.Start({}, "first.log");
  ASSERT_TRUE(ready.is_object()) << ReadFile(dir.Sub("first.log"));
  Send(ready["actor_endpoint"], 1, 48);
  ASSERT_EQ(serve.Stop(), 0);
  ready = serve.Start({}, "second.log");
  ASSERT_TRUE(ready.is_object()) << ReadFile(dir.Sub("second.log"));
  ASSERT_EQ(serve.Stop(), 0);

  const std::string checked = ReadFile(dir.Sub("db/CHECKED_TABLES"));
  const std::filesystem::path largest = LargestTableFile(dir.Sub("db"));
  ASSERT_FALSE(largest.empty());
  ASSERT_NE(checked.find(largest.filename().string() + " "), std::string::npos)
      << "the second start checked " << largest << "; CHECKED_TABLES:\n" << checked;
  // One byte flipped in the file's data blocks, which a start opens nothing of.
  FlipByte(largest, static_cast<std::streamoff>(std::filesystem::file_size(largest) / 3), 0x10);

  // The default start reads the file again (it changed since its check) and refuses.
  EXPECT_FALSE(serve.Start({}, "refused.log").is_object());
  EXPECT_NE(serve.WaitExit(), 0);
  const std::string refused = ReadFile(dir.Sub("refused.log"));
  EXPECT_NE(refused.find("table file " + largest.string() + " fails its checksums"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find("--no-verify"), std::string::npos) << refused;
  // So does --verify, which reads every file.
  EXPECT_FALSE(serve.Start({"--verify"}, "verify.log").is_object());
  EXPECT_NE(serve.WaitExit(), 0);
  EXPECT_NE(ReadFile(dir.Sub("verify.log")).find(largest.string()), std::string::npos);

  // The damage is real: the store's own consistency check finds segments it cannot read.
  const testing::RunResult verify =
      RunCommand({StriderBinary(), "replay", "inspect", dir.Sub("db"), "verify", "--json"});
  EXPECT_EQ(verify.exit_code, 1) << verify.output;
  const nlohmann::json report = nlohmann::json::parse(verify.output, nullptr, false);
  ASSERT_TRUE(report.is_object()) << verify.output;
  EXPECT_FALSE(report["ok"].get<bool>());
  EXPECT_FALSE(report["problems"].empty());

  // The operator's way out: serve as it is, and new segments are taken.
  ready = serve.Start({"--no-verify"}, "unverified.log");
  ASSERT_TRUE(ready.is_object()) << ReadFile(dir.Sub("unverified.log"));
  Send(ready["actor_endpoint"], 1000, 4);
  EXPECT_EQ(serve.Stop(), 0);
}

}  // namespace
}  // namespace strider::replay
