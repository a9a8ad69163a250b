// A training run's directory, laid out alike by every mode (docs/learner.md):
//   metrics.jsonl        one JSON object per line, appended: the mode's step lines and events
//   checkpoints/NAME/    the Trainer's checkpoints (learner/checkpoint.h), NAME the mode's
// Pretraining and the RL learner open theirs here, resume only from a checkpoint their own mode
// wrote of the model they train, and write their checkpoints through it, so the two agree on
// where things are and on what a checkpoint's state says about the run.
//
// Threads: one training thread, as the Trainer it writes.
#pragma once

#include <string>

#include "common/status.h"
#include "learner/checkpoint.h"
#include "learner/progress.h"

namespace strider {

class Trainer;

class RunDirectory {
 public:
  // Creates `path` (and its parents) and opens its metrics.jsonl for appending, with `display`
  // as Progress::Open's (-1: its default). `mode` is what this run's checkpoints record
  // (pretrain | rl).
  static Result<RunDirectory> Open(const std::string& path, const std::string& mode,
                                   int display = -1);

  const std::string& path() const { return path_; }
  // metrics.jsonl, and the progress shown on stderr.
  Progress& metrics() { return metrics_; }

  // The state of the checkpoint directory `checkpoint`, to resume this run from. Errors: the
  // checkpoint holds another model than `model`, or another mode wrote it.
  Result<CheckpointState> ReadResumeState(const std::string& checkpoint,
                                          const std::string& model) const;

  // <path>/checkpoints/<name>; `name` may have several parts (pretraining's "stage/final").
  std::string CheckpointPath(const std::string& name) const;
  // Writes `trainer`'s checkpoint at CheckpointPath(name) with `state`, whose mode is set to this
  // run's, and `extra`'s files (Trainer::WriteCheckpoint: atomic, previous-or-new).
  Status WriteCheckpoint(Trainer& trainer, const std::string& name, CheckpointState state,
                         const CheckpointExtra& extra = {}) const;

 private:
  RunDirectory(std::string path, std::string mode, Progress metrics);

  std::string path_;
  std::string mode_;
  Progress metrics_;
};

}  // namespace strider
