#include "common/model/config.h"

#include <algorithm>
#include <cmath>

#include "common/config.h"
#include "common/tokenizer.h"

namespace strider {

std::vector<char> ModelConfig::LayerKinds() const {
  std::vector<char> kinds(static_cast<size_t>(std::max<int64_t>(layers, 0)), 'I');
  if (layer_pattern.empty()) return kinds;
  for (int64_t i = 0; i < layers; ++i) {
    kinds[i] = layer_pattern[static_cast<size_t>(i) % layer_pattern.size()];
  }
  if (!last_layer.empty() && layers > 0) kinds.back() = last_layer[0];
  return kinds;
}

bool ValidDeviceName(const std::string& name) {
  if (name == "cpu" || name == "cuda") return true;
  const std::string prefix = "cuda:";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 4 ||
      name.compare(0, prefix.size(), prefix) != 0) {
    return false;
  }
  return std::all_of(name.begin() + prefix.size(), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

int64_t ModelConfig::CountLayers(char kind) const {
  const std::vector<char> kinds = LayerKinds();
  return std::count(kinds.begin(), kinds.end(), kind);
}

namespace {

void ReadModel(ConfigReader& model, ModelConfig* config) {
  model.Optional("name", &config->name);
  model.Required("vocabulary", &config->vocabulary);
  model.Required("width", &config->width);
  model.Required("layers", &config->layers);
  model.Optional("layer_pattern", &config->layer_pattern);
  model.Optional("last_layer", &config->last_layer);
  model.Optional("attention_residuals", &config->attention_residuals);
  model.Optional("residual_block", &config->residual_block);
  model.Optional("tie_embeddings", &config->tie_embeddings);
  model.Optional("context", &config->context);
  model.Optional("init_std", &config->init_std);
  model.Optional("norm_epsilon", &config->norm_epsilon);
  model.Optional("cache_dtype", &config->cache_dtype);
  model.Optional("threads", &config->threads);
  model.Optional("device", &config->device);

  ConfigReader incremental = model.Section("incremental_attention");
  auto& inc = config->incremental;
  incremental.Optional("heads", &inc.heads);
  incremental.Optional("key_dim", &inc.key_dim);
  incremental.Optional("value_dim", &inc.value_dim);
  incremental.Optional("conv_width", &inc.conv_width);
  incremental.Optional("decay_rank", &inc.decay_rank);
  incremental.Optional("decay_gate", &inc.decay_gate);
  incremental.Optional("min_log_decay", &inc.min_log_decay);
  incremental.Optional("chunk_size", &inc.chunk_size);
  incremental.Optional("gate_rank", &inc.gate_rank);
  incremental.Optional("output_norm_epsilon", &inc.output_norm_epsilon);

  ConfigReader latent = model.Section("latent_attention");
  auto& lat = config->latent;
  latent.Optional("heads", &lat.heads);
  latent.Optional("query_rank", &lat.query_rank);
  latent.Optional("kv_rank", &lat.kv_rank);
  latent.Optional("nope_dim", &lat.nope_dim);
  latent.Optional("rope_dim", &lat.rope_dim);
  latent.Optional("value_dim", &lat.value_dim);
  latent.Optional("output_gate", &lat.output_gate);
  latent.Optional("norm_epsilon", &lat.norm_epsilon);

  ConfigReader ffn = model.Section("feed_forward");
  auto& ff = config->feed_forward;
  ffn.Optional("dense_layers", &ff.dense_layers);
  ffn.Optional("dense_hidden", &ff.dense_hidden);
  ffn.Optional("latent_width", &ff.latent_width);
  ffn.Optional("expert_hidden", &ff.expert_hidden);
  ffn.Optional("routed_experts", &ff.routed_experts);
  ffn.Optional("experts_per_token", &ff.experts_per_token);
  ffn.Optional("shared_experts", &ff.shared_experts);
  ffn.Optional("shared_hidden", &ff.shared_hidden);
  ffn.Optional("gate_cap", &ff.gate_cap);
  ffn.Optional("up_cap", &ff.up_cap);
  ffn.Optional("latent_experts", &ff.latent_experts);
  ffn.Optional("activation", &ff.activation);
  ffn.Optional("router_activation", &ff.router_activation);
  ffn.Optional("renormalize", &ff.renormalize);
  ffn.Optional("renormalize_epsilon", &ff.renormalize_epsilon);
  ffn.Optional("routed_scaling_factor", &ff.routed_scaling_factor);
  ffn.Optional("expert_groups", &ff.expert_groups);
  ffn.Optional("groups_per_token", &ff.groups_per_token);
  ffn.Optional("quantile_balancing", &ff.quantile_balancing);

  ConfigReader vision = model.Section("vision");
  auto& vis = config->vision;
  vision.Optional("enabled", &vis.enabled);
  vision.Optional("patch_size", &vis.patch_size);
  vision.Optional("max_grid_rows", &vis.max_grid_rows);
  vision.Optional("max_grid_columns", &vis.max_grid_columns);
  vision.Optional("channels", &vis.channels);

  ConfigReader tok = model.Section("tokenizer");
  auto& t = config->tokenizer;
  tok.Optional("file", &t.file);
  tok.Optional("format", &t.format);
  tok.Optional("chat_template", &t.chat_template);
  tok.Optional("template_name", &t.template_name);
  tok.Optional("pattern", &t.pattern);
  t.file = ResolveConfigPath(t.file, model.origin());
  t.chat_template = ResolveConfigPath(t.chat_template, model.origin());
}

}  // namespace

Status ValidateModelConfig(const ModelConfig& c, const std::string& origin) {
  auto bad = [&](const std::string& key, const std::string& problem) {
    return Status::InvalidArgument(origin + ": model." + key + ": " + problem);
  };
  auto positive = [&](int64_t value, const std::string& key) -> Status {
    if (value <= 0) return bad(key, "must be positive, got " + std::to_string(value));
    return Status::Ok();
  };
  // The YAML reader parses numbers with strtod, which accepts "inf" and "nan"; NaN fails every
  // comparison, so a sign check alone would let it through to the weights and the decay gate.
  auto finite_positive = [&](double value, const std::string& key) -> Status {
    if (!std::isfinite(value) || value <= 0) {
      return bad(key, "must be a finite positive number, got " + std::to_string(value));
    }
    return Status::Ok();
  };
  STRIDER_RETURN_IF_ERROR(positive(c.vocabulary, "vocabulary"));
  STRIDER_RETURN_IF_ERROR(positive(c.width, "width"));
  STRIDER_RETURN_IF_ERROR(positive(c.layers, "layers"));
  STRIDER_RETURN_IF_ERROR(positive(c.residual_block, "residual_block"));
  STRIDER_RETURN_IF_ERROR(positive(c.context, "context"));
  if (c.vocabulary < token::kVocabularySize) {
    return bad("vocabulary", "must be at least the tokenizer's " +
                                 std::to_string(token::kVocabularySize) + " ids, got " +
                                 std::to_string(c.vocabulary));
  }
  if (c.layer_pattern.empty()) return bad("layer_pattern", "must not be empty");
  for (char kind : c.layer_pattern) {
    if (kind != 'I' && kind != 'G') {
      return bad("layer_pattern", "may hold only I (incremental) and G (latent), got '" +
                                      c.layer_pattern + "'");
    }
  }
  if (static_cast<int64_t>(c.layer_pattern.size()) > c.layers) {
    return bad("layer_pattern", "is longer than model.layers");
  }
  if (!c.last_layer.empty() && c.last_layer != "I" && c.last_layer != "G") {
    return bad("last_layer", "must be I or G, got '" + c.last_layer + "'");
  }
  if (c.cache_dtype != "float32" && c.cache_dtype != "bfloat16") {
    return bad("cache_dtype", "must be float32 or bfloat16, got '" + c.cache_dtype + "'");
  }
  STRIDER_RETURN_IF_ERROR(finite_positive(c.init_std, "init_std"));
  STRIDER_RETURN_IF_ERROR(finite_positive(c.norm_epsilon, "norm_epsilon"));
  if (c.threads < 0) return bad("threads", "must be 0 (all cores) or positive");
  if (!ValidDeviceName(c.device)) {
    return bad("device", "must be cpu, cuda or cuda:N, got '" + c.device + "'");
  }

  const auto& inc = c.incremental;
  if (c.CountLayers('I') > 0) {
    STRIDER_RETURN_IF_ERROR(positive(inc.heads, "incremental_attention.heads"));
    STRIDER_RETURN_IF_ERROR(positive(inc.key_dim, "incremental_attention.key_dim"));
    STRIDER_RETURN_IF_ERROR(positive(inc.value_dim, "incremental_attention.value_dim"));
    STRIDER_RETURN_IF_ERROR(positive(inc.conv_width, "incremental_attention.conv_width"));
    STRIDER_RETURN_IF_ERROR(positive(inc.decay_rank, "incremental_attention.decay_rank"));
    STRIDER_RETURN_IF_ERROR(positive(inc.chunk_size, "incremental_attention.chunk_size"));
    if (!std::isfinite(inc.min_log_decay) || inc.min_log_decay >= 0) {
      return bad("incremental_attention.min_log_decay",
                 "must be finite and negative (a log decay), got " +
                     std::to_string(inc.min_log_decay));
    }
    if (inc.decay_gate != "sigmoid" && inc.decay_gate != "softplus") {
      return bad("incremental_attention.decay_gate",
                 "must be sigmoid or softplus, got '" + inc.decay_gate + "'");
    }
    if (inc.gate_rank < 0) {
      return bad("incremental_attention.gate_rank",
                 "must not be negative (0 is a full-rank output gate)");
    }
    if (!std::isfinite(inc.output_norm_epsilon) || inc.output_norm_epsilon < 0) {
      return bad("incremental_attention.output_norm_epsilon",
                 "must be finite and not negative (0 is the model's norm_epsilon)");
    }
  }
  const auto& lat = c.latent;
  if (c.CountLayers('G') > 0) {
    STRIDER_RETURN_IF_ERROR(positive(lat.heads, "latent_attention.heads"));
    if (lat.query_rank < 0) {
      return bad("latent_attention.query_rank",
                 "must not be negative (0 is a full-rank query projection)");
    }
    STRIDER_RETURN_IF_ERROR(positive(lat.kv_rank, "latent_attention.kv_rank"));
    STRIDER_RETURN_IF_ERROR(positive(lat.nope_dim, "latent_attention.nope_dim"));
    STRIDER_RETURN_IF_ERROR(positive(lat.value_dim, "latent_attention.value_dim"));
    if (lat.rope_dim < 0) return bad("latent_attention.rope_dim", "must not be negative");
    if (!std::isfinite(lat.norm_epsilon) || lat.norm_epsilon < 0) {
      return bad("latent_attention.norm_epsilon",
                 "must be finite and not negative (0 is the model's norm_epsilon)");
    }
  }
  const auto& ff = c.feed_forward;
  if (ff.dense_layers < 0 || ff.dense_layers > c.layers) {
    return bad("feed_forward.dense_layers", "must be between 0 and model.layers");
  }
  if (ff.dense_layers > 0) {
    STRIDER_RETURN_IF_ERROR(positive(ff.dense_hidden, "feed_forward.dense_hidden"));
  }
  if (ff.dense_layers < c.layers) {
    if (ff.latent_experts) {
      STRIDER_RETURN_IF_ERROR(positive(ff.latent_width, "feed_forward.latent_width"));
    }
    STRIDER_RETURN_IF_ERROR(positive(ff.expert_hidden, "feed_forward.expert_hidden"));
    STRIDER_RETURN_IF_ERROR(positive(ff.routed_experts, "feed_forward.routed_experts"));
    STRIDER_RETURN_IF_ERROR(positive(ff.experts_per_token, "feed_forward.experts_per_token"));
    if (ff.experts_per_token >= ff.routed_experts) {
      // Quantile balancing reads the (k+1)-th score, so k must leave one expert unchosen.
      return bad("feed_forward.experts_per_token",
                 "must be below feed_forward.routed_experts (" +
                     std::to_string(ff.routed_experts) + "), got " +
                     std::to_string(ff.experts_per_token));
    }
    if (ff.shared_experts < 0) return bad("feed_forward.shared_experts", "must not be negative");
    if (ff.shared_experts > 0) {
      STRIDER_RETURN_IF_ERROR(positive(ff.shared_hidden, "feed_forward.shared_hidden"));
    }
    if (ff.router_activation != "sigmoid" && ff.router_activation != "softmax") {
      return bad("feed_forward.router_activation",
                 "must be sigmoid or softmax, got '" + ff.router_activation + "'");
    }
    if (!std::isfinite(ff.renormalize_epsilon) || ff.renormalize_epsilon < 0) {
      return bad("feed_forward.renormalize_epsilon",
                 "must be finite and not negative, got " + std::to_string(ff.renormalize_epsilon));
    }
    STRIDER_RETURN_IF_ERROR(
        finite_positive(ff.routed_scaling_factor, "feed_forward.routed_scaling_factor"));
    STRIDER_RETURN_IF_ERROR(positive(ff.expert_groups, "feed_forward.expert_groups"));
    if (ff.routed_experts % ff.expert_groups != 0) {
      return bad("feed_forward.expert_groups",
                 "must divide feed_forward.routed_experts (" + std::to_string(ff.routed_experts) +
                     "), got " + std::to_string(ff.expert_groups));
    }
    const int64_t group_size = ff.routed_experts / ff.expert_groups;
    if (ff.expert_groups > 1 && group_size < 2) {
      // A group's score is the sum of its two best experts' scores.
      return bad("feed_forward.expert_groups",
                 "must leave at least two experts per group, got " +
                     std::to_string(ff.expert_groups) + " groups of " +
                     std::to_string(ff.routed_experts) + " experts");
    }
    if (ff.groups_per_token < 1 || ff.groups_per_token > ff.expert_groups) {
      return bad("feed_forward.groups_per_token",
                 "must be between 1 and feed_forward.expert_groups (" +
                     std::to_string(ff.expert_groups) + "), got " +
                     std::to_string(ff.groups_per_token));
    }
    if (ff.experts_per_token > ff.groups_per_token * group_size) {
      return bad("feed_forward.experts_per_token",
                 "must fit in the groups a token keeps (" +
                     std::to_string(ff.groups_per_token * group_size) + " experts), got " +
                     std::to_string(ff.experts_per_token));
    }
  }
  if (ff.activation != "situ" && ff.activation != "silu") {
    return bad("feed_forward.activation",
               "must be situ (SiTU-GLU) or silu (SwiGLU), got '" + ff.activation + "'");
  }
  // Each SiTU cap is named on its own, so the message points at the key that is wrong.
  STRIDER_RETURN_IF_ERROR(finite_positive(ff.gate_cap, "feed_forward.gate_cap"));
  STRIDER_RETURN_IF_ERROR(finite_positive(ff.up_cap, "feed_forward.up_cap"));
  if (c.vision.enabled) {
    // Images enter as the byte format's placeholder ids (image start, patches, end); in a
    // model's own vocabulary those ids are ordinary tokens, so patches would overwrite text.
    if (!c.tokenizer.file.empty()) {
      return bad("vision.enabled", "images need the byte format's placeholder ids, and this "
                                   "model names its own tokenizer (" + c.tokenizer.file + ")");
    }
    STRIDER_RETURN_IF_ERROR(positive(c.vision.patch_size, "vision.patch_size"));
    STRIDER_RETURN_IF_ERROR(positive(c.vision.max_grid_rows, "vision.max_grid_rows"));
    STRIDER_RETURN_IF_ERROR(positive(c.vision.max_grid_columns, "vision.max_grid_columns"));
    STRIDER_RETURN_IF_ERROR(positive(c.vision.channels, "vision.channels"));
  }
  return Status::Ok();
}

Result<ModelConfig> LoadModelConfigFromReader(ConfigReader& root) {
  ModelConfig config;
  ConfigReader model = root.Section("model");
  if (!root.Has("model")) root.Fail("model", "is required: the file has no model: section");
  ReadModel(model, &config);
  // Finish, not status: a required key found missing is then reported with its misspelling
  // beside it. Only on error, since a caller may still read other keys of `root`.
  if (!root.status().ok()) return root.Finish();
  STRIDER_RETURN_IF_ERROR(ValidateModelConfig(config, root.origin()));
  return config;
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromFile(path));
  STRIDER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfigFromReader(root));
  STRIDER_RETURN_IF_ERROR(root.Finish());
  return config;
}

}  // namespace strider
