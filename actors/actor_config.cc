// `strider actor --config F`: the YAML layout (docs/actors.md) into ActorOptions.
#include <nlohmann/json.hpp>

#include "actors/actor.h"
#include "common/config.h"
#include "common/model/config.h"
#include "common/transport/curve.h"
#include "envs/registry.h"

namespace strider::actors {

Status ValidateActorOptions(const ActorOptions& o) {
  auto bad = [](const std::string& key, const std::string& problem) {
    return Status::InvalidArgument("actor." + key + ": " + problem);
  };
  if (o.model_config.empty()) return bad("model", "a model config path is required");
  if (!o.device.empty() && !ValidDeviceName(o.device)) {
    return bad("device", "must be cpu, cuda or cuda:N, got '" + o.device + "'");
  }
  if (o.episodes_in_flight < 1) return bad("episodes_in_flight", "must be >= 1");
  if (o.group_size < 1) return bad("group_size", "must be >= 1");
  if (o.episodes_in_flight % o.group_size != 0) {
    return bad("episodes_in_flight",
               "must be a multiple of group_size (" + std::to_string(o.group_size) + ")");
  }
  if (o.episodes < 0) return bad("episodes", "must be >= 0 (0: until stopped)");
  if (o.episodes % o.group_size != 0) {
    return bad("episodes", "must be a multiple of group_size (whole groups run)");
  }
  if (o.max_turns < 0) return bad("max_turns", "must be >= 0 (0: the environment's limit)");
  if (o.max_episode_tokens < 16) return bad("max_episode_tokens", "must be >= 16");
  if (o.segment_tokens < 1) return bad("segment_tokens", "must be >= 1");
  if (o.sampling.max_new_tokens < 1) return bad("sampling.max_new_tokens", "must be >= 1");
  if (o.sampling.max_new_tokens >= o.max_episode_tokens) {
    return bad("sampling.max_new_tokens", "must be below max_episode_tokens");
  }
  if (o.cache_budget_bytes <= 0) return bad("engine.cache_budget_mb", "must be > 0");
  // Where episodes go: the replay server, or an in-process sink (evaluation); never both, so a
  // run cannot look like training while nothing reaches the server.
  if (o.episode_sink && !o.replay_endpoint.empty()) {
    return bad("replay.endpoint", "must be empty for an actor with an episode sink");
  }
  if (!o.episode_sink) {
    if (o.replay_endpoint.empty()) return bad("replay.endpoint", "is required");
    if (o.spill_dir.empty()) return bad("replay.spill_dir", "is required");
    if (o.spill_max_bytes <= 0) return bad("replay.spill_max_mb", "must be > 0");
    if (o.spill_after_ms < 100) return bad("replay.spill_after_ms", "must be >= 100");
  }
  if (o.weights_poll_ms < 10) return bad("weight_stream.poll_ms", "must be >= 10");
  if (o.weights_sync && o.weights_endpoint.empty()) {
    // Without a publisher the first round would wait for ever.
    return bad("weight_stream.sync", "needs weight_stream.endpoint (or --weights-endpoint)");
  }
  if (o.round_groups < 0) return bad("weight_stream.round_groups", "must be >= 0");
  if (o.round_groups > 0 && !o.weights_sync) {
    return bad("weight_stream.round_groups", "applies only with sync: true");
  }
  if (o.metrics_interval_s <= 0) return bad("metrics.interval_s", "must be > 0");
  // Key files are read now, so a bad one stops the actor before it loads its model.
  for (const auto& [auth, key] : {std::pair{&o.replay_auth, "actor.replay.auth"},
                                  std::pair{&o.weights_auth, "actor.weight_stream.auth"}}) {
    if (auth->enabled()) {
      STRIDER_RETURN_IF_ERROR(transport::CurveClient::Load(*auth).status().WithContext(key));
    }
  }
  if (o.env.name.empty() && o.env.library.empty() && o.env.command.empty()) {
    return Status::InvalidArgument("env: name, library or command is required");
  }
  return Status::Ok();
}

Result<ActorOptions> LoadActorConfig(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromFile(path));
  ActorOptions o;
  ConfigReader actor = root.Section("actor");
  actor.Optional("id", &o.actor_id);
  actor.Required("model", &o.model_config);
  actor.Optional("weights", &o.weights);
  int64_t model_seed = 0, policy_version = 0, seed = 0;
  actor.Optional("model_seed", &model_seed);
  actor.Optional("policy_version", &policy_version);
  actor.Optional("threads", &o.threads);
  actor.Optional("device", &o.device);
  std::string precision = PrecisionName(o.precision);
  actor.Optional("precision", &precision);
  if (Result<Precision> parsed = ParsePrecision(precision); parsed.ok()) {
    o.precision = *parsed;
  } else {
    actor.Fail("precision", parsed.status().message());
  }
  actor.Optional("episodes", &o.episodes);
  actor.Optional("episodes_in_flight", &o.episodes_in_flight);
  actor.Optional("group_size", &o.group_size);
  actor.Optional("max_turns", &o.max_turns);
  actor.Optional("max_episode_tokens", &o.max_episode_tokens);
  actor.Optional("seed", &seed);
  actor.Optional("segment_tokens", &o.segment_tokens);
  actor.Check(model_seed >= 0 && policy_version >= 0 && seed >= 0, "seed",
              "seeds and versions must be >= 0");
  o.model_seed = static_cast<uint64_t>(model_seed);
  o.policy_version = static_cast<uint64_t>(policy_version);
  o.seed = static_cast<uint64_t>(seed);

