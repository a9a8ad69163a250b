// Staged pretraining (`mode: pretrain`, docs/design.md#pretraining-mode): the stages of a config
// run in order, each from the previous stage's final checkpoint, each writing its own, each
// evaluated.
//
// Run directory layout:
//   data/<stage>/<generator>/part-*.shard   generated training data (built once, reused)
//   checkpoints/<stage>/latest              mid-stage checkpoint (every checkpoint.every_steps)
//   checkpoints/<stage>/final               end of stage: what the next stage starts from
//   metrics.jsonl                           one line per step (progress.h) plus stage summaries
//   eval.jsonl                              one line per (stage, evaluated context)
//
// Resume: from any checkpoint directory. A final checkpoint starts the following stage; a
// mid-stage one continues the stage at its step with the packer at its data position, so the
// batches are the ones an uninterrupted run would have used.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/transcript.h"
#include "learner/pretrain/pretrain_config.h"

namespace strider {

class Model;

// The ids a model's pretraining corpus is written in (docs/tokenizers.md, "Pretraining"): the
// byte format (null `format`) for the built-in models, or the model's own tokenizer and
// template, with the tokens a document begins (-1: none) and ends with
// (tokenizer::DocumentMarkers) and the id space its shards record (data::IdSpace).
struct CorpusFormat {
  std::shared_ptr<const transcript::Format> format;
  int32_t begin_of_text = -1;
  int32_t end_of_text = -1;
  uint64_t id_space = 0;
};

// The byte format unless the model's config names a tokenizer.
Result<CorpusFormat> LoadCorpusFormat(const ModelConfig& model);

struct PretrainOptions {
  std::string run_dir = "runs/pretrain";
  std::string resume;             // a checkpoint directory, or empty
  int64_t max_steps_per_stage = -1;  // tests: stop each stage early (budget shrinks to match)
  int64_t stages = -1;            // run only the first n stages (-1: all)
  bool evaluate = true;
  int bar = -1;                   // stderr progress (Progress::Display): -1 a bar on a TTY, lines
                                  // every 10 s otherwise; 0 none; 1 bar; 2 lines
};

struct StageSummary {
  std::string stage;
  int64_t steps = 0;
  int64_t tokens = 0;
  double seconds = 0;
  double first_loss = 0;  // mean loss of the first 10% of steps run in this invocation
  double last_loss = 0;   // mean loss of the last 10%
  double max_violation_after_warmup = 0;
};

Result<std::vector<StageSummary>> RunPretraining(const PretrainConfig& config,
                                                 const PretrainOptions& options);

struct RetrievalEvaluation {
  int64_t context = 0;
  double loss = 0;                  // mean next-token loss over the evaluation documents
  double retrieval_accuracy = 0;    // share of queries whose answer tokens are all predicted
  double answer_token_accuracy = 0;
  int64_t queries = 0;
  int64_t correct = 0;              // queries answered exactly
  // 95% Wilson score interval of retrieval_accuracy, the queries taken as independent draws:
  // each fact's key, value and place are drawn on their own, though the facts of one document
  // share its filler.
  double ci_low = 0;
  double ci_high = 1;
};

// Retrieval accuracy and loss on `documents` generated documents of exactly `context` tokens
// (seed disjoint from training), through the inference path in chunks without gradients.
// Accuracy is teacher-forced: for each query, every answer token must be the argmax prediction
// given the true document before it. A model with its own tokenizer is evaluated on documents
// in its format, of at most `context` tokens (the rest of the row is padding, not scored).
Result<RetrievalEvaluation> EvaluateRetrieval(const Model& model, const PretrainConfig& config,
                                              const CorpusFormat& corpus, int64_t context,
                                              int64_t documents);

}  // namespace strider
