// The step dump (`strider learner --dump-step N --dump-dir D`): everything a chosen learner step
// computed, written so the step can be recomputed outside Strider. For step N the learner writes
// D/step-N.jsonl (D/step-N.rank-R.jsonl on a rank of a group): one JSON line per trajectory of
// the batch, kept or excluded, with its rewards and, per action token, the log-probs, value,
// advantage, return, importance weight, mask and aggregation weight the loss used; then one line
// of totals copied from the step's metrics line, so both agree by construction and the
// per-token lines are what an outside recomputation checks them against. docs/rl_learner.md
// ("Step dump") documents every field.
//
// The update pass hands each chunk's loss inputs and per-token results to a StepRecorder
// (StepSettings::recorder), set only on a step that is dumped: other steps pay nothing.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "learner/rl/losses.h"
#include "learner/rl/objective_config.h"
#include "learner/rl/rl_step.h"

namespace strider::rl {

// One update pass over one trajectory: what the loss saw per action token (in the
// trajectory's prepared.positions order; NaN where no chunk gave a token, which does not happen
// for a trajectory the pass trained on).
struct DumpedPass {
  int64_t epoch = 0;
  int64_t update = 0;              // the optimiser update within the step, from 0
  double sequence_weight = 0;      // the aggregation weight of each of its action tokens
  std::vector<float> current;      // the learner's log-probs in this pass
  std::vector<float> value;        // the value head in this pass (when the value loss is on)
  std::vector<float> entropy;      // of the sampling distribution
  std::vector<float> importance;   // the weight on the token's policy term
  std::vector<float> loss_weight;  // its aggregation weight in the loss
  std::vector<uint8_t> trained;    // 0: masked (IcePop, MIS)
};

class StepRecorder {
 public:
  // Before each optimiser update's pass: the passes recorded next belong to it.
  void BeginUpdate(int64_t epoch, int64_t update);

  // One chunk of the update pass over `trajectory`: `slots` index its action tokens (as
  // ChunkActionLogProbs gives them), `in` and `loss` are PolicyLoss's for those tokens (one row).
  void Record(const TrainingTrajectory& trajectory, std::span<const int64_t> slots,
              const PolicyLossInputs& in, const PolicyLossResult& loss);

  // Every pass over `trajectory`, in the order they ran; empty when none did.
  const std::vector<DumpedPass>& Passes(const TrainingTrajectory& trajectory) const;

 private:
  int64_t epoch_ = 0;
  int64_t update_ = 0;
  std::map<const TrainingTrajectory*, std::vector<DumpedPass>> passes_;
};

// D/step-N.jsonl, or D/step-N.rank-R.jsonl for rank R of a group (`rank` >= 0).
std::string StepDumpPath(const std::string& dir, int64_t step, int rank = -1);

// The dump's lines: one per trajectory of `batch` (recorder's passes over it), then the totals,
// whose figures are those of `metrics_line` (the step's metrics.jsonl line, a JSON object).
// InvalidArgument when the metrics line is not a JSON object.
Result<std::string> StepDumpText(int64_t step, const PreparedBatch& batch,
                                 const StepRecorder& recorder, const PolicyLossOptions& loss,
                                 const std::string& metrics_line);

// StepDumpText written durably (WriteFileDurably) at `path`, the directory created if needed.
Status WriteStepDump(const std::string& path, int64_t step, const PreparedBatch& batch,
                     const StepRecorder& recorder, const PolicyLossOptions& loss,
                     const std::string& metrics_line);

// Parses --dump-step values: each a positive step number or a comma-separated list of them;
// sorted, without repeats. InvalidArgument naming the bad value.
Result<std::vector<int64_t>> ParseDumpSteps(std::span<const std::string> values);

}  // namespace strider::rl
