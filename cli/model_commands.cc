// `strider model info|init|eval|check`: the model's accounting, initialisation, log-probs and the
// two-path contract check (docs/design.md#command-line).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/hf_commands.h"
#include "common/model/config.h"
#include "common/model/model.h"
#include "common/model/parameters.h"
#include "common/model/precision.h"
#include "common/model/two_path_check.h"
#include "common/tokenizer.h"

namespace strider::cli {
namespace {

using Json = nlohmann::ordered_json;

void PrintJson(const Json& json) { std::cout << json.dump(2) << std::endl; }

Json InfoJson(const ModelConfig& config) {
  const ParameterCounts counts = CountParameters(config);
  const CacheAccounting caches = AccountCaches(config);
  Json json;
  json["model"] = config.name;
  json["total_params"] = counts.total;
  json["active_params"] = counts.active;
  json["layers"] = config.layers;
  json["incremental_layers"] = config.CountLayers('I');
  json["latent_layers"] = config.CountLayers('G');
  json["routed_experts"] = config.feed_forward.routed_experts;
  json["experts_per_token"] = config.feed_forward.experts_per_token;
  json["context"] = config.context;
  json["kv_cache_values_per_token_per_layer"] = caches.kv_cache_values_per_token_per_layer;
  json["kv_cache_bytes_per_token"] = caches.kv_cache_bytes_per_token;
  json["state_bytes_per_layer"] = caches.state_bytes_per_layer;
  json["state_bytes_per_sequence"] = caches.state_bytes_per_sequence;
  json["sequence_bytes_at_context"] = caches.sequence_bytes_at_context;
  Json components;
  for (const auto& [component, total] : counts.total_by_component) {
    components[component] = {{"total", total}, {"active", counts.active_by_component.at(component)}};
  }
  json["by_component"] = components;
  Json baseline;
  baseline["description"] =
      "same model with full multi-head attention (same heads and head width) in every layer";
  baseline["kv_cache_values_per_token_per_layer"] = caches.baseline_kv_values_per_token_per_layer;
  baseline["kv_cache_bytes_per_token"] = caches.baseline_kv_cache_bytes_per_token;
  baseline["sequence_bytes_at_context"] = caches.baseline_sequence_bytes_at_context;
  json["multi_head_attention_baseline"] = baseline;
  json["latent_cache_saving_per_layer"] =
      static_cast<double>(caches.baseline_kv_values_per_token_per_layer) /
      static_cast<double>(std::max<int64_t>(1, caches.kv_cache_values_per_token_per_layer));
  json["sequence_memory_saving_at_context"] =
      caches.baseline_sequence_bytes_at_context / std::max(1.0, caches.sequence_bytes_at_context);
  return json;
}

// Token ids from "1,2,3", or from a file "@path" holding ids separated by commas or spaces.
Result<std::vector<int64_t>> ParseTokenIds(const std::string& text) {
  std::string body = text;
  if (!text.empty() && text[0] == '@') {
    std::ifstream file(text.substr(1));
    if (!file) return Status::NotFound(text.substr(1) + ": cannot open token file");
    std::stringstream contents;
    contents << file.rdbuf();
    body = contents.str();
  }
  for (char& c : body) {
    if (c == ',' || c == '\n' || c == '\t') c = ' ';
  }
  std::istringstream stream(body);
  std::vector<int64_t> ids;
  std::string word;
  while (stream >> word) {
    try {
      size_t used = 0;
      ids.push_back(std::stoll(word, &used));
      if (used != word.size()) throw std::invalid_argument(word);
    } catch (const std::exception&) {
      return Status::InvalidArgument("--tokens: '" + word + "' is not a token id");
    }
  }
  if (ids.empty()) return Status::InvalidArgument("--tokens: no token ids given");
  return ids;
}

// --device over the config's device: key, checked here so that a device this host lacks is a
// usage error before anything is allocated.
Status ApplyDevice(const std::string& flag, ModelConfig* config) {
  if (!flag.empty()) {
    if (!ValidDeviceName(flag)) {
      return Status::InvalidArgument("--device: '" + flag + "' is not cpu, cuda or cuda:N");
    }
    config->device = flag;
  }
  return ResolveDevice(config->device).status();
}

}  // namespace

void AddModelCommands(CLI::App& app, int& exit_code) {
  CLI::App* model = app.add_subcommand("model", "Model accounting, initialisation and checks");
  model->require_subcommand(1);
  AddHfModelCommands(model, exit_code);

  // model info
  auto info_config = std::make_shared<std::string>();
  auto info_degree = std::make_shared<int64_t>(0);
  auto info_device = std::make_shared<std::string>();
  CLI::App* info = model->add_subcommand(
      "info", "Parameter counts and cache sizes, computed from the config without allocating");
  auto info_hf = std::make_shared<std::string>();
  auto* info_config_option = info->add_option("--config", *info_config, "Model config YAML");
  info->add_option("--from-hf", *info_hf,
                   "Hugging Face checkpoint directory: config.json and the index suffice")
      ->excludes(info_config_option);
  info->add_option("--expert-parallel", *info_degree,
                   "Also the per-rank parameters and memory with the routed experts split over "
                   "N ranks (N divides routed_experts)");
  info->add_option("--device", *info_device,
                   "cpu, cuda or cuda:N: where the model would be placed (overrides device:)");
  info->callback([info_config, info_hf, info_degree, info_device, &exit_code] {
    if (!info_hf->empty() || info_config->empty()) {
      Status status = info_hf->empty()
                          ? Status::InvalidArgument("model info: give --config or --from-hf")
                          : PrintHfModelInfo(*info_hf, *info_degree);
      if (!status.ok()) exit_code = ReportError(status);
      return;
    }
    Result<ModelConfig> config = LoadModelConfig(*info_config);
    if (!config.ok()) {
      exit_code = ReportError(config.status());
      return;
    }
    if (Status placed = ApplyDevice(*info_device, &*config); !placed.ok()) {
      exit_code = ReportError(placed);
      return;
    }
    Json json = InfoJson(*config);
    json["device"] = config->device;
    if (*info_degree != 0) {
      const int64_t n = config->feed_forward.routed_experts;
      if (*info_degree < 1 || n % *info_degree != 0) {
        exit_code = ReportError(Status::InvalidArgument(
            "--expert-parallel " + std::to_string(*info_degree) + " must divide the " +
            std::to_string(n) + " routed experts of " + *info_config));
        return;
      }
      const ExpertParallelFootprint f = ExpertParallelFootprintOf(*config, *info_degree);
      json["expert_parallel"] = {
          {"degree", f.degree},
          {"experts_per_rank", n / f.degree},
          {"routed_params_total", f.routed_parameters_total},
          {"routed_params_per_rank", f.routed_parameters_per_rank},
          {"replicated_params", f.replicated_parameters},
          {"params_per_rank", f.parameters_per_rank},
          {"weight_bytes_per_rank", f.weight_bytes_per_rank},
          {"training_bytes_per_rank", f.training_bytes_per_rank},
          {"training_bytes_note",
           "fp32 weights, gradients and two AdamW moments; activations not included"}};
    }
    PrintJson(json);
  });

  // model init
  struct InitArgs {
    std::string config, out;
    uint64_t seed = 0;
  };
  auto init_args = std::make_shared<InitArgs>();
  CLI::App* init = model->add_subcommand("init", "Random initialisation saved as safetensors");
  init->add_option("--config", init_args->config, "Model config YAML")->required();
  init->add_option("--out", init_args->out, "Output weights file (.safetensors)")->required();
  init->add_option("--seed", init_args->seed, "Random seed");
  init->callback([init_args, &exit_code] {
    Result<ModelConfig> config = LoadModelConfig(init_args->config);
    if (!config.ok()) {
      exit_code = ReportError(config.status());
      return;
    }
    Result<std::unique_ptr<Model>> created = Model::Create(*config, init_args->seed);
    Status status = created.ok() ? (*created)->Save(init_args->out) : created.status();
    if (!status.ok()) {
      exit_code = ReportError(status);
      return;
    }
    PrintJson({{"out", init_args->out},
               {"total_params", CountParameters(*config).total},
               {"seed", init_args->seed}});
  });

  // model eval
  struct EvalArgs {
    std::string config, weights, from_hf, tokens, text, path = "inference", dtype, device;
    int64_t chunk = 0;
  };
  auto eval_args = std::make_shared<EvalArgs>();
  CLI::App* eval = model->add_subcommand("eval", "Per-token log-probabilities as JSON");
  auto* eval_config = eval->add_option("--config", eval_args->config, "Model config YAML");
  eval->add_option("--weights", eval_args->weights, "Weights (.safetensors)")->needs(eval_config);
  eval->add_option("--from-hf", eval_args->from_hf,
                   "Hugging Face checkpoint directory, converted in memory (fp32)")
      ->excludes(eval_config);
  auto* tokens_option = eval->add_option(
      "--tokens", eval_args->tokens, "Token ids: \"1,2,3\" or @file with ids");
  eval->add_option("--text", eval_args->text, "Text, encoded with the byte-level tokenizer")
      ->excludes(tokens_option);
  eval->add_option("--path", eval_args->path, "train or inference")
      ->check(CLI::IsMember({"train", "inference"}));
  eval->add_option("--chunk", eval_args->chunk,
                   "Inference path: append this many tokens at a time (default: all at once)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  eval->add_option("--dtype", eval_args->dtype,
                   "float32 or float64 (default: the dtype the weights load in)")
      ->check(CLI::IsMember({"float32", "float64"}));
  eval->add_option("--device", eval_args->device,
                   "cpu, cuda or cuda:N (default: the config's device:, else cpu)");
  eval->callback([eval_args, &exit_code] {
    auto run = [&]() -> Status {
      const bool from_hf = !eval_args->from_hf.empty();
      if (!from_hf && (eval_args->config.empty() || eval_args->weights.empty())) {
        return Status::InvalidArgument("model eval: give --config and --weights, or --from-hf");
      }
      ModelConfig config;
      if (!from_hf) {
        STRIDER_ASSIGN_OR_RETURN(config, LoadModelConfig(eval_args->config));
        STRIDER_RETURN_IF_ERROR(ApplyDevice(eval_args->device, &config));
      }
      ConfigureRuntime(config.threads);
      ConfigurePrecision(Precision::kFloat32);  // the contracts are fp32: no TF32
      std::vector<int64_t> ids;
      if (!eval_args->text.empty()) {
        ids.push_back(token::kBeginOfText);
        for (int32_t id : Tokenizer::Encode(eval_args->text)) ids.push_back(id);
      } else if (!eval_args->tokens.empty()) {
        STRIDER_ASSIGN_OR_RETURN(ids, ParseTokenIds(eval_args->tokens));
      } else {
        return Status::InvalidArgument("give --tokens or --text");
      }
      if (eval_args->chunk > 0 && eval_args->path != "inference") {
        return Status::InvalidArgument("--chunk applies to --path inference only");
      }
      std::unique_ptr<Model> model;
      if (from_hf) {
        STRIDER_ASSIGN_OR_RETURN(model, LoadHfModel(eval_args->from_hf, eval_args->device, &config));
      } else {
        STRIDER_ASSIGN_OR_RETURN(model, Model::Load(config, eval_args->weights));
      }
      if (eval_args->dtype == "float64") {
        STRIDER_RETURN_IF_ERROR(model->ConvertTo(at::kDouble));
      } else if (eval_args->dtype == "float32") {
        STRIDER_RETURN_IF_ERROR(model->ConvertTo(at::kFloat));
      }
      at::Tensor tokens = at::tensor(ids, at::kLong).unsqueeze(0);
      const int64_t length = tokens.size(1);
      at::Tensor logits;
      if (eval_args->path == "train") {
        at::NoGradGuard no_grad;
        STRIDER_ASSIGN_OR_RETURN(ForwardOutput out, model->Forward({tokens, {}}));
        logits = out.logits;
      } else {
        // Chunks after the first attend to the cache the earlier ones left; a chunk of one
        // token takes the single-token recurrent kernel.
        const int64_t chunk = eval_args->chunk > 0 ? eval_args->chunk : length;
        STRIDER_ASSIGN_OR_RETURN(InferenceState state, model->NewState(1));
        std::vector<at::Tensor> parts;
        for (int64_t start = 0; start < length; start += chunk) {
          const int64_t count = std::min(chunk, length - start);
          STRIDER_ASSIGN_OR_RETURN(ForwardOutput out,
                                   model->Append(&state, {tokens.narrow(1, start, count), {}}));
          parts.push_back(out.logits);
        }
        logits = at::cat(parts, 1);
      }
      at::Tensor log_probs =
          NextTokenLogProbs(logits, tokens).squeeze(0).to(at::kCPU, at::kDouble);
      Json json;
      json["path"] = eval_args->path;
      if (eval_args->path == "inference") {
        json["chunk"] = eval_args->chunk > 0 ? eval_args->chunk : length;
      }
      json["dtype"] = model->dtype() == at::kDouble ? "float64" : "float32";
      json["device"] = model->device().str();
      json["tokens"] = ids;
      Json values = Json::array({nullptr});  // the first token has no prediction
      for (int64_t t = 0; t < log_probs.size(0); ++t) {
        values.push_back(log_probs[t].item<double>());
      }
      json["logprobs"] = values;
      json["total_logprob"] = log_probs.sum().item<double>();
      PrintJson(json);
      return Status::Ok();
    };
    Status status = run();
    if (!status.ok()) exit_code = ReportError(status);
  });

  // model check
  struct CheckArgs {
    std::string config, dtype = "float32", device;
    int64_t tokens = 2048;
    int64_t batch = 1;
    uint64_t seed = 0;
  };
  auto check_args = std::make_shared<CheckArgs>();
  CLI::App* check = model->add_subcommand(
      "check", "Two-path contract on random weights: log-prob difference and routing agreement");
  check->add_option("--config", check_args->config, "Model config YAML")->required();
  check->add_option("--tokens", check_args->tokens, "Tokens per sequence")
      ->check(CLI::Range(2, 1 << 24));
  check->add_option("--batch", check_args->batch, "Sequences")->check(CLI::Range(1, 1024));
  check->add_option("--seed", check_args->seed, "Random seed for weights and tokens");
  check->add_option("--dtype", check_args->dtype, "float32 or float64")
      ->check(CLI::IsMember({"float32", "float64"}));
  check->add_option("--device", check_args->device,
                    "cpu, cuda or cuda:N (default: the config's device:, else cpu)");
  check->callback([check_args, &exit_code] {
    auto run = [&]() -> Status {
      STRIDER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(check_args->config));
      STRIDER_RETURN_IF_ERROR(ApplyDevice(check_args->device, &config));
      ConfigureRuntime(config.threads);
      ConfigurePrecision(Precision::kFloat32);  // the contracts are fp32: no TF32
      if (check_args->tokens > config.context) {
        return Status::InvalidArgument("--tokens " + std::to_string(check_args->tokens) +
                                       " exceeds model.context " + std::to_string(config.context));
      }
      STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                               Model::Create(config, check_args->seed));
      const bool fp64 = check_args->dtype == "float64";
      if (fp64) STRIDER_RETURN_IF_ERROR(model->ConvertTo(at::kDouble));
      at::Generator generator = at::detail::createCPUGenerator(check_args->seed + 1);
      // Text bytes only: special tokens such as image placeholders need their payloads.
      at::Tensor tokens = at::randint(0, token::kByteCount, {check_args->batch, check_args->tokens},
                                      generator, at::kLong);
      const auto start = std::chrono::steady_clock::now();
      STRIDER_ASSIGN_OR_RETURN(TwoPathReport result, CheckTwoPaths(*model, tokens));
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double tolerance = fp64 ? 1e-10 : 1e-5;
      const bool passed =
          result.max_abs_logprob_diff <= tolerance && result.routing_agreement >= 0.999;
      Json json;
      json["model"] = config.name;
      json["dtype"] = check_args->dtype;
      json["device"] = model->device().str();
      json["tokens"] = check_args->tokens;
      json["batch"] = check_args->batch;
      json["inference_chunks"] = result.inference_chunks;
      json["max_abs_logprob_diff"] = result.max_abs_logprob_diff;
      json["logprob_tolerance"] = tolerance;
      json["routing_agreement"] = result.routing_agreement;
      json["routing_decisions"] = result.routing_decisions;
      json["passed"] = passed;
      json["seconds"] = seconds;
      PrintJson(json);
      if (!passed) {
        return Status::Internal("two-path contract broken: max_abs_logprob_diff " +
                                std::to_string(result.max_abs_logprob_diff) +
                                ", routing_agreement " + std::to_string(result.routing_agreement));
      }
      return Status::Ok();
    };
    Status status = run();
    if (!status.ok()) exit_code = ReportError(status);
  });
}

}  // namespace strider::cli
