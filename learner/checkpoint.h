// Learner checkpoints: one directory per checkpoint holding
//   model.safetensors      the model's weights (router biases included)
//   optimizer.safetensors  AdamW moments and step (absent for a weights-only checkpoint)
//   state.json             where training stands: stage, step, tokens, data position, seeds
// A checkpoint is written into "<dir>.tmp", every file fsynced, then renamed over <dir>, so a
// crash leaves the previous checkpoint or the new one, never a mixture. A crash between the two
// renames of the swap leaves the previous one in "<dir>.old"; ReadCheckpointState and the next
// WriteCheckpoint move it back first.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace strider {

class Model;
class AdamW;

struct CheckpointState {
  std::string stage;            // stage name
  int64_t stage_index = 0;
  bool stage_complete = false;  // the stage's budget is done (the next stage starts from here)
  int64_t step = 0;             // optimiser steps taken in this stage
  int64_t stage_tokens = 0;     // training tokens consumed in this stage
  int64_t total_tokens = 0;     // over all stages
  int64_t data_position = 0;    // sequences the stage's packer has produced
  uint64_t seed = 0;            // the run's seed (data order and initialisation)
  std::string model;            // model config name, checked on load
};

std::string CheckpointModelPath(const std::string& directory);
std::string CheckpointOptimizerPath(const std::string& directory);

// `optimizer` may be null (weights-only checkpoint).
Status WriteCheckpoint(const std::string& directory, const Model& model, const AdamW* optimizer,
                       const CheckpointState& state);
Result<CheckpointState> ReadCheckpointState(const std::string& directory);

}  // namespace strider
