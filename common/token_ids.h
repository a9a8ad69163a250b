// The byte-level tokenizer's ids (common/tokenizer.h), on their own so that code which needs only
// the ids, LibTorch code among it, does not depend on the tokenizer's C++20 interface.
#pragma once

#include <cstdint>

namespace strider {

namespace token {
inline constexpr int32_t kByteCount = 256;
inline constexpr int32_t kPad = 256;
inline constexpr int32_t kBeginOfText = 257;
inline constexpr int32_t kEndOfText = 258;
inline constexpr int32_t kSystem = 259;      // a turn's role marker: starts a system turn
inline constexpr int32_t kUser = 260;
inline constexpr int32_t kModel = 261;
inline constexpr int32_t kToolCall = 262;    // opens a tool call written by the model
inline constexpr int32_t kToolCallEnd = 263; // closes it
inline constexpr int32_t kToolResult = 264;  // starts a tool's answer
inline constexpr int32_t kEndOfTurn = 265;
inline constexpr int32_t kImageStart = 266;
inline constexpr int32_t kImageEnd = 267;
inline constexpr int32_t kImagePatch = 268;  // placeholder position filled by a patch embedding
inline constexpr int32_t kFirstReserved = 269;
// Ids 269..287 are reserved for future special tokens.
inline constexpr int32_t kVocabularySize = 288;
}  // namespace token

}  // namespace strider
