// libFuzzer target for the safetensors reader (common/safetensors.h): weights arrive from files
// and over the weight stream. No input may crash, hang, allocate without bound or read out of
// bounds; what it accepts re-encodes and decodes to the same tensors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  strider::Result<strider::SafetensorsContents> contents = strider::DecodeSafetensors(bytes);
  if (!contents.ok()) return 0;
  std::vector<strider::TensorView> views;
  for (const auto& [name, tensor] : contents->tensors) {
    views.push_back({name, tensor.dtype, tensor.shape, tensor.bytes.data(), tensor.bytes.size()});
  }
  strider::Result<std::string> encoded = strider::EncodeSafetensors(views, contents->metadata);
  if (!encoded.ok()) return 0;  // e.g. a name the writer refuses; the reader was lenient
  strider::Result<strider::SafetensorsContents> again = strider::DecodeSafetensors(*encoded);
  if (!again.ok() || again->tensors.size() != contents->tensors.size()) std::abort();
  return 0;
}
