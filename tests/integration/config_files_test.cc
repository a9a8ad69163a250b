// Every file under configs/ loads with the loader of its kind, so a shipped config that a
// loader change broke, or a new kind of config without a loader, fails here and not first in
// a user's run. The folder names the kind; a file in a folder without a loader fails the test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "actors/actor.h"
#include "common/model/config.h"
#include "envs/dataset/dataset.h"
#include "envs/registry.h"
#include "launcher/launcher.h"
#include "learner/pretrain/pretrain_config.h"
#include "learner/rl/rl_config.h"
#include "replay/replay.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

namespace fs = std::filesystem;

bool HasPythonZmq() {
  return ::access("/usr/bin/python3", X_OK) == 0 &&
         std::system("/usr/bin/python3 -c 'import zmq' 2>/dev/null") == 0;
}

// Loads one file; `path` is relative to the repository root, the working directory.
using Loader = std::function<Status(const std::string& path)>;

const std::map<std::string, Loader>& Loaders() {
  static const std::map<std::string, Loader> loaders = {
      {"envs", [](const std::string& path) { return envs::LoadEnvironmentConfig(path).status(); }},
      // JSONL, not YAML: every line parsed as the dataset environment parses it.
      {"datasets", [](const std::string& path) { return envs::LoadDataset(path).status(); }},
      {"fleet", [](const std::string& path) { return launcher::LoadFleetConfig(path).status(); }},
      {"model", [](const std::string& path) { return LoadModelConfig(path).status(); }},
      {"pretrain", [](const std::string& path) { return LoadPretrainConfig(path).status(); }},
      {"replay", [](const std::string& path) { return replay::LoadServerConfig(path).status(); }},
      {"rl", [](const std::string& path) { return rl::LoadRlLearnerConfig(path).status(); }},
      {"actor",
       [](const std::string& path) -> Status {
         STRIDER_ASSIGN_OR_RETURN(actors::ActorOptions options, actors::LoadActorConfig(path));
         // The model the actor names must load too.
         return LoadModelConfig(options.model_config).status().WithContext(path + ": model");
       }},
  };
  return loaders;
}

TEST(ConfigFiles, EveryFileUnderConfigsLoadsWithItsKindsLoader) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "run through ctest (STRIDER_SOURCE_DIR)";
  fs::current_path(source);  // config paths inside the files are relative to the root
  const bool python = HasPythonZmq();
  std::set<std::string> kinds_seen;
  int loaded = 0;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator("configs")) {
    if (!entry.is_regular_file()) continue;
    const fs::path path = entry.path();
    const fs::path relative = path.lexically_relative("configs");
    // Scheduler files (Slurm, Kubernetes), not Strider configs: launcher_deploy_files_test
    // parses them and holds their commands to `strider launch --print-commands`.
    if (relative.begin()->string() == "deploy") continue;
    // configs/quickstart.yaml, the main job's fleet, is the one file at the top.
    const std::string kind =
        relative == "quickstart.yaml" ? std::string("fleet") : relative.begin()->string();
    SCOPED_TRACE(path.string());
    EXPECT_EQ(path.extension(), kind == "datasets" ? ".jsonl" : ".yaml");
    auto loader = Loaders().find(kind);
    if ((relative == relative.filename() && kind != "fleet") || loader == Loaders().end()) {
      ADD_FAILURE() << path << ": no loader for configs/" << kind << " (add one to this test)";
      continue;
    }
    kinds_seen.insert(kind);
    // An out-of-process environment is started to ask for its option keys.
    if (kind == "envs" && !python) {
      Result<ConfigReader> root = ConfigReader::FromFile(path.string());
      ASSERT_TRUE(root.ok());
      if (root->Section("env").Has("command")) {
        std::printf("skipped %s: needs /usr/bin/python3 with python3-zmq\n", path.c_str());
        continue;
      }
    }
    // A fleet's starting weights are written by its warm start (the command in its header);
    // an empty file stands in for them, so the rest of the fleet file is still checked.
    fs::path stand_in;  // the topmost path this test created for it
    if (kind == "fleet") {
      Result<ConfigReader> root = ConfigReader::FromFile(path.string());
      ASSERT_TRUE(root.ok());
      std::string weights;
      root->Optional("weights", &weights);
      if (!weights.empty() && weights.rfind("runs/", 0) == 0 && !fs::exists(weights)) {
        stand_in = weights;
        while (!stand_in.parent_path().empty() && !fs::exists(stand_in.parent_path())) {
          stand_in = stand_in.parent_path();
        }
        fs::create_directories(fs::path(weights).parent_path());
        std::ofstream(weights).flush();
      }
    }
    const Status status = loader->second(path.string());
    if (!stand_in.empty()) fs::remove_all(stand_in);
    EXPECT_TRUE(status.ok()) << status.ToString();
    ++loaded;
  }
  // The walk itself can fail: every kind of config the repository ships was seen.
  EXPECT_EQ(kinds_seen, (std::set<std::string>{"actor", "datasets", "envs", "fleet", "model",
                                               "pretrain", "replay", "rl"}));
  EXPECT_GE(loaded, 10);
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// What a user sees for the two usual mistakes, through the real loaders and shipped files.
TEST(ConfigFiles, MistakesNameWhatWasMeant) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "run through ctest (STRIDER_SOURCE_DIR)";
  fs::current_path(source);
  std::string text = ReadFile("configs/actor/calculator_tiny.yaml");
  const size_t model = text.find("\n  model: ");
  ASSERT_NE(model, std::string::npos);
  text.replace(model, 10, "\n  modle: ");
  const std::string misspelt = ::testing::TempDir() + "/strider_misspelt_actor.yaml";
  std::ofstream(misspelt) << text;
  Result<actors::ActorOptions> actor = actors::LoadActorConfig(misspelt);
  ASSERT_FALSE(actor.ok());
  EXPECT_NE(actor.status().message().find("actor.model: is required but missing"),
            std::string::npos)
      << actor.status().ToString();
  EXPECT_NE(actor.status().message().find(":5: actor.modle: unknown key (did you mean model?)"),
            std::string::npos)
      << actor.status().ToString();

  text = ReadFile("configs/model/tiny.yaml");
  const size_t width = text.find("\n  width: ");
  ASSERT_NE(width, std::string::npos);
  text.replace(width, 10, "\n  widht: ");
  const std::string misspelt_model = ::testing::TempDir() + "/strider_misspelt_model.yaml";
  std::ofstream(misspelt_model) << text;
  Result<ModelConfig> model_config = LoadModelConfig(misspelt_model);
  ASSERT_FALSE(model_config.ok());
  EXPECT_NE(model_config.status().message().find("model.width: is required but missing"),
            std::string::npos)
      << model_config.status().ToString();
  EXPECT_NE(model_config.status().message().find("model.widht: unknown key (did you mean width?)"),
            std::string::npos)
      << model_config.status().ToString();

  Result<PretrainConfig> pretrain = LoadPretrainConfig("configs/model/tiny.yaml");
  ASSERT_FALSE(pretrain.ok());
  EXPECT_NE(pretrain.status().message().find(
                "model_config: is required but missing: this is a model config (it has a "
                "model: section); --config takes a pretraining config (configs/pretrain/"),
            std::string::npos)
      << pretrain.status().ToString();
}

