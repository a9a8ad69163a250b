// A Hugging Face checkpoint directory (config.json, model.safetensors.index.json and its shards,
// or a single model.safetensors, plus the files that travel with them) read without loading its
// weights: the figures of `strider model info --from-hf`, the checks every command makes before
// it trusts the tensors, the streaming import into Strider's config and weights, and the
// streaming export that writes the shards back one tensor at a time. No LibTorch here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/model/config.h"
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

// One Strider parameter of an import: the published tensors it is made of, concatenated in
// order (a layer's routed experts stack along the first dimension), in the Strider shape. Every
// conversion Kimi Linear needs keeps the elements in order: [P, 1, w] convolutions become
// [P, w], A_log [1, 1, H, 1] becomes [H], a shared expert [S, d] becomes [1, S, d]. No published
// tensor: a Strider parameter the checkpoint does not carry (the learner's value head), written
// as zeros.
struct HfImportTensor {
  std::vector<std::string> hf_names;
  std::string strider_name;
  std::vector<int64_t> shape;
};
// Writes `tensors` to `path` as one safetensors file in `dtype` (F32 or F64), converting each
// from its mapped shards a slice at a time and releasing its pages after: memory stays at a slice
// whatever the checkpoint's size. Refuses a tensor the checkpoint lacks, an element count the
// Strider shape does not match (both shapes), and a dtype that does not convert (BOOL).
Status ConvertHfTensors(const HfCheckpoint& checkpoint, const std::vector<HfImportTensor>& tensors,
                        DType dtype, const std::string& path,
                        const std::map<std::string, std::string>& metadata = {});
// The same in memory: the safetensors bytes Model::LoadFromBytes reads.
Result<std::string> ConvertHfTensorsToBytes(
    const HfCheckpoint& checkpoint, const std::vector<HfImportTensor>& tensors, DType dtype,
    const std::map<std::string, std::string>& metadata = {});

// Strider's model config for a Kimi Linear config.json: every option set as the serving engines
// (vLLM, SGLang) compute (docs/models.md#kimi-linear-options). Refuses, by field, what the
// model does not express: moe_layer_freq other than 1, attention biases, grouped-query MLA
// (num_key_value_heads != num_attention_heads), rotary MLA (mla_use_nope false), a hidden_act
// other than silu.
Result<ModelConfig> KimiLinearModelConfig(const KimiLinearConfig& config);

// What an import writes: the model config, and each Strider parameter (in the parameter table's
// order) from its published tensors. Refuses, naming each, the published tensor patterns the
// model cannot express, the Strider parameters no published tensor fills (the value head
// apart), and any parameter whose published tensors do not hold its elements.
struct HfImportPlan {
  ModelConfig model;
  std::vector<HfImportTensor> tensors;
};
Result<HfImportPlan> PlanKimiLinearImport(const KimiLinearConfig& config);

// A checkpoint directory read and converted in memory: the model config and the weights as
// safetensors bytes in `dtype` (F32 or F64), for Model::LoadFromBytes(config, weights). Checks
// the tensors against the config first (CheckKimiLinearTensors).
struct HfModelWeights {
  ModelConfig config;
  std::string weights;
};
Result<HfModelWeights> LoadHfCheckpoint(const std::string& directory, DType dtype = DType::kF32);

// The model config as the `model:` section LoadModelConfig reads back (every key written).
std::string ModelConfigYaml(const ModelConfig& config);

// `strider model import`: writes into `out`
//   model.yaml           the Strider model config (ModelConfigYaml)
//   weights.safetensors  the weights in `dtype` (F64 wherever the checkpoint holds an F64
//                        tensor, so nothing is lost), streamed tensor by tensor (ConvertHfTensors)
//   hf/                  what export needs to write the published layout back: config.json, the
//                        index, every other file of the checkpoint (generation_config.json,
//                        tokenizer files, ...) as they are, and layout.json, each shard's tensor
//                        names, dtypes and shapes in file order with its header metadata.
struct HfImportReport {
  std::string config_path;
  std::string weights_path;
  std::string layout_directory;
  int64_t parameters = 0;  // Strider tensors written
  int64_t published_tensors = 0;
  uint64_t weight_bytes = 0;
  // The tokenizer the written model.yaml names from the copied files (docs/tokenizers.md):
  // tokenizer.json, or tiktoken.model with the split pattern of tokenization_kimi.py; empty
  // when the checkpoint carries neither, and then why.
  std::string tokenizer_file;
  std::string tokenizer_note;
};
constexpr const char* kHfLayoutFile = "layout.json";
Result<HfImportReport> ImportHfCheckpoint(const std::string& directory, const std::string& out,
                                          DType dtype = DType::kF32);

// `strider model export --config F --weights W... --to-hf OUT`: the published layout back from
// Strider weights, as `layout_directory` (an import's hf/) recorded it: the same shards with the
// same tensor names, dtypes (cast back from fp32 or fp64; bf16 values come back bit for bit),
// shapes and header metadata, the index, and the published files copied through. `weights` is
// one file, or an expert-parallel learner's files, one per rank, each holding its slice of the
// routed experts (metadata expert_shard); together they must cover every expert. Streams shard
// by shard and tensor by tensor from the mapped weights. Refuses a model config whose
// parameters differ from the layout's (named, both shapes), and a tensor no file holds.
Result<HfExportReport> ExportStriderWeightsToHf(const ModelConfig& model,
                                                const std::vector<std::string>& weights,
                                                const std::string& layout_directory,
                                                const std::string& out);

}  // namespace strider
