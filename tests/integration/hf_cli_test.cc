// `strider model import`, `eval --from-hf` and `export` as a user runs them, on the committed
// reference checkpoints (tests/model/hf_reference): real processes, files on disk, exit codes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/file_contents.h"
#include "tests/integration/child_process.h"

namespace strider {
namespace {

using testing::ReadFileBytes;
using testing::RunCommand;
using testing::RunResult;
using testing::StriderBinary;
namespace fs = std::filesystem;

std::string Fixture(const std::string& name) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return std::string(source ? source : ".") + "/tests/model/hf_reference/" + name;
}

class HfCommands : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() / ("strider_hf_cli_" + std::to_string(::getpid()));
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }
  std::string Path(const std::string& name) const { return (directory_ / name).string(); }
  // stdout and stderr together, for the refusals' messages.
  RunResult RunShell(const std::vector<std::string>& argv) const {
    std::string line;
    for (const std::string& arg : argv) line += "'" + arg + "' ";
    return RunCommand({"/bin/sh", "-c", line + "2>&1"});
  }
  fs::path directory_;
};

nlohmann::json Json(const RunResult& run) {
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return run.exit_code == 0 ? nlohmann::json::parse(run.output) : nlohmann::json();
}

TEST_F(HfCommands, ImportEvalAndExportTheReferenceCheckpoints) {
  for (const char* name : {"kimi_sharded_f32", "kimi_low_rank_query_bf16"}) {
    SCOPED_TRACE(name);
    const std::string source = Fixture(name), out = Path(std::string(name) + "_strider");
    nlohmann::json imported =
        Json(RunCommand({StriderBinary(), "model", "import", "--from-hf", source, "--out", out}));
    ASSERT_FALSE(imported.is_null());
    EXPECT_EQ(imported["config"], out + "/model.yaml");
    EXPECT_GT(imported["peak_resident_bytes"].get<int64_t>(), 0);

    // Evaluating the import and the checkpoint directly gives the same log-probs.
    const std::string tokens = "1,17,200,33,5,90,91,250,12,7,7,64";
    nlohmann::json from_files = Json(
        RunCommand({StriderBinary(), "model", "eval", "--config", out + "/model.yaml", "--weights",
                    out + "/weights.safetensors", "--tokens", tokens, "--path", "train"}));
    nlohmann::json direct = Json(RunCommand({StriderBinary(), "model", "eval", "--from-hf", source,
                                             "--tokens", tokens, "--chunk", "5"}));
    ASSERT_FALSE(from_files.is_null() || direct.is_null());
    ASSERT_EQ(from_files["logprobs"].size(), 12u);
    for (size_t t = 1; t < 12; ++t) {
      EXPECT_NEAR(from_files["logprobs"][t].get<double>(), direct["logprobs"][t].get<double>(),
                  1e-5)
          << t;
    }

    // Export writes the published files back: every shard byte for byte, the rest copied.
    const std::string back = Path(std::string(name) + "_back");
    nlohmann::json exported =
        Json(RunCommand({StriderBinary(), "model", "export", "--config", out + "/model.yaml",
                         "--weights", out + "/weights.safetensors", "--to-hf", back}));
    ASSERT_FALSE(exported.is_null());
    int compared = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(source)) {
      const std::string file = entry.path().filename().string();
      if (file == "model.safetensors.index.json") continue;  // rewritten; same fields
      EXPECT_EQ(ReadFileBytes(back + "/" + file), ReadFileBytes(entry.path().string())) << file;
      ++compared;
    }
    EXPECT_GE(compared, 3);
    nlohmann::json copied = Json(RunCommand(
        {StriderBinary(), "model", "export", "--from-hf", source, "--to-hf", back + "_copy"}));
    EXPECT_EQ(copied["tensors"], exported["tensors"]);
  }
}

TEST_F(HfCommands, RefusalsNameWhatIsWrong) {
  fs::create_directories(Path("llama"));
  fs::copy_file(Fixture("kimi_sharded_f32/config.json"), Path("llama/config.json"));
  {
    std::string text = ReadFileBytes(Path("llama/config.json"));
    text.replace(text.find("\"kimi_linear\""), 13, "\"llama\"");
    testing::WriteFileBytes(Path("llama/config.json"), text);
  }
  RunResult llama = RunShell(
      {StriderBinary(), "model", "import", "--from-hf", Path("llama"), "--out", Path("x")});
  EXPECT_NE(llama.exit_code, 0);
  EXPECT_NE(llama.output.find("model_type 'llama' is not supported"), std::string::npos)
      << llama.output;

  // A shard missing from the directory, named.
  fs::copy(Fixture("kimi_sharded_f32"), Path("partial"));
  fs::remove(Path("partial/model-00002-of-00003.safetensors"));
  RunResult partial = RunShell(
      {StriderBinary(), "model", "eval", "--from-hf", Path("partial"), "--tokens", "1,2,3"});
  EXPECT_NE(partial.exit_code, 0);
  EXPECT_NE(partial.output.find("model-00002-of-00003.safetensors"), std::string::npos)
      << partial.output;

  RunResult neither = RunShell({StriderBinary(), "model", "export", "--to-hf", Path("y")});
  EXPECT_NE(neither.exit_code, 0);
}

}  // namespace
}  // namespace strider
