#include "learner/pretrain/pretrain.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/model/model.h"
#include "common/model/torch_status.h"
#include "common/token_ids.h"
#include "common/tokenizer/chat_format.h"
#include "learner/checkpoint.h"
#include "learner/pretrain/data/builder.h"
#include "learner/pretrain/data/dataset.h"
#include "learner/pretrain/data/generators.h"
#include "learner/language_model_loss.h"
#include "learner/learner.h"
#include "learner/run_directory.h"
#include "learner/pretrain/token_batch.h"
#include "report/report.h"
#include "common/tokenizer.h"
#include "common/transcript.h"

namespace strider {
namespace {

namespace fs = std::filesystem;

// One run of packed sequences at one length inside a stage: a curriculum phase, or the stage's
// own context (always the last part).
struct StagePart {
  int64_t phase = -1;  // index in the stage's curriculum, -1 for the stage's own context
  int64_t context = 0;
  int64_t tokens = 0;
  const std::vector<DataMixtureEntry>* data = nullptr;
  int64_t rows = 0;   // sequences per optimiser step
  int64_t steps = 0;  // optimiser steps
  int64_t first_step = 0;
};

// The stage's parts in order. `max_steps` >= 0 caps the stage's steps, shared among the parts
// in proportion (each keeps at least one while the cap allows any), so a capped smoke run
// still reaches the stage's own context.
std::vector<StagePart> StageParts(const PretrainStage& stage, int64_t max_steps) {
  std::vector<StagePart> parts;
  auto add = [&](int64_t phase, int64_t context, int64_t tokens,
                 const std::vector<DataMixtureEntry>* data) {
    StagePart part;
    part.phase = phase;
    part.context = context;
    part.tokens = tokens;
    part.data = data;
    part.rows = std::max<int64_t>(1, stage.batch_tokens / context);
    const int64_t per_step = part.rows * context;
    part.steps = std::max<int64_t>(1, (tokens + per_step - 1) / per_step);
    parts.push_back(part);
  };
  for (size_t p = 0; p < stage.curriculum.size(); ++p) {
    const CurriculumPhase& phase = stage.curriculum[p];
    add(static_cast<int64_t>(p), phase.context, phase.tokens, &phase.data);
  }
  add(-1, stage.context, stage.tokens, &stage.data);
  int64_t total = 0;
  for (const StagePart& part : parts) total += part.steps;
  if (max_steps >= 0 && total > max_steps) {
    for (StagePart& part : parts) {
      part.steps = max_steps == 0 ? 0 : std::max<int64_t>(1, part.steps * max_steps / total);
    }
  }
  int64_t first = 0;
  for (StagePart& part : parts) {
    part.first_step = first;
    first += part.steps;
  }
  return parts;
}

// Index of the part that runs step `step` (the last part once the steps are done).
size_t PartOf(const std::vector<StagePart>& parts, int64_t step) {
  for (size_t p = 0; p + 1 < parts.size(); ++p) {
    if (step < parts[p].first_step + parts[p].steps) return p;
  }
  return parts.size() - 1;
}

// The stage's learning-rate schedule. Each stage has its own: a new context length is a new
// regime.
LearningRateSchedule StageSchedule(const PretrainConfig& config, const PretrainStage& stage,
                                   int64_t steps) {
  LearningRateSchedule schedule;
  schedule.peak =
      stage.learning_rate > 0 ? stage.learning_rate : config.trainer.optimizer.learning_rate;
  schedule.warmup_steps = stage.warmup_steps >= 0 ? stage.warmup_steps : config.warmup_steps;
  schedule.total_steps = steps;
  schedule.min_ratio = config.min_learning_rate_ratio;
  return schedule;
}

data::GeneratorOptions GeneratorOptionsFor(const PretrainConfig& config, const CorpusFormat& corpus,
                                           int64_t context) {
  data::GeneratorOptions options;
  options.format = corpus.format;
  options.begin_of_text = corpus.begin_of_text;
  options.end_of_text = corpus.end_of_text;
  options.length = context;
  options.min_length = context / 2;
  options.facts = config.retrieval_facts;
  options.key_letters = config.retrieval_key_letters;
  options.flawed_fraction = config.tool_use_flawed_fraction;
  options.flaws = config.tool_use_flaws;
  options.patch_size = config.model.vision.patch_size;
  options.image_size = config.model.vision.patch_size *
                       std::min<int64_t>({4, config.model.vision.max_grid_rows,
                                          config.model.vision.max_grid_columns});
  return options;
}

// Builds (once) and opens the shards of one part's mixture.
Result<std::vector<data::DataSource>> PrepareStageData(const PretrainConfig& config,
                                                       const CorpusFormat& corpus,
                                                       int64_t stage_index, const StagePart& part,
                                                       const std::string& run_dir) {
  const PretrainStage& stage = config.stages[stage_index];
  const std::vector<DataMixtureEntry>& mixture = *part.data;
  double total_weight = 0;
  for (const DataMixtureEntry& entry : mixture) total_weight += entry.weight;
  std::vector<data::DataSource> sources;
  for (size_t e = 0; e < mixture.size(); ++e) {
    const DataMixtureEntry& entry = mixture[e];
    data::DataSource source;
    source.weight = entry.weight;
    std::string directory = entry.shards;
    if (!entry.generator.empty()) {
      const std::string phase =
          part.phase < 0 ? std::string() : "phase" + std::to_string(part.phase) + "-";
      directory = run_dir + "/data/" + stage.name + "/" + phase + std::to_string(e) + "-" +
                  entry.generator;
      const std::string marker = directory + "/COMPLETE";
      if (!fs::exists(marker)) {
        std::error_code error;
        fs::remove_all(directory, error);
        STRIDER_ASSIGN_OR_RETURN(data::GeneratorKind kind,
                                 data::ParseGeneratorName(entry.generator));
        // Enough documents for the stage's share of the budget: each is seen about once.
        const int64_t tokens = std::max<int64_t>(
            static_cast<int64_t>(part.tokens * entry.weight / total_weight), part.context * 4);
        const uint64_t seed =
            config.trainer.seed * 1000003ull + stage_index * 101 + e + (part.phase + 1) * 7919;
        data::GeneratorOptions generator = GeneratorOptionsFor(config, corpus, part.context);
        if (entry.max_tokens > 0) generator.length = entry.max_tokens;
        if (entry.min_tokens > 0) generator.min_length = entry.min_tokens;
        if (entry.facts > 0) generator.facts = entry.facts;
        generator.environment = entry.environment;
        if (entry.flawed_fraction >= 0) generator.flawed_fraction = entry.flawed_fraction;
        STRIDER_ASSIGN_OR_RETURN(
            data::BuildSummary summary,
            data::BuildGeneratedShards(kind, generator, seed, 0, tokens, directory));
        (void)summary;
        std::ofstream(marker) << "ok\n";
      }
    }
    source.name = directory;
    STRIDER_ASSIGN_OR_RETURN(source.shards, data::OpenShardDirectory(directory));
    // Ids of another tokenizer would train as if they were this model's.
    for (const auto& shard : source.shards) {
      if (shard->id_space() == corpus.id_space) continue;
      return Status::InvalidArgument(
          "shard " + shard->path() + " holds " +
          (shard->id_space() == 0 ? std::string("byte-format ids")
                                  : "ids of another tokenizer") +
          ", but model " + config.model.name + " is trained in " +
          (corpus.format ? "the ids of its tokenizer " + config.model.tokenizer.file
                         : std::string("the byte format")) +
          " (strider data build --model writes a model's own ids; docs/tokenizers.md)");
    }
    sources.push_back(std::move(source));
  }
  return sources;
}

// Packed rows in the corpus's ids as the loss reads them; `lengths[b]` tokens of row b are
// documents, the rest padding (a model's own ids mask it by position, the byte format by id).
Result<TokenBatch> MakeCorpusBatch(const std::vector<std::vector<int32_t>>& sequences,
                                   const std::vector<int64_t>& lengths, const CorpusFormat& corpus,
                                   const ModelConfig& model) {
  if (corpus.format) return MakeTokenBatch(sequences, lengths, corpus.begin_of_text);
  return MakeTokenBatch(sequences, model);
}

// Where the batch's real tokens are, for the routing balance: the byte format's padding is its
// id (which also marks image patches left unrendered), a model's own is every position from
// `lengths[b]` on.
Result<at::Tensor> RealPositions(const TokenBatch& batch, const std::vector<int64_t>& lengths,
                                 const CorpusFormat& corpus) {
  at::Tensor real;
  STRIDER_RETURN_IF_ERROR(model::Guarded("routing balance", [&] {
    if (!corpus.format) {
      real = batch.tokens != token::kPad;
      return;
    }
    const at::Tensor position = at::arange(batch.tokens.size(1), at::kLong).unsqueeze(0);
    real = position < at::tensor(lengths, at::kLong).unsqueeze(1);
  }));
  return real;
}

// Sets the batch's loss weights: the mask, times `answer_weight` at every scored retrieval
// answer token and `action_weight` at every action token of a transcript. In a model's own
// format answers are found in the tokens' bytes and roles by its reader, over each row's
// `lengths` (documents; padding after them is masked already).
void WeightLoss(TokenBatch* batch, const CorpusFormat& corpus, const std::vector<int64_t>& lengths,
                double answer_weight, double action_weight) {
  if (answer_weight == 1.0 && action_weight == 1.0) return;
  at::Tensor tokens = batch->tokens.to(at::kInt).contiguous();
  const int64_t rows = tokens.size(0), length = tokens.size(1);
  const int32_t* t = tokens.data_ptr<int32_t>();
  batch->loss_weight = batch->loss_mask.clone().contiguous();
  float* mask = batch->loss_weight.data_ptr<float>();  // (B, L-1): target t+1 at index t
  for (int64_t b = 0; b < rows; ++b) {
    const int32_t* row = t + b * length;
    const int64_t filled = corpus.format ? lengths[b] : length;
    if (answer_weight != 1.0) {
      const std::vector<std::pair<int64_t, int64_t>> answers =
          corpus.format ? data::FindRetrievalAnswers(*corpus.format, row, filled)
                        : data::FindRetrievalAnswers(row, length);
      for (const auto& [begin, end] : answers) {
        // A row's first token is no target (a value cut by the row's start).
        for (int64_t position = std::max<int64_t>(begin, 1); position < end; ++position) {
          mask[b * (length - 1) + position - 1] *= static_cast<float>(answer_weight);
        }
      }
    }
    if (action_weight != 1.0) {
      // A packed row may start inside a transcript: its first turn's roles are read as context
      // until the next marker, which only leaves those few tokens unweighted.
      const std::vector<transcript::Role> roles = transcript::ReadRoles(
          corpus.format.get(), std::span<const int32_t>(row, static_cast<size_t>(filled)));
      for (int64_t position = 1; position < filled; ++position) {
        if (transcript::IsAction(roles[position])) {
          mask[b * (length - 1) + position - 1] *= static_cast<float>(action_weight);
        }
      }
    }
  }
}

Status AppendLine(const std::string& path, const std::string& line) {
  std::ofstream out(path, std::ios::app);
  out << line << "\n";
  return out ? Status::Ok() : Status::IoError("cannot append to " + path);
}

}  // namespace

Result<CorpusFormat> LoadCorpusFormat(const ModelConfig& model) {
  CorpusFormat corpus;
  if (!model.tokenizer.enabled()) return corpus;
  STRIDER_ASSIGN_OR_RETURN(corpus.format, tokenizer::LoadChatFormat(model.tokenizer));
  STRIDER_ASSIGN_OR_RETURN(const tokenizer::DocumentMarkers markers,
                           tokenizer::ReadDocumentMarkers(*corpus.format));
  corpus.begin_of_text = markers.begin_of_text;
  corpus.end_of_text = markers.end_of_text;
  corpus.id_space = data::IdSpace(corpus.format.get());
  if (corpus.format->vocabulary_size() > model.vocabulary) {
    return Status::InvalidArgument(
        "model " + model.name + " has " + std::to_string(model.vocabulary) +
        " ids, fewer than its tokenizer " + model.tokenizer.file + "'s " +
        std::to_string(corpus.format->vocabulary_size()));
  }
  return corpus;
}

Result<RetrievalEvaluation> EvaluateRetrieval(const Model& model, const PretrainConfig& config,
                                              const CorpusFormat& corpus, int64_t context,
                                              int64_t documents) {
  data::GeneratorOptions generator = GeneratorOptionsFor(config, corpus, context);
  generator.min_length = 0;  // exactly `context` tokens (a model's format: at most)
  // Disjoint from training's seeds.
  const uint64_t seed = config.trainer.seed * 1000003ull + 0x5EED0E7A1ull;
  RetrievalEvaluation result;
  result.context = context;
  double loss_sum = 0;
  int64_t targets = 0, correct_queries = 0, answer_tokens = 0, correct_tokens = 0;
  for (int64_t first = 0; first < documents; first += config.eval_batch) {
    const int64_t count = std::min(config.eval_batch, documents - first);
    std::vector<data::GeneratedDocument> docs;
    std::vector<std::vector<int32_t>> sequences;
    std::vector<int64_t> lengths;
    for (int64_t i = 0; i < count; ++i) {
      docs.push_back(data::Generate(data::GeneratorKind::kRetrieval, generator, seed, first + i));
      sequences.push_back(docs.back().tokens);
      const int64_t size = static_cast<int64_t>(sequences.back().size());
      if (corpus.format ? size > context : size != context) {
        return Status::Internal("retrieval document of " + std::to_string(size) +
                                " tokens for context " + std::to_string(context));
      }
      lengths.push_back(size);
      sequences.back().resize(context, corpus.end_of_text);
    }
    STRIDER_ASSIGN_OR_RETURN(TokenBatch batch,
                             MakeCorpusBatch(sequences, lengths, corpus, config.model));
    LossOptions options;
    options.path = TrainingPath::kInference;
    options.chunk_tokens = config.eval_chunk_tokens;
    options.backward = false;
    options.keep_predictions = true;
    STRIDER_ASSIGN_OR_RETURN(LossResult loss, LanguageModelLoss(model, batch, options));
    loss_sum += loss.loss * loss.targets;
    targets += loss.targets;
    at::Tensor predictions = loss.predictions.contiguous();
    const int64_t* p = predictions.data_ptr<int64_t>();
    for (int64_t b = 0; b < count; ++b) {
      for (const auto& [begin, end] : docs[b].answers) {
        bool all = true;
        for (int64_t position = begin; position < end; ++position) {
          const bool right = p[b * (context - 1) + position - 1] == sequences[b][position];
          all = all && right;
          correct_tokens += right;
          ++answer_tokens;
        }
        correct_queries += all;
        ++result.queries;
      }
    }
  }
  result.loss = loss_sum / std::max<int64_t>(1, targets);
  result.retrieval_accuracy = static_cast<double>(correct_queries) / std::max<int64_t>(1, result.queries);
  result.answer_token_accuracy =
      static_cast<double>(correct_tokens) / std::max<int64_t>(1, answer_tokens);
  result.correct = correct_queries;
  if (result.queries > 0) {
    // Wilson score interval at z = 1.96: unlike the normal approximation it stays inside [0, 1]
    // and keeps its coverage near 90-100%, where this accuracy lives.
    const double z = 1.959963984540054, z2 = z * z;
    const double n = static_cast<double>(result.queries);
    const double p = result.retrieval_accuracy;
    const double denominator = 1 + z2 / n;
    const double centre = (p + z2 / (2 * n)) / denominator;
    const double half = z / denominator * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n));
    result.ci_low = correct_queries == 0 ? 0.0 : std::max(0.0, centre - half);
    result.ci_high = correct_queries == result.queries ? 1.0 : std::min(1.0, centre + half);
  }
  return result;
}

