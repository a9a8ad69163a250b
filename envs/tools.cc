#include "envs/tools.h"

#include <nlohmann/json.hpp>

namespace strider::envs {
namespace {

bool IsNameStart(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

std::string_view Trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  return text;
}

// Shows a bad call to the model in an error message without flooding the context.
std::string Excerpt(std::string_view text) {
  constexpr size_t kMax = 60;
  if (text.size() <= kMax) return std::string(text);
  return std::string(text.substr(0, kMax)) + "...";
}

}  // namespace

Result<std::optional<ToolCall>> ParseToolCall(std::string_view turn_text) {
  const size_t open = turn_text.find(kToolCallOpen);
  if (open == std::string_view::npos) {
    if (turn_text.find(kToolCallClose) != std::string_view::npos) {
      return Status::InvalidArgument("tool call: <|tool_call_end|> without <|tool_call|>");
    }
    return std::optional<ToolCall>();
  }
  const size_t body_start = open + kToolCallOpen.size();
  const size_t close = turn_text.find(kToolCallClose, body_start);
  if (close == std::string_view::npos) {
    return Status::InvalidArgument("tool call: <|tool_call|> is never closed by <|tool_call_end|>");
  }
  std::string_view body = turn_text.substr(body_start, close - body_start);
  if (body.find(kToolCallOpen) != std::string_view::npos) {
    return Status::InvalidArgument("tool call: a second <|tool_call|> before <|tool_call_end|>");
  }
  if (turn_text.find(kToolCallOpen, close) != std::string_view::npos) {
    return Status::InvalidArgument("tool call: more than one call in a turn (one call per turn)");
  }
  if (body.size() > kMaxToolCallBytes) {
    return Status::InvalidArgument("tool call: longer than " + std::to_string(kMaxToolCallBytes) +
                                   " bytes");
  }
  body = Trim(body);
  size_t name_end = 0;
  while (name_end < body.size() && IsNameChar(body[name_end])) ++name_end;
  if (name_end == 0 || !IsNameStart(body[0])) {
    return Status::InvalidArgument("tool call: expected a tool name ([A-Za-z_][A-Za-z0-9_]*) at '" +
                                   Excerpt(body) + "'");
  }
  std::string_view rest = Trim(body.substr(name_end));
  if (rest.empty() || rest.front() != '(') {
    return Status::InvalidArgument("tool call: expected '(' after the tool name '" +
                                   std::string(body.substr(0, name_end)) + "'");
  }
  if (rest.back() != ')') {
    return Status::InvalidArgument("tool call: the arguments of '" +
                                   std::string(body.substr(0, name_end)) + "' do not end with ')'");
  }
  ToolCall call;
  call.name = std::string(body.substr(0, name_end));
  call.arguments = std::string(rest.substr(1, rest.size() - 2));
  return std::optional<ToolCall>(std::move(call));
}

Action MakeAction(std::string turn_text) {
  Action action;
  Result<std::optional<ToolCall>> call = ParseToolCall(turn_text);
  if (!call.ok()) {
    action.tool_call_error = call.status().message();
  } else if (call->has_value()) {
    action.tool_call = std::move(**call);
  }
  action.text = std::move(turn_text);
  return action;
}

std::string FormatToolCall(std::string_view name, std::string_view arguments) {
  std::string out(kToolCallOpen);
  out += name;
  out += '(';
  out += arguments;
  out += ')';
  out += kToolCallClose;
  return out;
}

std::string RenderToolList(const std::vector<ToolSpec>& tools) {
  if (tools.empty()) return "";
  std::string out = "Tools (call one as <|tool_call|>name(arguments)<|tool_call_end|>):\n";
  for (const ToolSpec& tool : tools) {
    std::string arguments = tool.arguments;
    const nlohmann::ordered_json schema =
        nlohmann::ordered_json::parse(tool.arguments, nullptr, false);
    if (schema.is_object()) {
      std::string flat;
      bool all_strings = true;
      for (const auto& [key, value] : schema.items()) {
        if (!value.is_string()) {
          all_strings = false;
          break;
        }
        if (!flat.empty()) flat += ", ";
        flat += key + ": " + value.get<std::string>();
      }
      if (all_strings) arguments = flat;
    }
    out += "- " + tool.name + "(" + arguments + "): " + tool.description + "\n";
  }
  return out;
}

transcript::Role TranscriptRole(ObservationRole role) {
  switch (role) {
    case ObservationRole::kSystem:
      return transcript::Role::kSystem;
    case ObservationRole::kUser:
      return transcript::Role::kUser;
    case ObservationRole::kToolResult:
      return transcript::Role::kToolResult;
  }
  return transcript::Role::kUser;
}

std::string ToolErrorText(std::string_view why) { return "error: " + std::string(why); }

std::string_view StepLabelName(StepLabel label) {
  switch (label) {
    case StepLabel::kCorrect:
      return "correct";
    case StepLabel::kIncorrect:
      return "incorrect";
    case StepLabel::kUnknown:
      break;
  }
  return "unknown";
}

std::string_view ObservationRoleName(ObservationRole role) {
  switch (role) {
    case ObservationRole::kSystem:
      return "system";
    case ObservationRole::kToolResult:
      return "tool_result";
    case ObservationRole::kUser:
      break;
  }
  return "user";
}

void EndAtTurnLimit(StepResult* result) {
  result->done = true;
  result->outcome_reward = 0.0;
  result->info["reason"] = "turn limit";
}

}  // namespace strider::envs