// An actor config read from another working directory finds the model it names, as the
// learner, pretraining and fleet configs do (`strider eval --config /abs/path/actor.yaml`).
TEST(ConfigFiles, ActorPathsResolveFromTheFilesDirectory) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "run through ctest (STRIDER_SOURCE_DIR)";
  const fs::path root = fs::absolute(source);
  fs::current_path(fs::temp_directory_path());
  ASSERT_FALSE(fs::exists("configs/model/calc.yaml")) << "the test needs a directory without it";
  Result<actors::ActorOptions> actor =
      actors::LoadActorConfig((root / "configs/actor/calculator.yaml").string());
  fs::current_path(root);
  ASSERT_TRUE(actor.ok()) << actor.status().ToString();
  EXPECT_EQ(fs::path(actor->model_config), root / "configs/model/calc.yaml");
  EXPECT_TRUE(LoadModelConfig(actor->model_config).ok());
  // From the repository root the path stays as written.
  Result<actors::ActorOptions> here = actors::LoadActorConfig("configs/actor/calculator.yaml");
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  EXPECT_EQ(here->model_config, "configs/model/calc.yaml");
}

// The expert count an expert-parallel learner divides is the model file's, read after it loads.
TEST(ConfigFiles, ExpertParallelIsCheckedAgainstTheNamedModel) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "run through ctest (STRIDER_SOURCE_DIR)";
  fs::current_path(source);
  const std::string shipped = ReadFile("configs/rl/calculator_sync.yaml");
  ASSERT_EQ(shipped.find("\ndistributed:"), std::string::npos);
  const testing::TempDir dir;
  auto load = [&](int world) {
    const std::string path = dir.Sub("world" + std::to_string(world) + ".yaml");
    std::ofstream(path) << shipped << "\ndistributed:\n  world_size: " << world
                        << "\n  expert_parallel: true\n";
    return rl::LoadRlLearnerConfig(path);
  };
  // configs/model/calc.yaml has 8 routed experts.
  EXPECT_TRUE(load(4).ok()) << load(4).status().ToString();
  const Status three = load(3).status();
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.message().find("routed_experts (8"), std::string::npos) << three.ToString();
  EXPECT_NE(three.message().find("world_size (3)"), std::string::npos) << three.ToString();
}

}  // namespace
}  // namespace strider
