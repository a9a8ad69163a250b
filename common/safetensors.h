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
#include <map>
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
Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
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

}  // namespace strider
