// Internal to common/tokenizer: what the file readers produce and the BPE tokenizer is built
// from. Users include common/tokenizer/tokenizer.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace strider::tokenizer::internal {

// Hugging Face's Split behaviours: how a match and the text between matches become pieces.
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::string pattern;  // as written in the file; translated for PCRE2 when compiled
  SplitBehavior behavior = SplitBehavior::kIsolated;
  // Matches and the text between them swap roles (tiktoken keeps only matches: Removed +
  // invert).
  bool invert = false;
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;       // absorbs white space before it
  bool rstrip = false;       // absorbs white space after it
  bool single_word = false;  // only where no word character touches it
  bool normalized = false;   // matched in the normalised text rather than the raw text
};

struct BpeSpec {
  // Vocabulary id -> the token's bytes; nullopt for ids the file leaves unused.
  std::vector<std::optional<std::string>> tokens;
  struct Merge {
    int32_t left = 0;
    int32_t right = 0;
    int32_t merged = 0;
    uint32_t rank = 0;  // lower merges first
  };
  std::vector<Merge> merges;
  std::vector<AddedToken> added;
  std::vector<SplitStep> splits;  // applied in order to each piece of the previous step
  bool nfc = false;               // NFC-normalise text between added tokens
  bool add_prefix_space = false;  // a space before text that does not start with one
  // A pre-token that is itself a token becomes that token without merging (tiktoken, and
  // tokenizer.json's ignore_merges).
  bool whole_word_lookup = false;
  std::optional<int32_t> unk;  // for bytes without a token; without one they are dropped
};

Result<BpeSpec> ParseTokenizerJson(std::string_view contents, std::string_view origin);
Result<BpeSpec> ParseTiktoken(std::string_view contents, const TokenizerOptions& options,
                              std::string_view origin);
Result<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(BpeSpec spec, size_t cache_words,
                                                    std::string_view origin);

// The pattern in the dialect of the libraries the files come from (Oniguruma for tokenizers,
// Rust's regex for tiktoken), rewritten for PCRE2: \s and \S as Unicode White_Space (PCRE2's
// also holds U+180E), and class intersections [A&&[^B]] as (?:(?![B])[A]).
Result<std::string> TranslatePattern(std::string_view pattern);

// UTF-8 scanning shared by ReplaceInvalidUtf8 and StreamDecoder: appends the valid characters
// of `bytes` to `out` and U+FFFD for each maximal invalid subpart. Unless `final`, a trailing
// sequence that is a valid prefix of a character is left unread. Returns the bytes read.
size_t AppendUtf8Replacing(std::string_view bytes, bool final, std::string& out);

// Whether `c` (a code point) is Unicode White_Space.
bool IsWhiteSpace(char32_t c);

// A file's whole contents (templates, tokenizer configs); NotFound or IoError naming it.
Result<std::string> ReadWhole(const std::filesystem::path& path);

}  // namespace strider::tokenizer::internal
