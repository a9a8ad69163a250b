#include "common/model/hf_checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "common/durable_file.h"
#include "common/file_closer.h"
#include "common/model/parameters.h"

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

// The files of a checkpoint directory other than its shards and index: what travels unchanged.
Result<std::vector<std::string>> PublishedFiles(const std::string& directory,
                                                const std::set<std::string>& skip) {
  std::error_code error;
  std::vector<std::string> others;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name.empty() || name[0] == '.') continue;
    if (skip.count(name) || name == kSafetensorsIndexName) continue;
    others.push_back(name);
  }
  if (error) return Status::IoError(fmt::format("{}: cannot list: {}", directory, error.message()));
  std::sort(others.begin(), others.end());
  return others;
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
  STRIDER_ASSIGN_OR_RETURN(std::vector<std::string> others,
                           PublishedFiles(checkpoint.directory, written));
  for (const std::string& name : others) {
    STRIDER_RETURN_IF_ERROR(CopyFileDurably(checkpoint.directory + "/" + name, out + "/" + name));
    report.copied_files.push_back(name);
  }
  STRIDER_RETURN_IF_ERROR(FsyncDirectory(out));
  return report;
}

namespace {

uint64_t Elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t dim : shape) n *= static_cast<uint64_t>(dim);
  return n;
}

// Where each published tensor of an import comes from, checked once for both writers.
struct ImportSource {
  const MappedSafetensors* shard;
  const SafetensorsEntry* entry;
};
struct OpenedImport {
  std::map<std::string, std::unique_ptr<MappedSafetensors>> shards;
  std::map<std::string, std::vector<ImportSource>> sources;  // by Strider name
  std::vector<TensorView> views;
};

Result<OpenedImport> OpenImport(const HfCheckpoint& checkpoint,
                                const std::vector<HfImportTensor>& tensors, DType dtype,
                                const std::string& target) {
  STRIDER_RETURN_IF_ERROR(RequireShards(checkpoint));
  if (dtype != DType::kF32 && dtype != DType::kF64) {
    return Status::InvalidArgument(
        fmt::format("{}: imports are written in F32 or F64, not {}", target, DTypeName(dtype)));
  }
  OpenedImport opened;
  for (const HfImportTensor& tensor : tensors) {
    std::vector<ImportSource>& sources = opened.sources[tensor.strider_name];
    uint64_t held = 0;
    std::vector<std::string> shapes;
    for (const std::string& hf_name : tensor.hf_names) {
      auto found = checkpoint.tensors.find(hf_name);
      if (found == checkpoint.tensors.end()) {
        return Status::NotFound(fmt::format("{}: no tensor '{}' (for {})", checkpoint.directory,
                                            hf_name, tensor.strider_name));
      }
      std::unique_ptr<MappedSafetensors>& shard = opened.shards[found->second.file];
      if (!shard) {
        STRIDER_ASSIGN_OR_RETURN(
            shard, MappedSafetensors::Open(checkpoint.directory + "/" + found->second.file));
      }
      const SafetensorsEntry* entry = shard->header().Find(hf_name);
      if (entry == nullptr) {
        return Status::Corruption(fmt::format("{}: shard {} does not hold '{}'",
                                              checkpoint.directory, found->second.file, hf_name));
      }
      if (entry->dtype == DType::kBool) {
        return Status::InvalidArgument(
            fmt::format("{}: tensor '{}' is BOOL, which does not convert to floating point",
                        checkpoint.directory, hf_name));
      }
      held += entry->Elements();
      shapes.push_back(ShapeText(entry->shape));
      sources.push_back({shard.get(), entry});
    }
    if (!tensor.hf_names.empty() && held != Elements(tensor.shape)) {
      return Status::InvalidArgument(fmt::format(
          "{}: tensor '{}' is {}, which does not hold the elements of {} {}", checkpoint.directory,
          fmt::join(tensor.hf_names.size() > 3
                        ? std::vector<std::string>{tensor.hf_names.front(), "..."}
                        : tensor.hf_names,
                    "' + '"),
          fmt::join(shapes.size() > 3 ? std::vector<std::string>{shapes.front(), "..."} : shapes,
                    " + "),
          tensor.strider_name, ShapeText(tensor.shape)));
    }
    TensorView view;
    view.name = tensor.strider_name;
    view.dtype = dtype;
    view.shape = tensor.shape;
    view.byte_size = Elements(tensor.shape) * DTypeSize(dtype);
    opened.views.push_back(std::move(view));
  }
  return opened;
}

