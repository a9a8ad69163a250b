#include "learner/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/model/model.h"
#include "learner/optimizer.h"

namespace strider {
namespace {

Status SyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return Status::IoError("cannot open " + path + " to sync");
  const int result = ::fsync(fd);
  ::close(fd);
  return result == 0 ? Status::Ok() : Status::IoError("cannot sync " + path);
}

// WriteCheckpoint swaps directories in two renames (<dir> to <dir>.old, then <dir>.tmp to <dir>);
// a crash between them leaves no <dir>, with the previous checkpoint whole in <dir>.old (its files
// were synced before). Moving it back restores the "previous or new" promise.
Status RecoverInterruptedSwap(const std::string& directory) {
  namespace fs = std::filesystem;
  const std::string previous = directory + ".old";
  std::error_code error;
  if (fs::exists(directory, error) || !fs::exists(previous + "/state.json", error)) {
    return Status::Ok();
  }
  fs::rename(previous, directory, error);
  if (error) {
    return Status::IoError("cannot restore interrupted checkpoint " + previous + ": " +
                           error.message());
  }
  return Status::Ok();
}

}  // namespace

std::string CheckpointModelPath(const std::string& directory) {
  return directory + "/model.safetensors";
}
std::string CheckpointOptimizerPath(const std::string& directory) {
  return directory + "/optimizer.safetensors";
}

Status WriteCheckpoint(const std::string& directory, const Model& model, const AdamW* optimizer,
                       const CheckpointState& state) {
  namespace fs = std::filesystem;
  const std::string temporary = directory + ".tmp";
  const std::string previous = directory + ".old";
  // Before <dir>.old is removed below: it may be the only whole checkpoint left.
  STRIDER_RETURN_IF_ERROR(RecoverInterruptedSwap(directory));
  std::error_code error;
  fs::remove_all(temporary, error);
  fs::create_directories(temporary, error);
  if (error) return Status::IoError("cannot create " + temporary + ": " + error.message());
  STRIDER_RETURN_IF_ERROR(model.Save(CheckpointModelPath(temporary)));
  if (optimizer != nullptr) {
    STRIDER_RETURN_IF_ERROR(optimizer->Save(CheckpointOptimizerPath(temporary)));
  }
  nlohmann::json json = {{"stage", state.stage},
                         {"stage_index", state.stage_index},
                         {"stage_complete", state.stage_complete},
                         {"step", state.step},
                         {"stage_tokens", state.stage_tokens},
                         {"total_tokens", state.total_tokens},
                         {"data_position", state.data_position},
                         {"seed", state.seed},
                         {"model", state.model},
                         {"format", 1}};
  const std::string state_path = temporary + "/state.json";
  {
    std::ofstream out(state_path);
    out << json.dump(2) << "\n";
    if (!out) return Status::IoError("cannot write " + state_path);
  }
  STRIDER_RETURN_IF_ERROR(SyncPath(state_path));
  STRIDER_RETURN_IF_ERROR(SyncPath(temporary));
  fs::remove_all(previous, error);
  if (fs::exists(directory)) {
    fs::rename(directory, previous, error);
    if (error) return Status::IoError("cannot move old checkpoint " + directory + ": " + error.message());
  }
  fs::rename(temporary, directory, error);
  if (error) return Status::IoError("cannot rename " + temporary + ": " + error.message());
  const fs::path parent = fs::path(directory).parent_path();
  if (!parent.empty()) STRIDER_RETURN_IF_ERROR(SyncPath(parent.string()));
  fs::remove_all(previous, error);
  return Status::Ok();
}

Result<CheckpointState> ReadCheckpointState(const std::string& directory) {
  STRIDER_RETURN_IF_ERROR(RecoverInterruptedSwap(directory));
  const std::string path = directory + "/state.json";
  std::ifstream in(path);
  if (!in) return Status::NotFound("no checkpoint state at " + path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    nlohmann::json json = nlohmann::json::parse(text.str());
    CheckpointState state;
    state.stage = json.at("stage").get<std::string>();
    state.stage_index = json.at("stage_index").get<int64_t>();
    state.stage_complete = json.at("stage_complete").get<bool>();
    state.step = json.at("step").get<int64_t>();
    state.stage_tokens = json.at("stage_tokens").get<int64_t>();
    state.total_tokens = json.at("total_tokens").get<int64_t>();
    state.data_position = json.at("data_position").get<int64_t>();
    state.seed = json.at("seed").get<uint64_t>();
    state.model = json.at("model").get<std::string>();
    return state;
  } catch (const std::exception& error) {
    return Status::Corruption(path + ": " + error.what());
  }
}

}  // namespace strider
