// `strider pretrain`, `strider learner` (mode: pretrain here; mode: rl in rl_commands.cc) and
// `strider data build` (docs/design.md#pretraining-mode and #command-line).
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/device_flag.h"
#include "common/model/model.h"
#include "common/model/torch_status.h"
#include "learner/pretrain/data/builder.h"
#include "learner/pretrain/data/generators.h"
#include "learner/pretrain/pretrain.h"
#include "learner/pretrain/pretrain_config.h"

namespace strider::cli {
namespace {

struct PretrainFlags {
  std::string config;
  std::string run_dir = "runs/pretrain";
  std::string resume;
  int64_t stages = -1;
  int64_t max_steps = -1;
  std::string device;  // empty: the config's device:
};

int RunPretrain(const PretrainFlags& flags) {
  Result<PretrainConfig> config = LoadPretrainConfig(flags.config);
  if (!config.ok()) return ReportError(config.status());
  // Before the run directory: a device this host lacks is a usage error.
  if (Status s = ApplyDeviceFlag(flags.device, flags.config, &config->model.device); !s.ok()) {
    return ReportError(s);
  }
  PretrainOptions options;
  options.run_dir = flags.run_dir;
  options.resume = flags.resume;
  options.stages = flags.stages;
  options.max_steps_per_stage = flags.max_steps;
  model::OutOfMemoryAdvice advice("the stages' chunk_tokens or batch_tokens in " + flags.config);
  Result<std::vector<StageSummary>> summaries = RunPretraining(*config, options);
  if (!summaries.ok()) return ReportError(summaries.status());
  for (const StageSummary& s : *summaries) {
    nlohmann::ordered_json json = {{"stage", s.stage},
                                   {"steps", s.steps},
                                   {"tokens", s.tokens},
                                   {"seconds", s.seconds},
                                   {"first_loss", s.first_loss},
                                   {"last_loss", s.last_loss},
                                   {"max_violation_after_warmup", s.max_violation_after_warmup}};
    std::cout << json.dump() << std::endl;
  }
  return kExitOk;
}

void AddPretrainFlags(CLI::App* command, PretrainFlags& flags) {
  command->add_option("--config", flags.config, "Pretraining config (YAML, configs/pretrain/)")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--run-dir", flags.run_dir,
                      "Run directory: data, checkpoints, metrics.jsonl, eval.jsonl");
  command->add_option("--resume", flags.resume, "Checkpoint directory to resume from");
  command->add_option("--stages", flags.stages, "Run only the first N stages");
  command->add_option("--max-steps", flags.max_steps, "Cap every stage at N steps (smoke runs)");
  command->add_option("--device", flags.device,
                      "cpu, cuda or cuda:N for the weights and training (overrides device:)");
}

}  // namespace