// Appends one Strider tensor: its published tensors converted a slice at a time, each
// released once written; zeros where none.
Status ProduceImported(const OpenedImport& opened, const TensorView& view,
                       const FileAppender& append) {
  constexpr size_t kSlice = 1 << 16;  // elements converted per append
  std::vector<uint8_t> buffer(kSlice * DTypeSize(view.dtype));
  const std::vector<ImportSource>& sources = opened.sources.at(view.name);
  if (sources.empty()) {
    std::fill(buffer.begin(), buffer.end(), 0);
    for (uint64_t left = view.byte_size; left > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buffer.size()));
      STRIDER_RETURN_IF_ERROR(
          append(std::string_view(reinterpret_cast<const char*>(buffer.data()), n)));
      left -= n;
    }
    return Status::Ok();
  }
  for (const ImportSource& source : sources) {
    const std::string_view bytes = source.shard->Bytes(*source.entry);
    const size_t width = DTypeSize(source.entry->dtype);
    const uint64_t elements = source.entry->Elements();
    for (uint64_t at = 0; at < elements; at += kSlice) {
      const size_t count = static_cast<size_t>(std::min<uint64_t>(kSlice, elements - at));
      STRIDER_RETURN_IF_ERROR(ConvertElements(source.entry->dtype, bytes.data() + at * width, count,
                                              view.dtype, buffer.data()));
      STRIDER_RETURN_IF_ERROR(append(std::string_view(reinterpret_cast<const char*>(buffer.data()),
                                                      count * DTypeSize(view.dtype))));
    }
    source.shard->Release(*source.entry);
  }
  return Status::Ok();
}

std::map<std::string, std::string> StriderMetadata(const std::string& name) {
  return {{"format", "strider"}, {"model", name}, {"version", "1"}};
}

// ---- Narrowing for export: fp32 or fp64 back to the published dtype ----

// Round to nearest even; a NaN keeps its top bits (a bf16 NaN widened to fp32 comes back as it
// was), made quiet only where truncation would turn it into an infinity.
uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    uint16_t top = static_cast<uint16_t>(bits >> 16);
    if ((top & 0x7f) == 0) top |= 0x40;
    return top;
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: the top mantissa bits, kept a NaN
    uint16_t mantissa = static_cast<uint16_t>((magnitude >> 13) & 0x3ffu);
    return sign | 0x7c00u | (mantissa ? mantissa : 0x200u);
  }
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: infinity
  if (magnitude < 0x38800000u) {                        // below 2^-14: subnormal or zero
    float absolute;
    std::memcpy(&absolute, &magnitude, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(absolute * 16777216.0f));  // x 2^24, exact
  }
  const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

// `count` elements of F32 or F64 `source` to `to` (F64, F32, BF16 or F16).
Status NarrowElements(DType from, const void* source, size_t count, DType to, void* target) {
  if (from != DType::kF32 && from != DType::kF64) {
    return Status::InvalidArgument(
        fmt::format("Strider weights are F32 or F64, not {}", DTypeName(from)));
  }
  auto value = [&](size_t i) -> double {
    if (from == DType::kF64) {
      double v;
      std::memcpy(&v, static_cast<const uint8_t*>(source) + 8 * i, 8);
      return v;
    }
    float v;
    std::memcpy(&v, static_cast<const uint8_t*>(source) + 4 * i, 4);
    return v;
  };
  auto* out = static_cast<uint8_t*>(target);
  switch (to) {
    case DType::kF64:
      for (size_t i = 0; i < count; ++i) {
        const double v = value(i);
        std::memcpy(out + 8 * i, &v, 8);
      }
      return Status::Ok();
    case DType::kF32:
      if (from == DType::kF32) {
        std::memcpy(out, source, 4 * count);  // bits as they are, NaN payloads included
        return Status::Ok();
      }
      for (size_t i = 0; i < count; ++i) {
        const float v = static_cast<float>(value(i));
        std::memcpy(out + 4 * i, &v, 4);
      }
      return Status::Ok();
    case DType::kBF16:
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) {
        float v;
        if (from == DType::kF32) {
          std::memcpy(&v, static_cast<const uint8_t*>(source) + 4 * i, 4);
        } else {
          v = static_cast<float>(value(i));
        }
        const uint16_t h = to == DType::kBF16 ? FloatToBf16(v) : FloatToHalf(v);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return Status::Ok();
    default:
      return Status::InvalidArgument(fmt::format(
          "cannot write {} from Strider's weights: floating point only", DTypeName(to)));
  }
}

bool ParseExpertShard(const std::map<std::string, std::string>& metadata, int64_t* first,
                      int64_t* count) {
  auto it = metadata.find("expert_shard");
  if (it == metadata.end()) return false;
  const size_t colon = it->second.find(':');
  if (colon == std::string::npos) return false;
  try {
    *first = std::stoll(it->second.substr(0, colon));
    *count = std::stoll(it->second.substr(colon + 1));
  } catch (const std::exception&) {
    return false;
  }
  return *first >= 0 && *count > 0;
}

}  // namespace

Status ConvertHfTensors(const HfCheckpoint& checkpoint, const std::vector<HfImportTensor>& tensors,
                        DType dtype, const std::string& path,
                        const std::map<std::string, std::string>& metadata) {
  STRIDER_ASSIGN_OR_RETURN(OpenedImport opened, OpenImport(checkpoint, tensors, dtype, path));
  return WriteSafetensorsProduced(
      path, opened.views,
      [&](const TensorView& view, const FileAppender& append) {
        return ProduceImported(opened, view, append);
      },
      metadata);
}

