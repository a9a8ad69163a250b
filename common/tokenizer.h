// The byte-level tokenizer shared by every component.
//
// Ids 0..255 are the bytes of UTF-8 text, so any text round-trips exactly and no vocabulary file
// is needed. Ids from 256 are special tokens that mark roles, tool calls and images; they never
// come out of Encode, only from code that builds a conversation, so user text cannot forge them.
// Models may have larger vocabularies (the reference has 163,840); ids past kVocabularySize are
// valid model outputs that this tokenizer renders as "<|id:N|>".
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/token_ids.h"

namespace strider {

class Tokenizer {
 public:
  // UTF-8 text to byte ids. Never produces special ids.
  static std::vector<int32_t> Encode(std::string_view text);

  // Ids to text: bytes as themselves (invalid UTF-8 passes through unchanged), special tokens
  // as "<|name|>", reserved or out-of-vocabulary ids as "<|id:N|>". Negative ids are rendered
  // the same way, so a corrupt record is visible, not hidden.
  static std::string Decode(std::span<const int32_t> ids);

  static bool IsSpecial(int32_t id) { return id >= token::kByteCount; }
  // "user" for token::kUser; empty for ids that are not named special tokens.
  static std::string_view SpecialName(int32_t id);
  // The id of "user", "tool_call", ... ; nullopt for unknown names.
  static std::optional<int32_t> SpecialId(std::string_view name);
};

}  // namespace strider
