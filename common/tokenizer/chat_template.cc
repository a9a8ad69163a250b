// Chat templates as transformers applies them, and role reading from probe renderings
// (chat_template.h).
#include "common/tokenizer/chat_template.h"

#include <algorithm>
#include <utility>

#include "common/tokenizer/bpe.h"

namespace strider::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

// The special-token variables of a tokenizer_config.json: each is a string or an AddedToken
// object whose "content" is the text (transformers' special_tokens_map).
Json SpecialTokensOf(const Json& config) {
  Json tokens = Json::object();
  static const char* const kNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
  for (const char* name : kNames) {
    auto it = config.find(name);
    if (it == config.end()) continue;
    if (it->is_string()) {
      tokens[name] = *it;
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      tokens[name] = (*it)["content"];
    }
  }
  return tokens;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::FromSource(std::string_view source, Json special_tokens,
                                              std::string_view origin) {
  STRIDER_ASSIGN_OR_RETURN(jinja::Template compiled, jinja::Template::Parse(source, origin));
  ChatTemplate chat;
  chat.source_ = std::string(source);
  if (special_tokens.is_object()) chat.special_tokens_ = std::move(special_tokens);
  chat.template_ = std::move(compiled);
  return chat;
}

Result<ChatTemplate> ChatTemplate::Load(const std::filesystem::path& path, std::string_view name) {
  STRIDER_ASSIGN_OR_RETURN(std::string contents, internal::ReadWhole(path));
  const std::string origin = path.string();
  const size_t first = contents.find_first_not_of(" \t\r\n");
  const bool json =
      path.extension() == ".json" || (path.extension() != ".jinja" && first != std::string::npos &&
                                      contents[first] == '{' && Json::accept(contents));
  if (!json) {
    // A bare template file; the tokens it names come from the config beside it, if any.
    Json special = Json::object();
    const std::filesystem::path config = path.parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(config)) {
      STRIDER_ASSIGN_OR_RETURN(std::string text, internal::ReadWhole(config));
      const Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_object()) special = SpecialTokensOf(parsed);
    }
    return FromSource(contents, std::move(special), origin);
  }
  const Json config = Json::parse(contents, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return Status::InvalidArgument(origin + ": not a JSON object");
  Json special = SpecialTokensOf(config);
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    // transformers saves the template beside the config since 4.43.
    const std::filesystem::path beside = path.parent_path() / "chat_template.jinja";
    if (!std::filesystem::exists(beside)) {
      return Status::NotFound(origin +
                              ": no \"chat_template\" and no chat_template.jinja beside it");
    }
    STRIDER_ASSIGN_OR_RETURN(std::string text, internal::ReadWhole(beside));
    return FromSource(text, std::move(special), beside.string());
  }
  if (it->is_string()) {
    if (!name.empty() && name != "default") {
      return Status::NotFound(origin + ": the config has one unnamed chat template, not '" +
                              std::string(name) + "'");
    }
    return FromSource(it->get<std::string>(), std::move(special), origin);
  }
  if (!it->is_array()) {
    return Status::InvalidArgument(origin + ": \"chat_template\" must be a string or a list");
  }
  const std::string wanted = name.empty() ? "default" : std::string(name);
  std::string names;
  for (const Json& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
        !entry["name"].is_string() || !entry["template"].is_string()) {
      return Status::InvalidArgument(origin +
                                     ": each named chat template needs \"name\" and \"template\"");
    }
    if (entry["name"] == wanted) {
      return FromSource(entry["template"].get<std::string>(), std::move(special),
                        origin + " (" + wanted + ")");
    }
    names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
  }
  return Status::NotFound(origin + ": no chat template named '" + wanted + "' (it has: " + names +
                          ")");
}

