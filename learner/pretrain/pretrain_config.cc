#include "learner/pretrain/pretrain_config.h"

#include <filesystem>

#include "common/config.h"
#include "envs/registry.h"
#include "learner/optimizer.h"
#include "learner/pretrain/data/generators.h"

namespace strider {
namespace {

void DefaultMixture(PretrainStage& stage) {
  if (!stage.data.empty()) return;
  if (stage.objective == "modality_alignment") {
    stage.data = {{"retrieval", "", 0.5}, {"tool_use", "", 0.3}, {"image_text", "", 0.2}};
  } else if (stage.objective == "long_context_adaptation") {
    stage.data = {{"retrieval", "", 0.7}, {"tool_use", "", 0.3}};
  } else {
    stage.data = {{"retrieval", "", 1.0}};
  }
}

// What the tool_use generator plays must be built in (a data build depends on no other
// process), have a scripted policy, reset with these options (bad values surface here, naming
// the key, not in the middle of a data build) and show no images (transcripts are token-only:
// an image would be dropped silently).
void CheckTranscribable(ConfigReader& env, const envs::EnvironmentConfig& config) {
  const std::string name = "'" + config.name + "'";
  if (!config.library.empty() || !config.command.empty()) {
    return env.Fail("name", "the tool_use generator plays built-in environments only");
  }
  if (!envs::MakeScriptedPolicy(config).ok()) {
    return env.Fail("name", name + " has no scripted policy to play it");
  }
  Result<std::unique_ptr<envs::Environment>> made = envs::MakeEnvironment(config);
  if (!made.ok()) return env.Fail("options", made.status().message());
  Result<envs::Observation> first = (*made)->Reset(0, {});
  (*made)->Close();
  if (!first.ok()) return env.Fail("options", first.status().message());
  if (!first->images.empty()) {
    env.Fail("name", name + " shows images, which tool_use transcripts cannot carry");
  }
}

// A `data:` list of a stage or curriculum phase whose sequences are `context` tokens.
std::vector<DataMixtureEntry> ReadMixture(ConfigReader& section, int64_t context,
                                          const std::string& path) {
  std::vector<DataMixtureEntry> mixture;
  for (ConfigReader d : section.List("data")) {
    DataMixtureEntry entry;
    d.Optional("generator", &entry.generator);
    d.Optional("shards", &entry.shards);
    d.Optional("weight", &entry.weight);
    d.Optional("min_tokens", &entry.min_tokens);
    d.Optional("max_tokens", &entry.max_tokens);
    d.Optional("facts", &entry.facts);
    d.Check(entry.min_tokens >= 0 && entry.max_tokens >= 0 && entry.facts >= 0, "min_tokens",
            "min_tokens, max_tokens and facts must not be negative");
    d.Check(entry.min_tokens == 0 || entry.max_tokens == 0 || entry.min_tokens <= entry.max_tokens,
            "min_tokens", "must not exceed max_tokens");
    d.Check(entry.max_tokens <= context, "max_tokens", "must not exceed the sequence length");
    d.Check((entry.min_tokens == 0 && entry.max_tokens == 0 && entry.facts == 0) ||
                entry.generator == "retrieval",
            "min_tokens", "min_tokens, max_tokens and facts apply to the retrieval generator");
    if (d.Has("flawed_fraction")) {
      d.Optional("flawed_fraction", &entry.flawed_fraction);
      d.Check(entry.generator == "tool_use", "flawed_fraction", "applies to the tool_use generator");
      d.Check(entry.flawed_fraction >= 0 && entry.flawed_fraction <= 1, "flawed_fraction",
              "must be in [0, 1]");
    }
    if (d.Has("env")) {
      d.Check(entry.generator == "tool_use", "env", "applies to the tool_use generator");
      ConfigReader env = d.Section("env");
      Result<envs::EnvironmentConfig> read = envs::ReadEnvironmentConfig(env);
      if (read.ok()) {
        entry.environment = *read;
        CheckTranscribable(env, entry.environment);
      }
    }
    d.Check(entry.generator.empty() != entry.shards.empty(), "generator",
            "give exactly one of generator or shards");
    if (!entry.generator.empty()) {
      Result<data::GeneratorKind> kind = data::ParseGeneratorName(entry.generator);
      d.Check(kind.ok(), "generator", kind.status().message());
    }
    entry.shards = ResolveConfigPath(entry.shards, path);
    d.Check(entry.weight > 0, "weight", "must be positive");
    mixture.push_back(entry);
  }
  return mixture;
}

// Image data must train on the training path: an image's patches must not straddle a chunk.
void CheckMixtureForPaths(ConfigReader& section, const std::string& paths,
                          const std::vector<DataMixtureEntry>& mixture) {
  if (paths != "inference") return;
  for (const DataMixtureEntry& entry : mixture) {
    section.Check(entry.generator != "image_text", "data",
                  "image_text data trains on the training path (images must not straddle chunks)");
  }
}

}  // namespace

Result<std::string> ReadLearnerMode(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromFile(path));
  std::string mode = "pretrain";
  root.Optional("mode", &mode);
  STRIDER_RETURN_IF_ERROR(root.status());
  return mode;
}

