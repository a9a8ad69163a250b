#include "learner/rl/rl_config.h"

#include "common/config.h"
#include "common/transport/curve.h"

namespace strider::rl {

Result<Rendezvous> ParseRendezvous(const std::string& text) {
  const size_t colon = text.rfind(':');
  auto bad = [&] {
    return Status::InvalidArgument("rendezvous '" + text +
                                   "': expected HOST:PORT with a port in [1, 65535]");
  };
  if (colon == std::string::npos || colon == 0) return bad();
  Rendezvous out;
  out.host = text.substr(0, colon);
  if (out.host.front() == '[') {
    if (out.host.size() < 3 || out.host.back() != ']') return bad();
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  const std::string port = text.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) {
    return bad();
  }
  const unsigned long value = std::stoul(port);
  if (value < 1 || value > 65535) return bad();
  out.port = static_cast<uint16_t>(value);
  return out;
}

bool UsesImplicitRewards(const RlLearnerConfig& config) {
  return config.objective.advantages.estimator == "implicit_process" ||
         config.reward.implicit_weight != 0;
}

namespace {

// The sections the Trainer applies: `optimizer:` and the router keys of `balance:`.
void ReadTrainerSections(ConfigReader& root, TrainerConfig* trainer) {
  ConfigReader optimizer = root.Section("optimizer");
  ReadAdamWOptions(optimizer, &trainer->optimizer);
  optimizer.Check(trainer->optimizer.learning_rate > 0, "learning_rate", "must be positive");
  ConfigReader balance = root.Section("balance");
  balance.Optional("enabled", &trainer->balance);
  balance.Optional("router_learning_rate_scale", &trainer->router_learning_rate_scale);
  balance.Check(trainer->router_learning_rate_scale >= 0, "router_learning_rate_scale",
                "must not be negative");
}

void ReadReplay(ConfigReader replay, RlReplayConfig* r) {
  replay.Optional("endpoint", &r->endpoint);
  replay.Optional("table", &r->table);
  replay.Optional("learner_id", &r->learner_id);
  replay.Check(!r->learner_id.empty(), "learner_id", "must not be empty");
  replay.Optional("units_per_step", &r->units_per_step);
  replay.Check(r->units_per_step >= 1 && r->units_per_step <= 65535, "units_per_step",
               "must be in [1, 65535]");
  replay.Optional("sample_timeout_s", &r->sample_timeout_s);
  replay.Check(r->sample_timeout_s > 0, "sample_timeout_s", "must be positive");
  ConfigReader auth = replay.Section("auth");
  r->auth = transport::ReadClientAuth(auth);
}

void ReadPublish(ConfigReader publish, RlPublishConfig* p) {
  publish.Optional("endpoint", &p->endpoint);
  publish.Optional("every_steps", &p->every_steps);
  publish.Check(p->every_steps >= 1, "every_steps", "must be at least 1");
  publish.Optional("chunk_bytes", &p->chunk_bytes);
  publish.Check(p->chunk_bytes >= 1024 && p->chunk_bytes <= (int64_t{1} << 30), "chunk_bytes",
                "must be in [1024, 2^30]");
  publish.Optional("keep_versions", &p->keep_versions);
  publish.Check(p->keep_versions >= 1, "keep_versions", "must be at least 1");
  ConfigReader auth = publish.Section("auth");
  p->auth = transport::ReadServerAuth(auth);
}

void ReadTrain(ConfigReader train, RlTrainConfig* t) {
  train.Optional("steps", &t->steps);
  train.Check(t->steps >= 0, "steps", "must not be negative");
  train.Optional("ppo_epochs", &t->ppo_epochs);
  train.Check(t->ppo_epochs >= 1, "ppo_epochs", "must be at least 1");
  train.Optional("minibatches", &t->minibatches);
  train.Check(t->minibatches >= 1, "minibatches", "must be at least 1");
  train.Optional("chunk_tokens", &t->chunk_tokens);
  train.Check(t->chunk_tokens >= 1, "chunk_tokens", "must be at least 1");
  train.Optional("backprop", &t->backprop);
  train.Check(t->backprop == "full" || t->backprop == "truncated", "backprop",
              "must be full or truncated, got '" + t->backprop + "'");
  train.Optional("sync", &t->sync);
  train.Optional("warmup_steps", &t->warmup_steps);
  train.Check(t->warmup_steps >= 0, "warmup_steps", "must not be negative");
  train.Optional("min_learning_rate_ratio", &t->min_learning_rate_ratio);
  train.Check(t->min_learning_rate_ratio >= 0 && t->min_learning_rate_ratio <= 1,
              "min_learning_rate_ratio", "must be in [0, 1]");
}

void ReadScoring(ConfigReader scoring, RlScoringConfig* s) {
  scoring.Optional("replay_routing", &s->replay_routing);
  scoring.Optional("mismatch_threshold", &s->mismatch_threshold);
  scoring.Check(s->mismatch_threshold > 0, "mismatch_threshold", "must be positive");
  scoring.Optional("reference", &s->reference);
  scoring.Check(!s->reference.empty(), "reference", "must be initial, none or a safetensors file");
}

// `reward:`: the shaping and the learned process reward model it may use.
void ReadReward(ConfigReader reward, RlLearnerConfig* config) {
  Result<reward::ShapingConfig> shaping = reward::ReadShapingConfig(reward);
  if (shaping.ok()) config->reward = *shaping;
  reward.Optional("process_model", &config->process_model);
  reward.Check(!config->reward.UsesProcessModel() || !config->process_model.empty(),
               "process_model",
               "is required with process_model_weight or outcome_gate: model_steps: a "
               "directory of strider reward train-prm");
}

void ReadImplicitPrm(ConfigReader section, ImplicitPrmConfig* c) {
  section.Optional("beta", &c->beta);
  section.Check(c->beta > 0 && c->beta < 1e3, "beta", "must be positive (PRIME's is 0.05)");
  section.Optional("init", &c->init);
  section.Optional("normalize", &c->normalize);
  section.Check(c->normalize == "batch" || c->normalize == "none", "normalize",
                "must be batch or none, got '" + c->normalize + "'");
  ConfigReader optimizer = section.Section("optimizer");
  ReadAdamWOptions(optimizer, &c->optimizer);
  optimizer.Check(c->optimizer.learning_rate > 0, "learning_rate", "must be positive");
}

void ReadDistributed(ConfigReader distributed, RlDistributedConfig* d) {
  distributed.Optional("world_size", &d->world_size);
  distributed.Check(d->world_size >= 1 && d->world_size <= 65536, "world_size",
                    "must be in [1, 65536]");
  distributed.Optional("rank", &d->rank);
  distributed.Check(d->rank >= 0 && d->rank < d->world_size, "rank",
                    "must be in [0, world_size)");
  distributed.Optional("rendezvous", &d->rendezvous);
  distributed.Check(ParseRendezvous(d->rendezvous).ok(), "rendezvous",
                    "must be HOST:PORT with a port in [1, 65535]");
  distributed.Optional("interface", &d->interface);
  distributed.Optional("timeout_s", &d->timeout_s);
  distributed.Check(d->timeout_s > 0, "timeout_s", "must be positive");
  distributed.Optional("expert_parallel", &d->expert_parallel);
  distributed.Optional("bucket_mb", &d->bucket_mb);
  distributed.Check(d->bucket_mb > 0 && d->bucket_mb <= 4096, "bucket_mb",
                    "must be in (0, 4096]");
  distributed.Optional("collectives", &d->collectives);
  distributed.Check(d->collectives == "auto" || d->collectives == "nccl" ||
                        d->collectives == "gloo",
                    "collectives", "must be auto, nccl or gloo");
}

// Settings of one section that another section's make wrong.
void CheckAcrossSections(ConfigReader& root, const RlLearnerConfig& config) {
  const PolicyLossOptions& loss = config.objective.loss;
  if (loss.kl_coef > 0 || UsesImplicitRewards(config)) {
    root.Check(config.scoring.reference != "none", "scoring.reference",
               "is none, but the KL penalty or implicit process rewards need a reference policy");
  }
  if (UsesImplicitRewards(config)) {
    // Its gradients are not reduced across ranks, nor are its experts sharded.
    root.Check(config.distributed.world_size == 1, "implicit_prm",
               "trains on one learner rank only; distributed.world_size must be 1");
  }
  if (config.train.sync) {
    root.Check(config.publish.every_steps == 1, "publish.every_steps",
               "must be 1 with train.sync: the actors wait for each update's weights");
    root.Check(!config.publish.endpoint.empty(), "publish.endpoint",
               "is required with train.sync: the actors wait for published weights");
  }
}

}  // namespace

Result<RlLearnerConfig> LoadRlLearnerConfig(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromFile(path));
  RlLearnerConfig config;
  config.origin = path;
  std::string mode;
  root.Required("mode", &mode);
  root.Check(mode == "rl", "mode", "this loader reads mode: rl configs, got " + mode);
  std::string model_config;
  root.Required("model_config", &model_config);
  root.Optional("init", &config.init);
  root.Optional("init_seed", &config.init_seed);
  root.Check(config.init_seed >= 0, "init_seed", "must not be negative");
  int64_t seed = static_cast<int64_t>(config.trainer.seed);
  root.Optional("seed", &seed);
  root.Check(seed >= 0, "seed", "must not be negative");
  config.trainer.seed = static_cast<uint64_t>(seed);
  root.Optional("threads", &config.threads);
  root.Check(config.threads >= 0, "threads", "must not be negative");
  // Overrides the model config's device: (where the learner's weights, optimiser state and
  // passes live).
  std::string device;
  root.Optional("device", &device);
  root.Check(device.empty() || ValidDeviceName(device), "device",
             "must be cpu, cuda or cuda:N, got '" + device + "'");
  // float32 (the exactness contracts) or bfloat16: fp32 masters, gradients and moments, the
  // passes on a bf16 copy (common/model/precision.h, docs/cuda.md).
  std::string precision = PrecisionName(config.trainer.precision);
  root.Optional("precision", &precision);
  if (Result<Precision> parsed = ParsePrecision(precision); parsed.ok()) {
    config.trainer.precision = *parsed;
  } else {
    root.Fail("precision", parsed.status().message());
  }
  ReadTrainerSections(root, &config.trainer);
  ReadReplay(root.Section("replay"), &config.replay);
  ReadPublish(root.Section("publish"), &config.publish);
  ReadTrain(root.Section("train"), &config.train);
  if (config.trainer.precision == Precision::kBFloat16) {
    // The actor's and the learner's bf16 products of the same bf16 weights round apart on
    // every token: the check is left to catch wrong weights, and the loss's truncated
    // importance weights (and masks) take the rounding (docs/cuda.md). The key still wins.
    config.scoring.mismatch_threshold = kBFloat16MismatchThreshold;
  }
  ReadScoring(root.Section("scoring"), &config.scoring);
  // An error here is the document's too (config.h): root.Finish() below reports it first, with
  // the unknown keys of every section checked.
  Status objective_read;
  {
    ConfigReader objective = root.Section("objective");
    objective_read = ReadObjectiveConfig(objective, &config.objective);
  }
  ReadReward(root.Section("reward"), &config);
  {
    ConfigReader checkpoint = root.Section("checkpoint");
    checkpoint.Optional("every_steps", &config.checkpoint_every_steps);
    checkpoint.Check(config.checkpoint_every_steps >= 0, "every_steps", "must not be negative");
  }
  ReadImplicitPrm(root.Section("implicit_prm"), &config.implicit_prm);
  ReadDistributed(root.Section("distributed"), &config.distributed);
  CheckAcrossSections(root, config);
  STRIDER_RETURN_IF_ERROR(root.Finish());
  STRIDER_RETURN_IF_ERROR(objective_read);
  config.model_config_path = ResolveConfigPath(model_config, path);
  STRIDER_ASSIGN_OR_RETURN(config.model, LoadModelConfig(config.model_config_path));
  if (!device.empty()) config.model.device = device;
  // Checked against the model the file names, which is only known once it is loaded.
  const int64_t experts = config.model.feed_forward.routed_experts;
  const int64_t world = config.distributed.world_size;
  if (config.distributed.expert_parallel && world > 1 && experts % world != 0) {
    return Status::InvalidArgument(
        path + ": distributed.expert_parallel: needs routed_experts (" + std::to_string(experts) +
        " in " + config.model_config_path + ") divisible by world_size (" +
        std::to_string(world) + ")");
  }
  config.init = ResolveConfigPath(config.init, path);
  config.process_model = ResolveConfigPath(config.process_model, path);
  config.implicit_prm.init = ResolveConfigPath(config.implicit_prm.init, path);
  if (config.scoring.reference != "initial" && config.scoring.reference != "none") {
    config.scoring.reference = ResolveConfigPath(config.scoring.reference, path);
  }
  return config;
}

}  // namespace strider::rl
