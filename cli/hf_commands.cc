// `strider model info --from-hf`, `model import --from-hf`, `model export ... --to-hf` and the
// checkpoint loading behind `model eval --from-hf`.
#include "cli/hf_commands.h"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model.h"
#include "common/process_memory.h"

namespace strider::cli {
namespace {

using Json = nlohmann::ordered_json;

// A checkpoint every command may trust: the config supported and every tensor the one the
// config calls for.
Result<HfCheckpoint> OpenChecked(const std::string& directory, bool need_shards) {
  STRIDER_ASSIGN_OR_RETURN(HfCheckpoint checkpoint, OpenHfCheckpoint(directory));
  if (need_shards) STRIDER_RETURN_IF_ERROR(RequireShards(checkpoint));
  STRIDER_RETURN_IF_ERROR(CheckKimiLinearTensors(checkpoint));
  return checkpoint;
}

}  // namespace

Status PrintHfModelInfo(const std::string& directory, int64_t expert_parallel) {
  STRIDER_ASSIGN_OR_RETURN(HfCheckpoint checkpoint, OpenChecked(directory, false));
  const KimiLinearConfig& c = checkpoint.config;
  const HfParameterFigures figures = KimiLinearFigures(c);
  STRIDER_ASSIGN_OR_RETURN(HfParameterCounts counts, CountHfParameters(checkpoint));
  Json json;
  json["source"] = directory;
  json["model_type"] = "kimi_linear";
  json["layers"] = c.num_hidden_layers;
  json["kda_layers"] = c.CountKdaLayers();
  json["mla_layers"] = c.num_hidden_layers - c.CountKdaLayers();
  json["moe_layers"] = c.CountMoeLayers();
  json["dense_layers"] = c.num_hidden_layers - c.CountMoeLayers();
  json["routed_experts"] = c.num_experts;
  json["experts_per_token"] = c.num_experts_per_token;
  json["shared_experts"] = c.num_shared_experts;
  json["vocabulary"] = c.vocab_size;
  json["dtype"] = c.dtype;
  json["tensors"] = static_cast<int64_t>(figures.tensors);
  json["total_params"] = counts.from_config;
  json["index_total_parameters"] = counts.from_index ? Json(*counts.from_index) : Json(nullptr);
  json["header_total_parameters"] =
      counts.from_headers ? Json(*counts.from_headers) : Json(nullptr);
  json["active_params"] = static_cast<uint64_t>(figures.active);
  json["active_params_without_embeddings"] =
      static_cast<uint64_t>(figures.active_without_embeddings);
  json["active_params_formula"] = figures.active_formula;
  Json components;
  for (const auto& [component, count] : figures.total_by_component) {
    components[component] = {
        {"total", static_cast<uint64_t>(count)},
        {"active", static_cast<uint64_t>(figures.active_by_component.at(component))}};
  }
  json["by_component"] = components;
  if (checkpoint.index && checkpoint.index->total_size) {
    json["checkpoint_bytes"] = *checkpoint.index->total_size;
  } else if (counts.header_bytes) {
    json["checkpoint_bytes"] = *counts.header_bytes;
  }
  if (expert_parallel != 0) {
    STRIDER_ASSIGN_OR_RETURN(HfExpertParallelFootprint f, KimiLinearFootprint(c, expert_parallel));
    json["expert_parallel"] = {
        {"degree", f.degree},
        {"experts_per_rank", f.experts_per_rank},
        {"routed_params_per_rank", static_cast<uint64_t>(f.routed_parameters_per_rank)},
        {"replicated_params", static_cast<uint64_t>(f.replicated_parameters)},
        {"params_per_rank", static_cast<uint64_t>(f.parameters_per_rank)},
        {"weight_bytes_per_rank", static_cast<uint64_t>(f.weight_bytes_per_rank)},
        {"weight_bytes_note",
         fmt::format("every parameter in {} ({} bytes)", c.dtype, c.DtypeBytes())},
        {"training_bytes_per_rank", static_cast<uint64_t>(f.training_bytes_per_rank)},
        {"training_bytes_note",
         fmt::format("mixed-precision AdamW, {} bytes per parameter: bf16 weights and gradients, "
                     "fp32 master weights and two fp32 moments; routed experts split over the "
                     "ranks, everything else replicated, optimiser state not sharded; "
                     "activations not included",
                     kTrainingBytesPerParameter)}};
  }
  std::cout << json.dump(2) << std::endl;
  return Status::Ok();
}

Result<std::unique_ptr<Model>> LoadHfModel(const std::string& directory, const std::string& device,
                                           ModelConfig* config) {
  STRIDER_ASSIGN_OR_RETURN(HfModelWeights loaded, LoadHfCheckpoint(directory, DType::kF32));
  if (!device.empty()) loaded.config.device = device;
  *config = loaded.config;
  return Model::LoadFromBytes(loaded.config, loaded.weights, directory);
}

void AddHfModelCommands(CLI::App* model, int& exit_code) {
  // model export
  struct ExportArgs {
    std::string from_hf, to_hf, config, hf_layout;
    std::vector<std::string> weights;
  };
  auto export_args = std::make_shared<ExportArgs>();
  CLI::App* exporter = model->add_subcommand(
      "export", "Write a checkpoint in the Hugging Face layout, streaming shard by shard");
  auto* from_hf = exporter->add_option("--from-hf", export_args->from_hf,
                                       "Hugging Face checkpoint directory (rewritten as it is)");
  auto* config = exporter->add_option("--config", export_args->config,
                                      "Strider model config (an import's model.yaml)");
  exporter
      ->add_option("--weights", export_args->weights,
                   "Strider weights: one file, or every rank's model.safetensors of an "
                   "expert-parallel learner checkpoint")
      ->needs(config);
  exporter
      ->add_option("--hf-layout", export_args->hf_layout,
                   "The published layout an import recorded (default: hf/ beside --config)")
      ->needs(config);
  from_hf->excludes(config);
  exporter->add_option("--to-hf", export_args->to_hf, "Output directory")->required();
  exporter->callback([export_args, &exit_code] {
    auto run = [&]() -> Status {
      ResetPeakResident();
      HfExportReport report;
      Json json;
      if (!export_args->from_hf.empty()) {
        STRIDER_ASSIGN_OR_RETURN(HfCheckpoint checkpoint, OpenChecked(export_args->from_hf, true));
        STRIDER_ASSIGN_OR_RETURN(report, ExportHfCheckpoint(checkpoint, export_args->to_hf));
        json["from_hf"] = export_args->from_hf;
      } else if (!export_args->config.empty()) {
        if (export_args->weights.empty()) {
          return Status::InvalidArgument("model export: --config needs --weights");
        }
        STRIDER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(export_args->config));
        const std::string layout =
            !export_args->hf_layout.empty()
                ? export_args->hf_layout
                : std::filesystem::path(export_args->config).parent_path().append("hf").string();
        STRIDER_ASSIGN_OR_RETURN(report, ExportStriderWeightsToHf(config, export_args->weights,
                                                                  layout, export_args->to_hf));
        json["config"] = export_args->config;
        json["weights"] = export_args->weights;
        json["hf_layout"] = layout;
      } else {
        return Status::InvalidArgument(
            "model export: give --from-hf DIR or --config F --weights W");
      }
      json["to_hf"] = export_args->to_hf;
      json["shards"] = report.shards;
      json["tensors"] = report.tensors;
      json["tensor_bytes"] = report.tensor_bytes;
      json["copied_files"] = report.copied_files;
      json["peak_resident_bytes"] = PeakResidentBytes();
      std::cout << json.dump(2) << std::endl;
      return Status::Ok();
    };
    if (Status status = run(); !status.ok()) exit_code = ReportError(status);
  });