Result<std::string> ChatTemplate::Render(const Json& messages,
                                         const ChatRenderOptions& options) const {
  if (!messages.is_array()) return Status::InvalidArgument("messages must be a JSON array");
  if (messages.empty()) {
    return Status::InvalidArgument("cannot apply a chat template to an empty conversation");
  }
  Json chat = Json::array();
  for (const Json& message : messages) {
    if (!message.is_object()) return Status::InvalidArgument("each message must be a JSON object");
    // transformers drops keys whose value is None before rendering.
    Json kept = Json::object();
    for (const auto& [key, value] : message.items()) {
      if (!value.is_null()) kept[key] = value;
    }
    // ... and passes a message's reasoning as both `thinking` (first) and `reasoning_content`.
    const Json* reasoning = nullptr;
    for (const char* field : {"reasoning_content", "thinking", "reasoning"}) {
      if (kept.contains(field)) {
        reasoning = &kept[field];
        break;
      }
    }
    if (reasoning != nullptr) {
      const Json value = *reasoning;
      Json aliased = Json::object();
      aliased["thinking"] = value;
      for (const auto& [key, v] : kept.items()) {
        if (key != "thinking") aliased[key] = v;
      }
      aliased["reasoning_content"] = value;
      kept = std::move(aliased);
    }
    chat.push_back(std::move(kept));
  }
  Json variables = special_tokens_;
  if (options.variables.is_object()) {
    for (const auto& [key, value] : options.variables.items()) variables[key] = value;
  }
  variables["messages"] = std::move(chat);
  variables["tools"] = options.tools;
  variables["documents"] = nullptr;
  variables["add_generation_prompt"] = options.add_generation_prompt;
  return template_.Render(variables);
}

// ---------------------------------------------------------------------------------------------
// Role reading

