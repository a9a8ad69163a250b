// The two file formats as a BpeSpec: Hugging Face's tokenizer.json (byte-level BPE) and
// tiktoken rank files.
#include <array>
#include <charconv>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>

#include "common/tokenizer/bpe.h"

namespace strider::tokenizer::internal {
namespace {

using nlohmann::json;

// GPT-2's split pattern: what a ByteLevel pre-tokenizer with use_regex applies.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode, inverted: the printable stand-in for each byte -> the byte.
const std::unordered_map<char32_t, unsigned char>& ByteOfChar() {
  static const auto* const table = [] {
    auto* map = new std::unordered_map<char32_t, unsigned char>();
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      (*map)[printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++)] =
          static_cast<unsigned char>(b);
    }
    return map;
  }();
  return *table;
}

void AppendUtf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// A vocabulary entry ("Ġthe") to the bytes it stands for (" the"). Characters outside the
// byte alphabet stand for themselves, as in tokenizers' ByteLevel decoder.
Result<std::string> TokenBytes(std::string_view text) {
  if (!IsValidUtf8(text)) return Status::Corruption("a token is not valid UTF-8");
  const auto& table = ByteOfChar();
  std::string bytes;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char b = s[i];
    const int length = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    char32_t c = length == 1 ? b : (b & (0x3F >> (length - 1)));
    for (int k = 1; k < length; ++k) c = (c << 6) | (s[i + k] & 0x3F);
    i += static_cast<size_t>(length);
    auto it = table.find(c);
    if (it != table.end()) {
      bytes += static_cast<char>(it->second);
    } else {
      AppendUtf8(c, bytes);
    }
  }
  return bytes;
}

template <typename T>
T Get(const json& object, const char* key, T fallback) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  return it->get<T>();
}

Status AddPreTokenizer(const json& node, bool first, BpeSpec& spec, bool& byte_level) {
  const std::string type = Get<std::string>(node, "type", "");
  if (type == "Sequence") {
    const json& list = node.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) {
      STRIDER_RETURN_IF_ERROR(AddPreTokenizer(list[i], first && i == 0, spec, byte_level));
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    byte_level = true;
    if (Get<bool>(node, "add_prefix_space", false)) {
      // tokenizers puts the space before every piece earlier steps made; only a leading
      // ByteLevel (GPT-2, RoBERTa) is supported, where that is the start of the text.
      if (!first) return Status::Unimplemented("ByteLevel add_prefix_space after another step");
      spec.add_prefix_space = true;
    }
    if (Get<bool>(node, "use_regex", true)) {
      spec.splits.push_back({std::string(kGpt2Pattern), SplitBehavior::kIsolated, false});
    }
    return Status::Ok();
  }
  if (type == "Split") {
    SplitStep step;
    const json& pattern = node.at("pattern");
    if (pattern.contains("Regex")) {
      step.pattern = pattern.at("Regex").get<std::string>();
    } else {
      step.pattern = "\\Q" + pattern.at("String").get<std::string>() + "\\E";
    }
    const std::string behavior = Get<std::string>(node, "behavior", "Isolated");
    static const std::array<std::pair<std::string_view, SplitBehavior>, 5> kBehaviors = {{
        {"Isolated", SplitBehavior::kIsolated},
        {"Removed", SplitBehavior::kRemoved},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous},
    }};
    bool known = false;
    for (const auto& [name, value] : kBehaviors) {
      if (behavior == name) {
        step.behavior = value;
        known = true;
      }
    }
    if (!known) return Status::InvalidArgument("Split behavior " + behavior);
    step.invert = Get<bool>(node, "invert", false);
    spec.splits.push_back(std::move(step));
    return Status::Ok();
  }
  if (type == "Digits") {
    spec.splits.push_back({Get<bool>(node, "individual_digits", false) ? "\\p{N}" : "\\p{N}+",
                           SplitBehavior::kIsolated, false});
    return Status::Ok();
  }
  return Status::Unimplemented("pre_tokenizer " + type +
                               " (byte-level BPE files use "
                               "Sequence, Split, ByteLevel and Digits)");
}

