#include "common/transcript.h"

#include <algorithm>
#include <string>

#include "common/tokenizer.h"

namespace strider::transcript {
namespace {

// The special token that opens a role's text: a turn's marker, the tool-call marker, or
// image-start. Role names are these tokens' names.
int32_t OpeningToken(Role role) {
  switch (role) {
    case Role::kSystem:
      return token::kSystem;
    case Role::kUser:
      return token::kUser;
    case Role::kModel:
      return token::kModel;
    case Role::kToolCall:
      return token::kToolCall;
    case Role::kToolResult:
      return token::kToolResult;
    case Role::kImage:
      return token::kImageStart;
  }
  return -1;
}

}  // namespace

std::string_view RoleName(Role role) {
  if (role == Role::kImage) return "image";  // not "image_start": the run is the whole image
  const std::string_view name = Tokenizer::SpecialName(OpeningToken(role));
  return name.empty() ? "unknown" : name;
}

void Transcript::Append(Role role, int32_t token) {
  if (runs_.empty() || runs_.back().role != role || role == Role::kImage) {
    runs_.push_back({role, {}});
  }
  runs_.back().tokens.push_back(token);
  last_role_ = role;
}

void Transcript::AppendText(Role role, std::string_view text) {
  for (int32_t t : Tokenizer::Encode(text)) Append(role, t);
}

void Transcript::CloseModelTurn(Role role) {
  if (!model_turn_open_) return;
  Append(role, format_ ? format_->end_of_turn() : token::kEndOfTurn);
  model_turn_open_ = false;
  in_tool_call_ = false;
}

void Transcript::Fail(Status status) {
  if (status_.ok()) status_ = std::move(status);
}

// Templates render the whole conversation, so each step renders it again and appends what is
// new. Context extends the last rendering; after a model turn the turn's own tokens stay as
// sampled, and what follows its end-of-turn marker comes from a rendering where the turn's text
// is a placeholder (templates may render the last model turn differently from earlier ones).
void Transcript::AppendRendering(Role role, bool generation_prompt) {
  if (!status_.ok()) return;
  size_t last = messages_.size();  // one past the last model turn
  while (last > 0 && messages_[last - 1].role != Role::kModel) --last;
  if (turn_sampled_ && last > 0) {
    messages_[last - 1] = format_->ReadModelTurn(turn_bytes_);
    turn_sampled_ = false;
  }
  const std::span<const Message> messages(messages_);
  std::string added;
  if (after_model_turn_) {
    static constexpr std::string_view kPlaceholder = "[[the model turn]]";
    std::vector<Message> marked = messages_;
    if (last > 0) marked[last - 1].content = std::string(kPlaceholder);
    Result<std::string> with = format_->Render(marked, tools_, generation_prompt);
    if (!with.ok()) return Fail(with.status());
    const std::string& end = format_->end_of_turn_text();
    const size_t at = with->find(kPlaceholder);
    const size_t closed = at == std::string::npos ? at : with->find(end, at + kPlaceholder.size());
    if (closed != std::string::npos) {
      added = with->substr(closed + end.size());
    } else {
      // A template that writes no text for a turn with a tool call (Llama 3's): what follows the
      // last end-of-turn of the conversation rendered up to the model turn.
      Result<std::string> before = format_->Render(messages.first(last), tools_, false);
      Result<std::string> after = format_->Render(messages, tools_, generation_prompt);
      if (!before.ok()) return Fail(before.status());
      if (!after.ok()) return Fail(after.status());
      const size_t last_end = before->rfind(end);
      if (last_end == std::string::npos || !after->starts_with(*before)) {
        return Fail(Status::FailedPrecondition(
            "the chat template's rendering of a conversation does not continue after the model's "
            "turn"));
      }
      added = before->substr(last_end + end.size()) + after->substr(before->size());
    }
    Result<std::string> real = format_->Render(messages, tools_, generation_prompt);
    if (!real.ok()) return Fail(real.status());
    rendered_ = std::move(*real);
    after_model_turn_ = false;
  } else {
    Result<std::string> now = format_->Render(messages, tools_, generation_prompt);
    if (!now.ok()) return Fail(now.status());
    if (!now->starts_with(rendered_)) {
      return Fail(Status::FailedPrecondition(
          "the chat template's rendering of a conversation does not extend its rendering before "
          "the last turn"));
    }
    added = now->substr(rendered_.size());
    rendered_ = std::move(*now);
  }
  for (int32_t t : format_->Encode(added)) Append(role, t);
}

void Transcript::AddSystem(std::string_view description, std::string_view tool_list,
                           std::span<const Tool> tools) {
  if (format_) {
    tools_.assign(tools.begin(), tools.end());
    std::string content(description);
    if (tools.empty() && !tool_list.empty()) {
      if (!content.empty()) content += "\n";
      content += tool_list;
    }
    if (!content.empty()) messages_.push_back({Role::kSystem, std::move(content)});
    // A template may write a default system prompt, or nothing, for an empty conversation; the
    // first turn's rendering says which.
    if (!messages_.empty()) AppendRendering(Role::kSystem, false);
    return;
  }
  Append(Role::kSystem, token::kBeginOfText);
  Append(Role::kSystem, token::kSystem);
  AppendText(Role::kSystem, description);
  if (!description.empty() && !tool_list.empty()) AppendText(Role::kSystem, "\n");
  AppendText(Role::kSystem, tool_list);
  Append(Role::kSystem, token::kEndOfTurn);
}

void Transcript::AddObservation(Role role, std::string_view text,
                                std::span<const int64_t> image_patches) {
  if (format_) {
    if (!image_patches.empty()) {
      return Fail(Status::Unimplemented("images in a chat template's transcript"));
    }
    CloseModelTurn(role);
    messages_.push_back({role, std::string(text)});
    AppendRendering(role, false);
    return;
  }
  CloseModelTurn(role);
  Append(role, OpeningToken(role));
  for (int64_t patches : image_patches) {
    // Each image its own run, even two in a row: Append starts a new image run every time,
    // so the placeholders go in by hand.
    Append(Role::kImage, token::kImageStart);
    runs_.back().tokens.insert(runs_.back().tokens.end(), patches, token::kImagePatch);
    runs_.back().tokens.push_back(token::kImageEnd);
  }
  AppendText(role, text);
  Append(role, token::kEndOfTurn);
}

void Transcript::AddStepResult(Role role, std::string_view text,
                               std::span<const int64_t> image_patches, bool done) {
  // A final observation with nothing in it (a verdict the environment keeps to itself) is not
  // a turn; anything else is, and so is an empty one the model must answer.
  if (!text.empty() || !image_patches.empty() || !done) {
    AddObservation(role, text, image_patches);
  } else {
    CloseModelTurn(role);
  }
  if (!done) BeginModelTurn();
}

void Transcript::BeginModelTurn() {
  if (format_) {
    AppendRendering(last_role_, true);
    messages_.push_back({Role::kModel, ""});
    after_model_turn_ = true;
    turn_sampled_ = false;
    turn_bytes_.clear();
    model_turn_open_ = true;
    in_tool_call_ = false;
    return;
  }
  Append(last_role_, token::kModel);
  model_turn_open_ = true;
  in_tool_call_ = false;
}

Role Transcript::AddModelToken(int32_t token) {
  if (format_) {
    const std::vector<int32_t> stops = format_->stop_tokens();
    const bool stop = std::find(stops.begin(), stops.end(), token) != stops.end();
    if (!stop) {
      // A call is `tool_call` from the token that completes its opening text.
      const std::string& start = format_->tool_call_start();
      const size_t from = turn_bytes_.size() >= start.size() ? turn_bytes_.size() - start.size() + 1
                                                             : 0;
      turn_bytes_ += format_->DecodeBytes(std::span<const int32_t>(&token, 1));
      if (!start.empty() && turn_bytes_.find(start, from) != std::string::npos) {
        in_tool_call_ = true;
      }
      turn_sampled_ = true;
    }
    const Role role = in_tool_call_ && !stop ? Role::kToolCall : Role::kModel;
    Append(role, token);
    if (token == format_->end_of_turn()) {
      model_turn_open_ = false;
      in_tool_call_ = false;
    }
    return role;
  }
  if (token == token::kToolCall) in_tool_call_ = true;
  const Role role = in_tool_call_ ? Role::kToolCall : Role::kModel;
  if (token == token::kToolCallEnd) in_tool_call_ = false;
  Append(role, token);
  if (token == token::kEndOfTurn) {
    model_turn_open_ = false;
    in_tool_call_ = false;
  }
  return role;
}

void Transcript::AddModelTurn(std::string_view text) {
  if (format_) {
    // The turn in the template's own syntax: its rendering, from the model turn's header
    // through the end-of-turn marker, as if the model had sampled it.
    if (!status_.ok()) return;
    Message turn{Role::kModel, std::string(text)};
    const std::string open = "<|" + std::string(Tokenizer::SpecialName(token::kToolCall)) + "|>";
    const std::string close =
        "<|" + std::string(Tokenizer::SpecialName(token::kToolCallEnd)) + "|>";
    const size_t call = text.find(open);
    if (call != std::string_view::npos) {
      const std::string_view rest = text.substr(call + open.size());
      const size_t name_end = rest.find('(');
      const size_t args_end = rest.rfind(')');
      if (name_end != std::string_view::npos && args_end != std::string_view::npos &&
          args_end > name_end && rest.substr(args_end + 1) == close) {
        turn.content = std::string(text.substr(0, call));
        turn.tool_name = std::string(rest.substr(0, name_end));
        turn.tool_arguments = std::string(rest.substr(name_end + 1, args_end - name_end - 1));
      }
    }
    if (!messages_.empty() && messages_.back().role == Role::kModel) messages_.pop_back();
    messages_.push_back(turn);
    Result<std::string> now = format_->Render(messages_, tools_, false);
    if (!now.ok()) return Fail(now.status());
    const std::string& end = format_->end_of_turn_text();
    const size_t closed = now->starts_with(rendered_) ? now->find(end, rendered_.size())
                                                      : std::string::npos;
    if (closed == std::string::npos) {
      return Fail(Status::FailedPrecondition(
          "the chat template's rendering of a model turn does not extend the conversation"));
    }
    const std::string sampled = now->substr(rendered_.size(), closed + end.size() -
                                                                rendered_.size());
    turn_bytes_.clear();
    for (int32_t t : format_->Encode(sampled)) AddModelToken(t);
    messages_.back() = std::move(turn);  // as written, not as read back from its text
    turn_sampled_ = false;
    return;
  }
  // Decode writes the call markers as "<|tool_call|>" and "<|tool_call_end|>"; nothing else in
  // a decoded turn comes from a special token the model could use there.
  const std::string open = "<|" + std::string(Tokenizer::SpecialName(token::kToolCall)) + "|>";
  const std::string close =
      "<|" + std::string(Tokenizer::SpecialName(token::kToolCallEnd)) + "|>";
  size_t at = 0;
  while (at < text.size()) {
    if (text.compare(at, open.size(), open) == 0) {
      AddModelToken(token::kToolCall);
      at += open.size();
    } else if (text.compare(at, close.size(), close) == 0) {
      AddModelToken(token::kToolCallEnd);
      at += close.size();
    } else {
      AddModelToken(static_cast<unsigned char>(text[at]));
      ++at;
    }
  }
  AddModelToken(token::kEndOfTurn);
}

void Transcript::End() {
  if (format_) {
    // The rest of the template's rendering; a template's conversation has no end-of-text.
    CloseModelTurn(Role::kSystem);
    if (after_model_turn_) AppendRendering(Role::kSystem, false);
    return;
  }
  CloseModelTurn(Role::kSystem);
  Append(Role::kSystem, token::kEndOfText);
}

std::vector<Run> Transcript::Take() {
  std::vector<Run> taken = std::move(runs_);
  runs_.clear();
  return taken;
}

std::vector<int32_t> Transcript::Tokens() const {
  std::vector<int32_t> tokens;
  for (const Run& run : runs_) tokens.insert(tokens.end(), run.tokens.begin(), run.tokens.end());
  return tokens;
}

std::vector<Role> Transcript::Roles() const {
  std::vector<Role> roles;
  for (const Run& run : runs_) roles.insert(roles.end(), run.tokens.size(), run.role);
  return roles;
}

std::string Format::ToEnvironmentText(std::string_view turn_text) const {
  const Message turn = ReadModelTurn(turn_text);
  const std::string open = "<|" + std::string(Tokenizer::SpecialName(token::kToolCall)) + "|>";
  const std::string close = "<|" + std::string(Tokenizer::SpecialName(token::kToolCallEnd)) + "|>";
  if (turn.malformed_call) {
    const size_t start = turn_text.find(tool_call_start());
    return std::string(turn_text.substr(0, start)) + open + std::string(turn_text.substr(start));
  }
  if (turn.tool_name.empty()) return std::string(turn_text);
  std::string text = turn.content;
  if (!text.empty()) text += "\n";
  return text + open + turn.tool_name + "(" + turn.tool_arguments + ")" + close;
}

std::vector<Role> ReadRoles(const Format* format, std::span<const int32_t> tokens) {
  return format ? format->ReadRoles(tokens) : ReadRoles(tokens);
}

std::vector<Role> ReadRoles(std::span<const int32_t> tokens) {
  std::vector<Role> roles;
  roles.reserve(tokens.size());
  Role turn = Role::kSystem;  // the role of the turn being read
  Role last = Role::kSystem;  // the role of the token before
  bool model_turn = false;
  bool in_tool_call = false;
  bool in_image = false;
  for (int32_t t : tokens) {
    Role role = turn;
    if (model_turn) {
      // Everything in a model turn was sampled, up to and including its end-of-turn.
      if (t == token::kToolCall) in_tool_call = true;
      role = in_tool_call ? Role::kToolCall : Role::kModel;
      if (t == token::kToolCallEnd) in_tool_call = false;
      if (t == token::kEndOfTurn) model_turn = false;
    } else if (t == token::kModel) {
      role = last;
      turn = Role::kModel;
      model_turn = true;
      in_tool_call = false;
    } else if (t == token::kSystem || t == token::kUser || t == token::kToolResult) {
      turn = t == token::kSystem ? Role::kSystem
             : t == token::kUser ? Role::kUser
                                 : Role::kToolResult;
      role = turn;
    } else if (t == token::kImageStart || in_image) {
      role = Role::kImage;
      in_image = t != token::kImageEnd;
    } else if (t == token::kEndOfText || t == token::kBeginOfText) {
      role = Role::kSystem;
    }
    roles.push_back(role);
    last = role;
  }
  return roles;
}

}  // namespace strider::transcript
