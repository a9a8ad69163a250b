// The model commands as a user runs them: real `strider` processes, files on disk, exit codes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <torch/cuda.h>
#include <vector>

#include "common/safetensors.h"
#include "tests/integration/child_process.h"

namespace strider {
namespace {

using testing::ChildProcess;
using testing::RunCommand;
using testing::RunResult;
using testing::StriderBinary;

std::string SourcePath(const std::string& relative) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return std::string(source ? source : ".") + "/" + relative;
}

class ModelCommands : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = std::filesystem::temp_directory_path() /
                 ("strider_model_cli_" + std::to_string(::getpid()));
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }
  // `model init` of the tiny config into the test's directory; returns the weights' path.
  std::string InitTinyWeights(const std::string& seed) {
    const std::string weights = (directory_ / ("tiny_" + seed + ".safetensors")).string();
    RunResult init =
        RunCommand({StriderBinary(), "model", "init", "--config",
                    SourcePath("configs/model/tiny.yaml"), "--out", weights, "--seed", seed});
    EXPECT_EQ(init.exit_code, 0) << init.output;
    return weights;
  }
  std::filesystem::path directory_;
};

TEST_F(ModelCommands, InitThenEvalGivesTheSameLogProbsOnBothPaths) {
  const std::string tiny = SourcePath("configs/model/tiny.yaml");
  const std::string weights = (directory_ / "tiny.safetensors").string();
  RunResult init = RunCommand({StriderBinary(), "model", "init", "--config", tiny, "--out",
                               weights, "--seed", "7"});
  ASSERT_EQ(init.exit_code, 0) << init.output;
  ASSERT_TRUE(std::filesystem::exists(weights));

  std::vector<double> totals;
  for (const char* path : {"train", "inference"}) {
    RunResult eval = RunCommand({StriderBinary(), "model", "eval", "--config", tiny, "--weights",
                                 weights, "--text", "tool results come back as text", "--path",
                                 path});
    ASSERT_EQ(eval.exit_code, 0) << eval.output;
    nlohmann::json json = nlohmann::json::parse(eval.output);
    EXPECT_EQ(json["path"], path);
    EXPECT_TRUE(json["logprobs"][0].is_null());  // the first token has no prediction
    EXPECT_EQ(json["logprobs"].size(), json["tokens"].size());
    totals.push_back(json["total_logprob"].get<double>());
  }
  EXPECT_NEAR(totals[0], totals[1], 1e-4);
}

constexpr char kEvalText[] = "tool results come back as text, one token at a time";

// `model eval` output parsed, or a failure naming the command's exit code and output.
nlohmann::json Eval(const std::string& weights, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      StriderBinary(), "model", "eval",   "--config", SourcePath("configs/model/tiny.yaml"),
      "--weights",     weights, "--text", kEvalText};
  argv.insert(argv.end(), extra.begin(), extra.end());
  RunResult eval = RunCommand(argv);
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  if (eval.exit_code != 0) return nlohmann::json();
  return nlohmann::json::parse(eval.output);
}

// Largest difference between two runs' per-token log-probs (the first entry is null in both).
double MaxLogProbDifference(const nlohmann::json& a, const nlohmann::json& b) {
  EXPECT_EQ(a["logprobs"].size(), b["logprobs"].size());
  double largest = 0;
  for (size_t t = 1; t < a["logprobs"].size() && t < b["logprobs"].size(); ++t) {
    largest = std::max(largest,
                       std::abs(a["logprobs"][t].get<double>() - b["logprobs"][t].get<double>()));
  }
  return largest;
}

