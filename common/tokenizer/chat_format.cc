// A model's transcript format from its chat template and tokenizer (chat_format.h).
#include "common/tokenizer/chat_format.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "common/tokenizer/bpe.h"

namespace strider::tokenizer {
namespace {

using Json = nlohmann::ordered_json;
using transcript::Message;
using transcript::Role;
using transcript::Tool;

constexpr std::string_view kProbeQuestion = "probe question";
constexpr std::string_view kProbeName = "probe_tool";
constexpr std::string_view kProbeArgument = "probe_argument";
constexpr std::string_view kProbeValue = "probe value";

std::string_view TrimRight(std::string_view text) {
  const size_t end = text.find_last_not_of(" \t\r\n");
  return end == std::string_view::npos ? std::string_view() : text.substr(0, end + 1);
}

std::string_view Trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  return begin == std::string_view::npos ? std::string_view() : TrimRight(text.substr(begin));
}

// A tool's arguments as a JSON schema: an environment's flat {"name": "type"} becomes an object
// schema with every argument required; a schema passes as it is.
Json Parameters(const Tool& tool) {
  const Json args = Json::parse(tool.arguments, nullptr, /*allow_exceptions=*/false);
  if (!args.is_object()) return Json{{"type", "object"}, {"properties", Json::object()}};
  if (args.contains("type") && args.contains("properties")) return args;
  Json properties = Json::object();
  Json required = Json::array();
  for (const auto& [name, type] : args.items()) {
    properties[name] = Json{{"type", type.is_string() ? type : Json("string")}};
    required.push_back(name);
  }
  return Json{{"type", "object"}, {"properties", properties}, {"required", required}};
}

// Where `pattern` matches `text` at `at`, a digit run in the pattern matching any digit run (a
// call's index, as Kimi's ids carry): the end of the match, or npos.
size_t MatchLoose(std::string_view text, size_t at, std::string_view pattern) {
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t p = 0;
  while (p < pattern.size()) {
    if (digit(pattern[p])) {
      if (at >= text.size() || !digit(text[at])) return std::string_view::npos;
      while (p < pattern.size() && digit(pattern[p])) ++p;
      while (at < text.size() && digit(text[at])) ++at;
      continue;
    }
    if (at >= text.size() || text[at] != pattern[p]) return std::string_view::npos;
    ++at;
    ++p;
  }
  return at;
}

class ChatFormat final : public transcript::Format {
 public:
  ChatFormat(std::shared_ptr<const Tokenizer> tokenizer, ChatTemplate chat, ChatRoleReader reader)
      : tokenizer_(std::move(tokenizer)), chat_(std::move(chat)), reader_(std::move(reader)) {}

  Status Probe();

  Result<std::string> Render(std::span<const Message> messages, std::span<const Tool> tools,
                             bool generation_prompt) const override {
    ChatRenderOptions options;
    options.add_generation_prompt = generation_prompt;
    if (!tools.empty()) {
      options.tools = Json::array();
      for (const Tool& tool : tools) {
        Json function = {{"name", tool.name}};
        if (!tool.description.empty()) function["description"] = tool.description;
        function["parameters"] = Parameters(tool);
        options.tools.push_back(Json{{"type", "function"}, {"function", std::move(function)}});
      }
    }
    return chat_.Render(ToJson(messages, tools), options);
  }

  std::vector<int32_t> Encode(std::string_view text) const override {
    return tokenizer_->Encode(text);
  }
  std::string DecodeBytes(std::span<const int32_t> ids) const override {
    return tokenizer_->DecodeBytes(ids);
  }
  Message ReadModelTurn(std::string_view turn_text) const override;
  int32_t end_of_turn() const override { return end_of_turn_; }
  int32_t vocabulary_size() const override { return tokenizer_->VocabSize(); }
  const std::string& end_of_turn_text() const override { return reader_.end_of_turn(); }
  std::vector<int32_t> stop_tokens() const override { return stop_tokens_; }
  const std::string& tool_call_start() const override { return call_opener_; }
  DocumentMarkers document_markers() const;
  std::vector<Role> ReadRoles(std::span<const int32_t> tokens) const override {
    return reader_.ReadRoles(tokens);
  }