Status AddNormalizer(const json& node, BpeSpec& spec) {
  if (node.is_null()) return Status::Ok();
  const std::string type = Get<std::string>(node, "type", "");
  if (type == "Sequence") {
    for (const json& child : node.at("normalizers")) {
      STRIDER_RETURN_IF_ERROR(AddNormalizer(child, spec));
    }
    return Status::Ok();
  }
  if (type == "NFC") {
    spec.nfc = true;
    return Status::Ok();
  }
  return Status::Unimplemented("normalizer " + type + " (NFC is supported)");
}

Result<int32_t> VocabularyId(const std::unordered_map<std::string, int32_t>& vocabulary,
                             const std::string& token) {
  auto it = vocabulary.find(token);
  if (it == vocabulary.end()) return Status::InvalidArgument("merge names unknown token " + token);
  return it->second;
}

Result<BpeSpec> ParseTokenizerJsonImpl(const json& root) {
  BpeSpec spec;
  const json& model = root.at("model");
  const std::string type = Get<std::string>(model, "type", "BPE");
  if (type != "BPE") return Status::Unimplemented("model type " + type + " (BPE is supported)");
  if (!Get<std::string>(model, "continuing_subword_prefix", "").empty() ||
      !Get<std::string>(model, "end_of_word_suffix", "").empty()) {
    return Status::Unimplemented("BPE with word prefixes or suffixes");
  }
  if (Get<double>(model, "dropout", 0.0) > 0.0) {
    return Status::Unimplemented("BPE dropout (random merges; a training-time option)");
  }
  spec.whole_word_lookup = Get<bool>(model, "ignore_merges", false);

  std::unordered_map<std::string, int32_t> vocabulary;
  for (const auto& [text, id_json] : model.at("vocab").items()) {
    const int32_t id = id_json.get<int32_t>();
    if (id < 0 || id > (1 << 24))
      return Status::InvalidArgument("vocabulary id " + std::to_string(id));
    if (static_cast<size_t>(id) >= spec.tokens.size())
      spec.tokens.resize(static_cast<size_t>(id) + 1);
    STRIDER_ASSIGN_OR_RETURN(std::string bytes, TokenBytes(text));
    spec.tokens[static_cast<size_t>(id)] = std::move(bytes);
    vocabulary.emplace(text, id);
  }
  uint32_t rank = 0;
  for (const json& merge : model.at("merges")) {
    std::string left, right;
    if (merge.is_string()) {
      const std::string line = merge.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return Status::InvalidArgument("merge \"" + line + "\" is not two tokens");
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else {
      if (!merge.is_array() || merge.size() != 2) return Status::InvalidArgument("merge entry");
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    }
    BpeSpec::Merge m;
    STRIDER_ASSIGN_OR_RETURN(m.left, VocabularyId(vocabulary, left));
    STRIDER_ASSIGN_OR_RETURN(m.right, VocabularyId(vocabulary, right));
    STRIDER_ASSIGN_OR_RETURN(m.merged, VocabularyId(vocabulary, left + right));
    m.rank = rank++;
    spec.merges.push_back(m);
  }
  const std::string unk = Get<std::string>(model, "unk_token", "");
  if (!unk.empty()) {
    auto it = vocabulary.find(unk);
    if (it != vocabulary.end()) spec.unk = it->second;
  }

  if (root.contains("added_tokens")) {
    for (const json& token : root.at("added_tokens")) {
      AddedToken added;
      added.id = token.at("id").get<int32_t>();
      added.content = token.at("content").get<std::string>();
      added.special = Get<bool>(token, "special", false);
      added.lstrip = Get<bool>(token, "lstrip", false);
      added.rstrip = Get<bool>(token, "rstrip", false);
      added.single_word = Get<bool>(token, "single_word", false);
      added.normalized = Get<bool>(token, "normalized", !added.special);
      if (!IsValidUtf8(added.content)) return Status::Corruption("added token is not valid UTF-8");
      spec.added.push_back(std::move(added));
    }
  }
  STRIDER_RETURN_IF_ERROR(AddNormalizer(root.value("normalizer", json()), spec));
  bool byte_level = false;
  const json pre = root.value("pre_tokenizer", json());
  if (!pre.is_null()) STRIDER_RETURN_IF_ERROR(AddPreTokenizer(pre, true, spec, byte_level));
  if (!byte_level) {
    return Status::Unimplemented(
        "a tokenizer.json without a ByteLevel pre-tokenizer (only "
        "byte-level BPE is supported)");
  }
  const json decoder = root.value("decoder", json());
  if (!decoder.is_null() && Get<std::string>(decoder, "type", "") != "ByteLevel") {
    return Status::Unimplemented("decoder " + Get<std::string>(decoder, "type", "") +
                                 " (ByteLevel is supported)");
  }
  return spec;
}

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

Result<std::string> DecodeBase64(std::string_view text) {
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    const int value = Base64Value(c);
    if (value < 0) return Status::Corruption("not base64");
    buffer = (buffer << 6) | static_cast<uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  return out;
}

}  // namespace