Result<std::string> ConvertHfTensorsToBytes(const HfCheckpoint& checkpoint,
                                            const std::vector<HfImportTensor>& tensors, DType dtype,
                                            const std::map<std::string, std::string>& metadata) {
  STRIDER_ASSIGN_OR_RETURN(OpenedImport opened,
                           OpenImport(checkpoint, tensors, dtype, checkpoint.directory));
  std::vector<std::string> buffers;
  buffers.reserve(opened.views.size());
  for (TensorView& view : opened.views) {
    std::string& bytes = buffers.emplace_back();
    bytes.reserve(view.byte_size);
    STRIDER_RETURN_IF_ERROR(ProduceImported(opened, view, [&](std::string_view piece) {
      bytes.append(piece);
      return Status::Ok();
    }));
    view.data = bytes.data();
  }
  return EncodeSafetensors(opened.views, metadata);
}

Result<ModelConfig> KimiLinearModelConfig(const KimiLinearConfig& c) {
  auto refuse = [](const std::string& what) {
    return Status::Unimplemented("kimi_linear: " + what);
  };
  if (c.num_experts > 0 && c.moe_layer_freq != 1) {
    return refuse(fmt::format(
        "moe_layer_freq {}: Strider's sparse layers are every layer after the dense ones (1)",
        c.moe_layer_freq));
  }
  if (c.attention_bias) return refuse("attention_bias true: projections with biases");
  if (c.num_key_value_heads != 0 && c.num_key_value_heads != c.num_attention_heads) {
    return refuse(fmt::format("num_key_value_heads {} differs from num_attention_heads {}",
                              c.num_key_value_heads, c.num_attention_heads));
  }
  if (!c.mla_use_nope) return refuse("mla_use_nope false: MLA with rotary embeddings");
  if (c.hidden_act != "silu") {
    return refuse(fmt::format("hidden_act '{}' (supported: silu)", c.hidden_act));
  }
  ModelConfig m;
  m.name = "kimi_linear";
  m.vocabulary = c.vocab_size;
  m.width = c.hidden_size;
  m.layers = c.num_hidden_layers;
  m.layer_pattern.clear();
  for (bool kda : c.kda) m.layer_pattern.push_back(kda ? 'I' : 'G');
  m.last_layer.clear();
  // Kimi Linear adds each sublayer to the stream; K3 reads attention residuals in blocks.
  m.attention_residuals = c.attn_res_block_size > 0;
  if (c.attn_res_block_size > 0) m.residual_block = c.attn_res_block_size;
  m.tie_embeddings = c.tie_word_embeddings;
  if (c.max_length > 0) m.context = c.max_length;
  m.init_std = c.initializer_range;
  m.norm_epsilon = c.rms_norm_eps;
  m.vision.enabled = false;

  IncrementalAttentionConfig& kda = m.incremental;
  kda.heads = c.kda_heads;
  kda.key_dim = c.kda_head_dim;
  kda.value_dim = c.kda_head_dim;
  kda.conv_width = c.kda_conv_width;
  kda.decay_rank = c.kda_head_dim;  // f_a_proj [head_dim, d]
  kda.decay_gate = "softplus";
  kda.gate_rank = c.use_full_rank_gate ? 0 : c.kda_head_dim;  // g_a_proj [head_dim, d]
  // vLLM's and SGLang's KDA layers normalise the output with 1e-5 whatever rms_norm_eps says.
  kda.output_norm_epsilon = 1e-5;

  LatentAttentionConfig& mla = m.latent;
  mla.heads = c.num_attention_heads;
  mla.query_rank = c.q_lora_rank;
  mla.kv_rank = c.kv_lora_rank;
  mla.nope_dim = c.qk_nope_head_dim;
  mla.rope_dim = c.qk_rope_head_dim;
  mla.value_dim = c.v_head_dim;
  mla.output_gate = c.mla_use_output_gate;
  mla.norm_epsilon = 0;  // rms_norm_eps, as the serving engines

  FeedForwardConfig& ff = m.feed_forward;
  ff.activation = "silu";
  ff.dense_hidden = c.intermediate_size;
  if (c.num_experts == 0) {
    ff.dense_layers = c.num_hidden_layers;
  } else {
    ff.dense_layers = std::min(c.first_k_dense_replace, c.num_hidden_layers);
    ff.latent_experts = false;
    ff.expert_hidden = c.moe_intermediate_size;
    ff.routed_experts = c.num_experts;
    ff.experts_per_token = c.num_experts_per_token;
    // Kimi's S shared experts are one SwiGLU of width S * moe_intermediate_size.
    ff.shared_experts = c.num_shared_experts > 0 ? 1 : 0;
    ff.shared_hidden = std::max<int64_t>(1, c.num_shared_experts) * c.moe_intermediate_size;
    ff.router_activation = c.router_activation;
    ff.renormalize = c.renormalize;
    ff.renormalize_epsilon = 0;
    ff.routed_scaling_factor = c.routed_scaling_factor;
    ff.expert_groups = c.use_grouped_topk ? std::max<int64_t>(1, c.num_expert_group) : 1;
    ff.groups_per_token = c.use_grouped_topk ? std::max<int64_t>(1, c.topk_group) : 1;
    // The published correction bias is kept as trained; balancing would move it.
    ff.quantile_balancing = false;
  }
  STRIDER_RETURN_IF_ERROR(ValidateModelConfig(m, "kimi_linear config.json"));
  return m;
}