 private:
  Json ToJson(std::span<const Message> messages, std::span<const Tool> tools) const;
  // A call's arguments as the template takes them: the environment's ARGUMENTS as the value of
  // a tool's only argument, else as the JSON object they spell.
  Json Arguments(const Message& message, std::span<const Tool> tools) const;

  std::shared_ptr<const Tokenizer> tokenizer_;
  ChatTemplate chat_;
  ChatRoleReader reader_;  // reads through *tokenizer_, which this format keeps alive
  int32_t end_of_turn_ = -1;
  std::vector<int32_t> stop_tokens_;
  bool arguments_as_text_ = false;  // the template takes arguments only as JSON text
  bool calls_ = false;              // the template renders tool calls
  // What opens a call as the model samples it: the first token of the call's opening text where
  // that is a marker token (Kimi's <|tool_calls_section_begin|>, Qwen's added <tool_call>), so
  // the call's role is known from its first token; else the whole opening text.
  std::string call_opener_;
  std::string call_prefix_;  // a call's text from its start to the name
  std::string call_middle_;  // between the name and the arguments' JSON object
  std::string call_suffix_;  // after the arguments, to the end of the turn
};

Json ChatFormat::Arguments(const Message& message, std::span<const Tool> tools) const {
  std::vector<std::string> names;
  for (const Tool& tool : tools) {
    if (tool.name != message.tool_name) continue;
    const Json parameters = Parameters(tool);
    for (const auto& [name, schema] : parameters["properties"].items()) names.push_back(name);
  }
  const Json parsed = Json::parse(message.tool_arguments, nullptr, /*allow_exceptions=*/false);
  Json arguments;
  if (parsed.is_object() && (names.size() != 1 || parsed.contains(names[0]))) {
    arguments = parsed;
  } else if (names.size() == 1) {
    arguments = Json{{names[0], message.tool_arguments}};
  } else {
    arguments = Json{{"input", message.tool_arguments}};
  }
  return arguments_as_text_ ? Json(arguments.dump()) : arguments;
}

Json ChatFormat::ToJson(std::span<const Message> messages, std::span<const Tool> tools) const {
  Json out = Json::array();
  int calls = 0;
  std::string last_id, last_name;
  for (const Message& m : messages) {
    switch (m.role) {
      case Role::kModel: {
        Json turn = {{"role", "assistant"}, {"content", m.content}};
        if (!m.tool_name.empty()) {
          // Kimi's ids ("functions.NAME:INDEX", the index counting the conversation's calls);
          // other templates ignore them or only pair a result with its call.
          last_id = "functions." + m.tool_name + ":" + std::to_string(calls++);
          last_name = m.tool_name;
          turn["tool_calls"] = Json::array(
              {Json{{"id", last_id},
                    {"type", "function"},
                    {"function", {{"name", m.tool_name}, {"arguments", Arguments(m, tools)}}}}});
        }
        out.push_back(std::move(turn));
        break;
      }
      case Role::kToolResult: {
        Json turn = {{"role", "tool"}};
        if (!last_id.empty()) {
          turn["tool_call_id"] = last_id;
          turn["name"] = last_name;
        }
        turn["content"] = m.content;
        out.push_back(std::move(turn));
        break;
      }
      case Role::kSystem:
        out.push_back(Json{{"role", "system"}, {"content", m.content}});
        break;
      default:
        out.push_back(Json{{"role", "user"}, {"content", m.content}});
        break;
    }
  }
  return out;
}

// The shape of a tool call, from a probe call rendered after a probe question.
Status ChatFormat::Probe() {
  const Json special = chat_.special_tokens();
  const std::string& end = reader_.end_of_turn();
  const std::optional<int32_t> id = tokenizer_->SpecialTokenId(end);
  if (!id) {
    return Status::InvalidArgument("the chat template ends a model turn with '" + end +
                                   "', which is not a special token of the tokenizer");
  }
  end_of_turn_ = *id;
  stop_tokens_ = {end_of_turn_};
  if (special.contains("eos_token") && special["eos_token"].is_string()) {
    const std::optional<int32_t> eos =
        tokenizer_->SpecialTokenId(special["eos_token"].get<std::string>());
    if (eos && *eos != end_of_turn_) stop_tokens_.push_back(*eos);
  }
  const std::string& start_text = reader_.tool_call_start();
  if (start_text.empty()) return Status::Ok();  // no tool calls in this format
  call_opener_ = start_text;
  const std::vector<int32_t> start_ids = tokenizer_->Encode(start_text);
  if (!start_ids.empty()) {
    const std::string first =
        tokenizer_->DecodeBytes(std::span<const int32_t>(start_ids.data(), 1));
    const std::optional<int32_t> marker = tokenizer_->SpecialTokenId(first);
    if (tokenizer_->IsSpecial(start_ids[0]) || (marker && *marker == start_ids[0])) {
      call_opener_ = first;
    }
  }
  const Tool tool{std::string(kProbeName), "{\"" + std::string(kProbeArgument) + "\": \"string\"}",
                  "A probe."};
  const Message messages[] = {
      {Role::kUser, std::string(kProbeQuestion)},
      {Role::kModel, "", std::string(kProbeName), std::string(kProbeValue)}};
  Result<std::string> rendered = Render(messages, {&tool, 1}, false);
  if (!rendered.ok()) {
    arguments_as_text_ = true;
    rendered = Render(messages, {&tool, 1}, false);
  }
  if (!rendered.ok()) return Status::Ok();
  const std::string& r = *rendered;
  const size_t question = r.find(kProbeQuestion);
  const size_t start =
      r.find(reader_.tool_call_start(), question == std::string::npos ? 0 : question);
  const size_t stop = start == std::string::npos ? start : r.find(end, start);
  if (stop == std::string::npos) return Status::Ok();
  const std::string_view region = TrimRight(std::string_view(r).substr(start, stop - start));
  const size_t name = region.find(kProbeName);
  const size_t argument = region.find("\"" + std::string(kProbeArgument) + "\"");
  const size_t brace = argument == std::string::npos ? argument : region.rfind('{', argument);
  const size_t value =
      argument == std::string::npos ? argument : region.find(kProbeValue, argument);
  const size_t close = value == std::string::npos ? value : region.find('}', value);
  if (name == std::string::npos || brace == std::string::npos || close == std::string::npos ||
      brace < name + kProbeName.size()) {
    return Status::InvalidArgument(
        "cannot find the name and arguments of the chat template's "
        "tool call in '" +
        std::string(region) + "'");
  }
  call_prefix_ = std::string(region.substr(0, name));
  call_middle_ =
      std::string(region.substr(name + kProbeName.size(), brace - name - kProbeName.size()));
  call_suffix_ = std::string(Trim(region.substr(close + 1)));
  calls_ = true;
  return Status::Ok();
}

DocumentMarkers ChatFormat::document_markers() const {
  const Json& special = chat_.special_tokens();
  const auto named = [&](const char* name) -> std::optional<int32_t> {
    if (!special.contains(name) || !special[name].is_string()) return std::nullopt;
    return tokenizer_->SpecialTokenId(special[name].get<std::string>());
  };
  DocumentMarkers markers;
  markers.begin_of_text = named("bos_token").value_or(-1);
  const std::optional<int32_t> eos = named("eos_token");
  std::optional<int32_t> end;
  if (eos && *eos != end_of_turn_) end = eos;
  if (!end) end = tokenizer_->SpecialTokenId("<|endoftext|>");
  if (!end) end = tokenizer_->SpecialTokenId("<|end_of_text|>");
  if (!end) end = eos;
  markers.end_of_text = end.value_or(end_of_turn_);
  return markers;
}

Message ChatFormat::ReadModelTurn(std::string_view bytes) const {
  const std::string valid = ReplaceInvalidUtf8(bytes);
  const std::string_view text = valid;
  Message m{Role::kModel, valid};
  const std::string& start_text = reader_.tool_call_start();
  const size_t start = start_text.empty() ? std::string_view::npos : text.find(start_text);
  if (start == std::string_view::npos) return m;
  m.malformed_call = true;  // until read below
  if (!calls_) return m;
  const std::string_view region = TrimRight(text.substr(start));
  if (!region.starts_with(call_prefix_)) return m;
  size_t name_end = call_prefix_.size();
  size_t arguments_begin = std::string_view::npos;
  for (; name_end < region.size(); ++name_end) {
    arguments_begin = MatchLoose(region, name_end, call_middle_);
    if (arguments_begin != std::string_view::npos) break;
  }
  if (arguments_begin == std::string_view::npos || name_end == call_prefix_.size()) return m;
  const size_t arguments_end = call_suffix_.empty() ? region.size() : region.rfind(call_suffix_);
  if (arguments_end == std::string_view::npos || arguments_end < arguments_begin ||
      arguments_end + call_suffix_.size() != region.size()) {
    return m;
  }
  Json arguments =
      Json::parse(Trim(region.substr(arguments_begin, arguments_end - arguments_begin)), nullptr,
                  /*allow_exceptions=*/false);
  if (arguments.is_string()) {
    arguments = Json::parse(arguments.get<std::string>(), nullptr, /*allow_exceptions=*/false);
  }
  if (!arguments.is_object()) return m;
  m.content = std::string(TrimRight(text.substr(0, start)));
  m.tool_name = std::string(region.substr(call_prefix_.size(), name_end - call_prefix_.size()));
  m.tool_arguments = arguments.size() == 1 && arguments.begin()->is_string()
                         ? arguments.begin()->get<std::string>()
                         : arguments.dump();
  m.malformed_call = false;
  return m;
}

}  // namespace

