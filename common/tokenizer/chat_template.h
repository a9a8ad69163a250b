// A model's chat template: how a conversation (system, user, assistant and tool turns, tool
// calls, a tool list) becomes the prompt text, byte-identical to transformers'
// `apply_chat_template(..., tokenize=False)` (docs/tokenizers.md), and the roles of the tokens of
// such a prompt read back from the tokens alone.
//
// The template is the model's own Jinja text (jinja.h), from `tokenizer_config.json`
// ("chat_template": a string, or a list of {name, template}) or a `chat_template.jinja` file;
// the config's bos/eos/... tokens are the template's variables of those names, as transformers
// passes them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/jinja.h"
#include "common/tokenizer/tokenizer.h"
#include "common/transcript.h"

namespace strider::tokenizer {

struct ChatRenderOptions {
  // Appends the header of the next assistant turn, as a prompt for sampling does.
  bool add_generation_prompt = false;
  // OpenAI-style tool schemas ({"type": "function", "function": {...}}); null: no tools (the
  // template sees `tools` as none).
  nlohmann::ordered_json tools = nullptr;
  // Further template variables (enable_thinking, date_string, ...), as keyword arguments to
  // apply_chat_template; they override the special tokens of the same name.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // `path` is a tokenizer_config.json (or any JSON object with "chat_template"), or a template
  // file (.jinja); for a config that holds several named templates, `name` picks one ("default"
  // when empty, as transformers does). A .jinja file next to a tokenizer_config.json takes that
  // config's special tokens.
  static Result<ChatTemplate> Load(const std::filesystem::path& path, std::string_view name = "");
  // The template's text itself; `special_tokens` maps bos_token, eos_token, ... to their text.
  static Result<ChatTemplate> FromSource(std::string_view source,
                                         nlohmann::ordered_json special_tokens = nullptr,
                                         std::string_view origin = "chat template");

  // `messages`: a JSON array of {"role", "content", "tool_calls", "tool_call_id", ...}. Keys with
  // a null value are dropped and a message's reasoning (`reasoning_content`, `thinking` or
  // `reasoning`) is passed under the first two names, as transformers does before rendering.
  Result<std::string> Render(const nlohmann::ordered_json& messages,
                             const ChatRenderOptions& options = {}) const;

  const std::string& source() const { return source_; }
  // The special-token variables (bos_token, eos_token, ...) the template is rendered with.
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  // For templates that print today's date (strftime_now): a fixed clock for reproducible output.
  void set_strftime(jinja::Template::Strftime strftime) {
    template_.set_strftime(std::move(strftime));
  }

 private:
  std::string source_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  jinja::Template template_;
};

// Reads the roles of a token stream that a chat template rendered, from the tokens alone, so a
// learner trains only the model's own tokens. The format's markers are found by rendering probe
// conversations through the template once:
//   - the assistant header: what add_generation_prompt appends;
//   - the end of an assistant turn: the first special token after an assistant message's text;
//   - the start of a tool call: what every rendered tool call begins with (from its first special
//     token when it has one, as Kimi's <|tool_calls_section_begin|>; else its text, as Llama 3's
//     {"name": ...});
//   - the header of each other turn (system, user, tool result), and, for formats where the
//     model answers a tool result with no header of its own (DeepSeek V3), what closes the
//     result.
// Roles: from the end of an assistant header through the end-of-turn token the model sampled is
// `model`, and from a tool call's start to the end of that turn `tool_call` (the end-of-turn
// token stays `model`); everything else is context with the role of the turn it is in (a turn's
// header included; an assistant header takes the role of the turn before it, as in
// common/transcript.h). A model turn cut short (no end-of-turn) ends where the next turn's
// header begins. Headers count only where they begin at a special token, so text that merely
// spells one does not move a boundary.
class ChatRoleReader {
 public:
  // `tokenizer` is the model's, and must outlive the reader.
  static Result<ChatRoleReader> Create(const ChatTemplate& chat, const Tokenizer& tokenizer);

  std::vector<transcript::Role> ReadRoles(std::span<const int32_t> tokens) const;

  // The markers found, for documentation and errors.
  const std::string& assistant_header() const { return assistant_header_; }
  const std::string& end_of_turn() const { return end_of_turn_; }
  const std::string& tool_call_start() const { return tool_call_start_; }

 private:
  struct Header {
    std::string text;
    transcript::Role role;
  };

  const Tokenizer* tokenizer_ = nullptr;
  std::string assistant_header_;
  std::string end_of_turn_;
  std::string tool_call_start_;
  // Where the model answers a tool result without a new header, what closes the result.
  std::string model_after_result_;
  std::vector<Header> headers_;  // longest first
};

}  // namespace strider::tokenizer