TEST_F(ModelCommands, ChunkedInferenceGivesTheUnchunkedLogProbs) {
  const std::string weights = InitTinyWeights("3");
  const nlohmann::json whole = Eval(weights, {"--path", "inference"});
  ASSERT_FALSE(whole.is_null());
  ASSERT_GT(whole["tokens"].size(), 40u);
  EXPECT_EQ(whole["chunk"].get<size_t>(), whole["tokens"].size());
  // 1: the single-token recurrent kernel and the decode kernel of latent attention at every
  // step; 3 and 7: chunkwise prefill over an existing state, absorbed attention over the cache.
  for (const char* chunk : {"1", "3", "7"}) {
    SCOPED_TRACE(std::string("--chunk ") + chunk);
    const nlohmann::json chunked = Eval(weights, {"--path", "inference", "--chunk", chunk});
    ASSERT_FALSE(chunked.is_null());
    EXPECT_EQ(chunked["chunk"].get<int64_t>(), std::stoll(chunk));
    EXPECT_EQ(chunked["tokens"], whole["tokens"]);
    EXPECT_LE(MaxLogProbDifference(chunked, whole), 1e-5);
  }
  // Chunks are an inference-path notion.
  EXPECT_EQ(RunCommand({StriderBinary(), "model", "eval", "--config",
                        SourcePath("configs/model/tiny.yaml"), "--weights", weights, "--text",
                        kEvalText, "--path", "train", "--chunk", "4"})
                .exit_code,
            2);
}

TEST_F(ModelCommands, Float64WeightsLoadAsStoredAndMixedOnesAreRefused) {
  const std::string weights = InitTinyWeights("5");
  // The same weights widened to float64, and a copy where only the first tensor is.
  Result<SafetensorsContents> contents = ReadSafetensors(weights);
  ASSERT_TRUE(contents.ok()) << contents.status().ToString();
  std::vector<std::vector<double>> widened;
  std::vector<TensorView> all_f64, mixed;
  widened.reserve(contents->tensors.size());
  for (const auto& [name, tensor] : contents->tensors) {
    ASSERT_EQ(tensor.dtype, DType::kF32) << name;
    std::vector<float> values(tensor.bytes.size() / sizeof(float));
    std::memcpy(values.data(), tensor.bytes.data(), tensor.bytes.size());
    widened.emplace_back(values.begin(), values.end());
    TensorView f64{name, DType::kF64, tensor.shape, widened.back().data(),
                   widened.back().size() * sizeof(double)};
    all_f64.push_back(f64);
    mixed.push_back(mixed.empty() ? f64
                                  : TensorView{name, DType::kF32, tensor.shape, tensor.bytes.data(),
                                               tensor.bytes.size()});
  }
  const std::string f64_path = (directory_ / "tiny_f64.safetensors").string();
  const std::string mixed_path = (directory_ / "tiny_mixed.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(f64_path, all_f64, contents->metadata).ok());
  ASSERT_TRUE(WriteSafetensors(mixed_path, mixed, contents->metadata).ok());

  const nlohmann::json f32 = Eval(weights, {"--path", "inference"});
  const nlohmann::json stored = Eval(f64_path, {"--path", "inference"});
  const nlohmann::json asked = Eval(weights, {"--path", "inference", "--dtype", "float64"});
  const nlohmann::json trained = Eval(weights, {"--path", "train", "--dtype", "float64"});
  const nlohmann::json narrowed = Eval(f64_path, {"--path", "inference", "--dtype", "float32"});
  ASSERT_FALSE(f32.is_null() || stored.is_null() || asked.is_null() || trained.is_null() ||
               narrowed.is_null());
  EXPECT_EQ(f32["dtype"], "float32");
  EXPECT_EQ(stored["dtype"], "float64");  // loaded as stored, not narrowed
  EXPECT_EQ(asked["dtype"], "float64");
  EXPECT_EQ(trained["dtype"], "float64");
  EXPECT_EQ(narrowed["dtype"], "float32");
  // Widening float32 weights is exact, so the stored and the converted float64 weights are
  // the same numbers; the training path agrees to well below float32 rounding.
  EXPECT_LE(MaxLogProbDifference(stored, asked), 1e-12);
  EXPECT_LE(MaxLogProbDifference(stored, trained), 1e-8);
  EXPECT_LE(MaxLogProbDifference(stored, f32), 1e-5);
  EXPECT_GT(MaxLogProbDifference(stored, f32), 0.0);  // the float64 run did compute in float64
  EXPECT_LE(MaxLogProbDifference(narrowed, f32), 1e-12);

  // A checkpoint mixing float64 and float32 is a usage error that says why.
  const std::string command = StriderBinary() + " model eval --config " +
                              SourcePath("configs/model/tiny.yaml") + " --weights " + mixed_path +
                              " --tokens 1,2,3 2>&1";
  RunResult refused = RunCommand({"/bin/sh", "-c", command});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("F64 weights throughout or none"), std::string::npos)
      << refused.output;
}

