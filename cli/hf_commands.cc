// `strider model info --from-hf`, `model import --from-hf` and `model export --from-hf --to-hf`.
#include "cli/hf_commands.h"

#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "common/model/hf_checkpoint.h"
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

void AddHfModelCommands(CLI::App* model, int& exit_code) {
  // model export
  struct ExportArgs {
    std::string from_hf, to_hf;
  };
  auto export_args = std::make_shared<ExportArgs>();
  CLI::App* exporter = model->add_subcommand(
      "export", "Write a checkpoint in the Hugging Face layout, streaming shard by shard");
  exporter->add_option("--from-hf", export_args->from_hf, "Hugging Face checkpoint directory")
      ->required();
  exporter->add_option("--to-hf", export_args->to_hf, "Output directory")->required();
  exporter->callback([export_args, &exit_code] {
    auto run = [&]() -> Status {
      ResetPeakResident();
      STRIDER_ASSIGN_OR_RETURN(HfCheckpoint checkpoint, OpenChecked(export_args->from_hf, true));
      STRIDER_ASSIGN_OR_RETURN(HfExportReport report,
                               ExportHfCheckpoint(checkpoint, export_args->to_hf));
      Json json;
      json["from_hf"] = export_args->from_hf;
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
    std::string from_hf, out;
  };
  auto import_args = std::make_shared<ImportArgs>();
  CLI::App* importer = model->add_subcommand(
      "import", "Check a Hugging Face checkpoint and convert it to Strider's config and weights");
  importer->add_option("--from-hf", import_args->from_hf, "Hugging Face checkpoint directory")
      ->required();
  importer->add_option("--out", import_args->out, "Output directory")->required();
  importer->callback([import_args, &exit_code] {
    auto run = [&]() -> Status {
      STRIDER_ASSIGN_OR_RETURN(HfCheckpoint checkpoint, OpenChecked(import_args->from_hf, true));
      // Refuses by name every published tensor whose computation the model cannot express yet
      // (common/model/hf_kimi_linear.cc), so no conversion is guessed.
      return PlanKimiLinearImport(checkpoint.config).status();
    };
    if (Status status = run(); !status.ok()) exit_code = ReportError(status);
  });
}

}  // namespace strider::cli
