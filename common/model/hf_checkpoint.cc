#include "common/model/hf_checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "common/durable_file.h"
#include "common/file_closer.h"

namespace strider {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSingleFile = "model.safetensors";
// How many names of each kind a refusal spells out before it gives the count of the rest.
constexpr size_t kNamesPerKind = 8;

std::string ShapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

Result<std::string> ReadSmallFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(fmt::format("{}: no such file", path));
    return Status::IoError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  FileCloser closer(fd);
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
    }
    if (got == 0) break;
    text.append(buffer, static_cast<size_t>(got));
    if (text.size() > (64u << 20)) {
      return Status::InvalidArgument(fmt::format("{}: larger than 64 MiB", path));
    }
  }
  return text;
}

// Copies a file durably in pieces, so a large tokenizer file never sits whole in memory.
Status CopyFileDurably(const std::string& from, const std::string& to) {
  int fd = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::IoError(fmt::format("{}: cannot open: {}", from, std::strerror(errno)));
  }
  FileCloser closer(fd);
  return WriteFileDurablyStreamed(to, [&](const FileAppender& append) -> Status {
    std::string buffer(1 << 20, '\0');
    for (;;) {
      ssize_t got = ::read(fd, buffer.data(), buffer.size());
      if (got < 0) {
        if (errno == EINTR) continue;
        return Status::IoError(fmt::format("{}: read failed: {}", from, std::strerror(errno)));
      }
      if (got == 0) return Status::Ok();
      STRIDER_RETURN_IF_ERROR(append(std::string_view(buffer.data(), static_cast<size_t>(got))));
    }
  });
}

// "a, b, c and 12 more"
std::string Some(const std::vector<std::string>& names) {
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + std::min(names.size(), kNamesPerKind));
  std::string text = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > shown.size()) text += fmt::format(" and {} more", names.size() - shown.size());
  return text;
}

}  // namespace

Result<HfCheckpoint> OpenHfCheckpoint(const std::string& directory) {
  HfCheckpoint checkpoint;
  checkpoint.directory = directory;
  const std::string config_path = directory + "/config.json";
  Result<std::string> config_text = ReadSmallFile(config_path);
  if (!config_text.ok()) {
    if (config_text.status().IsNotFound()) {
      return Status::NotFound(
          fmt::format("{}: no config.json: not a Hugging Face checkpoint directory", directory));
    }
    return config_text.status();
  }
  STRIDER_ASSIGN_OR_RETURN(checkpoint.config, ParseKimiLinearConfig(*config_text, config_path));

  const std::string index_path = directory + "/" + kSafetensorsIndexName;
  std::map<std::string, std::string> where;  // tensor -> shard, from the index or the one file
  if (fs::exists(index_path)) {
    STRIDER_ASSIGN_OR_RETURN(SafetensorsIndex index, ReadSafetensorsIndex(index_path));
    where = index.weight_map;
    checkpoint.shards = index.Shards();
    checkpoint.index = std::move(index);
  } else if (fs::exists(directory + "/" + kSingleFile)) {
    checkpoint.shards = {kSingleFile};
  } else {
    return Status::NotFound(
        fmt::format("{}: neither {} nor {}", directory, kSafetensorsIndexName, kSingleFile));
  }
  for (const auto& [name, file] : where) checkpoint.tensors[name].file = file;

  for (const std::string& shard : checkpoint.shards) {
    const std::string path = directory + "/" + shard;
    if (!fs::exists(path)) {
      checkpoint.missing_shards.push_back(shard);
      continue;
    }
    STRIDER_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(path));
    std::set<std::string> held;
    for (const SafetensorsEntry& entry : header.entries) {
      held.insert(entry.name);
      auto listed = checkpoint.tensors.find(entry.name);
      if (checkpoint.index &&
          (listed == checkpoint.tensors.end() || listed->second.file != shard)) {
        return Status::Corruption(fmt::format(
            "{}: holds tensor '{}', which {} {}", path, entry.name, kSafetensorsIndexName,
            listed == checkpoint.tensors.end() ? std::string("does not list")
                                               : "places in " + listed->second.file));
      }
      HfTensorEntry& tensor = checkpoint.tensors[entry.name];
      tensor.file = shard;
      tensor.read = true;
      tensor.dtype = entry.dtype;
      tensor.shape = entry.shape;
    }
    for (const auto& [name, tensor] : checkpoint.tensors) {
      if (tensor.file == shard && !held.count(name)) {
        return Status::Corruption(
            fmt::format("{}: {} places tensor '{}' in this shard, which "
                        "does not hold it",
                        path, kSafetensorsIndexName, name));
      }
    }
  }
  return checkpoint;
}

