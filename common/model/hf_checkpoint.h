// A Hugging Face checkpoint directory (config.json, model.safetensors.index.json and its shards,
// or a single model.safetensors, plus the files that travel with them) read without loading its
// weights: the figures of `strider model info --from-hf`, the checks every command makes before
// it trusts the tensors, and the streaming export that rewrites the shards one tensor at a time.
// No LibTorch here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/model/hf_kimi_linear.h"
#include "common/safetensors.h"
#include "common/status.h"

namespace strider {

struct HfTensorEntry {
  std::string file;   // the shard that holds it
  bool read = false;  // dtype and shape come from the shard's header
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
};

struct HfCheckpoint {
  std::string directory;
  KimiLinearConfig config;
  std::optional<SafetensorsIndex> index;    // absent for a single model.safetensors
  std::vector<std::string> shards;          // file names, sorted
  std::vector<std::string> missing_shards;  // listed in the index but not on disk
  std::map<std::string, HfTensorEntry> tensors;
};

// Reads config.json, the index (or the single file's header) and the header of every shard
// present. Refuses an unsupported model_type, a malformed or truncated shard (naming it), and
// an index that disagrees with its shards (a tensor listed for a shard that does not hold it,
// or held by a shard without being listed). Shards may be absent: the figures need only the
// config and the index; commands that need the weights call RequireShards.
Result<HfCheckpoint> OpenHfCheckpoint(const std::string& directory);
Status RequireShards(const HfCheckpoint& checkpoint);

// The checkpoint's tensors against the table for its config: every missing tensor and every
// unexpected one by name, and every shape that differs with both shapes (shapes only where the
// shard headers were read). One Status lists them all, a few of each kind and the counts.
Status CheckKimiLinearTensors(const HfCheckpoint& checkpoint);

// The parameter count three ways: from the config (the table), from the index's
// metadata.total_parameters where it has one, and from the shard headers' shapes where every
// shard is present. Refuses when any two disagree, naming both numbers.
struct HfParameterCounts {
  uint64_t from_config = 0;
  std::optional<uint64_t> from_index;
  std::optional<uint64_t> from_headers;
  std::optional<uint64_t> header_bytes;  // the tensors' bytes, from the headers
};
Result<HfParameterCounts> CountHfParameters(const HfCheckpoint& checkpoint);

// Parameter figures from the config alone.
struct HfParameterFigures {
  double total = 0;
  double active = 0;                     // per token
  double active_without_embeddings = 0;  // less the embedding table (a lookup, not a product)
  std::string active_formula;            // with the numbers substituted
  std::map<std::string, double> total_by_component;
  std::map<std::string, double> active_by_component;
  double tensors = 0;
};
HfParameterFigures KimiLinearFigures(const KimiLinearConfig& config);

// What one rank holds with the routed experts split over `degree` ranks and everything else
// replicated (data parallel over the same ranks).
struct HfExpertParallelFootprint {
  int64_t degree = 1;
  int64_t experts_per_rank = 0;
  double routed_parameters_per_rank = 0;
  double replicated_parameters = 0;
  double parameters_per_rank = 0;
  double weight_bytes_per_rank = 0;    // at the checkpoint's dtype
  double training_bytes_per_rank = 0;  // see kTrainingBytesPerParameter
};
// Mixed-precision AdamW: bf16 weights (2) and gradients (2), fp32 master weights (4) and two
// fp32 moments (4 + 4), no optimiser-state sharding; activations not included.
constexpr double kTrainingBytesPerParameter = 16;
Result<HfExpertParallelFootprint> KimiLinearFootprint(const KimiLinearConfig& config,
                                                      int64_t degree);

// Rewrites every shard into `out` tensor by tensor from the mapped source (the same names,
// dtypes, shapes and bytes, in the same shards), writes the index, and copies every other file of
// the directory (config.json, generation_config.json, tokenizer files, ...) unchanged. Resident
// memory stays near one tensor: each is released after it is written.
struct HfExportReport {
  int64_t shards = 0;
  int64_t tensors = 0;
  uint64_t tensor_bytes = 0;
  std::vector<std::string> copied_files;
};
Result<HfExportReport> ExportHfCheckpoint(const HfCheckpoint& checkpoint, const std::string& out);

// One tensor of an import: the published tensor and the Strider parameter it becomes, in the
// Strider shape (the same elements in the same order: [P, 1, w] convolutions become [P, w]).
struct HfImportTensor {
  std::string hf_name;
  std::string strider_name;
  std::vector<int64_t> shape;
};
// Writes `tensors` to `path` as one safetensors file in `dtype` (F32 or F64), converting each
// from its mapped shard a slice at a time and releasing its pages after: memory stays at a slice
// whatever the checkpoint's size. Refuses a tensor the checkpoint lacks, an element count the
// Strider shape does not match (both shapes), and a dtype that does not convert (BOOL).
Status ConvertHfTensors(const HfCheckpoint& checkpoint, const std::vector<HfImportTensor>& tensors,
                        DType dtype, const std::string& path);

// What `strider model import --from-hf` can copy today: (published name, Strider name) for every
// tensor whose row maps. Refuses, naming each published tensor pattern the model cannot express
// yet and each Strider parameter no published tensor fills, with the reason, rather than guessing.
Result<std::vector<std::pair<std::string, std::string>>> PlanKimiLinearImport(
    const KimiLinearConfig& config);

}  // namespace strider