Result<PretrainConfig> LoadPretrainConfig(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromFile(path));
  PretrainConfig config;
  config.origin = path;
  std::string mode = "pretrain";
  root.Optional("mode", &mode);
  root.Check(mode == "pretrain", "mode", "this loader reads mode: pretrain configs, got " + mode);
  std::string model_config;
  // The usual mix-up is a model config given for the pretraining config that names one.
  if (!root.Has("model_config") && root.Has("model")) {
    root.Fail("model_config",
              "is required but missing: this is a model config (it has a model: section); "
              "--config takes a pretraining config (configs/pretrain/*.yaml), whose model_config: "
              "names the model config");
  }
  root.Required("model_config", &model_config);
  TrainerConfig& trainer = config.trainer;
  int64_t seed = static_cast<int64_t>(trainer.seed);
  root.Optional("seed", &seed);
  trainer.seed = static_cast<uint64_t>(seed);
  root.Optional("threads", &config.threads);
  // Overrides the model config's device: (where the weights, optimiser state and passes live).
  std::string device;
  root.Optional("device", &device);
  root.Check(device.empty() || ValidDeviceName(device), "device",
             "must be cpu, cuda or cuda:N, got '" + device + "'");
  // float32 or bfloat16 (fp32 masters, gradients and moments, passes on a bf16 copy;
  // docs/cuda.md).
  std::string precision = PrecisionName(trainer.precision);
  root.Optional("precision", &precision);
  if (Result<Precision> parsed = ParsePrecision(precision); parsed.ok()) {
    trainer.precision = *parsed;
  } else {
    root.Fail("precision", parsed.status().message());
  }
  {
    ConfigReader optimizer = root.Section("optimizer");
    ReadAdamWOptions(optimizer, &trainer.optimizer);
    optimizer.Optional("warmup_steps", &config.warmup_steps);
    optimizer.Optional("min_learning_rate_ratio", &config.min_learning_rate_ratio);
    optimizer.Check(config.warmup_steps >= 0, "warmup_steps", "must not be negative");
    optimizer.Check(config.min_learning_rate_ratio >= 0 && config.min_learning_rate_ratio <= 1,
                    "min_learning_rate_ratio", "must be in [0, 1]");
  }
  {
    ConfigReader balance = root.Section("balance");
    balance.Optional("enabled", &trainer.balance);
    balance.Optional("warmup_steps", &config.balance_warmup_steps);
    balance.Optional("max_violation", &config.max_violation);
    balance.Optional("router_learning_rate_scale", &trainer.router_learning_rate_scale);
    balance.Optional("window_steps", &trainer.balance_window_steps);
    balance.Check(trainer.balance_window_steps >= 1, "window_steps", "must be at least 1");
    balance.Optional("prepass", &trainer.balance_prepass);
    balance.Optional("prepass_sweeps", &config.balance_prepass_sweeps);
    balance.Check(config.balance_prepass_sweeps >= 1, "prepass_sweeps", "must be at least 1");
    balance.Check(trainer.router_learning_rate_scale >= 0, "router_learning_rate_scale",
                  "must not be negative");
  }
  {
    ConfigReader retrieval = root.Section("retrieval");
    retrieval.Optional("facts", &config.retrieval_facts);
    retrieval.Check(config.retrieval_facts >= 1, "facts", "must be at least 1");
    retrieval.Optional("key_letters", &config.retrieval_key_letters);
    retrieval.Check(config.retrieval_key_letters == 1 || config.retrieval_key_letters == 2,
                    "key_letters", "must be 1 or 2");
    retrieval.Check(config.retrieval_key_letters == 2 || config.retrieval_facts <= 26, "facts",
                    "at most 26 with one-letter keys (keys of a document are distinct)");
    retrieval.Optional("answer_weight", &config.retrieval_answer_weight);
    retrieval.Check(config.retrieval_answer_weight > 0, "answer_weight", "must be positive");
  }
  {
    ConfigReader tool_use = root.Section("tool_use");
    tool_use.Optional("action_weight", &config.tool_use_action_weight);
    tool_use.Check(config.tool_use_action_weight > 0, "action_weight", "must be positive");
    tool_use.Optional("flawed_fraction", &config.tool_use_flawed_fraction);
    tool_use.Check(config.tool_use_flawed_fraction >= 0 && config.tool_use_flawed_fraction <= 1,
                   "flawed_fraction", "must be in [0, 1]");
    if (tool_use.Has("flaws")) {
      std::vector<std::string> flaws;
      tool_use.Optional("flaws", &flaws);
      config.tool_use_flaws.clear();
      tool_use.Check(!flaws.empty(), "flaws", "must name at least one flaw");
      for (const std::string& name : flaws) {
        Result<data::ToolUseFlaw> flaw = data::ParseToolUseFlaw(name);
        if (!flaw.ok()) {
          tool_use.Fail("flaws", flaw.status().message());
          break;
        }
        config.tool_use_flaws.push_back(*flaw);
      }
    }
  }
  {
    ConfigReader evaluation = root.Section("evaluation");
    evaluation.Optional("documents", &config.eval_documents);
    evaluation.Optional("batch", &config.eval_batch);
    evaluation.Optional("chunk_tokens", &config.eval_chunk_tokens);
    evaluation.Check(config.eval_documents >= 1, "documents", "must be at least 1");
    evaluation.Check(config.eval_batch >= 1, "batch", "must be at least 1");
    evaluation.Check(config.eval_chunk_tokens >= 1, "chunk_tokens", "must be at least 1");
  }
  {
    ConfigReader checkpoint = root.Section("checkpoint");
    checkpoint.Optional("every_steps", &config.checkpoint_every_steps);
  }
  for (ConfigReader s : root.List("stages")) {
    PretrainStage stage;
    s.Required("name", &stage.name);
    s.Required("context", &stage.context);
    s.Required("tokens", &stage.tokens);
    s.Optional("batch_tokens", &stage.batch_tokens);
    s.Required("objective", &stage.objective);
    s.Optional("paths", &stage.paths);
    s.Optional("chunk_tokens", &stage.chunk_tokens);
    s.Optional("backprop", &stage.backprop);
    s.Optional("learning_rate", &stage.learning_rate);
    s.Optional("warmup_steps", &stage.warmup_steps);
    if (s.Has("action_weight")) {
      s.Optional("action_weight", &stage.action_weight);
      s.Check(stage.action_weight > 0, "action_weight", "must be positive");
    }
    stage.data = ReadMixture(s, stage.context, path);
    for (ConfigReader c : s.List("curriculum")) {
      CurriculumPhase phase;
      c.Required("context", &phase.context);
      c.Required("tokens", &phase.tokens);
      c.Check(phase.context >= 16 && phase.context <= stage.context, "context",
              "must be at least 16 tokens and at most the stage's context");
      c.Check(phase.tokens > 0, "tokens", "must be positive");
      phase.data = ReadMixture(c, phase.context, path);
      c.Check(!phase.data.empty(), "data", "a curriculum phase needs its data mixture");
      CheckMixtureForPaths(c, stage.paths, phase.data);
      stage.curriculum.push_back(phase);
    }
    s.Check(!stage.name.empty() && stage.name.find('/') == std::string::npos, "name",
            "must be a non-empty name without '/'");
    s.Check(stage.context >= 16, "context", "must be at least 16 tokens");
    s.Check(stage.tokens > 0, "tokens", "must be positive");
    s.Check(stage.batch_tokens > 0, "batch_tokens", "must be positive");
    s.Check(stage.objective == "modality_alignment" ||
                stage.objective == "long_context_adaptation" ||
                stage.objective == "long_range_reasoning",
            "objective",
            "must be modality_alignment, long_context_adaptation or long_range_reasoning");
    s.Check(stage.paths == "training" || stage.paths == "inference", "paths",
            "must be training or inference");
    s.Check(stage.backprop == "full" || stage.backprop == "truncated", "backprop",
            "must be full or truncated");
    s.Check(stage.chunk_tokens >= 1, "chunk_tokens", "must be positive");
    DefaultMixture(stage);
    CheckMixtureForPaths(s, stage.paths, stage.data);
    config.stages.push_back(stage);
  }
  root.Check(!config.stages.empty(), "stages", "at least one stage is required");
  for (size_t i = 0; i < config.stages.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      root.Check(config.stages[i].name != config.stages[j].name, "stages",
                 "stage names must be unique ('" + config.stages[i].name + "' repeats)");
    }
  }
  STRIDER_RETURN_IF_ERROR(root.Finish());
  config.model_config_path = ResolveConfigPath(model_config, path);
  STRIDER_ASSIGN_OR_RETURN(config.model, LoadModelConfig(config.model_config_path));
  if (!device.empty()) config.model.device = device;
  for (const PretrainStage& stage : config.stages) {
    // Image documents are byte-format placeholder runs the model embeds by their id: in a
    // model's own vocabulary that id is an ordinary token (docs/tokenizers.md).
    std::vector<const std::vector<DataMixtureEntry>*> mixtures = {&stage.data};
    for (const CurriculumPhase& phase : stage.curriculum) mixtures.push_back(&phase.data);
    for (const std::vector<DataMixtureEntry>* mixture : mixtures) {
      for (const DataMixtureEntry& entry : *mixture) {
        if (entry.generator != "image_text" || !config.model.tokenizer.enabled()) continue;
        return Status::InvalidArgument(
            path + ": stage '" + stage.name +
            "' draws on the image_text generator, whose image placeholders are byte-format ids, "
            "but model " + config.model.name + " names its own tokenizer (" +
            config.model.tokenizer.file +
            "); give the stage a data: list without image_text (a modality_alignment stage "
            "without one has it by default)");
      }
    }
    if (stage.context > config.model.context) {
      return Status::InvalidArgument(path + ": stage '" + stage.name + "' context " +
                                     std::to_string(stage.context) + " exceeds model.context " +
                                     std::to_string(config.model.context));
    }
  }
  return config;
}

}  // namespace strider