Status RequireShards(const HfCheckpoint& checkpoint) {
  if (checkpoint.missing_shards.empty()) return Status::Ok();
  return Status::NotFound(fmt::format("{}: {} shard(s) listed in {} are missing: {}",
                                      checkpoint.directory, checkpoint.missing_shards.size(),
                                      kSafetensorsIndexName, Some(checkpoint.missing_shards)));
}

Status CheckKimiLinearTensors(const HfCheckpoint& checkpoint) {
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> expected_names;
  for (const KimiTensor& tensor : KimiLinearTensors(checkpoint.config)) {
    expected_names.insert(tensor.hf_name);
    auto found = checkpoint.tensors.find(tensor.hf_name);
    if (found == checkpoint.tensors.end()) {
      missing.push_back(tensor.hf_name);
    } else if (found->second.read && found->second.shape != tensor.shape) {
      mismatched.push_back(fmt::format("{} is {} in {}, the config gives {}", tensor.hf_name,
                                       ShapeText(found->second.shape), found->second.file,
                                       ShapeText(tensor.shape)));
    }
  }
  for (const auto& [name, entry] : checkpoint.tensors) {
    if (!expected_names.count(name)) unexpected.push_back(name);
  }
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return Status::Ok();
  std::vector<std::string> parts;
  if (!missing.empty()) {
    parts.push_back(fmt::format("{} missing tensor(s): {}", missing.size(), Some(missing)));
  }
  if (!unexpected.empty()) {
    parts.push_back(
        fmt::format("{} unexpected tensor(s) (not in a kimi_linear checkpoint of "
                    "this config): {}",
                    unexpected.size(), Some(unexpected)));
  }
  if (!mismatched.empty()) {
    parts.push_back(fmt::format("{} shape(s) not matching config.json: {}", mismatched.size(),
                                Some(mismatched)));
  }
  return Status::InvalidArgument(
      fmt::format("{}: {}", checkpoint.directory, fmt::join(parts, "; ")));
}

HfParameterFigures KimiLinearFigures(const KimiLinearConfig& config) {
  HfParameterFigures f;
  const double k = static_cast<double>(config.num_experts_per_token);
  const double n = static_cast<double>(std::max<int64_t>(1, config.num_experts));
  for (const KimiTensor& tensor : KimiLinearTensors(config)) {
    const double count = static_cast<double>(tensor.Count());
    const std::string component(tensor.rule->component);
    const double active = component == "routed_experts" ? count * k / n : count;
    f.total += count;
    f.active += active;
    f.total_by_component[component] += count;
    f.active_by_component[component] += active;
    f.tensors += 1;
  }
  const double routed = f.total_by_component["routed_experts"];
  const double embeddings = f.total_by_component["embeddings"];
  f.active_without_embeddings = f.active - embeddings;
  f.active_formula = fmt::format(
      "active = total - routed_experts * (1 - k/n) = {:.0f} - {:.0f} * (1 - {}/{}) = {:.0f} "
      "(every tensor but the routed experts, which contribute k of n per token; less the "
      "embedding table, a lookup: {:.0f})",
      f.total, routed, config.num_experts_per_token, config.num_experts, f.active,
      f.active_without_embeddings);
  return f;
}

Result<HfParameterCounts> CountHfParameters(const HfCheckpoint& checkpoint) {
  HfParameterCounts counts;
  for (const KimiTensor& tensor : KimiLinearTensors(checkpoint.config)) {
    counts.from_config += static_cast<uint64_t>(tensor.Count());
  }
  if (checkpoint.index) counts.from_index = checkpoint.index->total_parameters;
  if (counts.from_index && *counts.from_index != counts.from_config) {
    return Status::Corruption(fmt::format(
        "{}: {} gives metadata.total_parameters {}, but the tensors config.json calls for hold {}",
        checkpoint.directory, kSafetensorsIndexName, *counts.from_index, counts.from_config));
  }
  if (checkpoint.missing_shards.empty()) {
    uint64_t parameters = 0, bytes = 0;
    for (const auto& [name, tensor] : checkpoint.tensors) {
      uint64_t count = 1;
      for (int64_t dim : tensor.shape) count *= static_cast<uint64_t>(dim);
      parameters += count;
      bytes += count * DTypeSize(tensor.dtype);
    }
    if (parameters != counts.from_config) {
      return Status::Corruption(
          fmt::format("{}: the shard headers hold {} parameters, the "
                      "config calls for {}",
                      checkpoint.directory, parameters, counts.from_config));
    }
    counts.from_headers = parameters;
    counts.header_bytes = bytes;
  }
  return counts;
}

