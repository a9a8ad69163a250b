// Learner checkpoints: one directory per checkpoint holding
//   model.safetensors      the model's weights (router biases included)
//   optimizer.safetensors  AdamW moments and step (absent for a weights-only checkpoint)
//   state.json             where training stands (CheckpointState; format 2). Format 1, written
//                          before RL, held the pretraining fields at the top level: it still
//                          reads, as mode pretrain without generator state.
// A checkpoint is written into "<dir>.tmp", every file fsynced, then renamed over <dir>, so a
// crash leaves the previous checkpoint or the new one, never a mixture. A crash between the two
// renames of the swap leaves the previous one in "<dir>.old"; ReadCheckpointState and the next
// WriteCheckpoint move it back first.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"

namespace strider {

class Model;
class AdamW;

// Pretraining's own position: its stage and where the stage's packer stands.
struct PretrainCheckpoint {
  std::string stage;            // stage name
  int64_t stage_index = 0;
  bool stage_complete = false;  // the stage's budget is done (the next stage starts from here)
  int64_t stage_tokens = 0;     // training tokens consumed in this stage
  int64_t data_position = 0;    // sequences the stage's packer has produced
};

// Where a run stands, for any mode. The optimiser state is the checkpoint's
// optimizer.safetensors; everything else a resumed run needs is here.
struct CheckpointState {
  std::string mode = "pretrain";  // the mode that wrote it: pretrain | rl
  std::string model;              // model config name, checked on load
  uint64_t seed = 0;              // the run's seed (data order and initialisation)
  int64_t step = 0;               // optimiser steps taken (pretraining: in the current stage)
  // Version of the weights in this checkpoint. RL: the highest version ever published, so a
  // resumed learner publishes above it. Pretraining: 0.
  uint64_t policy_version = 0;
  int64_t sample_step = 0;        // batches the mode has drawn from its data (RL: from replay)
  int64_t total_tokens = 0;       // training tokens over the whole run
  // The mode's position in its data source, opaque to the checkpoint (text). RL: the replay
  // sampler's cursor; pretraining keeps its packer position in `pretrain`.
  std::string sampler_cursor;
  // The Trainer generator's state (at::Generator::get_state bytes), so a resumed run draws what
  // an uninterrupted one would. Empty: none saved (format 1, or a weights-only checkpoint).
  std::string rng_state;
  PretrainCheckpoint pretrain;    // mode pretrain only
};

std::string CheckpointModelPath(const std::string& directory);
std::string CheckpointOptimizerPath(const std::string& directory);

// Writes a mode's own files (a second model's, say) into the checkpoint being written, given
// its directory, so they are swapped in with the rest or not at all.
using CheckpointExtra = std::function<Status(const std::string& directory)>;

// `optimizer` may be null (weights-only checkpoint).
Status WriteCheckpoint(const std::string& directory, const Model& model, const AdamW* optimizer,
                       const CheckpointState& state, const CheckpointExtra& extra = {});
Result<CheckpointState> ReadCheckpointState(const std::string& directory);

}  // namespace strider
