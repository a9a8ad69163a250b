// The pretraining run's configuration (`mode: pretrain`), read strictly: unknown keys are errors
// naming the file, line and key. See configs/pretrain/*.yaml and docs/pretraining.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/status.h"
#include "envs/environment.h"
#include "learner/pretrain/data/generators.h"
#include "learner/trainer_config.h"

namespace strider {

// One entry of a stage's data mixture: a built-in generator or a shard directory.
struct DataMixtureEntry {
  std::string generator;  // retrieval | tool_use | image_text
  std::string shards;     // a directory written by `strider data build`
  double weight = 1.0;
  // retrieval generator: document lengths are uniform in [min_tokens, max_tokens] (0: the
  // stage's context / 2 and context), so a stage can mix in short documents, whose facts are
  // close together and many per token.
  int64_t min_tokens = 0;
  int64_t max_tokens = 0;
  int64_t facts = 0;  // retrieval generator: facts per document (0: retrieval.facts)
  // tool_use generator: the built-in environment whose scripted episodes it renders (`env:`,
  // read as an actor's `env:` section); no name is the calculator at difficulty 1.
  envs::EnvironmentConfig environment;
  // tool_use generator: this entry's share of flawed transcripts, in place of
  // `tool_use.flawed_fraction` (negative: that one). Lets a late phase add mistakes to a policy
  // whose skill formed on correct transcripts.
  double flawed_fraction = -1;
};

// A run of steps at a shorter length that a stage makes before its own context: the stage's
// curriculum. A tiny model learns a look-up only where the fact and its query are a few dozen
// tokens apart; once learned, the look-up carries to long contexts (docs/pretraining.md).
struct CurriculumPhase {
  int64_t context = 0;  // sequence length of the phase, at most the stage's
  int64_t tokens = 0;   // token budget of the phase, on top of the stage's own
  std::vector<DataMixtureEntry> data;
};

struct PretrainStage {
  std::string name;
  int64_t context = 0;         // sequence length of this stage
  int64_t tokens = 0;          // training token budget
  int64_t batch_tokens = 4096; // tokens per optimiser step (sequences = batch_tokens / context)
  // modality_alignment | long_context_adaptation | long_range_reasoning. Picks the default
  // mixture when `data` is absent and is recorded with the stage's evaluation.
  std::string objective;
  // training: Model::Forward over whole sequences; inference: Model::Append in chunks carrying
  // the incremental state and latent cache forward, as the rollout engine runs.
  std::string paths = "training";
  int64_t chunk_tokens = 512;   // inference paths: tokens per chunk
  std::string backprop = "full";  // inference paths: full | truncated (per-chunk backward)
  double learning_rate = 0;     // 0: the optimizer section's rate
  int64_t warmup_steps = -1;    // -1: the schedule section's value
  // The weight of action tokens in this stage's loss, in place of `tool_use.action_weight`
  // (negative: that one). A late stage can lean on the policy's tokens once the format is learned.
  double action_weight = -1;
  std::vector<DataMixtureEntry> data;
  // Phases run in order before the stage's own context, under the stage's learning-rate
  // schedule (which spans them all), with the same paths and batch size in tokens.
  std::vector<CurriculumPhase> curriculum;
};

struct PretrainConfig {
  std::string origin;             // the file it came from
  std::string model_config_path;  // resolved path of the model config
  ModelConfig model;
  int64_t threads = 0;            // 0: the model config's threads
  // `seed`, the `optimizer:` section's AdamW keys and the `balance:` section's router keys
  // (enabled, router_learning_rate_scale, window_steps, prepass), with the trainer's defaults.
  // A slower router (router_learning_rate_scale < 1) keeps the biases current: the bias computed
  // on one step's batch is used on the next, after Adam has moved every router weight by about
  // the learning rate, which shifts many near-tied tokens across experts at once. Pooling a few
  // steps (window_steps) fits the biases to the mixture of document kinds rather than to one
  // batch's mix. The prepass fits them to the step's own batch before training on it: a bias
  // fitted to the previous batch is a step stale, and with learning rates that teach a tiny
  // model in minutes that staleness alone overloads experts by 30-60% (MaxVio measured on fresh
  // batches); it costs one more forward pass per step (about a third of a step).
  TrainerConfig trainer;
  int64_t warmup_steps = 20;      // linear warm-up, then cosine decay per stage
  double min_learning_rate_ratio = 0.1;
  int64_t balance_warmup_steps = 20;  // MaxVio is checked against the bound after this
  double max_violation = 0.3;
  // Quantile updates of the prepass (trainer.balance_prepass) on the step's router scores.
  int64_t balance_prepass_sweeps = 3;
  // Retrieval documents (generator and evaluation).
  int64_t retrieval_facts = 4;
  int64_t retrieval_key_letters = 2;  // 1 or 2 capital letters per key (generators.h)
  // Training loss weight of retrieval answer tokens (the value digits after "?KEY="), relative
  // to every other scored token. The answers are a few tokens among thousands of filler ones,
  // so without extra weight the look-up is a small share of the gradient.
  double retrieval_answer_weight = 1.0;
  // Training loss weight of the action tokens of tool_use transcripts (what a model turn
  // samples: its text and tool calls, found by transcript::ReadRoles), relative to the context
  // around them. A calculator episode is about 470 tokens of which some 40 are the policy's;
  // the numbers it must copy are a handful, so unweighted the fixed system prompt dominates.
  double tool_use_action_weight = 1.0;
  // Share of tool_use transcripts with one mistake in them (a wrong operand, a misread answer,
  // a guess without tools): imitated mistakes lower the warm start's success, clean transcripts
  // alone leave nothing wrong to learn from later.
  double tool_use_flawed_fraction = 0.2;
  // The kinds of mistake a flawed transcript draws from (config: `flaws: [wrong_call, misread,
  // no_tool]`, all three by default). Only `no_tool` leaves the policy's skill intact and
  // imitates a decision, answering without the tool, that outcome rewards can correct.
  std::vector<data::ToolUseFlaw> tool_use_flaws = data::GeneratorOptions().flaws;
  // Evaluation after each stage.
  int64_t eval_documents = 32;
  int64_t eval_batch = 8;
  int64_t eval_chunk_tokens = 512;
  int64_t checkpoint_every_steps = 0;  // 0: only at the end of a stage
  std::vector<PretrainStage> stages;
};

// Reads a config whose `mode` is pretrain (absent means pretrain). `model_config` is resolved
// against the working directory, then against the config file's directory and its parents.
Result<PretrainConfig> LoadPretrainConfig(const std::string& path);

// The `mode:` of a learner config ("pretrain" when absent), without validating the rest.
Result<std::string> ReadLearnerMode(const std::string& path);

}  // namespace strider
