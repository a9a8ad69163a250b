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
// That is the built-in byte format, for the built-in models. A model whose config names a
// tokenizer and a chat template (docs/tokenizers.md) has a Format of its own instead
// (common/tokenizer/chat_format.h): the same calls render the turns through its template and
// tokenizer, and ReadRoles reads its streams.
//
// No LibTorch here: environment and replay code may render and read transcripts too.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

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

// A turn of a conversation as a chat template sees it.
struct Message {
  Role role = Role::kUser;  // kSystem, kUser, kModel or kToolResult
  std::string content;
  // A model turn's tool call in the environment's terms (envs/tools.h): NAME(ARGUMENTS). Empty
  // name: no call.
  std::string tool_name;
  std::string tool_arguments;
  // The turn begins a tool call that could not be read: `content` is the whole turn.
  bool malformed_call = false;
};

// A tool the conversation declares, as the environment describes it (envs::ToolSpec).
struct Tool {
  std::string name;
  std::string arguments;  // JSON: a flat object of name -> type, or a JSON schema
  std::string description;
};

// A model's own conversation format: a chat template and the tokenizer it was trained with.
// Immutable once made, so transcripts share it across threads.
class Format {
 public:
  virtual ~Format() = default;

  // The conversation's text as the template renders it, with the header of the next model turn
  // when `generation_prompt`; `tools` as the template's tool list.
  virtual Result<std::string> Render(std::span<const Message> messages, std::span<const Tool> tools,
                                     bool generation_prompt) const = 0;
  // Rendered text to ids as the reference libraries tokenise a rendered prompt (special tokens
  // written in it become their ids), and ids back to their exact bytes.
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  virtual std::string DecodeBytes(std::span<const int32_t> ids) const = 0;
  // A model turn's bytes (as decoded, without its end-of-turn marker) as a message: its text
  // (made valid UTF-8) and its tool call, read in the format's syntax.
  virtual Message ReadModelTurn(std::string_view turn_text) const = 0;
  // The same text with its tool call in the environment's syntax (envs/tools.h), for the
  // environment: NAME(ARGUMENTS) between the call markers; a call that could not be read has no
  // closing marker, so the environment answers it as malformed. Text without a call comes back
  // unchanged.
  std::string ToEnvironmentText(std::string_view turn_text) const;
  // The special token that ends a model turn, and its text.
  virtual int32_t end_of_turn() const = 0;
  virtual const std::string& end_of_turn_text() const = 0;
  // One past the largest id the tokenizer produces: the model's vocabulary must cover it.
  virtual int32_t vocabulary_size() const = 0;
  // The ids a model turn stops at (end_of_turn and the end-of-text tokens).
  virtual std::vector<int32_t> stop_tokens() const = 0;
  // What opens a tool call in a model turn ("<tool_call>" for Qwen): a sampled token is
  // `tool_call` from the one this text ends in.
  virtual const std::string& tool_call_start() const = 0;
  // The roles of a token stream in this format (transcript::ReadRoles for the byte format).
  virtual std::vector<Role> ReadRoles(std::span<const int32_t> tokens) const = 0;
};

// An episode's tokens, appended turn by turn in the order an actor writes them. Run() records
// what was added since the last Take(); the position in the turn structure (inside a model
// turn, inside a tool call) survives Take(), so a caller that streams runs elsewhere (the actor
// to its segmenter) keeps only the tokens of the current step. Not thread-safe; copyable (a
// group's members continue from their shared prompt's copy).
class Transcript {
 public:
  // The built-in byte format.
  Transcript() = default;
  // `format`'s turns; null is the byte format.
  explicit Transcript(std::shared_ptr<const Format> format) : format_(std::move(format)) {}

  // Begin-of-text and the system turn: the environment's description and its tool list on the
  // next line (either may be empty). A model format renders `tools` through its template
  // instead of `tool_list`, and the description as the system message (none when it is empty
  // and there are no tools).
  void AddSystem(std::string_view description, std::string_view tool_list,
                 std::span<const Tool> tools = {});

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

  // The format's first failure to render (a template error, or a template whose renderings of
  // one conversation do not extend each other); a model format only. Tokens of a failed call
  // are not added, so a caller must check this before using them.
  const Status& status() const { return status_; }
  // The conversation so far (a model format only), as the template rendered it.
  const std::vector<Message>& messages() const { return messages_; }
  const std::shared_ptr<const Format>& format() const { return format_; }

 private:
  void Append(Role role, int32_t token);
  void AppendText(Role role, std::string_view text);
  void CloseModelTurn(Role role);
  // A model format: the messages rendered again, and what they add to the text so far appended
  // as context with `role` (after a model turn: what follows that turn's end).
  void AppendRendering(Role role, bool generation_prompt);
  void Fail(Status status);

  std::vector<Run> runs_;
  Role last_role_ = Role::kSystem;  // the role of the last token written
  bool model_turn_open_ = false;
  bool in_tool_call_ = false;

  // A model format's state.
  std::shared_ptr<const Format> format_;
  std::vector<Message> messages_;
  std::vector<Tool> tools_;
  std::string rendered_;          // the text of the last rendering
  bool after_model_turn_ = false; // a model turn came after `rendered_`
  std::string turn_bytes_;        // the current model turn's bytes so far
  bool turn_sampled_ = false;     // ... came token by token: its message is read from them
  Status status_;
};

// The roles of a token stream in the byte format, read from the tokens alone: the same as the
// roles recorded when it was rendered, except where a model turn cut short was closed (that
// end-of-turn reads as `model`). For streams rendered elsewhere, learners and evaluation.
std::vector<Role> ReadRoles(std::span<const int32_t> tokens);
// The same for any format: `format`'s reading, the byte format's when it is null.
std::vector<Role> ReadRoles(const Format* format, std::span<const int32_t> tokens);

}  // namespace strider::transcript