  // model import
  struct ImportArgs {
    std::string from_hf, out, dtype = "float32";
  };
  auto import_args = std::make_shared<ImportArgs>();
  CLI::App* importer = model->add_subcommand(
      "import", "Convert a Hugging Face checkpoint to Strider's config and weights, streaming");
  importer->add_option("--from-hf", import_args->from_hf, "Hugging Face checkpoint directory")
      ->required();
  importer->add_option("--out", import_args->out, "Output directory")->required();
  importer
      ->add_option("--dtype", import_args->dtype,
                   "float32 (default; float64 wherever the checkpoint holds float64) or float64")
      ->check(CLI::IsMember({"float32", "float64"}));
  importer->callback([import_args, &exit_code] {
    auto run = [&]() -> Status {
      ResetPeakResident();
      STRIDER_ASSIGN_OR_RETURN(
          HfImportReport report,
          ImportHfCheckpoint(import_args->from_hf, import_args->out,
                             import_args->dtype == "float64" ? DType::kF64 : DType::kF32));
      Json json;
      json["from_hf"] = import_args->from_hf;
      json["config"] = report.config_path;
      json["weights"] = report.weights_path;
      json["hf_layout"] = report.layout_directory;
      json["parameters"] = report.parameters;
      json["published_tensors"] = report.published_tensors;
      if (!report.tokenizer_file.empty()) json["tokenizer"] = report.tokenizer_file;
      if (!report.tokenizer_note.empty()) json["tokenizer_note"] = report.tokenizer_note;
      json["weight_bytes"] = report.weight_bytes;
      json["peak_resident_bytes"] = PeakResidentBytes();
      std::cout << json.dump(2) << std::endl;
      return Status::Ok();
    };
    if (Status status = run(); !status.ok()) exit_code = ReportError(status);
  });
}

}  // namespace strider::cli