TEST_F(ModelCommands, CheckPassesAndInfoCountsTheReference) {
  RunResult check = RunCommand({StriderBinary(), "model", "check", "--config",
                                SourcePath("configs/model/tiny.yaml"), "--tokens", "300"});
  ASSERT_EQ(check.exit_code, 0) << check.output;
  nlohmann::json report = nlohmann::json::parse(check.output);
  EXPECT_TRUE(report["passed"].get<bool>());
  EXPECT_LE(report["max_abs_logprob_diff"].get<double>(), 1e-5);

  RunResult info = RunCommand(
      {StriderBinary(), "model", "info", "--config", SourcePath("configs/model/reference.yaml")});
  ASSERT_EQ(info.exit_code, 0) << info.output;
  nlohmann::json counts = nlohmann::json::parse(info.output);
  EXPECT_NEAR(counts["total_params"].get<double>() / 2.8e12, 1.0, 0.05);
  EXPECT_NEAR(counts["active_params"].get<double>() / 104e9, 1.0, 0.05);
  EXPECT_EQ(counts["kv_cache_values_per_token_per_layer"].get<int64_t>(), 576);
}

TEST_F(ModelCommands, BadInputExitsWithUsageErrors) {
  // Weights made for another config are a usage error (exit 2), not a crash.
  const std::string weights = (directory_ / "tiny.safetensors").string();
  ASSERT_EQ(RunCommand({StriderBinary(), "model", "init", "--config",
                        SourcePath("configs/model/tiny.yaml"), "--out", weights})
                .exit_code,
            0);
  EXPECT_EQ(RunCommand({StriderBinary(), "model", "eval", "--config",
                        SourcePath("configs/model/small.yaml"), "--weights", weights, "--tokens",
                        "1,2,3"})
                .exit_code,
            2);
  // A config with an unknown key.
  const std::string broken = (directory_ / "broken.yaml").string();
  std::ofstream(broken) << "model:\n  vocabulary: 288\n  width: 64\n  layers: 4\n  widht: 3\n";
  EXPECT_EQ(RunCommand({StriderBinary(), "model", "info", "--config", broken}).exit_code, 2);
  // A missing config file and a missing flag.
  EXPECT_EQ(RunCommand({StriderBinary(), "model", "info", "--config", "/nonexistent.yaml"})
                .exit_code,
            2);
  EXPECT_EQ(RunCommand({StriderBinary(), "model", "info"}).exit_code, 2);
  // Token ids outside the vocabulary.
  EXPECT_EQ(RunCommand({StriderBinary(), "model", "eval", "--config",
                        SourcePath("configs/model/tiny.yaml"), "--weights", weights, "--tokens",
                        "1,99999"})
                .exit_code,
            2);
}

// A command's exit code and what it wrote to stderr.
struct Refusal {
  int exit_code = -1;
  std::string error;
};

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// `source` with every "configs/model/tiny.yaml" made absolute and `line` inserted after the
// first line that starts with `after`.
std::string WithLine(const std::string& source, const std::string& after, const std::string& line) {
  std::string text = ReadText(SourcePath(source));
  const std::string model = "configs/model/tiny.yaml";
  for (size_t at = text.find(model); at != std::string::npos; at = text.find(model, at + 1)) {
    text.replace(at, model.size(), SourcePath(model));
    at += SourcePath(model).size() - 1;
  }
  const size_t start = text.rfind('\n', text.find("\n" + after) + 1);
  const size_t end = text.find('\n', start + 1);
  return text.insert(end + 1, line + "\n");
}