Result<HfImportPlan> PlanKimiLinearImport(const KimiLinearConfig& config) {
  HfImportPlan plan;
  STRIDER_ASSIGN_OR_RETURN(plan.model, KimiLinearModelConfig(config));
  const std::vector<KimiTensor> tensors = KimiLinearTensors(config);
  // One line per published name pattern that does not map, with its reason, in table order.
  std::vector<std::string> unmapped;
  std::set<const KimiTensorRule*> reported;
  std::map<std::string, std::vector<const KimiTensor*>> sources;
  for (const KimiTensor& tensor : tensors) {
    if (tensor.rule->maps) {
      sources[tensor.strider_name].push_back(&tensor);
    } else if (reported.insert(tensor.rule).second) {
      unmapped.push_back(fmt::format("  {}: {}", tensor.rule->hf, tensor.rule->note));
    }
  }
  std::vector<std::string> strider_only, mismatched, unused;
  std::set<std::string> used;
  for (const ParameterSpec& spec : ModelParameterSpecs(plan.model)) {
    HfImportTensor tensor{{}, spec.name, spec.shape};
    auto found = sources.find(spec.name);
    if (found == sources.end()) {
      // The learner's value head is Strider's own: it starts at zero.
      if (spec.name.rfind("value_head.", 0) != 0) strider_only.push_back("  " + spec.name);
      plan.tensors.push_back(std::move(tensor));
      continue;
    }
    used.insert(spec.name);
    int64_t count = 0;
    for (const KimiTensor* source : found->second) {
      tensor.hf_names.push_back(source->hf_name);
      count += source->Count();
    }
    if (count != spec.Count()) {
      mismatched.push_back(fmt::format("  {} {}: the published tensors hold {} element(s)",
                                       spec.name, ShapeText(spec.shape), count));
    }
    plan.tensors.push_back(std::move(tensor));
  }
  for (const auto& [name, list] : sources) {
    if (!used.count(name)) {
      unused.push_back(fmt::format("  {} (from {})", name, list.front()->hf_name));
    }
  }
  if (unmapped.empty() && strider_only.empty() && mismatched.empty() && unused.empty()) {
    return plan;
  }
  std::vector<std::string> parts;
  if (!unmapped.empty()) {
    parts.push_back(fmt::format("the model does not yet express these published tensors:\n{}",
                                fmt::join(unmapped, "\n")));
  }
  if (!strider_only.empty()) {
    parts.push_back(fmt::format(
        "these Strider parameters of the imported config have no published counterpart:\n{}",
        Some(strider_only)));
  }
  if (!mismatched.empty()) {
    parts.push_back(fmt::format("these parameters do not match their published tensors:\n{}",
                                Some(mismatched)));
  }
  if (!unused.empty()) {
    parts.push_back(fmt::format(
        "the table maps published tensors onto parameters the imported config lacks:\n{}",
        Some(unused)));
  }
  return Status::Unimplemented(fmt::format("kimi_linear import of {} published tensors: {}",
                                           tensors.size(), fmt::join(parts, "\n")));
}

Result<HfModelWeights> LoadHfCheckpoint(const std::string& directory, DType dtype) {
  STRIDER_ASSIGN_OR_RETURN(HfCheckpoint checkpoint, OpenHfCheckpoint(directory));
  STRIDER_RETURN_IF_ERROR(RequireShards(checkpoint));
  STRIDER_RETURN_IF_ERROR(CheckKimiLinearTensors(checkpoint));
  STRIDER_ASSIGN_OR_RETURN(HfImportPlan plan, PlanKimiLinearImport(checkpoint.config));
  HfModelWeights loaded;
  STRIDER_ASSIGN_OR_RETURN(
      loaded.weights,
      ConvertHfTensorsToBytes(checkpoint, plan.tensors, dtype, StriderMetadata(plan.model.name)));
  loaded.config = std::move(plan.model);
  return loaded;
}

