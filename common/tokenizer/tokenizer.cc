// Loading a tokenizer file, and the byte tokenizer behind the common interface.
#include "common/tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>

#include "common/tokenizer.h"
#include "common/tokenizer/bpe.h"

namespace strider::tokenizer {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text, const EncodeOptions&) const override {
    // The byte tokenizer never makes special ids from text, so both option values agree.
    if (IsValidUtf8(text)) return ::strider::Tokenizer::Encode(text);
    return ::strider::Tokenizer::Encode(ReplaceInvalidUtf8(text));
  }
  std::string DecodeBytes(std::span<const int32_t> ids) const override {
    return ::strider::Tokenizer::Decode(ids);
  }
  int32_t VocabSize() const override { return token::kVocabularySize; }
  std::optional<int32_t> SpecialTokenId(std::string_view text) const override {
    if (text.size() < 4 || !text.starts_with("<|") || !text.ends_with("|>")) return std::nullopt;
    return ::strider::Tokenizer::SpecialId(text.substr(2, text.size() - 4));
  }
  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < token::kVocabularySize && ::strider::Tokenizer::IsSpecial(id);
  }
};

}  // namespace

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  return ReplaceInvalidUtf8(DecodeBytes(ids));
}

Result<std::unique_ptr<Tokenizer>> ParseTokenizer(std::string_view contents,
                                                  const TokenizerOptions& options,
                                                  std::string_view origin) {
  TokenizerFormat format = options.format;
  if (format == TokenizerFormat::kAuto) {
    const size_t first = contents.find_first_not_of(" \t\r\n");
    format = first != std::string_view::npos && contents[first] == '{'
                 ? TokenizerFormat::kTokenizerJson
                 : TokenizerFormat::kTiktoken;
  }
  Result<internal::BpeSpec> spec = format == TokenizerFormat::kTokenizerJson
                                       ? internal::ParseTokenizerJson(contents, origin)
                                       : internal::ParseTiktoken(contents, options, origin);
  if (!spec.ok()) return spec.status();
  return internal::MakeBpeTokenizer(std::move(spec).value(), options.cache_words, origin);
}

Result<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::filesystem::path& path,
                                                 const TokenizerOptions& options) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status::NotFound(path.string() + ": cannot open the tokenizer file");
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) return Status::IoError(path.string() + ": read failed");
  return ParseTokenizer(contents.str(), options, path.string());
}

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

namespace internal {

Result<std::string> ReadWhole(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status::NotFound(path.string() + ": cannot open");
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) return Status::IoError(path.string() + ": read failed");
  return contents.str();
}

}  // namespace internal
}  // namespace strider::tokenizer