class DeviceSetting : public ModelCommands {
 protected:
  Refusal Run(const std::vector<std::string>& argv) {
    const std::string stderr_path = (directory_ / "stderr.txt").string();
    ChildProcess child;
    Refusal result;
    if (!child.Start(argv, stderr_path)) return result;
    child.ReadAll(std::chrono::milliseconds(60000));
    result.exit_code = child.Wait();
    result.error = ReadText(stderr_path);
    return result;
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (directory_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
};

TEST_F(DeviceSetting, AMissingGpuIsAUsageErrorNamingTheDeviceInEveryCommand) {
  const std::string tiny = SourcePath("configs/model/tiny.yaml");
  const std::string weights = InitTinyWeights("3");
  // This build's LibTorch decides whether plain cuda exists; no machine has a hundredth GPU.
  std::vector<std::string> devices = {"cuda:99"};
  if (!torch::cuda::is_available()) devices.push_back("cuda");
  const std::string actor = SourcePath("configs/actor/calculator_tiny.yaml");
  const std::string store = directory_.string();
  for (const std::string& device : devices) {
    const std::vector<std::vector<std::string>> commands = {
        {"model", "check", "--config", tiny, "--tokens", "16"},
        {"model", "eval", "--config", tiny, "--weights", weights, "--tokens", "1,2,3"},
        {"model", "info", "--config", tiny},
        {"actor", "--config", actor},
        {"eval", "--config", actor, "--weights", weights},
        {"learner", "--config", SourcePath("configs/rl/calculator_tiny.yaml")},
        {"learner", "--config", SourcePath("configs/pretrain/tiny.yaml")},
        {"pretrain", "--config", SourcePath("configs/pretrain/tiny.yaml")},
        {"reward", "train-prm", "--store", store, "--model", tiny, "--weights", weights},
        {"reward", "score-prm", "--checkpoint", store, "--store", store},
    };
    for (std::vector<std::string> argv : commands) {
      const std::string command = argv[0] + " " + argv[1];
      argv.insert(argv.begin(), StriderBinary());
      argv.push_back("--device");
      argv.push_back(device);
      const Refusal refusal = Run(argv);
      EXPECT_EQ(refusal.exit_code, 2) << command << " --device " << device << ": " << refusal.error;
      EXPECT_NE(refusal.error.find("device " + device + ":"), std::string::npos)
          << command << ": " << refusal.error;
    }
  }
  // A misspelt device is a usage error too.
  EXPECT_EQ(Run({StriderBinary(), "model", "check", "--config", tiny, "--device", "gpu"}).exit_code,
            2);
}

TEST_F(DeviceSetting, ConfigKeysChooseTheDeviceAndTheFlagOverridesThem) {
  const std::string on_missing_gpu = "cuda:99";
  const std::string model =
      Write("model.yaml", WithLine("configs/model/tiny.yaml", "model:", "  device: cuda:99"));
  Refusal refusal = Run({StriderBinary(), "model", "check", "--config", model, "--tokens", "16"});
  EXPECT_EQ(refusal.exit_code, 2) << refusal.error;
  EXPECT_NE(refusal.error.find("device cuda:99"), std::string::npos) << refusal.error;
  // --device wins over the key.
  RunResult check = RunCommand({StriderBinary(), "model", "check", "--config", model, "--tokens",
                                "16", "--device", "cpu"});
  ASSERT_EQ(check.exit_code, 0) << check.output;
  EXPECT_EQ(nlohmann::json::parse(check.output)["device"], "cpu");

  // The device: keys of the actor, learner and pretraining configs.
  const std::vector<std::vector<std::string>> files = {
      {"actor.yaml", "configs/actor/calculator_tiny.yaml", "actor:", "  device: cuda:99", "actor"},
      {"rl.yaml", "configs/rl/calculator_tiny.yaml", "mode:", "device: cuda:99", "learner"},
      {"pretrain.yaml", "configs/pretrain/tiny.yaml", "mode:", "device: cuda:99", "pretrain"}};
  for (const std::vector<std::string>& file : files) {
    const std::string path = Write(file[0], WithLine(file[1], file[2], file[3]));
    refusal = Run({StriderBinary(), file[4], "--config", path});
    EXPECT_EQ(refusal.exit_code, 2) << file[0] << ": " << refusal.error;
    EXPECT_NE(refusal.error.find("device " + on_missing_gpu), std::string::npos)
        << file[0] << ": " << refusal.error;
  }
  const std::string misspelt =
      Write("bad.yaml", WithLine("configs/actor/calculator_tiny.yaml", "actor:", "  device: gpu"));
  refusal = Run({StriderBinary(), "actor", "--config", misspelt});
  EXPECT_EQ(refusal.exit_code, 2) << refusal.error;
  EXPECT_NE(refusal.error.find("actor.device"), std::string::npos) << refusal.error;
}

}  // namespace
}  // namespace strider
