// The transcript format, written out: these strings are the stream the actor has always sent
// the engine and stored (system turn, observation turns, model turns with their tool calls),
// so stored trajectories keep their meaning and generated documents match what actors show.
#include "common/transcript.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/tokenizer.h"

namespace strider::transcript {
namespace {

// "role:text" per run, runs joined by " | ".
std::string Describe(const std::vector<Run>& runs) {
  std::string out;
  for (const Run& run : runs) {
    if (!out.empty()) out += " | ";
    out += std::string(RoleName(run.role)) + ":" + Tokenizer::Decode(run.tokens);
  }
  return out;
}

// Plain text sampled token by token, without an end-of-turn (a turn cut at max_new_tokens).
void Sample(Transcript& transcript, std::string_view text) {
  for (int32_t t : Tokenizer::Encode(text)) transcript.AddModelToken(t);
}

TEST(RoleName, RolesAreNamedAsTheStoredRolesAre) {
  EXPECT_EQ(RoleName(Role::kSystem), "system");
  EXPECT_EQ(RoleName(Role::kUser), "user");
  EXPECT_EQ(RoleName(Role::kModel), "model");
  EXPECT_EQ(RoleName(Role::kToolCall), "tool_call");
  EXPECT_EQ(RoleName(Role::kToolResult), "tool_result");
  EXPECT_EQ(RoleName(Role::kImage), "image");
  EXPECT_EQ(RoleName(static_cast<Role>(6)), "unknown");
}

TEST(Transcript, RendersAnEpisodeAsTheActorStreamsIt) {
  Transcript t;
  t.AddSystem("Solve it.", "Tools:\n- calc(expression: string): adds\n");
  t.AddObservation(Role::kUser, "What is 12+7?");
  t.BeginModelTurn();
  EXPECT_EQ(Describe(t.runs()),
            "system:<|begin_of_text|><|system|>Solve it.\nTools:\n- calc(expression: string): "
            "adds\n<|end_of_turn|> | user:<|user|>What is 12+7?<|end_of_turn|><|model|>");
  t.Take();
  t.AddModelTurn("Add.<|tool_call|>calc(12+7)<|tool_call_end|>");
  EXPECT_EQ(Describe(t.Take()),
            "model:Add. | tool_call:<|tool_call|>calc(12+7)<|tool_call_end|> | "
            "model:<|end_of_turn|>");
  t.AddStepResult(Role::kToolResult, "19", {}, false);
  EXPECT_EQ(Describe(t.Take()), "tool_result:<|tool_result|>19<|end_of_turn|><|model|>");
  t.AddModelTurn("Answer: 19");
  t.AddStepResult(Role::kToolResult, "", {}, true);
  EXPECT_EQ(Describe(t.Take()), "model:Answer: 19<|end_of_turn|>");
  EXPECT_FALSE(t.model_turn_open());
}

TEST(Transcript, SystemTurnWithoutToolsOrDescription) {
  Transcript only_description;
  only_description.AddSystem("Count them.", "");
  EXPECT_EQ(Tokenizer::Decode(only_description.Tokens()),
            "<|begin_of_text|><|system|>Count them.<|end_of_turn|>");
  Transcript only_tools;
  only_tools.AddSystem("", "Tools:\n");
  EXPECT_EQ(Tokenizer::Decode(only_tools.Tokens()),
            "<|begin_of_text|><|system|>Tools:\n<|end_of_turn|>");
}

TEST(Transcript, ATurnCutShortIsClosedWithTheObservationsRole) {
  Transcript t;
  t.BeginModelTurn();
  Sample(t, "I am still thin");
  EXPECT_TRUE(t.model_turn_open());
  t.Take();
  t.AddStepResult(Role::kUser, "Answer, please.", {}, false);
  EXPECT_EQ(Describe(t.Take()),
            "user:<|end_of_turn|><|user|>Answer, please.<|end_of_turn|><|model|>");
  // A sampled end-of-text ends the model's output but not its turn.
  EXPECT_EQ(t.AddModelToken(token::kEndOfText), Role::kModel);
  EXPECT_TRUE(t.model_turn_open());
  t.AddStepResult(Role::kToolResult, "", {}, true);
  EXPECT_EQ(Describe(t.Take()), "model:<|end_of_text|> | tool_result:<|end_of_turn|>");
}

TEST(Transcript, AnEmptyObservationStillMakesATurnWhenTheEpisodeGoesOn) {
  Transcript t;
  t.BeginModelTurn();
  t.AddModelTurn("hm");
  t.Take();
  t.AddStepResult(Role::kUser, "", {}, false);
  EXPECT_EQ(Describe(t.Take()), "user:<|user|><|end_of_turn|><|model|>");
}

TEST(Transcript, EachImageIsARunOfItsOwnBeforeTheText) {
  Transcript t;
  const std::vector<int64_t> patches = {2, 1};
  t.AddObservation(Role::kUser, "How many?", patches);
  EXPECT_EQ(Describe(t.runs()),
            "user:<|user|> | image:<|image_start|><|image_patch|><|image_patch|><|image_end|> | "
            "image:<|image_start|><|image_patch|><|image_end|> | user:How many?<|end_of_turn|>");
}

TEST(Transcript, ToolCallTokensHaveTheirRoleFromMarkerToMarker) {
  Transcript t;
  t.BeginModelTurn();
  t.Take();
  EXPECT_EQ(t.AddModelToken('x'), Role::kModel);
  EXPECT_EQ(t.AddModelToken(token::kToolCall), Role::kToolCall);
  EXPECT_EQ(t.AddModelToken('f'), Role::kToolCall);
  EXPECT_EQ(t.AddModelToken(token::kToolCallEnd), Role::kToolCall);
  EXPECT_EQ(t.AddModelToken('y'), Role::kModel);
  // An unclosed call ends with its turn: the next turn starts outside a call.
  EXPECT_EQ(t.AddModelToken(token::kToolCall), Role::kToolCall);
  EXPECT_EQ(t.AddModelToken(token::kEndOfTurn), Role::kToolCall);
  t.AddStepResult(Role::kToolResult, "error: no closing marker", {}, false);
  EXPECT_EQ(t.AddModelToken('z'), Role::kModel);
}

TEST(Transcript, ADecodedModelTurnRendersBackToItsTokens) {
  const std::vector<int32_t> sampled = {'o', 'k', token::kToolCall, 'c', '(', '1', ')',
                                        token::kToolCallEnd, '.'};
  Transcript t;
  t.BeginModelTurn();
  t.Take();
  t.AddModelTurn(Tokenizer::Decode(sampled));
  std::vector<int32_t> expected = sampled;
  expected.push_back(token::kEndOfTurn);
  EXPECT_EQ(t.Tokens(), expected);
}

TEST(Transcript, GeneratedDocumentsEndWithEndOfText) {
  Transcript t;
  t.AddSystem("d", "");
  t.AddObservation(Role::kUser, "q");
  t.BeginModelTurn();
  t.AddModelTurn("Answer: 1");
  t.AddStepResult(Role::kToolResult, "", {}, true);
  t.End();
  const std::vector<int32_t> tokens = t.Tokens();
  EXPECT_EQ(tokens.front(), token::kBeginOfText);
  EXPECT_EQ(tokens.back(), token::kEndOfText);
  EXPECT_EQ(t.Roles().back(), Role::kSystem);
}

TEST(ReadRoles, AgreesWithTheRolesRecordedWhileRendering) {
  Transcript t;
  t.AddSystem("Solve it.", "Tools:\n");
  const std::vector<int64_t> patches = {3};
  t.AddObservation(Role::kUser, "Look.", patches);
  t.BeginModelTurn();
  t.AddModelTurn("Add.<|tool_call|>calc(1+2)<|tool_call_end|>");
  t.AddStepResult(Role::kToolResult, "3", {}, false);
  t.AddModelTurn("Answer: 3");
  t.AddStepResult(Role::kUser, "Right.", {}, true);
  t.End();
  const std::vector<int32_t> tokens = t.Tokens();
  const std::vector<Role> roles = t.Roles();
  ASSERT_EQ(tokens.size(), roles.size());
  EXPECT_EQ(ReadRoles(tokens), roles);
}

TEST(ReadRoles, AClosingMarkerWrittenForACutTurnReadsAsTheModels) {
  Transcript t;
  t.BeginModelTurn();
  Sample(t, "cut");
  t.AddStepResult(Role::kUser, "go on", {}, false);
  std::vector<Role> recorded = t.Roles();
  const std::vector<Role> read = ReadRoles(t.Tokens());
  ASSERT_EQ(read.size(), recorded.size());
  // <|model|> c u t <|end_of_turn|>: the marker is the only difference.
  EXPECT_EQ(recorded[4], Role::kUser);
  EXPECT_EQ(read[4], Role::kModel);
  recorded[4] = Role::kModel;
  EXPECT_EQ(read, recorded);
}

}  // namespace
}  // namespace strider::transcript
