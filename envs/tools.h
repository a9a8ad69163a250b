// Tool calls in a model turn, and the tool list shown to the model.
//
// The actor decodes the model's turn with Tokenizer::Decode, which renders the tool-call special
// tokens as "<|tool_call|>" and "<|tool_call_end|>" (ids 262 and 263). Byte text can never produce
// those ids (Encode only yields bytes), so a marker found in decoded text always came from a
// special token the model sampled, never from a user or tool string. Parsing works on that text:
//
//   Let me compute it.<|tool_call|>calc(12*7+3)<|tool_call_end|>
//
// A call is NAME(ARGUMENTS): NAME is [A-Za-z_][A-Za-z0-9_]*, ARGUMENTS the raw text between the
// first "(" and the last ")" (each tool parses its own). One call per turn.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/transcript.h"
#include "envs/environment.h"

namespace strider::envs {

inline constexpr std::string_view kToolCallOpen = "<|tool_call|>";
inline constexpr std::string_view kToolCallClose = "<|tool_call_end|>";
// Longest call text (name and arguments) the parser accepts; longer is malformed.
inline constexpr size_t kMaxToolCallBytes = 64 * 1024;

// The call in a decoded turn: nullopt when the turn has no "<|tool_call|>" marker, an
// InvalidArgument status naming the problem when the call is malformed (no closing marker, two
// calls, a bad name, missing parentheses, too long).
Result<std::optional<ToolCall>> ParseToolCall(std::string_view turn_text);

// An Action from a decoded turn: `tool_call` set for a valid call, `tool_call_error` for a
// malformed one. Never fails: a malformed call is for the environment to answer.
Action MakeAction(std::string turn_text);

// "<|tool_call|>name(arguments)<|tool_call_end|>", as scripted policies write calls.
std::string FormatToolCall(std::string_view name, std::string_view arguments);

// The tool list for the prompt, one tool per line:
//   Tools (call one as <|tool_call|>name(arguments)<|tool_call_end|>):
//   - calc(expression: string): evaluates an arithmetic expression
// Empty when there are no tools. `arguments` schemas render as "key: type, ..." when they are a
// flat JSON object of strings, else verbatim.
std::string RenderToolList(const std::vector<ToolSpec>& tools);

// The transcript role of an observation's turn (common/transcript.h renders the conversation).
transcript::Role TranscriptRole(ObservationRole role);

// The tool_result text for a call the environment cannot run: "error: <why>". Environments use
// it for malformed calls, unknown tools and bad arguments so the model sees the same shape.
std::string ToolErrorText(std::string_view why);

// Ends an episode whose last allowed turn gave no answer: done, outcome 0, info reason
// "turn limit". Built-in environments call it so every one ends the same way.
void EndAtTurnLimit(StepResult* result);

}  // namespace strider::envs
