// Reading and writing the safetensors format, so weights and optimiser state open in the wider
// ecosystem (Python's safetensors, Hugging Face tools).
//
// Layout: 8-byte little-endian header length N, N bytes of JSON ({"name": {"dtype": "F32",
// "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {"k": "v"}}), then the tensor
// bytes, each tensor's range relative to the end of the header.
//
// No LibTorch here: the model converts between at::Tensor and these plain byte buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strider {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

std::string_view DTypeName(DType dtype);  // "F32", as safetensors spells it
Result<DType> ParseDType(std::string_view name);
size_t DTypeSize(DType dtype);

// A tensor to be written: the bytes are borrowed and must stay valid during the write.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t byte_size = 0;  // must equal product(shape) * DTypeSize(dtype)
};

struct LoadedTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

struct SafetensorsContents {
  std::map<std::string, std::string> metadata;
  std::map<std::string, LoadedTensor> tensors;
};

// Writes atomically and durably (WriteFileDurably in common/durable_file.h), so a crash leaves
// either the old file or the new one. Rejects duplicate names and views whose byte size does not
// match their shape.
// `written`, when set, is called after each tensor's bytes have gone to the file (in file order),
// so a caller streaming from a mapped file can release those pages before the next tensor.
Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata = {},
                        const std::function<void(const TensorView&)>& written = nullptr);

// WriteSafetensors for tensors whose bytes are made while the file is written (converted from
// another file, say), so no tensor but the one being produced needs to exist in memory.
// `tensors` give names, dtypes, shapes and byte sizes (their data is ignored); `produce` is
// called once per tensor, in file order, and must append exactly its byte_size bytes.
using TensorProducer =
    std::function<Status(const TensorView& tensor, const std::function<Status(std::string_view)>&
                                                       append)>;
Status WriteSafetensorsProduced(const std::string& path, const std::vector<TensorView>& tensors,
                                const TensorProducer& produce,
                                const std::map<std::string, std::string>& metadata = {});

// Reads and validates the whole file: header length within the file, JSON well formed, known
// dtypes, every data range inside the data section, sizes matching shapes, ranges neither
// overlapping nor leaving gaps. Errors name the file and the tensor at fault.
Result<SafetensorsContents> ReadSafetensors(const std::string& path);

// The same format in memory, for weights that travel over the network instead of through a file
// (the weight publisher and the actors). EncodeSafetensors gives exactly the bytes
// WriteSafetensors would write; DecodeSafetensors checks a buffer as ReadSafetensors checks a
// file, with `name` standing for the file in errors. Neither touches the disk.
Result<std::string> EncodeSafetensors(const std::vector<TensorView>& tensors,
                                      const std::map<std::string, std::string>& metadata = {});
Result<SafetensorsContents> DecodeSafetensors(std::string_view bytes,
                                              const std::string& name = "safetensors buffer");

// ---- Large checkpoints: one tensor at a time -------------------------------------------------

// One tensor's entry in a file's header. `begin` and `end` are relative to the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t Elements() const;
};

struct SafetensorsHeader {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsEntry> entries;  // in file order
  uint64_t data_start = 0;                // 8 + header length
  uint64_t file_size = 0;
  const SafetensorsEntry* Find(std::string_view name) const;
};

// Reads and validates only the header (a few reads, whatever the file's size), with the checks
// ReadSafetensors makes: a truncated file fails here because its tensors' ranges no longer
// fill the data section.
Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

// A file mapped read-only: tensors are viewed in place and copied or converted one at a time.
// Mapped pages a caller has touched count as resident until Release drops them, so a pass over
// a shard releases each tensor after use and keeps no more than one tensor's pages resident.
class MappedSafetensors {
 public:
  static Result<std::unique_ptr<MappedSafetensors>> Open(const std::string& path);
  ~MappedSafetensors();
  MappedSafetensors(const MappedSafetensors&) = delete;
  MappedSafetensors& operator=(const MappedSafetensors&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  std::string_view Bytes(const SafetensorsEntry& entry) const;
  TensorView View(const SafetensorsEntry& entry) const;
  // Drops the entry's pages from this process's resident set (the page cache keeps them).
  void Release(const SafetensorsEntry& entry) const;

 private:
  MappedSafetensors(std::string path, SafetensorsHeader header, const uint8_t* base, size_t size)
      : path_(std::move(path)), header_(std::move(header)), base_(base), size_(size) {}
  std::string path_;
  SafetensorsHeader header_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

// Converts `count` elements from `from` to `to` (F32 or F64; any source dtype but BOOL):
// bf16 and fp16 widen exactly, integers convert as C++ does. Refuses other targets by name.
Status ConvertElements(DType from, const void* source, size_t count, DType to, void* target);

// ---- Sharded checkpoints (model.safetensors.index.json) -----------------------------------

constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

// The index of a sharded checkpoint: which file holds each tensor, and the metadata (total_size
// in bytes, and total_parameters where the writer recorded it).
struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name
  std::optional<uint64_t> total_size;
  std::optional<uint64_t> total_parameters;
  std::vector<std::string> Shards() const;        // distinct file names, sorted
};

// Reads `path`; refuses a weight map entry that is not a plain file name in the same directory.
Result<SafetensorsIndex> ReadSafetensorsIndex(const std::string& path);
// Writes it durably, metadata first; total_parameters is written only when set.
Status WriteSafetensorsIndex(const std::string& path, const SafetensorsIndex& index);

// Writes `tensors` into `directory` as model-0000i-of-0000N.safetensors, in the order given,
// starting a new shard before a tensor would take the current one past `max_shard_bytes` (a
// larger tensor gets a shard to itself), and the index beside them. One shard: the single file
// model.safetensors and no index, as the reference tools do.
Result<SafetensorsIndex> WriteShardedSafetensors(const std::string& directory,
                                                 const std::vector<TensorView>& tensors,
                                                 uint64_t max_shard_bytes,
                                                 const std::map<std::string, std::string>&
                                                     metadata = {});

}  // namespace strider
