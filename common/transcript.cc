#include "common/transcript.h"

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
  Append(role, token::kEndOfTurn);
  model_turn_open_ = false;
  in_tool_call_ = false;
}

void Transcript::AddSystem(std::string_view description, std::string_view tool_list) {
  Append(Role::kSystem, token::kBeginOfText);
  Append(Role::kSystem, token::kSystem);
  AppendText(Role::kSystem, description);
  if (!description.empty() && !tool_list.empty()) AppendText(Role::kSystem, "\n");
  AppendText(Role::kSystem, tool_list);
  Append(Role::kSystem, token::kEndOfTurn);
}

void Transcript::AddObservation(Role role, std::string_view text,
                                std::span<const int64_t> image_patches) {
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
  Append(last_role_, token::kModel);
  model_turn_open_ = true;
  in_tool_call_ = false;
}

Role Transcript::AddModelToken(int32_t token) {
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