namespace {

constexpr std::string_view kSystemProbe = "Probe system text.";
constexpr std::string_view kUserProbe = "Probe user text.";
constexpr std::string_view kAssistantProbe = "Probe assistant text.";
constexpr std::string_view kResultProbe = "Probe tool result.";

Json Message(std::string_view role, std::string_view content) {
  return Json{{"role", role}, {"content", content}};
}

Json ToolCallTurn(std::string_view id, std::string_view name, const Json& arguments) {
  return Json{{"role", "assistant"},
              {"content", ""},
              {"tool_calls",
               Json::array({Json{{"id", id},
                                 {"type", "function"},
                                 {"function", {{"name", name}, {"arguments", arguments}}}}})}};
}

size_t CommonPrefix(std::string_view a, std::string_view b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// Token ids and the byte offset where each begins in `text` (one past the end appended).
struct Tokens {
  std::vector<int32_t> ids;
  std::vector<size_t> offsets;
};

Tokens TokenizeWithOffsets(const Tokenizer& tokenizer, std::string_view text) {
  Tokens t;
  t.ids = tokenizer.Encode(text);
  size_t at = 0;
  for (int32_t id : t.ids) {
    t.offsets.push_back(at);
    at += tokenizer.DecodeBytes(std::span<const int32_t>(&id, 1)).size();
  }
  t.offsets.push_back(at);
  return t;
}

// A token that a template writes as a unit: special, or added (Qwen's <tool_call>).
bool IsMarker(const Tokenizer& tokenizer, int32_t id) {
  if (tokenizer.IsSpecial(id)) return true;
  const std::string text = tokenizer.DecodeBytes(std::span<const int32_t>(&id, 1));
  const std::optional<int32_t> added = tokenizer.SpecialTokenId(text);
  return added && *added == id;
}

// `text` from its first marker token on ("" if it has none); with `to_last_marker`, only through
// the end of its last marker token.
std::string MarkerSpan(const Tokenizer& tokenizer, std::string_view text, bool to_last_marker) {
  const Tokens t = TokenizeWithOffsets(tokenizer, text);
  size_t begin = std::string::npos, end = 0;
  for (size_t i = 0; i < t.ids.size(); ++i) {
    if (!IsMarker(tokenizer, t.ids[i])) continue;
    if (begin == std::string::npos) begin = t.offsets[i];
    end = t.offsets[i + 1];
  }
  if (begin == std::string::npos) return "";
  return std::string(text.substr(begin, (to_last_marker ? end : text.size()) - begin));
}

}  // namespace

Result<ChatRoleReader> ChatRoleReader::Create(const ChatTemplate& chat,
                                              const Tokenizer& tokenizer) {
  const auto fail = [](std::string why) {
    return Status::InvalidArgument("cannot read roles for this chat template: " + std::move(why));
  };
  const Json base = Json::array({Message("system", kSystemProbe), Message("user", kUserProbe)});
  ChatRenderOptions plain;
  ChatRenderOptions prompt;
  prompt.add_generation_prompt = true;
  STRIDER_ASSIGN_OR_RETURN(std::string r0, chat.Render(base, plain));
  STRIDER_ASSIGN_OR_RETURN(std::string r1, chat.Render(base, prompt));
  if (r1.size() <= r0.size() || r1.compare(0, r0.size(), r0) != 0) {
    return fail("add_generation_prompt does not append an assistant header");
  }
  ChatRoleReader reader;
  reader.tokenizer_ = &tokenizer;
  reader.assistant_header_ = MarkerSpan(tokenizer, r1.substr(r0.size()), false);
  if (reader.assistant_header_.empty()) {
    return fail("the assistant header '" + r1.substr(r0.size()) + "' has no special token");
  }

  // The end of an assistant turn: the first special token after the assistant's text.
  Json with_reply = base;
  with_reply.push_back(Message("assistant", kAssistantProbe));
  STRIDER_ASSIGN_OR_RETURN(std::string r2, chat.Render(with_reply, plain));
  const size_t reply = r2.find(kAssistantProbe, r0.size() > 0 ? std::min(r0.size(), r2.size()) : 0);
  if (reply == std::string::npos) return fail("the assistant's text does not appear in its turn");
  {
    const std::string after = r2.substr(reply + kAssistantProbe.size());
    const Tokens t = TokenizeWithOffsets(tokenizer, after);
    for (size_t i = 0; i < t.ids.size() && reader.end_of_turn_.empty(); ++i) {
      if (tokenizer.IsSpecial(t.ids[i]))
        reader.end_of_turn_ = after.substr(t.offsets[i], t.offsets[i + 1] - t.offsets[i]);
    }
    if (reader.end_of_turn_.empty()) return fail("no special token ends an assistant turn");
  }

  // Context headers. A header is the text from its first marker token to the turn's text; the
  // form cut after its last marker token is kept too where no other role's header is the same.
  std::vector<Header> full, cut;
  const auto add = [&](std::string_view before, transcript::Role role) {
    const std::string whole = MarkerSpan(tokenizer, before, false);
    if (whole.empty()) return;
    full.push_back({whole, role});
    cut.push_back({MarkerSpan(tokenizer, before, true), role});
  };
  std::string bos;
  if (chat.special_tokens().contains("bos_token"))
    bos = chat.special_tokens()["bos_token"].get<std::string>();
  {
    size_t start = (!bos.empty() && r0.starts_with(bos)) ? bos.size() : 0;
    const size_t sys = r0.find(kSystemProbe);
    const size_t user = r0.find(kUserProbe);
    if (sys == std::string::npos || user == std::string::npos || user < sys) {
      return fail("the system and user messages do not appear in order");
    }
    add(std::string_view(r0).substr(start, sys - start), transcript::Role::kSystem);
    size_t end = r0.find(reader.end_of_turn_, sys);
    end = end == std::string::npos || end > user ? sys + kSystemProbe.size()
                                                 : end + reader.end_of_turn_.size();
    add(std::string_view(r0).substr(end, user - end), transcript::Role::kUser);
  }
  // A tool list's declaration, where the format gives it a turn of its own (Kimi's
  // <|im_system|>tool_declare<|im_middle|>): from the marker before the first byte that a tool
  // list changes through the marker after it, read as system.
  {
    ChatRenderOptions with_tools;
    with_tools.tools = Json::array({Json{{"type", "function"},
                                         {"function",
                                          {{"name", "probe_alpha"},
                                           {"description", "A probe."},
                                           {"parameters", {{"type", "object"}}}}}}});
    Result<std::string> declared = chat.Render(base, with_tools);
    if (declared.ok() && *declared != r0) {
      const std::string& d = *declared;
      const size_t differ = CommonPrefix(d, r0);
      const Tokens t = TokenizeWithOffsets(tokenizer, d);
      size_t begin = std::string::npos, end = std::string::npos;
      for (size_t i = 0; i < t.ids.size(); ++i) {
        if (!IsMarker(tokenizer, t.ids[i])) continue;
        if (t.offsets[i] <= differ) begin = t.offsets[i];
        if (t.offsets[i + 1] > differ && end == std::string::npos && begin != std::string::npos &&
            t.offsets[i] >= differ) {
          end = t.offsets[i + 1];
        }
      }
      if (begin != std::string::npos && end != std::string::npos) {
        full.push_back({d.substr(begin, end - begin), transcript::Role::kSystem});
      }
    }
  }
  // Tool calls and results, from two different calls: what the renderings share is the format's.
  std::string call_prefix[2];
  std::string result_header[2];
  bool tools_render = true;
  for (int k = 0; k < 2; ++k) {
    Json conversation = base;
    const std::string id = k == 0 ? "call_probe_0" : "functions.other_omega:1";
    const Json arguments = k == 0 ? Json{{"x", 1}} : Json{{"query", "q"}};
    const Json result_turn = Json{{"role", "tool"},
                                  {"tool_call_id", id},
                                  {"name", k == 0 ? "probe_alpha" : "other_omega"},
                                  {"content", kResultProbe}};
    conversation.push_back(ToolCallTurn(id, k == 0 ? "probe_alpha" : "other_omega", arguments));
    conversation.push_back(result_turn);
    Result<std::string> rendered = chat.Render(conversation, plain);
    if (!rendered.ok()) {
      // Some templates take the arguments only as JSON text (DeepSeek's).
      conversation = base;
      conversation.push_back(
          ToolCallTurn(id, k == 0 ? "probe_alpha" : "other_omega", arguments.dump()));
      conversation.push_back(result_turn);
      rendered = chat.Render(conversation, plain);
    }
    if (!rendered.ok()) {
      tools_render = false;  // a template without tool support: no tool-call role to read
      break;
    }
    if (k == 0) {
      // Formats where the model answers a tool result without a new assistant header (DeepSeek:
      // <｜tool▁output▁end｜> then the answer): what ends the result opens a model turn.
      Json answered = conversation;
      answered.push_back(Message("assistant", kAssistantProbe));
      Result<std::string> a = chat.Render(answered, plain);
      if (a.ok()) {
        const size_t result_at = a->find(kResultProbe, r0.size());
        const size_t reply_at = a->find(kAssistantProbe, r0.size());
        if (result_at != std::string::npos && reply_at != std::string::npos &&
            reply_at > result_at) {
          const size_t from = result_at + kResultProbe.size();
          const std::string between = a->substr(from, reply_at - from);
          if (between.find(reader.assistant_header_) == std::string::npos) {
            reader.model_after_result_ = MarkerSpan(tokenizer, between, true);
          }
        }
      }
    }
    const std::string& r = *rendered;
    if (r.compare(0, r0.size(), r0) != 0) {
      tools_render = false;
      break;
    }
    const size_t turn_end = r.find(reader.end_of_turn_, r0.size());
    const size_t result = r.find(kResultProbe, r0.size());
    if (turn_end == std::string::npos || result == std::string::npos || result < turn_end) {
      return fail("a tool call's turn does not end with '" + reader.end_of_turn_ + "'");
    }
    call_prefix[k] = r.substr(r0.size(), turn_end - r0.size());
    const size_t after = turn_end + reader.end_of_turn_.size();
    result_header[k] = r.substr(after, result - after);
  }
  if (tools_render) {
    std::string shared = call_prefix[0].substr(0, CommonPrefix(call_prefix[0], call_prefix[1]));
    // Past the assistant header (and whatever it opens with, such as an empty think block).
    const size_t header = shared.find(reader.assistant_header_);
    if (header != std::string::npos) shared.erase(0, header + reader.assistant_header_.size());
    std::string start = MarkerSpan(tokenizer, shared, true);
    if (start.empty()) {
      const size_t first = shared.find_first_not_of(" \t\r\n");
      start = first == std::string::npos ? "" : shared.substr(first);
    }
    reader.tool_call_start_ = start;
    const std::string shared_result =
        result_header[0].substr(0, CommonPrefix(result_header[0], result_header[1]));
    add(shared_result, transcript::Role::kToolResult);
  }
  for (const Header& c : cut) {
    const bool clash = std::any_of(cut.begin(), cut.end(), [&](const Header& other) {
      return other.role != c.role && other.text == c.text;
    });
    const bool known =
        std::any_of(full.begin(), full.end(), [&](const Header& h) { return h.text == c.text; });
    if (!clash && !known && !c.text.empty()) full.push_back(c);
  }
  std::stable_sort(full.begin(), full.end(),
                   [](const Header& a, const Header& b) { return a.text.size() > b.text.size(); });
  reader.headers_ = std::move(full);
  return reader;
}

std::vector<transcript::Role> ChatRoleReader::ReadRoles(std::span<const int32_t> tokens) const {
  using transcript::Role;
  const Tokenizer& tok = *tokenizer_;
  std::string text;
  std::vector<size_t> offsets;
  for (int32_t id : tokens) {
    offsets.push_back(text.size());
    text += tok.DecodeBytes(std::span<const int32_t>(&id, 1));
  }
  offsets.push_back(text.size());

  // Where tool calls may start, in order (one scan, not one per token).
  std::vector<size_t> call_starts;
  if (!tool_call_start_.empty()) {
    for (size_t p = text.find(tool_call_start_); p != std::string::npos;
         p = text.find(tool_call_start_, p + 1)) {
      call_starts.push_back(p);
    }
  }
  size_t next_call = 0;

  std::vector<Role> roles(tokens.size(), Role::kSystem);
  Role context = Role::kSystem;
  bool in_model = false;
  bool in_call = false;
  size_t header_end = 0;  // tokens starting before this offset belong to the last header found
  Role header_role = Role::kSystem;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const size_t at = offsets[i];
    if (at < header_end) {
      roles[i] = header_role;
      continue;
    }
    const bool marker = IsMarker(tok, tokens[i]);
    const std::string* opener = nullptr;
    if (marker && text.compare(at, assistant_header_.size(), assistant_header_) == 0) {
      opener = &assistant_header_;
    } else if (marker && !in_model && !model_after_result_.empty() &&
               context == Role::kToolResult &&
               text.compare(at, model_after_result_.size(), model_after_result_) == 0) {
      opener = &model_after_result_;
    }
    if (opener != nullptr) {
      // An assistant header: the role of the turn before it (a model turn cut short is `model`
      // up to here, and its header then reads as context of the turn before that).
      header_role = context;
      header_end = at + opener->size();
      roles[i] = header_role;
      in_model = true;
      in_call = false;
      continue;
    }
    if (marker) {
      const Header* found = nullptr;
      for (const Header& h : headers_) {
        if (text.compare(at, h.text.size(), h.text) == 0) {
          found = &h;
          break;
        }
      }
      if (found != nullptr) {
        context = found->role;
        header_role = found->role;
        header_end = at + found->text.size();
        roles[i] = header_role;
        in_model = false;
        in_call = false;
        continue;
      }
    }
    if (!in_model) {
      roles[i] = context;
      continue;
    }
    // The end-of-turn token by its text: a vocabulary may hold the same text under two ids.
    if (tok.IsSpecial(tokens[i]) && text.compare(at, offsets[i + 1] - at, end_of_turn_) == 0) {
      roles[i] = Role::kModel;
      in_model = false;
      in_call = false;
      continue;
    }
    // A call starts in this token if its opening text begins anywhere inside it.
    while (next_call < call_starts.size() && call_starts[next_call] < at) ++next_call;
    if (next_call < call_starts.size() && call_starts[next_call] < offsets[i + 1]) in_call = true;
    roles[i] = in_call ? Role::kToolCall : Role::kModel;
  }
  return roles;
}

}  // namespace strider::tokenizer
