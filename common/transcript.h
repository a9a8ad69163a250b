// The transcript format: how an episode becomes tokens, and which role each token has. The
// actor renders what the model sees through it, the data generators render environment
// episodes through it, and learners and evaluation read trajectories back with it, so a model
// pretrained on generated transcripts sees exactly the stream an actor will show it.
//
//   <|begin_of_text|><|system|>DESCRIPTION\nTOOL LIST<|end_of_turn|>
//   <|user|>[IMAGE RUNS]TASK<|end_of_turn|>
//   <|model|>Add.<|tool_call|>calc(12+7)<|tool_call_end|><|end_of_turn|>
//   <|tool_result|>19<|end_of_turn|>
//   <|model|>Answer: 19<|end_of_turn|>
//   [<|end_of_text|>]                        a generated document ends here; a trajectory does not
//
// An image run is <|image_start|>, one <|image_patch|> per patch, <|image_end|>. Roles:
// everything the model sampled is `model`, except a tool call (its opening marker through its
// closing marker), which is `tool_call`. Everything written around it is context with the role
// of the turn it belongs to: begin- and end-of-text are `system`, a turn's marker and closing
// marker have the turn's role, the header of a model turn has the role of the turn before it,
// and a model turn cut short (no end-of-turn sampled) is closed by the next observation, with
// the observation's role.
//
// Tool calls are text in the environment API (envs/tools.h: "<|tool_call|>name(args)..."):
// Tokenizer::Decode writes the two call markers that way, and AddModelTurn turns them back into
// their special tokens, so decoding a model turn and rendering it again gives the same tokens.
// The tool list's text is the environment's (envs::RenderToolList); this file places it.
//
// No LibTorch here: environment and replay code may render and read transcripts too.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace strider::transcript {

// Token roles. The values are those the replay schema stores per token (schema::Role).
enum class Role : uint8_t { kSystem = 0, kUser, kModel, kToolCall, kToolResult, kImage };

// "system", "user", "model", "tool_call", "tool_result", "image".
std::string_view RoleName(Role role);
// Tokens the model sampled: the policy's actions. The others are context.
inline bool IsAction(Role role) { return role == Role::kModel || role == Role::kToolCall; }

// A run of tokens with one role. Each image is a run of its own, so a caller can attach the
// picture to it; other consecutive tokens of one role share a run.
struct Run {
  Role role = Role::kUser;
  std::vector<int32_t> tokens;
};

// An episode's tokens, appended turn by turn in the order an actor writes them. Run() records
// what was added since the last Take(); the position in the turn structure (inside a model
// turn, inside a tool call) survives Take(), so a caller that streams runs elsewhere (the actor
// to its segmenter) keeps only the tokens of the current step. Not thread-safe; copyable (a
// group's members continue from their shared prompt's copy).
class Transcript {
 public:
  // Begin-of-text and the system turn: the environment's description and its tool list on the
  // next line (either may be empty).
  void AddSystem(std::string_view description, std::string_view tool_list);

  // An observation as one turn with `role` (system, user or tool_result): its marker, one
  // image run per entry of `image_patches` (the patch count of each image, in order), its text,
  // end-of-turn. A model turn still open is closed first, with `role`.
  void AddObservation(Role role, std::string_view text,
                      std::span<const int64_t> image_patches = {});

  // What follows a model turn (an environment step's result): the observation, unless the
  // episode is `done` and the observation is empty (then only an open model turn is closed),
  // and, unless done, the header of the next model turn.
  void AddStepResult(Role role, std::string_view text, std::span<const int64_t> image_patches,
                     bool done);

  // The header of a model turn (<|model|>), with the role of the turn before it.
  void BeginModelTurn();

  // One token the model sampled in the current turn; returns its role. End-of-turn closes the
  // turn (a sampled end-of-text does not: the next observation closes it).
  Role AddModelToken(int32_t token);

  // A whole model turn from its text as decoded (tool-call markers become their tokens), then
  // end-of-turn, as if the model had sampled them. BeginModelTurn must come first.
  void AddModelTurn(std::string_view text);

  // End-of-text after the last turn (closing a model turn still open). Generated documents end
  // this way; an actor's trajectory stops after its last observation.
  void End();

  // Runs added since the last Take(), and taking them.
  const std::vector<Run>& runs() const { return runs_; }
  std::vector<Run> Take();

  // The tokens of runs(), and one role per token.
  std::vector<int32_t> Tokens() const;
  std::vector<Role> Roles() const;

  bool model_turn_open() const { return model_turn_open_; }

 private:
  void Append(Role role, int32_t token);
  void AppendText(Role role, std::string_view text);
  void CloseModelTurn(Role role);

  std::vector<Run> runs_;
  Role last_role_ = Role::kSystem;  // the role of the last token written
  bool model_turn_open_ = false;
  bool in_tool_call_ = false;
};

// The roles of a token stream in this format, read from the tokens alone: the same as the
// roles recorded when it was rendered, except where a model turn cut short was closed (that
// end-of-turn reads as `model`). For streams rendered elsewhere, learners and evaluation.
std::vector<Role> ReadRoles(std::span<const int32_t> tokens);

}  // namespace strider::transcript