Result<HfExpertParallelFootprint> KimiLinearFootprint(const KimiLinearConfig& config,
                                                      int64_t degree) {
  if (degree < 1 || config.num_experts % degree != 0) {
    return Status::InvalidArgument(fmt::format(
        "--expert-parallel {} must divide the {} routed experts", degree, config.num_experts));
  }
  const HfParameterFigures figures = KimiLinearFigures(config);
  HfExpertParallelFootprint f;
  f.degree = degree;
  f.experts_per_rank = config.num_experts / degree;
  const double routed = figures.total_by_component.count("routed_experts")
                            ? figures.total_by_component.at("routed_experts")
                            : 0.0;
  f.routed_parameters_per_rank = routed / static_cast<double>(degree);
  f.replicated_parameters = figures.total - routed;
  f.parameters_per_rank = f.replicated_parameters + f.routed_parameters_per_rank;
  f.weight_bytes_per_rank = f.parameters_per_rank * static_cast<double>(config.DtypeBytes());
  f.training_bytes_per_rank = f.parameters_per_rank * kTrainingBytesPerParameter;
  return f;
}

Result<HfExportReport> ExportHfCheckpoint(const HfCheckpoint& checkpoint, const std::string& out) {
  STRIDER_RETURN_IF_ERROR(RequireShards(checkpoint));
  std::error_code error;
  if (fs::exists(out) && fs::equivalent(out, checkpoint.directory, error)) {
    return Status::InvalidArgument(
        fmt::format("{}: the export would overwrite its own source", out));
  }
  fs::create_directories(out, error);
  if (error) {
    return Status::IoError(fmt::format("{}: cannot create: {}", out, error.message()));
  }
  HfExportReport report;
  for (const std::string& shard : checkpoint.shards) {
    STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<MappedSafetensors> source,
                             MappedSafetensors::Open(checkpoint.directory + "/" + shard));
    std::vector<TensorView> views;
    std::map<std::string_view, const SafetensorsEntry*> entries;
    for (const SafetensorsEntry& entry : source->header().entries) {
      views.push_back(source->View(entry));
      entries.emplace(entry.name, &entry);
      report.tensor_bytes += entry.end - entry.begin;
    }
    // The writer orders tensors as the reference writer does, so a shard it wrote comes back
    // in its own order; each tensor's source pages go once its bytes are in the new file.
    STRIDER_RETURN_IF_ERROR(
        WriteSafetensors(out + "/" + shard, views, source->header().metadata,
                         [&](const TensorView& view) { source->Release(*entries.at(view.name)); }));
    report.tensors += static_cast<int64_t>(views.size());
    ++report.shards;
  }
  if (checkpoint.index) {
    SafetensorsIndex index = *checkpoint.index;
    index.total_size = report.tensor_bytes;
    STRIDER_RETURN_IF_ERROR(WriteSafetensorsIndex(out + "/" + kSafetensorsIndexName, index));
  }
  // Everything else Strider does not change travels as it is: config.json,
  // generation_config.json, tokenizer and chat template files, the modelling code.
  const std::set<std::string> written(checkpoint.shards.begin(), checkpoint.shards.end());
  std::vector<std::string> others;
  for (const fs::directory_entry& entry : fs::directory_iterator(checkpoint.directory, error)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name.empty() || name[0] == '.') continue;
    if (written.count(name) || name == kSafetensorsIndexName) continue;
    others.push_back(name);
  }
  if (error) {
    return Status::IoError(
        fmt::format("{}: cannot list: {}", checkpoint.directory, error.message()));
  }
  std::sort(others.begin(), others.end());
  for (const std::string& name : others) {
    STRIDER_RETURN_IF_ERROR(CopyFileDurably(checkpoint.directory + "/" + name, out + "/" + name));
    report.copied_files.push_back(name);
  }
  STRIDER_RETURN_IF_ERROR(FsyncDirectory(out));
  return report;
}