  ConfigReader sampling = actor.Section("sampling");
  int64_t sampling_seed = 0;
  sampling.Optional("temperature", &o.sampling.temperature);
  sampling.Optional("top_k", &o.sampling.top_k);
  sampling.Optional("top_p", &o.sampling.top_p);
  sampling.Optional("max_new_tokens", &o.sampling.max_new_tokens);
  sampling.Optional("stop_strings", &o.sampling.stop_strings);
  sampling.Optional("seed", &sampling_seed);
  o.sampling.seed = static_cast<uint64_t>(sampling_seed);

  ConfigReader engine = actor.Section("engine");
  int64_t cache_mb = o.cache_budget_bytes >> 20;
  engine.Optional("cache_budget_mb", &cache_mb);
  o.cache_budget_bytes = cache_mb << 20;
  engine.Optional("block_tokens", &o.block_tokens);
  engine.Optional("max_batch", &o.max_batch);
  engine.Optional("prefill_chunk_tokens", &o.prefill_chunk_tokens);
  engine.Optional("prefill_tokens_per_step", &o.prefill_tokens_per_step);

  ConfigReader replay = actor.Section("replay");
  replay.Optional("endpoint", &o.replay_endpoint);
  replay.Optional("table", &o.table);
  replay.Optional("spill_dir", &o.spill_dir);
  int64_t spill_mb = o.spill_max_bytes >> 20, queue_mb = o.send_queue_max_bytes >> 20;
  replay.Optional("spill_max_mb", &spill_mb);
  replay.Optional("send_queue_max_mb", &queue_mb);
  o.spill_max_bytes = spill_mb << 20;
  o.send_queue_max_bytes = queue_mb << 20;
  replay.Optional("spill_after_ms", &o.spill_after_ms);
  ConfigReader replay_auth = replay.Section("auth");
  o.replay_auth = transport::ReadClientAuth(replay_auth);

  ConfigReader weights = actor.Section("weight_stream");
  weights.Optional("endpoint", &o.weights_endpoint);
  weights.Optional("poll_ms", &o.weights_poll_ms);
  weights.Optional("sync", &o.weights_sync);
  weights.Optional("round_groups", &o.round_groups);
  ConfigReader weights_auth = weights.Section("auth");
  o.weights_auth = transport::ReadClientAuth(weights_auth);

  ConfigReader metrics = actor.Section("metrics");
  metrics.Optional("path", &o.metrics_path);
  metrics.Optional("interval_s", &o.metrics_interval_s);
  metrics.Optional("progress", &o.progress);

  // A file without `env:` loads with no environment: ValidateActorOptions refuses it unless a
  // flag names one (`strider eval --env`).
  Result<envs::EnvironmentConfig> env_config = envs::EnvironmentConfig{};
  if (root.Has("env")) {
    ConfigReader env = root.Section("env");
    env_config = envs::ReadEnvironmentConfig(env);
  }
  STRIDER_RETURN_IF_ERROR(root.Finish());
  if (!env_config.ok()) return env_config.status();
  o.env = *env_config;
  // As in the learner, pretraining and fleet configs: `strider eval --config /abs/actor.yaml`
  // from another directory finds the model the file names.
  o.model_config = ResolveConfigPath(o.model_config, path);
  o.weights = ResolveConfigPath(o.weights, path);
  // Ranges are checked by ValidateActorOptions once command-line flags have had their say
  // (the endpoint and spill directory often come from flags).
  return o;
}

std::string ActorMetrics::ToJson() const {
  nlohmann::json j = {
      {"event", "metrics"},
      {"elapsed_s", elapsed_s},
      {"episodes_started", episodes_started},
      {"episodes", episodes_finished},
      {"episodes_ok", episodes_ok},
      {"episodes_per_s", elapsed_s > 0 ? episodes_finished / elapsed_s : 0.0},
      {"turns", turns},
      {"generated_tokens", generated_tokens},
      {"context_tokens", context_tokens},
      {"tokens_per_s", elapsed_s > 0 ? (generated_tokens + context_tokens) / elapsed_s : 0.0},
      {"generated_tokens_per_s", elapsed_s > 0 ? generated_tokens / elapsed_s : 0.0},
      {"tool_calls", tool_calls},
      {"malformed_tool_calls", malformed_tool_calls},
      {"errors", errors},
      {"segments", segments},
      {"acked_segments", acked_segments},
      {"refused_segments", refused_segments},
      {"policy_version", policy_version},
      {"weight_updates", weight_updates},
      {"engine_steps", engine_steps},
      {"engine_step_seconds", engine_step_seconds},
      {"prefill_steps", prefill_steps},
      {"prefill_step_seconds", prefill_step_seconds},
      {"decode_step_seconds", decode_step_seconds},
      {"prefill_tokens", prefill_tokens},
      {"decode_tokens", decode_tokens},
      {"env_call_seconds", env_call_seconds},
      {"replay_connected", replay_connected},
      {"queues",
       {{"live_episodes", live_episodes},
        {"env_calls_running", env_calls_running},
        {"engine_sequences", engine_sequences},
        {"send_queue_segments", send_queue_segments},
        {"send_queue_bytes", send_queue_bytes},
        {"in_flight_segments", in_flight_segments}}},
      {"spill", {{"files", spill_files}, {"bytes", spill_bytes}}},
  };
  if (sync) {
    j["round"] = round;
    j["weights_wait_s"] = weights_wait_s;
    j["waiting_for_weights"] = waiting_for_weights;
  }
  return j.dump();
}

}  // namespace strider::actors
