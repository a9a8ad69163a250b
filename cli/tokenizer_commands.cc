// `strider tokenizer encode|decode --tokenizer FILE (--text T | --file F) [--json]`: a model's
// tokenizer (tokenizer.json or a tiktoken rank file) from the command line, for users and for
// checks against other implementations (docs/tokenizers.md).
#include <climits>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/tokenizer/tokenizer.h"

namespace strider::cli {
namespace {

struct TokenizerFlags {
  std::string tokenizer;
  std::string text;
  std::string file;
  bool json = false;
  std::string pattern;
  std::vector<std::string> specials;  // TEXT=ID
  bool split_special_tokens = false;
};

Result<std::unique_ptr<tokenizer::Tokenizer>> Load(const TokenizerFlags& flags) {
  tokenizer::TokenizerOptions options;
  options.tiktoken_pattern = flags.pattern;
  for (const std::string& special : flags.specials) {
    const size_t equals = special.rfind('=');
    if (equals == std::string::npos || equals == 0) {
      return Status::InvalidArgument("--special " + special + ": expected TEXT=ID");
    }
    try {
      options.tiktoken_special_tokens.emplace_back(special.substr(0, equals),
                                                   std::stoi(special.substr(equals + 1)));
    } catch (const std::exception&) {
      return Status::InvalidArgument("--special " + special + ": the id is not a number");
    }
  }
  return tokenizer::LoadTokenizer(flags.tokenizer, options);
}

Result<std::string> Input(const TokenizerFlags& flags) {
  if (flags.file.empty()) return flags.text;
  std::ifstream file(flags.file, std::ios::binary);
  if (!file) return Status::NotFound(flags.file + ": cannot open");
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

Status Encode(const TokenizerFlags& flags) {
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, Load(flags));
  STRIDER_ASSIGN_OR_RETURN(std::string text, Input(flags));
  tokenizer::EncodeOptions options;
  options.split_special_tokens = flags.split_special_tokens;
  const std::vector<int32_t> ids = tok->Encode(text, options);
  if (flags.json) {
    std::printf("%s\n", nlohmann::json{{"ids", ids}, {"count", ids.size()}}.dump().c_str());
    return Status::Ok();
  }
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line += ' ';
    line += std::to_string(ids[i]);
  }
  std::printf("%s\n", line.c_str());
  return Status::Ok();
}

// Ids separated by white space or commas, optionally inside [ ] (a JSON array reads as well).
Result<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  std::string token;
  const auto flush = [&]() -> Status {
    if (token.empty()) return Status::Ok();
    try {
      size_t used = 0;
      const long value = std::stol(token, &used);
      if (used != token.size() || value < INT32_MIN || value > INT32_MAX) throw std::exception();
      ids.push_back(static_cast<int32_t>(value));
    } catch (const std::exception&) {
      return Status::InvalidArgument("\"" + token + "\" is not a token id");
    }
    token.clear();
    return Status::Ok();
  };
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '[' || c == ']') {
      STRIDER_RETURN_IF_ERROR(flush());
    } else {
      token += c;
    }
  }
  STRIDER_RETURN_IF_ERROR(flush());
  return ids;
}

Status Decode(const TokenizerFlags& flags) {
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, Load(flags));
  STRIDER_ASSIGN_OR_RETURN(std::string input, Input(flags));
  STRIDER_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIds(input));
  const std::string text = tok->Decode(ids);
  if (flags.json) {
    std::printf("%s\n", nlohmann::json{{"text", text}}.dump().c_str());
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  return Status::Ok();
}

void AddCommon(CLI::App* command, TokenizerFlags& flags, const char* input_what) {
  command
      ->add_option("--tokenizer", flags.tokenizer,
                   "tokenizer.json, or a tiktoken rank file (then --pattern)")
      ->required();
  auto* text = command->add_option("--text", flags.text, input_what);
  auto* file = command->add_option("--file", flags.file, "read the input from this file");
  text->excludes(file);
  file->excludes(text);
  command->add_flag("--json", flags.json, "print one JSON object");
  command->add_option("--pattern", flags.pattern, "split pattern of a tiktoken rank file");
  command->add_option("--special", flags.specials,
                      "a special token of a tiktoken rank file as TEXT=ID (repeatable)");
}

}  // namespace

void AddTokenizerCommands(CLI::App& app, int& exit_code) {
  CLI::App* group = app.add_subcommand(
      "tokenizer", "Encode and decode with a model's tokenizer (tokenizer.json or tiktoken)");
  group->require_subcommand(1);
  auto flags = std::make_shared<TokenizerFlags>();
  CLI::App* encode = group->add_subcommand("encode", "Text to token ids");
  AddCommon(encode, *flags, "the text to encode");
  encode->add_flag("--split-special-tokens", flags->split_special_tokens,
                   "tokenise special tokens' text as plain text instead of their ids");
  encode->callback([flags, &exit_code] {
    Status status = Encode(*flags);
    if (!status.ok()) exit_code = ReportError(status);
  });
  CLI::App* decode = group->add_subcommand("decode", "Token ids to text");
  AddCommon(decode, *flags, "the ids, separated by spaces or commas");
  decode->callback([flags, &exit_code] {
    Status status = Decode(*flags);
    if (!status.ok()) exit_code = ReportError(status);
  });
}

}  // namespace strider::cli