Status ConvertHfTensors(const HfCheckpoint& checkpoint, const std::vector<HfImportTensor>& tensors,
                        DType dtype, const std::string& path) {
  STRIDER_RETURN_IF_ERROR(RequireShards(checkpoint));
  if (dtype != DType::kF32 && dtype != DType::kF64) {
    return Status::InvalidArgument(
        fmt::format("{}: imports are written in F32 or F64, not {}", path, DTypeName(dtype)));
  }
  std::map<std::string, std::unique_ptr<MappedSafetensors>> shards;
  std::map<std::string, std::pair<const MappedSafetensors*, const SafetensorsEntry*>> sources;
  std::vector<TensorView> views;
  for (const HfImportTensor& tensor : tensors) {
    auto found = checkpoint.tensors.find(tensor.hf_name);
    if (found == checkpoint.tensors.end()) {
      return Status::NotFound(fmt::format("{}: no tensor '{}' (for {})", checkpoint.directory,
                                          tensor.hf_name, tensor.strider_name));
    }
    std::unique_ptr<MappedSafetensors>& shard = shards[found->second.file];
    if (!shard) {
      STRIDER_ASSIGN_OR_RETURN(
          shard, MappedSafetensors::Open(checkpoint.directory + "/" + found->second.file));
    }
    const SafetensorsEntry* entry = shard->header().Find(tensor.hf_name);
    uint64_t elements = 1;
    for (int64_t dim : tensor.shape) elements *= static_cast<uint64_t>(dim);
    if (entry == nullptr || elements != entry->Elements()) {
      return Status::InvalidArgument(fmt::format(
          "{}: tensor '{}' is {}, which does not hold the elements of {} {}", checkpoint.directory,
          tensor.hf_name, entry ? ShapeText(entry->shape) : std::string("absent"),
          tensor.strider_name, ShapeText(tensor.shape)));
    }
    if (entry->dtype == DType::kBool) {
      return Status::InvalidArgument(
          fmt::format("{}: tensor '{}' is BOOL, which does not "
                      "convert to floating point",
                      checkpoint.directory, tensor.hf_name));
    }
    TensorView view;
    view.name = tensor.strider_name;
    view.dtype = dtype;
    view.shape = tensor.shape;
    view.byte_size = elements * DTypeSize(dtype);
    views.push_back(std::move(view));
    sources[tensor.strider_name] = {shard.get(), entry};
  }
  constexpr size_t kSlice = 1 << 16;  // elements converted per append
  std::vector<uint8_t> buffer(kSlice * DTypeSize(dtype));
  return WriteSafetensorsProduced(
      path, views, [&](const TensorView& view, const FileAppender& append) -> Status {
        const auto [shard, entry] = sources.at(view.name);
        const std::string_view bytes = shard->Bytes(*entry);
        const size_t width = DTypeSize(entry->dtype);
        const uint64_t elements = entry->Elements();
        for (uint64_t at = 0; at < elements; at += kSlice) {
          const size_t count = static_cast<size_t>(std::min<uint64_t>(kSlice, elements - at));
          STRIDER_RETURN_IF_ERROR(ConvertElements(entry->dtype, bytes.data() + at * width, count,
                                                  dtype, buffer.data()));
          STRIDER_RETURN_IF_ERROR(append(std::string_view(
              reinterpret_cast<const char*>(buffer.data()), count * DTypeSize(dtype))));
        }
        shard->Release(*entry);
        return Status::Ok();
      });
}

Result<std::vector<std::pair<std::string, std::string>>> PlanKimiLinearImport(
    const KimiLinearConfig& config) {
  std::vector<std::pair<std::string, std::string>> plan;
  // One line per published name pattern that does not map, with its reason, in table order.
  std::vector<std::string> unmapped;
  std::set<const KimiTensorRule*> reported;
  for (const KimiTensor& tensor : KimiLinearTensors(config)) {
    if (tensor.rule->maps) {
      plan.emplace_back(tensor.hf_name, tensor.strider_name);
    } else if (reported.insert(tensor.rule).second) {
      unmapped.push_back(fmt::format("  {}: {}", tensor.rule->hf, tensor.rule->note));
    }
  }
  if (unmapped.empty()) return plan;
  std::vector<std::string> strider_only;
  for (const StriderOnlyParameter& parameter : StriderParametersWithoutKimiCounterpart()) {
    strider_only.push_back(fmt::format("  {}: {}", parameter.strider, parameter.note));
  }
  return Status::Unimplemented(fmt::format(
      "kimi_linear import: {} of {} tensors map onto Strider's parameters today; the model does "
      "not yet express these published tensors:\n{}\nand these Strider parameters have no "
      "published counterpart:\n{}",
      plan.size(), KimiLinearTensors(config).size(), fmt::join(unmapped, "\n"),
      fmt::join(strider_only, "\n")));
}

}  // namespace strider
