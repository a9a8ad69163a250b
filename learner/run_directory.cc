#include "learner/run_directory.h"

#include <filesystem>
#include <utility>

#include "learner/learner.h"

namespace strider {

RunDirectory::RunDirectory(std::string path, std::string mode, Progress metrics)
    : path_(std::move(path)), mode_(std::move(mode)), metrics_(std::move(metrics)) {}

Result<RunDirectory> RunDirectory::Open(const std::string& path, const std::string& mode,
                                        int display) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) return Status::IoError("cannot create run directory " + path);
  STRIDER_ASSIGN_OR_RETURN(Progress metrics, Progress::Open(path + "/metrics.jsonl", display));
  return RunDirectory(path, mode, std::move(metrics));
}

Result<CheckpointState> RunDirectory::ReadResumeState(const std::string& checkpoint,
                                                      const std::string& model) const {
  STRIDER_ASSIGN_OR_RETURN(CheckpointState state, ReadCheckpointState(checkpoint));
  if (state.model != model) {
    return Status::InvalidArgument("checkpoint " + checkpoint + " holds model '" + state.model +
                                   "', the config trains '" + model + "'");
  }
  if (state.mode != mode_) {
    return Status::InvalidArgument("checkpoint " + checkpoint + " was written by mode '" +
                                   state.mode + "', not " + mode_);
  }
  return state;
}

std::string RunDirectory::CheckpointPath(const std::string& name) const {
  return path_ + "/checkpoints/" + name;
}

Status RunDirectory::WriteCheckpoint(Trainer& trainer, const std::string& name,
                                     CheckpointState state, const CheckpointExtra& extra) const {
  state.mode = mode_;
  return trainer.WriteCheckpoint(CheckpointPath(name), std::move(state), extra);
}

}  // namespace strider
