// The environment API: what an actor plays episodes against
// (docs/design.md#processes-and-data-flow, #trajectories-and-segments).
//
// An episode is Reset, then Step once per model turn until `done`:
//
//   Reset(seed, options) ──> first observation (system/user text, images) + the tools it offers
//   Step(action)         ──> next observation (a tool result, a user turn), step reward + label, done
//
// The actor owns the token stream. It tokenizes each observation once and appends it; it never
// re-renders the conversation. An action is the text of the model's turn exactly as decoded from
// the tokens the model produced, plus the tool call parsed from it (ParseToolCall in tools.h).
// Tool syntax in the token stream (the same as the pretraining transcripts):
//
//   <|model|>Let me compute it.<|tool_call|>calc(12*7+3)<|tool_call_end|><|end_of_turn|>
//   <|tool_result|>87<|end_of_turn|>
//
// Built-in environments run their tools inside Step (a tool's answer is the observation);
// tools that run code or touch files do so in a child process with limits (sandbox.h).
//
// Contracts:
//   - Errors are values. A Step error ends that episode (the actor records it); it never takes
//     the actor or other episodes down.
//   - An Environment object plays one episode at a time and is used by one thread at a time;
//     an actor creates one object per concurrent episode through the registry.
//   - Reset with the same seed and options gives the same episode (problems, documents, images).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strider::envs {

// Bumped when the layout of anything a shared-library plug-in exchanges changes (plugin.h).
inline constexpr uint32_t kEnvironmentApiVersion = 1;

struct ToolSpec {
  std::string name;         // what the model writes: name(arguments)
  std::string arguments;    // a JSON schema of the arguments, e.g. {"expression": "string"}
  std::string description;  // one line for the prompt
};

// An image in row-major HWC bytes (uint8), as the model's vision input takes it.
struct Image {
  int32_t width = 0;
  int32_t height = 0;
  int32_t channels = 3;
  std::string pixels;  // width * height * channels bytes
};

enum class ObservationRole { kSystem, kUser, kToolResult };

// Text appended to the conversation as one turn with `role`; images go before the text, each
// as image-start, patch placeholders, image-end.
struct Observation {
  ObservationRole role = ObservationRole::kUser;
  std::string text;
  std::vector<Image> images;
};

struct ToolCall {
  std::string name;
  std::string arguments;  // the raw text between the parentheses
};

// The model's turn.
struct Action {
  std::string text;                    // the whole turn, tool call included, decoded from tokens
  std::optional<ToolCall> tool_call;   // parsed; unset when the turn has no (valid) call
  std::string tool_call_error;         // why a call-shaped turn did not parse; empty otherwise
};

enum class StepLabel { kUnknown, kCorrect, kIncorrect };

struct StepResult {
  Observation observation;            // appended unless `done` and its text is empty
  std::optional<double> reward;       // step reward (process reward), when the env knows one
  StepLabel label = StepLabel::kUnknown;
  bool done = false;
  std::optional<double> outcome_reward;  // set on the last step
  std::map<std::string, std::string> info;
};

struct EnvironmentSpec {
  std::string name;
  std::string description;
  std::vector<ToolSpec> tools;
  int32_t max_turns = 16;  // the actor ends an episode that runs past this
  // The option keys Reset and the config accept (ReadEnvironmentConfig reads exactly these).
  std::vector<std::string> options;
};

// Options from the config (`env: {name: calculator, options: {...}}`), as strings; each
// environment parses and validates its own keys and rejects unknown ones.
using Options = std::map<std::string, std::string>;

class Environment {
 public:
  virtual ~Environment() = default;
  virtual EnvironmentSpec Describe() const = 0;
  // Starts an episode; the first observation is usually a system turn listing the tools and
  // a user turn with the task (return them as one observation with role kUser: the actor
  // renders the tool list itself from Describe()).
  // `episode_options` override the config's options for this episode (for example difficulty).
  virtual Result<Observation> Reset(uint64_t seed, const Options& episode_options) = 0;
  virtual Result<StepResult> Step(const Action& action) = 0;
  // Releases external resources (a child process, a socket). Called once; safe to skip.
  virtual void Close() {}
};

// A scripted policy that solves the environment, for tests and `strider env run`: given the
// observations so far, the text of the next model turn (tool call included).
class ScriptedPolicy {
 public:
  virtual ~ScriptedPolicy() = default;
  virtual Result<std::string> NextTurn(const std::vector<Observation>& observations) = 0;
};

// How a config names an environment (`env:` in actor and env-run configs).
struct EnvironmentConfig {
  std::string name;      // a registered environment, or the name a plug-in reports
  Options options;
  std::string library;   // path of a shared-library plug-in (plugin path 1); empty otherwise
  std::string command;   // command line of an out-of-process environment (plugin path 2)
  int64_t step_timeout_ms = 10000;  // out-of-process replies slower than this end the episode
};

// Implemented by the registry (registry.cc): built-ins by name, plug-ins by library or command.
// Errors name what was wrong: unknown name (listing the known ones), a library of another API
// version, a process that does not answer `describe`.
Result<std::unique_ptr<Environment>> MakeEnvironment(const EnvironmentConfig& config);
Result<std::unique_ptr<ScriptedPolicy>> MakeScriptedPolicy(const EnvironmentConfig& config);
std::vector<std::string> RegisteredEnvironments();

// Labels and roles as lower-case words ("correct", "tool_result"), for logs, JSON and plug-ins.
std::string_view StepLabelName(StepLabel label);
std::string_view ObservationRoleName(ObservationRole role);

}  // namespace strider::envs
