// Tokenizers of imported models: byte-level BPE from a Hugging Face `tokenizer.json` and
// tiktoken rank files, with ids identical to the `tokenizers` and `tiktoken` libraries
// (docs/tokenizers.md), behind one interface that the built-in byte tokenizer also implements.
//
// Also here: text that is not valid UTF-8 made valid by one rule, and the pieces a serving loop
// needs to turn sampled ids back into text as they arrive (StreamDecoder, MarkerMatcher).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/tokenizer_config.h"

namespace strider::tokenizer {

struct EncodeOptions {
  // false: special tokens written in the text become their ids, as the reference libraries do by
  // default (`tokenizers` encode, tiktoken `allowed_special="all"`). true: their text is
  // tokenised like any other text (`split_special_tokens=True`, tiktoken
  // `disallowed_special=()`), so text from users or tools cannot forge them. Added tokens that
  // are not special are matched either way.
  bool split_special_tokens = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Text to ids. Input that is not valid UTF-8 is first made valid by ReplaceInvalidUtf8 (each
  // maximal invalid subsequence becomes U+FFFD, as Python's bytes.decode(errors="replace")).
  // No BOS/EOS is added: prompts carry their own, as chat templates write them. Thread-safe.
  virtual std::vector<int32_t> Encode(std::string_view text,
                                      const EncodeOptions& options = {}) const = 0;

  // Ids to the bytes their tokens stand for, concatenated: exact, so a byte-level token that
  // ends inside a multi-byte character yields only part of it. Special and added tokens give
  // their text; ids outside the vocabulary give "<|id:N|>" so nothing is dropped silently.
  virtual std::string DecodeBytes(std::span<const int32_t> ids) const = 0;

  // DecodeBytes made valid UTF-8 by ReplaceInvalidUtf8: what the reference libraries return.
  std::string Decode(std::span<const int32_t> ids) const;

  // One past the largest id this tokenizer can produce or decode.
  virtual int32_t VocabSize() const = 0;
  // The id of a special or added token by its text ("<|im_end|>"); nullopt if there is none.
  virtual std::optional<int32_t> SpecialTokenId(std::string_view text) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
};

enum class TokenizerFormat {
  kAuto,           // tokenizer.json if the file starts with '{', else a tiktoken rank file
  kTokenizerJson,  // Hugging Face tokenizers' tokenizer.json (byte-level BPE)
  kTiktoken,       // lines of "<base64 token bytes> <rank>"
};

struct TokenizerOptions {
  TokenizerFormat format = TokenizerFormat::kAuto;
  // tiktoken files hold only ranks: the split pattern and special tokens (text, id) come from
  // the model's own code or config. The pattern is required for that format.
  std::string tiktoken_pattern;
  std::vector<std::pair<std::string, int32_t>> tiktoken_special_tokens;
  // Distinct pre-token words whose ids are remembered (about 100 bytes each).
  size_t cache_words = 1 << 16;
};

Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::filesystem::path& path,
                                                 const TokenizerOptions& options = {});
// The same from the file's contents; `origin` names it in errors.
Result<std::unique_ptr<Tokenizer>> ParseTokenizer(std::string_view contents,
                                                  const TokenizerOptions& options,
                                                  std::string_view origin = "tokenizer");

// The built-in byte tokenizer (common/tokenizer.h: ids 0-255 are bytes, then Strider's own
// special tokens) behind this interface, for code that takes any tokenizer.
std::unique_ptr<Tokenizer> MakeByteTokenizer();

// Valid UTF-8 for any bytes: each maximal subpart of an ill-formed sequence (Unicode 15, 3.9,
// "U+FFFD substitution of maximal subparts"; what Python's errors="replace" does) becomes
// U+FFFD. Valid input comes back unchanged.
std::string ReplaceInvalidUtf8(std::string_view bytes);
bool IsValidUtf8(std::string_view bytes);

// Decodes a stream of ids one at a time without ever splitting a character: bytes of a
// character whose last token has not arrived yet are held back, as serving engines do. The
// concatenation of every Push and the final Finish equals Decode of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // The text that id completes (often empty for a token that ends inside a character).
  std::string Push(int32_t id);
  // The held-back bytes of an unfinished character, each maximal subpart as U+FFFD; resets.
  std::string Finish();
  size_t held_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

// Finds marker strings (stop strings, tool-call tags) in text that arrives in pieces. Text that
// could still be the start of a marker is held back until it is decided, so the result does not
// depend on how the text was cut: markers are found leftmost first, the longest one where
// several start at the same byte, without overlaps, exactly as in the whole text at once.
class MarkerMatcher {
 public:
  struct Piece {
    std::string text;  // the marker's text when marker >= 0
    int marker = -1;   // index into the markers, -1 for plain text
    bool operator==(const Piece&) const = default;
  };

  // Empty markers are ignored.
  explicit MarkerMatcher(std::vector<std::string> markers);

  // Appends text; returns the pieces now decided, in order.
  std::vector<Piece> Feed(std::string_view text);
  // The held-back tail as plain text (it was not a marker); resets.
  std::vector<Piece> Finish();
  size_t held_bytes() const { return pending_.size(); }

 private:
  std::vector<std::string> markers_;
  bool first_byte_[256] = {};
  std::string pending_;
};

}  // namespace strider::tokenizer