namespace {

// The split pattern of a Kimi tokenizer's tokenization_kimi.py: the raw string literals joined
// by "|" where `pat_str` is assigned. The published file spells it as
// `pat_str = "|".join([r"""...""", ...])`; a single literal is taken as it is.
std::optional<std::string> KimiSplitPattern(const std::string& source) {
  const size_t at = source.find("pat_str");
  if (at == std::string::npos) return std::nullopt;
  size_t next = source.find('=', at);
  if (next == std::string::npos) return std::nullopt;
  ++next;
  const size_t join = source.find_first_not_of(" \t", next);
  if (join != std::string::npos && source.compare(join, 9, "\"|\".join(") == 0) next = join + 9;
  // Literals separated by brackets, commas and whitespace, until anything else.
  std::vector<std::string> parts;
  for (;;) {
    next = source.find_first_not_of(" \t\r\n,[", next);
    if (next == std::string::npos || source.compare(next, 4, "r\"\"\"") != 0) break;
    const size_t close = source.find("\"\"\"", next + 4);
    if (close == std::string::npos) return std::nullopt;
    parts.push_back(source.substr(next + 4, close - next - 4));
    next = close + 3;
  }
  if (parts.empty()) return std::nullopt;
  return fmt::format("{}", fmt::join(parts, "|"));
}

// The tokenizer section of an import from the files it copied into `layout_directory`.
void NameImportedTokenizer(const std::string& layout_directory,
                           const std::vector<std::string>& files, ModelConfig* model,
                           HfImportReport* report) {
  auto has = [&](const char* name) {
    return std::find(files.begin(), files.end(), name) != files.end();
  };
  tokenizer::TokenizerConfig t;
  if (has("tokenizer.json")) {
    t.file = "hf/tokenizer.json";
  } else if (has("tiktoken.model")) {
    std::optional<std::string> pattern;
    if (has("tokenization_kimi.py")) {
      Result<std::string> source = ReadSmallFile(layout_directory + "/tokenization_kimi.py");
      if (source.ok()) pattern = KimiSplitPattern(*source);
    }
    if (!pattern) {
      report->tokenizer_note =
          "tiktoken.model without a split pattern read from tokenization_kimi.py: add "
          "model.tokenizer (file, format: tiktoken, pattern) by hand";
      return;
    }
    t.file = "hf/tiktoken.model";
    t.format = "tiktoken";
    t.pattern = *pattern;
  } else {
    report->tokenizer_note = "no tokenizer.json or tiktoken.model: the byte tokenizer";
    return;
  }
  if (has("tokenizer_config.json")) t.chat_template = "hf/tokenizer_config.json";
  report->tokenizer_file = t.file;
  model->tokenizer = std::move(t);
}

// A YAML double-quoted scalar: the pattern's backslashes and quotes escaped.
std::string YamlQuoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string ModelConfigYaml(const ModelConfig& c) {
  // {} prints the shortest text that reads back to the same double.
  auto flag = [](bool value) { return value ? "true" : "false"; };
  std::string y = "model:\n";
  y += fmt::format("  name: {}\n  vocabulary: {}\n  width: {}\n  layers: {}\n", c.name,
                   c.vocabulary, c.width, c.layers);
  y += fmt::format("  layer_pattern: {}\n", c.layer_pattern);
  if (!c.last_layer.empty()) y += fmt::format("  last_layer: {}\n", c.last_layer);
  y += fmt::format("  attention_residuals: {}\n  residual_block: {}\n  tie_embeddings: {}\n",
                   flag(c.attention_residuals), c.residual_block, flag(c.tie_embeddings));
  y += fmt::format("  context: {}\n  init_std: {}\n  norm_epsilon: {}\n", c.context, c.init_std,
                   c.norm_epsilon);
  y += fmt::format("  cache_dtype: {}\n  threads: {}\n  device: {}\n", c.cache_dtype, c.threads,
                   c.device);
  const IncrementalAttentionConfig& i = c.incremental;
  y += "  incremental_attention:\n";
  y += fmt::format(
      "    heads: {}\n    key_dim: {}\n    value_dim: {}\n    conv_width: {}\n"
      "    decay_rank: {}\n    decay_gate: {}\n    min_log_decay: {}\n    chunk_size: {}\n"
      "    gate_rank: {}\n    output_norm_epsilon: {}\n",
      i.heads, i.key_dim, i.value_dim, i.conv_width, i.decay_rank, i.decay_gate, i.min_log_decay,
      i.chunk_size, i.gate_rank, i.output_norm_epsilon);
  const LatentAttentionConfig& l = c.latent;
  y += "  latent_attention:\n";
  y += fmt::format(
      "    heads: {}\n    query_rank: {}\n    kv_rank: {}\n    nope_dim: {}\n    rope_dim: {}\n"
      "    value_dim: {}\n    output_gate: {}\n    norm_epsilon: {}\n",
      l.heads, l.query_rank, l.kv_rank, l.nope_dim, l.rope_dim, l.value_dim, flag(l.output_gate),
      l.norm_epsilon);
  const FeedForwardConfig& f = c.feed_forward;
  y += "  feed_forward:\n";
  y += fmt::format(
      "    dense_layers: {}\n    dense_hidden: {}\n    latent_experts: {}\n    latent_width: {}\n"
      "    expert_hidden: {}\n    routed_experts: {}\n    experts_per_token: {}\n"
      "    shared_experts: {}\n    shared_hidden: {}\n    activation: {}\n    gate_cap: {}\n"
      "    up_cap: {}\n    router_activation: {}\n    renormalize: {}\n"
      "    renormalize_epsilon: {}\n    routed_scaling_factor: {}\n    expert_groups: {}\n"
      "    groups_per_token: {}\n    quantile_balancing: {}\n",
      f.dense_layers, f.dense_hidden, flag(f.latent_experts), f.latent_width, f.expert_hidden,
      f.routed_experts, f.experts_per_token, f.shared_experts, f.shared_hidden, f.activation,
      f.gate_cap, f.up_cap, f.router_activation, flag(f.renormalize), f.renormalize_epsilon,
      f.routed_scaling_factor, f.expert_groups, f.groups_per_token, flag(f.quantile_balancing));
  const VisionConfig& v = c.vision;
  y += "  vision:\n";
  y += fmt::format(
      "    enabled: {}\n    patch_size: {}\n    max_grid_rows: {}\n    max_grid_columns: {}\n"
      "    channels: {}\n",
      flag(v.enabled), v.patch_size, v.max_grid_rows, v.max_grid_columns, v.channels);
  const tokenizer::TokenizerConfig& t = c.tokenizer;
  if (t.enabled()) {
    y += fmt::format("  tokenizer:\n    file: {}\n    format: {}\n", YamlQuoted(t.file), t.format);
    if (!t.chat_template.empty())
      y += fmt::format("    chat_template: {}\n", YamlQuoted(t.chat_template));
    if (!t.template_name.empty())
      y += fmt::format("    template_name: {}\n", YamlQuoted(t.template_name));
    if (!t.pattern.empty()) y += fmt::format("    pattern: {}\n", YamlQuoted(t.pattern));
  }
  return y;
}

Result<HfImportReport> ImportHfCheckpoint(const std::string& directory, const std::string& out,
                                          DType dtype) {
  STRIDER_ASSIGN_OR_RETURN(HfCheckpoint checkpoint, OpenHfCheckpoint(directory));
  STRIDER_RETURN_IF_ERROR(RequireShards(checkpoint));
  STRIDER_RETURN_IF_ERROR(CheckKimiLinearTensors(checkpoint));
  STRIDER_ASSIGN_OR_RETURN(HfImportPlan plan, PlanKimiLinearImport(checkpoint.config));
  // fp32 loses the low bits of an fp64 tensor, which export could then not give back.
  for (const auto& [hf_name, tensor] : checkpoint.tensors) {
    if (tensor.dtype == DType::kF64) dtype = DType::kF64;
  }
  const std::string name = fs::path(directory).lexically_normal().filename().string();
  if (!name.empty() && name != "." && name.find_first_of(": \t\"'#") == std::string::npos) {
    plan.model.name = name;
  }
  std::error_code error;
  const std::string layout_directory = out + "/hf";
  fs::create_directories(layout_directory, error);
  if (error) {
    return Status::IoError(fmt::format("{}: cannot create: {}", layout_directory, error.message()));
  }
  HfImportReport report;
  report.config_path = out + "/model.yaml";
  report.weights_path = out + "/weights.safetensors";
  report.layout_directory = layout_directory;
  STRIDER_RETURN_IF_ERROR(ConvertHfTensors(checkpoint, plan.tensors, dtype, report.weights_path,
                                           StriderMetadata(plan.model.name)));
  report.parameters = static_cast<int64_t>(plan.tensors.size());
  for (const HfImportTensor& tensor : plan.tensors) {
    report.weight_bytes += Elements(tensor.shape) * DTypeSize(dtype);
  }

  // The layout: each shard's header (names, dtypes, shapes in file order, metadata).
  nlohmann::ordered_json layout;
  layout["format"] = "strider hf layout";
  layout["version"] = 1;
  layout["model_type"] = "kimi_linear";
  layout["shards"] = nlohmann::ordered_json::array();
  for (const std::string& shard : checkpoint.shards) {
    STRIDER_ASSIGN_OR_RETURN(SafetensorsHeader header,
                             ReadSafetensorsHeader(directory + "/" + shard));
    nlohmann::ordered_json entry;
    entry["file"] = shard;
    entry["metadata"] = header.metadata;
    entry["tensors"] = nlohmann::ordered_json::array();
    for (const SafetensorsEntry& tensor : header.entries) {
      entry["tensors"].push_back(
          {{"name", tensor.name}, {"dtype", DTypeName(tensor.dtype)}, {"shape", tensor.shape}});
      ++report.published_tensors;
    }
    layout["shards"].push_back(std::move(entry));
  }
  STRIDER_RETURN_IF_ERROR(
      WriteFileDurably(layout_directory + "/" + kHfLayoutFile, layout.dump(1) + "\n"));
  const std::set<std::string> shards(checkpoint.shards.begin(), checkpoint.shards.end());
  STRIDER_ASSIGN_OR_RETURN(std::vector<std::string> others, PublishedFiles(directory, shards));
  if (checkpoint.index) others.push_back(kSafetensorsIndexName);
  for (const std::string& file : others) {
    STRIDER_RETURN_IF_ERROR(CopyFileDurably(directory + "/" + file, layout_directory + "/" + file));
  }
  STRIDER_RETURN_IF_ERROR(FsyncDirectory(layout_directory));
  NameImportedTokenizer(layout_directory, others, &plan.model, &report);
  STRIDER_RETURN_IF_ERROR(WriteFileDurably(report.config_path, ModelConfigYaml(plan.model)));
  STRIDER_RETURN_IF_ERROR(FsyncDirectory(out));
  return report;
}

Result<HfExportReport> ExportStriderWeightsToHf(const ModelConfig& model,
                                                const std::vector<std::string>& weights,
                                                const std::string& layout_directory,
                                                const std::string& out) {
  if (weights.empty()) return Status::InvalidArgument("export: no weights given");
  // The plan of the layout's config, checked against the config the weights were trained with.
  Result<std::string> config_text = ReadSmallFile(layout_directory + "/config.json");
  if (!config_text.ok()) {
    return Status::NotFound(fmt::format(
        "{}: no config.json: give the hf/ directory `strider model import` wrote beside the "
        "model config ({})",
        layout_directory, config_text.status().message()));
  }
  STRIDER_ASSIGN_OR_RETURN(KimiLinearConfig kimi,
                           ParseKimiLinearConfig(*config_text, layout_directory + "/config.json"));
  STRIDER_ASSIGN_OR_RETURN(HfImportPlan plan, PlanKimiLinearImport(kimi));
  {
    std::map<std::string, std::vector<int64_t>> given;
    for (const ParameterSpec& spec : ModelParameterSpecs(model)) given[spec.name] = spec.shape;
    std::vector<std::string> differ;
    for (const HfImportTensor& tensor : plan.tensors) {
      auto it = given.find(tensor.strider_name);
      if (it == given.end()) {
        if (!tensor.hf_names.empty()) differ.push_back(tensor.strider_name + " is absent");
      } else if (it->second != tensor.shape) {
        differ.push_back(fmt::format("{} is {}, the published layout needs {}", tensor.strider_name,
                                     ShapeText(it->second), ShapeText(tensor.shape)));
      }
    }
    if (!differ.empty()) {
      return Status::InvalidArgument(
          fmt::format("export: the model config does not describe {}'s checkpoint: {}",
                      layout_directory, Some(differ)));
    }
  }
  // Published name -> its Strider tensor and the element range it occupies there.
  struct Place {
    const HfImportTensor* tensor;
    uint64_t offset;
  };
  std::map<std::string, Place> places;
  std::map<std::string, const HfImportTensor*> by_name;
  for (const HfImportTensor& tensor : plan.tensors) {
    by_name[tensor.strider_name] = &tensor;
    for (const std::string& hf_name : tensor.hf_names) places[hf_name] = {&tensor, 0};
  }

  // The weights: every file mapped; an expert-parallel rank's file holds rows [first,
  // first + count) of each routed tensor (dimension 0), everything else whole.
  struct Piece {
    const MappedSafetensors* file;
    const SafetensorsEntry* entry;
    uint64_t begin, end;  // element range of the whole tensor it holds
  };
  std::vector<std::unique_ptr<MappedSafetensors>> files;
  std::map<std::string, std::vector<Piece>> pieces;
  for (const std::string& path : weights) {
    STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<MappedSafetensors> file,
                             MappedSafetensors::Open(path));
    int64_t first = 0, count = 0;
    const bool sharded = ParseExpertShard(file->header().metadata, &first, &count);
    for (const SafetensorsEntry& entry : file->header().entries) {
      auto it = by_name.find(entry.name);
      if (it == by_name.end()) {
        return Status::InvalidArgument(fmt::format(
            "{}: tensor '{}' is not a parameter of the published model", path, entry.name));
      }
      const std::vector<int64_t>& whole = it->second->shape;
      if (entry.dtype != DType::kF32 && entry.dtype != DType::kF64) {
        return Status::InvalidArgument(
            fmt::format("{}: tensor '{}' is {}, Strider's weights are "
                        "F32 or F64",
                        path, entry.name, DTypeName(entry.dtype)));
      }
      Piece piece{file.get(), &entry, 0, Elements(whole)};
      if (entry.shape != whole) {
        std::vector<int64_t> part = whole;
        if (sharded && !part.empty()) part[0] = count;
        if (!sharded || entry.shape != part || first + count > whole[0]) {
          return Status::InvalidArgument(fmt::format(
              "{}: tensor '{}' is {}, the model config gives {}{}", path, entry.name,
              ShapeText(entry.shape), ShapeText(whole),
              sharded ? fmt::format(" (rows {}..{} of it)", first, first + count) : std::string()));
        }
        const uint64_t row = Elements(whole) / static_cast<uint64_t>(whole[0]);
        piece.begin = static_cast<uint64_t>(first) * row;
        piece.end = static_cast<uint64_t>(first + count) * row;
      }
      pieces[entry.name].push_back(piece);
    }
    files.push_back(std::move(file));
  }