Result<std::vector<StageSummary>> RunPretraining(const PretrainConfig& config,
                                                 const PretrainOptions& options) {
  // The corpus, its padding and loss weights, and the evaluation are in the model's ids.
  STRIDER_ASSIGN_OR_RETURN(const CorpusFormat corpus, LoadCorpusFormat(config.model));
  ConfigureRuntime(config.threads > 0 ? config.threads : config.model.threads);
  STRIDER_ASSIGN_OR_RETURN(RunDirectory run,
                           RunDirectory::Open(options.run_dir, "pretrain", options.bar));
  Progress& progress = run.metrics();
  const std::string eval_path = options.run_dir + "/eval.jsonl";

  // Where to start: a fresh model, or a checkpoint.
  int64_t first_stage = 0;
  int64_t resume_step = 0, resume_position = 0, resume_stage_tokens = 0, total_tokens = 0;
  std::string start_checkpoint;
  if (!options.resume.empty()) {
    STRIDER_ASSIGN_OR_RETURN(CheckpointState state,
                             run.ReadResumeState(options.resume, config.model.name));
    const PretrainCheckpoint& at = state.pretrain;
    if (at.stage_index >= static_cast<int64_t>(config.stages.size()) ||
        config.stages[at.stage_index].name != at.stage) {
      return Status::InvalidArgument("checkpoint " + options.resume + " is from stage '" +
                                     at.stage + "', which this config does not have there");
    }
    start_checkpoint = options.resume;
    total_tokens = state.total_tokens;
    if (at.stage_complete) {
      first_stage = at.stage_index + 1;
    } else {
      first_stage = at.stage_index;
      resume_step = state.step;
      resume_position = at.data_position;
      resume_stage_tokens = at.stage_tokens;
    }
  }
  const int64_t last_stage =
      options.stages >= 0 ? std::min<int64_t>(options.stages, config.stages.size())
                          : static_cast<int64_t>(config.stages.size());

  std::vector<StageSummary> summaries;
  for (int64_t k = first_stage; k < last_stage; ++k) {
    const PretrainStage& stage = config.stages[k];
    // The stage starts from a checkpoint on disk (the previous stage's final one, or the resume
    // point), never from memory, so what a stage starts from is exactly what was saved.
    std::string from = start_checkpoint;
    if (k > first_stage || (from.empty() && k > 0)) {
      from = run.CheckpointPath(config.stages[k - 1].name + "/final");
    }
    const bool mid_stage = k == first_stage && resume_step > 0;
    start_checkpoint.clear();

    const std::vector<StagePart> parts = StageParts(stage, options.max_steps_per_stage);
    int64_t step = mid_stage ? resume_step : 0;
    int64_t stage_tokens = mid_stage ? resume_stage_tokens : 0;
    const int64_t steps = parts.back().first_step + parts.back().steps;
    int64_t budget = 0;
    for (const StagePart& part : parts) budget += part.steps * part.rows * part.context;
    // The packer of the part being trained; a new one (its own shards and seed) at each part.
    std::unique_ptr<data::Packer> packer;
    size_t packer_part = parts.size();
    auto open_part = [&](size_t p, int64_t skip_to) -> Status {
      STRIDER_ASSIGN_OR_RETURN(std::vector<data::DataSource> sources,
                               PrepareStageData(config, corpus, k, parts[p], options.run_dir));
      const uint64_t seed = config.trainer.seed * 7919 + k + (parts[p].phase + 1) * 104729;
      STRIDER_ASSIGN_OR_RETURN(
          packer, data::Packer::Create(std::move(sources), parts[p].context, seed,
                                       corpus.format ? corpus.end_of_text : token::kPad));
      if (skip_to > 0) packer->SkipTo(skip_to);
      packer_part = p;
      return Status::Ok();
    };
    STRIDER_RETURN_IF_ERROR(open_part(PartOf(parts, step), mid_stage ? resume_position : 0));
    const TrainerOptions trainer_options =
        MakeTrainerOptions(config.trainer, StageSchedule(config, stage, steps));
    STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                             Trainer::Create(config.model, trainer_options, from));
    // The passes run the compute model (the bf16 copy in bfloat16); the optimiser and
    // checkpoints the masters.
    Model& model = trainer->compute_model();
    LossOptions loss_options;
    loss_options.path =
        stage.paths == "inference" ? TrainingPath::kInference : TrainingPath::kTraining;
    loss_options.chunk_tokens = stage.chunk_tokens;
    loss_options.truncated = stage.backprop == "truncated";
    loss_options.record_routing = config.trainer.balance;

    StageSummary summary;
    summary.stage = stage.name;
    std::vector<double> losses;
    const auto started = std::chrono::steady_clock::now();
    int64_t tokens_this_run = 0;
    auto checkpoint = [&](const std::string& name, bool complete) {
      CheckpointState state;
      state.model = config.model.name;
      state.seed = config.trainer.seed;
      state.step = step;
      state.total_tokens = total_tokens;
      state.pretrain.stage = stage.name;
      state.pretrain.stage_index = k;
      state.pretrain.stage_complete = complete;
      state.pretrain.stage_tokens = stage_tokens;
      // The position in the part `step` runs in: 0 when that part has not started yet.
      state.pretrain.data_position = PartOf(parts, step) == packer_part ? packer->position() : 0;
      return run.WriteCheckpoint(*trainer, stage.name + "/" + name, state);
    };
    for (; step < steps; ++step) {
      const size_t part = PartOf(parts, step);
      if (part != packer_part) STRIDER_RETURN_IF_ERROR(open_part(part, 0));
      const int64_t rows = parts[packer_part].rows;
      const int64_t context = parts[packer_part].context;
      std::vector<std::vector<int32_t>> sequences;
      std::vector<int64_t> filled;
      for (int64_t r = 0; r < rows; ++r) {
        sequences.push_back(packer->Next());
        filled.push_back(packer->filled());
      }
      STRIDER_ASSIGN_OR_RETURN(TokenBatch batch,
                               MakeCorpusBatch(sequences, filled, corpus, config.model));
      WeightLoss(&batch, corpus, filled, config.retrieval_answer_weight,
                 stage.action_weight > 0 ? stage.action_weight : config.tool_use_action_weight);
      at::Tensor real_positions;
      if (config.trainer.balance) {
        STRIDER_ASSIGN_OR_RETURN(real_positions, RealPositions(batch, filled, corpus));
      }
      if (config.trainer.balance && config.trainer.balance_prepass) {
        LossOptions prepass = loss_options;
        prepass.backward = false;
        prepass.record_routing = true;
        STRIDER_ASSIGN_OR_RETURN(LossResult scores, LanguageModelLoss(model, batch, prepass));
        STRIDER_ASSIGN_OR_RETURN(RoutingRecord real,
                                 RoutingAtPositions(scores.routing, real_positions));
        STRIDER_RETURN_IF_ERROR(trainer->FitRoutingBalance(real, config.balance_prepass_sweeps));
      }
      trainer->ZeroGrad();
      STRIDER_ASSIGN_OR_RETURN(LossResult loss, LanguageModelLoss(model, batch, loss_options));
      STRIDER_RETURN_IF_ERROR(trainer->Step(step).status());
      if (config.trainer.balance) {
        // MaxVio of this step's own choices: made with the biases of the steps before, or with
        // those fitted to this batch by the prepass.
        STRIDER_ASSIGN_OR_RETURN(RoutingRecord real, RoutingAtPositions(loss.routing, real_positions));
        STRIDER_ASSIGN_OR_RETURN(const double violation, trainer->BalanceRouting(std::move(real)));
        if (step >= config.balance_warmup_steps) {
          summary.max_violation_after_warmup =
              std::max(summary.max_violation_after_warmup, violation);
        }
      }
      stage_tokens += rows * context;
      total_tokens += rows * context;
      tokens_this_run += rows * context;
      losses.push_back(loss.loss);
      ProgressFields fields;
      fields.stage = stage.name;
      fields.step = step + 1;
      fields.steps_total = steps;
      fields.tokens_done = stage_tokens;
      fields.tokens_total = budget;
      fields.loss = loss.loss;
      trainer->Report(&progress, fields, rows * context);
      if (config.checkpoint_every_steps > 0 && (step + 1) % config.checkpoint_every_steps == 0 &&
          step + 1 < steps) {
        ++step;  // the checkpoint records the next step to run
        Status status = checkpoint("latest", false);
        --step;
        STRIDER_RETURN_IF_ERROR(status);
      }
    }
    progress.Finish();
    STRIDER_RETURN_IF_ERROR(checkpoint("final", true));
    summary.steps = static_cast<int64_t>(losses.size());
    summary.tokens = tokens_this_run;
    summary.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (!losses.empty()) {
      const size_t tenth = std::max<size_t>(1, losses.size() / 10);
      double head = 0, tail = 0;
      for (size_t i = 0; i < tenth; ++i) head += losses[i], tail += losses[losses.size() - 1 - i];
      summary.first_loss = head / tenth;
      summary.last_loss = tail / tenth;
    }
    nlohmann::json line = {{"event", "stage_end"},
                           {"stage", stage.name},
                           {"steps", summary.steps},
                           {"tokens", summary.tokens},
                           {"seconds", summary.seconds},
                           {"first_loss", summary.first_loss},
                           {"last_loss", summary.last_loss},
                           {"max_violation_after_warmup", summary.max_violation_after_warmup}};
    progress.WriteLine(line.dump());

    if (options.evaluate) {
      for (int64_t j = 0; j <= k; ++j) {
        STRIDER_ASSIGN_OR_RETURN(
            RetrievalEvaluation eval,
            EvaluateRetrieval(model, config, corpus, config.stages[j].context,
                              config.eval_documents));
        nlohmann::json row = {{"stage", stage.name},
                              {"stage_index", k},
                              {"objective", stage.objective},
                              {"context", eval.context},
                              {"loss", eval.loss},
                              {"retrieval_accuracy", eval.retrieval_accuracy},
                              {"answer_token_accuracy", eval.answer_token_accuracy},
                              {"queries", eval.queries},
                              {"correct", eval.correct},
                              {"ci_low", eval.ci_low},
                              {"ci_high", eval.ci_high},
                              {"total_tokens", total_tokens}};
        STRIDER_RETURN_IF_ERROR(AppendLine(eval_path, row.dump()));
      }
    }
    summaries.push_back(summary);
    // The report after every stage, so an interrupted run still has one for what it did.
    STRIDER_RETURN_IF_ERROR(WriteRunReport(options.run_dir).status());
  }
  return summaries;
}

}  // namespace strider