Result<BpeSpec> ParseTokenizerJson(std::string_view contents, std::string_view origin) {
  const std::string where(origin);
  json root = json::parse(contents, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return Status::Corruption(where + ": not a JSON object");
  }
  try {
    Result<BpeSpec> spec = ParseTokenizerJsonImpl(root);
    if (!spec.ok()) return spec.status().WithContext(where);
    return spec;
  } catch (const json::exception& error) {
    // A key missing or of the wrong type: the file is not a tokenizer.json we can read.
    return Status::Corruption(where + ": " + error.what());
  }
}

Result<BpeSpec> ParseTiktoken(std::string_view contents, const TokenizerOptions& options,
                              std::string_view origin) {
  const std::string where(origin);
  if (options.tiktoken_pattern.empty()) {
    return Status::InvalidArgument(where + ": a tiktoken rank file needs its split pattern");
  }
  BpeSpec spec;
  std::unordered_map<std::string, int32_t> ids;
  size_t line_number = 0;
  size_t pos = 0;
  while (pos < contents.size()) {
    size_t end = contents.find('\n', pos);
    if (end == std::string_view::npos) end = contents.size();
    std::string_view line = contents.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const auto bad = [&](std::string_view what) {
      return Status::Corruption(where + ":" + std::to_string(line_number) + ": " +
                                std::string(what));
    };
    if (space == std::string_view::npos) return bad("expected \"<base64> <rank>\"");
    Result<std::string> bytes = DecodeBase64(line.substr(0, space));
    if (!bytes.ok() || bytes->empty()) return bad("token is not base64");
    const std::string_view rank_text = line.substr(space + 1);
    int32_t rank = -1;
    const auto [ptr, ec] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || ptr != rank_text.data() + rank_text.size() || rank < 0 ||
        rank > (1 << 24)) {
      return bad("rank is not a number");
    }
    if (static_cast<size_t>(rank) >= spec.tokens.size())
      spec.tokens.resize(static_cast<size_t>(rank) + 1);
    if (spec.tokens[static_cast<size_t>(rank)]) return bad("rank given twice");
    if (!ids.emplace(*bytes, rank).second) return bad("token given twice");
    spec.tokens[static_cast<size_t>(rank)] = std::move(*bytes);
  }
  if (ids.empty()) return Status::Corruption(where + ": no tokens");
  // tiktoken merges the adjacent pair whose concatenation has the lowest rank. Every way a
  // token splits into two tokens is such a pair, ranked by the token itself.
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    if (!spec.tokens[id] || spec.tokens[id]->size() < 2) continue;
    const std::string& bytes = *spec.tokens[id];
    for (size_t k = 1; k < bytes.size(); ++k) {
      auto left = ids.find(bytes.substr(0, k));
      if (left == ids.end()) continue;
      auto right = ids.find(bytes.substr(k));
      if (right == ids.end()) continue;
      spec.merges.push_back(
          {left->second, right->second, static_cast<int32_t>(id), static_cast<uint32_t>(id)});
    }
  }
  for (const auto& [text, id] : options.tiktoken_special_tokens) {
    if (static_cast<size_t>(id) < spec.tokens.size() && spec.tokens[static_cast<size_t>(id)]) {
      return Status::InvalidArgument(where + ": special token " + text + " has id " +
                                     std::to_string(id) + ", which a rank already uses");
    }
    AddedToken added;
    added.content = text;
    added.id = id;
    added.special = true;
    spec.added.push_back(std::move(added));
  }
  // tiktoken keeps only what the pattern matches, and a piece that is a token stays whole.
  spec.splits.push_back({options.tiktoken_pattern, SplitBehavior::kRemoved, true});
  spec.whole_word_lookup = true;
  return spec;
}

}  // namespace strider::tokenizer::internal