  // The layout the import recorded.
  Result<std::string> layout_text = ReadSmallFile(layout_directory + "/" + kHfLayoutFile);
  if (!layout_text.ok()) return layout_text.status();
  nlohmann::json layout;
  try {
    layout = nlohmann::json::parse(*layout_text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(
        fmt::format("{}/{}: not valid JSON: {}", layout_directory, kHfLayoutFile, e.what()));
  }
  if (!layout.contains("shards") || !layout["shards"].is_array()) {
    return Status::Corruption(fmt::format("{}/{}: no shards", layout_directory, kHfLayoutFile));
  }
  std::error_code error;
  fs::create_directories(out, error);
  if (error) return Status::IoError(fmt::format("{}: cannot create: {}", out, error.message()));

  HfExportReport report;
  std::set<std::string> written_shards;
  std::vector<uint8_t> buffer;
  constexpr uint64_t kSlice = 1 << 16;
  // Each published tensor's offset inside its Strider tensor: the plan's order, the layout's
  // shapes.
  std::map<std::string, std::vector<int64_t>> published_shapes;
  try {
    for (const auto& shard : layout["shards"]) {
      for (const auto& t : shard.at("tensors")) {
        published_shapes[t.at("name").get<std::string>()] =
            t.at("shape").get<std::vector<int64_t>>();
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(fmt::format("{}/{}: {}", layout_directory, kHfLayoutFile, e.what()));
  }
  for (const HfImportTensor& tensor : plan.tensors) {
    uint64_t offset = 0;
    for (const std::string& hf_name : tensor.hf_names) {
      places[hf_name].offset = offset;
      auto shape = published_shapes.find(hf_name);
      if (shape == published_shapes.end()) {
        return Status::Corruption(fmt::format("{}/{}: no tensor '{}' (for {})", layout_directory,
                                              kHfLayoutFile, hf_name, tensor.strider_name));
      }
      offset += Elements(shape->second);
    }
    if (!tensor.hf_names.empty() && offset != Elements(tensor.shape)) {
      return Status::InvalidArgument(
          fmt::format("{}: the published tensors of {} hold {} elements, its shape {} needs {}",
                      layout_directory, tensor.strider_name, offset, ShapeText(tensor.shape),
                      Elements(tensor.shape)));
    }
  }
  for (const auto& shard : layout["shards"]) {
    const std::string file = shard.at("file").get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos) {
      return Status::Corruption(fmt::format("{}/{}: shard '{}' is not a file name",
                                            layout_directory, kHfLayoutFile, file));
    }
    std::map<std::string, std::string> metadata;
    for (const auto& [key, value] : shard.at("metadata").items()) {
      metadata[key] = value.get<std::string>();
    }
    std::vector<TensorView> views;
    for (const auto& t : shard.at("tensors")) {
      TensorView view;
      view.name = t.at("name").get<std::string>();
      STRIDER_ASSIGN_OR_RETURN(view.dtype, ParseDType(t.at("dtype").get<std::string>()));
      view.shape = t.at("shape").get<std::vector<int64_t>>();
      view.byte_size = Elements(view.shape) * DTypeSize(view.dtype);
      if (!places.count(view.name)) {
        return Status::InvalidArgument(
            fmt::format("export: published tensor '{}' has no Strider parameter", view.name));
      }
      report.tensor_bytes += view.byte_size;
      views.push_back(std::move(view));
    }
    STRIDER_RETURN_IF_ERROR(WriteSafetensorsProduced(
        out + "/" + file, views,
        [&](const TensorView& view, const FileAppender& append) -> Status {
          const Place& place = places.at(view.name);
          const std::string& strider = place.tensor->strider_name;
          uint64_t at = place.offset;
          const uint64_t end = place.offset + Elements(view.shape);
          auto found = pieces.find(strider);
          while (at < end) {
            const Piece* piece = nullptr;
            if (found != pieces.end()) {
              for (const Piece& p : found->second) {
                if (p.begin <= at && at < p.end) piece = &p;
              }
            }
            if (piece == nullptr) {
              return Status::NotFound(fmt::format(
                  "export: no weights file holds element {} of {} (for {}){}", at, strider,
                  view.name,
                  weights.size() > 1 ? ": the expert-parallel files do not cover every expert"
                                     : ""));
            }
            const uint64_t stop = std::min(end, piece->end);
            const std::string_view bytes = piece->file->Bytes(*piece->entry);
            const size_t width = DTypeSize(piece->entry->dtype);
            for (uint64_t from = at; from < stop; from += kSlice) {
              const size_t count = static_cast<size_t>(std::min<uint64_t>(kSlice, stop - from));
              buffer.resize(count * DTypeSize(view.dtype));
              STRIDER_RETURN_IF_ERROR(NarrowElements(piece->entry->dtype,
                                                     bytes.data() + (from - piece->begin) * width,
                                                     count, view.dtype, buffer.data()));
              STRIDER_RETURN_IF_ERROR(append(
                  std::string_view(reinterpret_cast<const char*>(buffer.data()), buffer.size())));
            }
            piece->file->Release(*piece->entry);
            at = stop;
          }
          return Status::Ok();
        },
        metadata));
    report.tensors += static_cast<int64_t>(views.size());
    ++report.shards;
    written_shards.insert(file);
  }
  if (fs::exists(layout_directory + "/" + kSafetensorsIndexName)) {
    STRIDER_ASSIGN_OR_RETURN(SafetensorsIndex index,
                             ReadSafetensorsIndex(layout_directory + "/" + kSafetensorsIndexName));
    index.total_size = report.tensor_bytes;
    STRIDER_RETURN_IF_ERROR(WriteSafetensorsIndex(out + "/" + kSafetensorsIndexName, index));
  }
  std::set<std::string> skip = written_shards;
  skip.insert(kHfLayoutFile);
  STRIDER_ASSIGN_OR_RETURN(std::vector<std::string> others, PublishedFiles(layout_directory, skip));
  for (const std::string& name : others) {
    STRIDER_RETURN_IF_ERROR(CopyFileDurably(layout_directory + "/" + name, out + "/" + name));
    report.copied_files.push_back(name);
  }
  STRIDER_RETURN_IF_ERROR(FsyncDirectory(out));
  return report;
}

}  // namespace strider