void AddPretrainCommands(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<PretrainFlags>();
  CLI::App* pretrain = app.add_subcommand(
      "pretrain", "Staged pretraining: runs the config's stages in order, evaluates each");
  AddPretrainFlags(pretrain, *flags);
  pretrain->callback([flags, &exit_code] { exit_code = RunPretrain(*flags); });

  auto learner_flags = std::make_shared<PretrainFlags>();
  auto rl_flags = std::make_shared<RlLearnerFlags>();
  CLI::App* learner = app.add_subcommand(
      "learner",
      "One learner: runs the config's mode. mode: pretrain trains the staged curriculum; mode: rl "
      "samples trajectories from replay, updates the policy and publishes weights to actors");
  learner->add_option("--config", learner_flags->config,
                      "Learner config (YAML): configs/pretrain/*.yaml or configs/rl/*.yaml")
      ->required()
      ->check(CLI::ExistingFile);
  learner->add_option("--run-dir", learner_flags->run_dir,
                      "Run directory: checkpoints, metrics.jsonl (default runs/pretrain or runs/rl)");
  learner->add_option("--resume", learner_flags->resume, "Checkpoint directory to resume from");
  learner->add_option("--stages", learner_flags->stages, "mode pretrain: run only the first N stages");
  learner->add_option("--max-steps", learner_flags->max_steps,
                      "pretrain: cap every stage at N steps; rl: stop after N steps");
  learner->add_option("--device", learner_flags->device,
                      "cpu, cuda or cuda:N for the weights and training (overrides device:)");
  learner->add_option("--replay", rl_flags->replay,
                      "mode rl: the replay server's learner endpoint (overrides replay.endpoint)");
  learner->add_option("--publish", rl_flags->publish,
                      "mode rl: bind the weight publisher here (overrides publish.endpoint)");
  learner->add_option("--init", rl_flags->init,
                      "mode rl: starting weights, safetensors (overrides init; also the reference "
                      "policy of scoring.reference: initial)")
      ->check(CLI::ExistingFile);
  learner->add_option("--rank", rl_flags->rank,
                      "mode rl: this process's rank among --world-size data-parallel learner "
                      "ranks (overrides distributed.rank)");
  learner->add_option("--world-size", rl_flags->world_size,
                      "mode rl: data-parallel learner ranks (overrides distributed.world_size)");
  learner->add_option("--rendezvous", rl_flags->rendezvous,
                      "mode rl: HOST:PORT where rank 0 hosts the ranks' TCPStore (overrides "
                      "distributed.rendezvous)");
  learner->add_option("--http", rl_flags->http,
                      "mode rl: serve /metrics (Prometheus) and /status (JSON) on HOST:PORT "
                      "(0: any port)");
  learner->add_option("--dump-step", rl_flags->dump_steps,
                      "mode rl: write learner step N's inputs, per-token terms and totals to "
                      "--dump-dir (N,M,... or repeated for several steps)");
  learner->add_option("--dump-dir", rl_flags->dump_dir,
                      "mode rl: where --dump-step writes step-N.jsonl (created if missing)");
  learner_flags->run_dir.clear();
  learner->callback([learner_flags, rl_flags, &exit_code] {
    Result<std::string> mode = ReadLearnerMode(learner_flags->config);
    if (!mode.ok()) {
      exit_code = ReportError(mode.status());
    } else if (*mode == "pretrain") {
      if (!rl_flags->http.empty()) {
        exit_code = ReportError(Status::InvalidArgument(
            "--http is for mode rl; " + learner_flags->config +
            " has mode: pretrain (its progress is in RUN_DIR/metrics.jsonl)"));
        return;
      }
      if (!rl_flags->init.empty()) {
        exit_code = ReportError(Status::InvalidArgument(
            "--init is for mode rl; " + learner_flags->config + " has mode: pretrain"));
        return;
      }
      if (!rl_flags->dump_steps.empty() || !rl_flags->dump_dir.empty()) {
        exit_code = ReportError(Status::InvalidArgument(
            "--dump-step and --dump-dir are for mode rl; " + learner_flags->config +
            " has mode: pretrain"));
        return;
      }
      if (rl_flags->rank >= 0 || rl_flags->world_size >= 0 || !rl_flags->rendezvous.empty()) {
        exit_code = ReportError(Status::InvalidArgument(
            "--rank, --world-size and --rendezvous are for mode rl; " + learner_flags->config +
            " has mode: pretrain"));
        return;
      }
      PretrainFlags flags = *learner_flags;
      if (flags.run_dir.empty()) flags.run_dir = "runs/pretrain";
      exit_code = RunPretrain(flags);
    } else if (*mode == "rl") {
      if (learner_flags->stages >= 0) {
        exit_code = ReportError(
            Status::InvalidArgument("--stages is for mode pretrain; " + learner_flags->config +
                                    " has mode: rl"));
        return;
      }
      RlLearnerFlags flags = *rl_flags;
      flags.config = learner_flags->config;
      flags.run_dir = learner_flags->run_dir;
      flags.resume = learner_flags->resume;
      flags.max_steps = learner_flags->max_steps;
      flags.device = learner_flags->device;
      exit_code = RunRlLearnerCommand(flags);
    } else {
      exit_code = ReportError(Status::InvalidArgument(
          learner_flags->config + ": mode: must be pretrain or rl, got '" + *mode + "'"));
    }
  });

  struct DataFlags {
    std::string out;
    std::vector<std::string> text;
    std::string generator;
    int64_t documents = 0;
    int64_t tokens = 0;
    int64_t length = 1024;
    int64_t min_length = 0;
    int64_t facts = 4;
    int64_t key_letters = 2;
    double flawed = 0.2;
    int64_t image_size = 32;
    int64_t patch_size = 4;
    int64_t seed = 1;
    int64_t shard_tokens = 16 << 20;
    std::string model;
  };
  auto data_flags = std::make_shared<DataFlags>();
  CLI::App* data = app.add_subcommand("data", "Pretraining data tools");
  data->require_subcommand(1);
  CLI::App* build = data->add_subcommand(
      "build", "Write token shards from UTF-8 text files (one document each) or a generator");
  build->add_option("--out", data_flags->out, "Output directory (must hold no shards)")->required();
  CLI::Option* text = build->add_option("--text", data_flags->text, "UTF-8 text files")
                          ->check(CLI::ExistingFile);
  CLI::Option* generator = build->add_option("--generator", data_flags->generator,
                                             "Generator: retrieval, tool_use or image_text");
  text->excludes(generator);
  build->add_option("--documents", data_flags->documents, "Documents to generate");
  build->add_option("--tokens", data_flags->tokens, "Generate until this many tokens");
  build->add_option("--length", data_flags->length, "For retrieval: document length in tokens");
  build->add_option("--min-length", data_flags->min_length,
                    "For retrieval: draw lengths uniformly from [min-length, length]");
  build->add_option("--facts", data_flags->facts, "For retrieval: facts per document");
  build
      ->add_option("--key-letters", data_flags->key_letters,
                   "For retrieval: letters per key (1 or 2)")
      ->check(CLI::Range(1, 2));
  build->add_option("--flawed", data_flags->flawed, "For tool_use: share of flawed transcripts");
  build->add_option("--image-size", data_flags->image_size, "For image_text: image side in pixels");
  build->add_option("--patch-size", data_flags->patch_size, "For image_text: model patch side");
  build->add_option("--seed", data_flags->seed, "Generator seed");
  build->add_option("--shard-tokens", data_flags->shard_tokens, "Tokens per shard file");
  build
      ->add_option("--model", data_flags->model,
                   "Model config (YAML) whose tokenizer writes the ids (docs/tokenizers.md); "
                   "default: the byte format")
      ->check(CLI::ExistingFile);
  build->callback([data_flags, &exit_code] {
    const DataFlags& f = *data_flags;
    data::BuildOptions options;
    options.shard_tokens = f.shard_tokens;
    CorpusFormat corpus;
    if (!f.model.empty()) {
      Result<ModelConfig> model = LoadModelConfig(f.model);
      Result<CorpusFormat> loaded =
          model.ok() ? LoadCorpusFormat(*model) : Result<CorpusFormat>(model.status());
      if (!loaded.ok()) {
        exit_code = ReportError(loaded.status());
        return;
      }
      corpus = *loaded;
    }
    options.format = corpus.format;
    options.begin_of_text = corpus.begin_of_text;
    options.end_of_text = corpus.end_of_text;
    Result<data::BuildSummary> summary = Status::InvalidArgument("give --text or --generator");
    if (!f.text.empty()) {
      summary = data::BuildTextShards(f.text, f.out, options);
    } else if (!f.generator.empty()) {
      Result<data::GeneratorKind> kind = data::ParseGeneratorName(f.generator);
      if (!kind.ok()) {
        exit_code = ReportError(kind.status());
        return;
      }
      data::GeneratorOptions generator;
      generator.length = f.length;
      generator.min_length = f.min_length;
      generator.facts = f.facts;
      generator.key_letters = f.key_letters;
      generator.flawed_fraction = f.flawed;
      generator.image_size = f.image_size;
      generator.patch_size = f.patch_size;
      generator.format = corpus.format;
      generator.begin_of_text = corpus.begin_of_text;
      generator.end_of_text = corpus.end_of_text;
      summary = data::BuildGeneratedShards(*kind, generator, static_cast<uint64_t>(f.seed),
                                           f.documents, f.tokens, f.out, options);
    }
    if (!summary.ok()) {
      exit_code = ReportError(summary.status());
      return;
    }
    nlohmann::ordered_json json = {{"out", f.out},
                                   {"shards", summary->shards},
                                   {"documents", summary->documents},
                                   {"tokens", summary->tokens}};
    std::cout << json.dump() << std::endl;
    exit_code = kExitOk;
  });
}

}  // namespace strider::cli
