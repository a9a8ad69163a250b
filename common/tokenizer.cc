// The byte-level tokenizer. There is no vocabulary to load: bytes map to ids 0..255 one to one,
// and the special tokens are a fixed table whose order must match the ids in tokenizer.h.
#include "common/tokenizer.h"

#include <array>

namespace strider {
namespace {

// Indexed by id - token::kByteCount; one name per id from kPad up to kFirstReserved.
constexpr std::array<std::string_view, token::kFirstReserved - token::kByteCount> kSpecialNames = {
    "pad",         "begin_of_text", "end_of_text", "system",      "user",
    "model",       "tool_call",     "tool_call_end", "tool_result", "end_of_turn",
    "image_start", "image_end",     "image_patch",
};
// Spot checks that the table and the ids in tokenizer.h have not drifted apart.
static_assert(kSpecialNames[token::kPad - token::kByteCount] == "pad");
static_assert(kSpecialNames[token::kUser - token::kByteCount] == "user");
static_assert(kSpecialNames[token::kToolResult - token::kByteCount] == "tool_result");
static_assert(kSpecialNames[token::kImagePatch - token::kByteCount] == "image_patch");

}  // namespace

std::vector<int32_t> Tokenizer::Encode(std::string_view text) {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  // Through unsigned char: plain char is signed on x86, and byte 0xff must become id 255, not -1.
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < token::kByteCount) {
      text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
      continue;
    }
    std::string_view name = SpecialName(id);
    text += "<|";
    if (name.empty()) {
      // Reserved, beyond this vocabulary, or negative: shown by number so nothing is dropped.
      text += "id:";
      text += std::to_string(id);
    } else {
      text += name;
    }
    text += "|>";
  }
  return text;
}

std::string_view Tokenizer::SpecialName(int32_t id) {
  if (id < token::kByteCount || id >= token::kFirstReserved) return {};
  return kSpecialNames[static_cast<size_t>(id - token::kByteCount)];
}

std::optional<int32_t> Tokenizer::SpecialId(std::string_view name) {
  for (size_t i = 0; i < kSpecialNames.size(); ++i) {
    if (kSpecialNames[i] == name) return token::kByteCount + static_cast<int32_t>(i);
  }
  return std::nullopt;
}

}  // namespace strider
