// libFuzzer target for the tool-call parser (envs/tools.h): a model's turn is arbitrary bytes
// (the tokenizer is byte-level). No input may crash, hang or read out of bounds; a call it finds
// formats back into text that parses to the same call.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "envs/tools.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  strider::Result<std::optional<strider::envs::ToolCall>> call = strider::envs::ParseToolCall(text);
  (void)strider::envs::MakeAction(std::string(text));
  if (!call.ok() || !call->has_value()) return 0;
  const std::string again = strider::envs::FormatToolCall((*call)->name, (*call)->arguments);
  strider::Result<std::optional<strider::envs::ToolCall>> reparsed =
      strider::envs::ParseToolCall(again);
  if (!reparsed.ok() || !reparsed->has_value() || (*reparsed)->name != (*call)->name ||
      (*reparsed)->arguments != (*call)->arguments) {
    std::abort();  // a call that does not survive its own formatting
  }
  return 0;
}