Result<std::shared_ptr<const transcript::Format>> MakeChatFormat(
    std::shared_ptr<const Tokenizer> tokenizer, ChatTemplate chat) {
  if (!tokenizer) return Status::InvalidArgument("a chat format needs a tokenizer");
  STRIDER_ASSIGN_OR_RETURN(ChatRoleReader reader, ChatRoleReader::Create(chat, *tokenizer));
  auto format =
      std::make_shared<ChatFormat>(std::move(tokenizer), std::move(chat), std::move(reader));
  STRIDER_RETURN_IF_ERROR(format->Probe());
  return std::shared_ptr<const transcript::Format>(std::move(format));
}

Result<DocumentMarkers> ReadDocumentMarkers(const transcript::Format& format) {
  const auto* chat = dynamic_cast<const ChatFormat*>(&format);
  if (chat == nullptr) {
    return Status::InvalidArgument("document markers are read from a tokenizer's chat format");
  }
  return chat->document_markers();
}

Result<std::shared_ptr<const transcript::Format>> LoadChatFormat(const TokenizerConfig& config) {
  if (!config.enabled()) return Status::InvalidArgument("the tokenizer config names no file");
  TokenizerOptions options;
  if (config.format == "tokenizer_json") {
    options.format = TokenizerFormat::kTokenizerJson;
  } else if (config.format == "tiktoken") {
    options.format = TokenizerFormat::kTiktoken;
  } else if (config.format != "auto") {
    return Status::InvalidArgument("tokenizer format '" + config.format +
                                   "' is not auto, tokenizer_json or tiktoken");
  }
  options.tiktoken_pattern = config.pattern;
  // A Hugging Face model directory keeps its template in tokenizer_config.json beside the
  // tokenizer file.
  std::filesystem::path chat_path = config.chat_template;
  if (chat_path.empty()) {
    chat_path = std::filesystem::path(config.file).parent_path() / "tokenizer_config.json";
    if (!std::filesystem::exists(chat_path)) {
      return Status::InvalidArgument("the tokenizer config names no chat_template, and " +
                                     chat_path.string() + " does not exist");
    }
  }
  if (chat_path.extension() == ".json") {
    // tiktoken files hold ranks only: the special tokens are the config's added tokens.
    STRIDER_ASSIGN_OR_RETURN(std::string text, internal::ReadWhole(chat_path));
    const Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object() && parsed.contains("added_tokens_decoder") &&
        parsed["added_tokens_decoder"].is_object()) {
      for (const auto& [id, token] : parsed["added_tokens_decoder"].items()) {
        if (!token.is_object() || !token.contains("content") || !token["content"].is_string()) {
          continue;
        }
        char* end = nullptr;
        const long value = std::strtol(id.c_str(), &end, 10);
        if (end == id.c_str() || *end != '\0') continue;
        options.tiktoken_special_tokens.emplace_back(token["content"].get<std::string>(),
                                                     static_cast<int32_t>(value));
      }
    }
  }
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                           LoadTokenizer(config.file, options));
  STRIDER_ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::Load(chat_path, config.template_name));
  return MakeChatFormat(std::shared_ptr<const Tokenizer>(std::move(tokenizer)), std::move(chat));
}

}  // namespace strider::tokenizer
