// `strider tokenizer encode|decode --tokenizer FILE (--text T | --file F) [--json]`: a model's
// tokenizer (tokenizer.json or a tiktoken rank file) from the command line, for users and for
// checks against other implementations (docs/tokenizers.md). `strider tokenizer chat` renders a
// conversation through a model's chat template, as transformers' apply_chat_template does, and
// with a tokenizer shows each token's role.
#include <climits>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/tokenizer/chat_template.h"
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

struct ChatFlags {
  std::string chat_template;
  std::string name;
  std::string messages;
  std::string tools;
  std::vector<std::string> variables;  // KEY=JSON
  bool add_generation_prompt = false;
  std::string tokenizer;
  bool json = false;
};

Result<nlohmann::ordered_json> ReadJson(const std::string& path) {
  TokenizerFlags input;
  input.file = path;
  STRIDER_ASSIGN_OR_RETURN(std::string text, Input(input));
  nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(text, nullptr, false);
  if (parsed.is_discarded()) return Status::InvalidArgument(path + ": not valid JSON");
  return parsed;
}

Status Chat(const ChatFlags& flags) {
  STRIDER_ASSIGN_OR_RETURN(tokenizer::ChatTemplate chat,
                           tokenizer::ChatTemplate::Load(flags.chat_template, flags.name));
  STRIDER_ASSIGN_OR_RETURN(nlohmann::ordered_json conversation, ReadJson(flags.messages));
  tokenizer::ChatRenderOptions options;
  options.add_generation_prompt = flags.add_generation_prompt;
  // A file holds the messages, or an object with "messages" and optionally "tools".
  nlohmann::ordered_json messages = conversation;
  if (conversation.is_object()) {
    messages = conversation.value("messages", nlohmann::ordered_json());
    options.tools = conversation.value("tools", nlohmann::ordered_json());
  }
  if (!flags.tools.empty()) {
    STRIDER_ASSIGN_OR_RETURN(options.tools, ReadJson(flags.tools));
  }
  for (const std::string& variable : flags.variables) {
    const size_t equals = variable.find('=');
    if (equals == std::string::npos || equals == 0) {
      return Status::InvalidArgument("--var " + variable + ": expected KEY=JSON");
    }
    const std::string value = variable.substr(equals + 1);
    nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(value, nullptr, false);
    // A value that is not JSON is taken as a string: --var date_string="26 Jul 2024".
    options.variables[variable.substr(0, equals)] =
        parsed.is_discarded() ? nlohmann::ordered_json(value) : parsed;
  }
  STRIDER_ASSIGN_OR_RETURN(std::string text, chat.Render(messages, options));
  if (flags.tokenizer.empty()) {
    if (flags.json) {
      std::printf("%s\n", nlohmann::json{{"text", text}}.dump().c_str());
    } else {
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    return Status::Ok();
  }
  TokenizerFlags load;
  load.tokenizer = flags.tokenizer;
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok, Load(load));
  STRIDER_ASSIGN_OR_RETURN(tokenizer::ChatRoleReader reader,
                           tokenizer::ChatRoleReader::Create(chat, *tok));
  const std::vector<int32_t> ids = tok->Encode(text);
  const std::vector<transcript::Role> roles = reader.ReadRoles(ids);
  if (flags.json) {
    nlohmann::json names = nlohmann::json::array();
    for (transcript::Role role : roles) names.push_back(std::string(transcript::RoleName(role)));
    const nlohmann::json out{{"text", text}, {"ids", ids}, {"roles", names}};
    std::printf("%s\n", out.dump().c_str());
    return Status::Ok();
  }
  // One line per run of tokens with one role: the role, then the run's text as JSON.
  for (size_t begin = 0; begin < ids.size();) {
    size_t end = begin;
    while (end < ids.size() && roles[end] == roles[begin]) ++end;
    const std::string piece =
        tok->Decode(std::span<const int32_t>(ids.data() + begin, end - begin));
    std::printf("%-11s %s\n", std::string(transcript::RoleName(roles[begin])).c_str(),
                nlohmann::json(piece).dump().c_str());
    begin = end;
  }
  return Status::Ok();
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
  auto chat_flags = std::make_shared<ChatFlags>();
  CLI::App* chat = group->add_subcommand(
      "chat", "Render a conversation through a model's chat template (as apply_chat_template)");
  chat->add_option("--template", chat_flags->chat_template,
                   "tokenizer_config.json (its \"chat_template\") or a .jinja file")
      ->required();
  chat->add_option("--name", chat_flags->name, "which of a config's named templates (default)");
  chat->add_option("--messages", chat_flags->messages,
                   "JSON file: the messages, or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  chat->add_option("--tools", chat_flags->tools, "JSON file with the tool schemas");
  chat->add_option("--var", chat_flags->variables,
                   "a further template variable as KEY=JSON, e.g. enable_thinking=false");
  chat->add_flag("--add-generation-prompt", chat_flags->add_generation_prompt,
                 "end with the header of the next assistant turn");
  chat->add_option("--tokenizer", chat_flags->tokenizer,
                   "also tokenise the prompt and print each run of tokens with its role");
  chat->add_flag("--json", chat_flags->json, "print one JSON object (text, and ids and roles)");
  chat->callback([chat_flags, &exit_code] {
    Status status = Chat(*chat_flags);
    if (!status.ok()) exit_code = ReportError(status);
  });
}

}  // namespace strider::cli
