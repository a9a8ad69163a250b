// Transcripts in a model's own format (common/tokenizer/chat_format.h): an episode written turn
// by turn as an actor writes it (sampled tokens one at a time, observations, tool calls and
// results) is the template's rendering of the same conversation, tokenised as the whole
// rendering is, and every token has the role it should, recorded and read back.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/tokenizer/chat_format.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "common/transcript.h"
#include "envs/episode.h"
#include "envs/tools.h"
#include "learner/pretrain/data/generators.h"
#include "tests/file_contents.h"

namespace strider::tokenizer {
namespace {

using strider::testing::ReadFileBytes;
using Json = nlohmann::ordered_json;
using transcript::Role;
using transcript::Transcript;

std::string DataPath(const std::string& name) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return std::string(source ? source : ".") + "/tests/tokenizer/data/" + name;
}

ChatTemplate LoadTemplate(const std::string& name) {
  const Json cases = Json::parse(ReadFileBytes(DataPath("chat/cases.json")));
  const Json& entry = cases["templates"][name];
  Result<ChatTemplate> chat =
      ChatTemplate::FromSource(ReadFileBytes(DataPath("chat/" + entry["file"].get<std::string>())),
                               entry["special_tokens"], name);
  EXPECT_TRUE(chat.ok()) << chat.status().ToString();
  return std::move(chat).value();
}

// The committed byte-level BPE with the template's markers as special tokens, and Qwen's
// <tool_call> tags as added tokens, as Qwen's tokenizer has them.
std::shared_ptr<const Tokenizer> TokenizerWith(const std::vector<std::string>& special) {
  Json spec = Json::parse(ReadFileBytes(DataPath("bpe_gpt2.json")));
  int32_t next = static_cast<int32_t>(spec["model"]["vocab"].size());
  std::vector<std::string> tokens = special;
  tokens.push_back("<tool_call>");
  tokens.push_back("</tool_call>");
  for (const std::string& text : tokens) {
    bool present = false;
    for (const Json& token : spec["added_tokens"]) present = present || token["content"] == text;
    if (present) continue;
    spec["added_tokens"].push_back(
        {{"id", next++},
         {"content", text},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false},
         {"special", !text.starts_with("<tool") && !text.starts_with("</tool")}});
  }
  Result<std::unique_ptr<Tokenizer>> tok = ParseTokenizer(spec.dump(), {}, "test tokenizer");
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return std::shared_ptr<const Tokenizer>(std::move(tok).value());
}

const transcript::Tool kCalc{"calc", R"({"expression": "string"})", "Evaluates arithmetic."};

// Samples `text` token by token into the open model turn, as the actor does.
void Sample(Transcript& t, const Tokenizer& tok, const std::string& text) {
  for (int32_t id : tok.Encode(text)) t.AddModelToken(id);
}

struct Written {
  std::vector<int32_t> tokens;
  std::vector<Role> roles;
};

void Keep(Transcript& t, Written& w) {
  for (const transcript::Run& run : t.Take()) {
    w.tokens.insert(w.tokens.end(), run.tokens.begin(), run.tokens.end());
    w.roles.insert(w.roles.end(), run.tokens.size(), run.role);
  }
}

// The episode the tests write: a system prompt with a tool, a question with CJK and emoji, a
// turn with a tool call, its result, an answer, and a verdict.
Written WriteEpisode(Transcript& t, const Tokenizer& tok, const std::string& call_turn,
                     const std::string& answer_turn) {
  Written w;
  t.AddSystem("Be brief.", "", {&kCalc, 1});
  t.AddObservation(Role::kUser, "What is 12+7? 好🙂");
  t.BeginModelTurn();
  Keep(t, w);
  Sample(t, tok, call_turn);
  Keep(t, w);
  t.AddStepResult(Role::kToolResult, "19", {}, false);
  Keep(t, w);
  Sample(t, tok, answer_turn);
  Keep(t, w);
  t.AddStepResult(Role::kUser, "Correct.", {}, false);
  Keep(t, w);
  return w;
}

// The same conversation as messages, for the template itself.
Json Conversation(const Json& call_arguments, const std::string& call_id) {
  Json call = {{"type", "function"},
               {"function", {{"name", "calc"}, {"arguments", call_arguments}}}};
  if (!call_id.empty()) call["id"] = call_id;
  Json result = {{"role", "tool"}, {"content", "19"}};
  if (!call_id.empty()) {
    result["tool_call_id"] = call_id;
    result["name"] = "calc";
  }
  return Json::array(
      {{{"role", "system"}, {"content", "Be brief."}},
       {{"role", "user"}, {"content", "What is 12+7? 好🙂"}},
       {{"role", "assistant"}, {"content", "Let me compute."}, {"tool_calls", Json::array({call})}},
       result,
       {{"role", "assistant"}, {"content", "It is 19 🙂."}},
       {{"role", "user"}, {"content", "Correct."}}});
}

Json CalcTools() {
  return Json::array({{{"type", "function"},
                       {"function",
                        {{"name", "calc"},
                         {"description", "Evaluates arithmetic."},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"expression", {{"type", "string"}}}}},
                           {"required", {"expression"}}}}}}}});
}

// Each token's recorded role is that of the segment holding its first byte; ReadRoles agrees on
// which tokens are the model's.
void ExpectRoles(const Tokenizer& tok, const transcript::Format& format, const Written& w,
                 const std::vector<std::pair<Role, std::string>>& segments) {
  std::string joined;
  for (const auto& [role, text] : segments) joined += text;
  ASSERT_EQ(tok.DecodeBytes(w.tokens), joined);
  const std::vector<Role> read = transcript::ReadRoles(&format, w.tokens);
  ASSERT_EQ(read.size(), w.tokens.size());
  size_t offset = 0, segment = 0, segment_end = segments[0].second.size();
  for (size_t i = 0; i < w.tokens.size(); ++i) {
    while (offset >= segment_end) segment_end += segments[++segment].second.size();
    const std::string piece = tok.DecodeBytes(std::span<const int32_t>(&w.tokens[i], 1));
    EXPECT_EQ(transcript::RoleName(w.roles[i]), transcript::RoleName(segments[segment].first))
        << "token " << i << " \"" << piece << "\" at byte " << offset;
    EXPECT_EQ(transcript::IsAction(read[i]), transcript::IsAction(w.roles[i]))
        << "read back: token " << i << " \"" << piece << "\" at byte " << offset;
    offset += piece.size();
  }
}

TEST(ChatTranscriptTest, QwenEpisodeIsTheTemplatesRendering) {
  const auto tok = TokenizerWith({});
  const ChatTemplate chat = LoadTemplate("qwen2_5");
  Result<std::shared_ptr<const transcript::Format>> format = MakeChatFormat(tok, chat);
  ASSERT_TRUE(format.ok()) << format.status().ToString();
  Transcript t(*format);
  const std::string call =
      "Let me compute.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": "
      "\"12+7\"}}\n</tool_call><|im_end|>";
  const Written w = WriteEpisode(t, *tok, call, "It is 19 🙂.<|im_end|>");
  ASSERT_TRUE(t.status().ok()) << t.status().ToString();

  ChatRenderOptions options;
  options.tools = CalcTools();
  options.add_generation_prompt = true;
  Result<std::string> rendered = chat.Render(Conversation({{"expression", "12+7"}}, ""), options);
  ASSERT_TRUE(rendered.ok()) << rendered.status().ToString();
  EXPECT_EQ(tok->DecodeBytes(w.tokens), *rendered);
  EXPECT_EQ(w.tokens, tok->Encode(*rendered));  // as the whole rendering is tokenised

  const size_t tools_end = rendered->find("<|im_start|>user");
  ExpectRoles(*tok, **format, w,
              {{Role::kSystem, rendered->substr(0, tools_end)},
               {Role::kUser,
                "<|im_start|>user\nWhat is 12+7? 好🙂<|im_end|>\n"
                "<|im_start|>assistant\n"},
               {Role::kModel, "Let me compute.\n"},
               {Role::kToolCall,
                "<tool_call>\n{\"name\": \"calc\", \"arguments\": "
                "{\"expression\": \"12+7\"}}\n</tool_call>"},
               {Role::kModel, "<|im_end|>"},
               {Role::kToolResult,
                "\n<|im_start|>user\n<tool_response>\n19\n</tool_response>"
                "<|im_end|>\n<|im_start|>assistant\n"},
               {Role::kModel, "It is 19 🙂.<|im_end|>"},
               {Role::kUser, "\n<|im_start|>user\nCorrect.<|im_end|>\n<|im_start|>assistant\n"}});

  // The environment sees the call in its own syntax.
  EXPECT_EQ((*format)->ToEnvironmentText(call.substr(0, call.size() - 10)),
            "Let me compute.\n<|tool_call|>calc(12+7)<|tool_call_end|>");
  EXPECT_EQ((*format)->ToEnvironmentText("It is 19."), "It is 19.");
  EXPECT_EQ((*format)->ToEnvironmentText("Hm <tool_call>\n{\"name\": \"calc\""),
            "Hm <|tool_call|><tool_call>\n{\"name\": \"calc\"");
}

TEST(ChatTranscriptTest, ScriptedTurnsRenderAsSampledOnes) {
  const auto tok = TokenizerWith({});
  Result<std::shared_ptr<const transcript::Format>> format =
      MakeChatFormat(tok, LoadTemplate("qwen2_5"));
  ASSERT_TRUE(format.ok()) << format.status().ToString();
  Transcript sampled(*format);
  const Written want = WriteEpisode(
      sampled, *tok,
      "Let me compute.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": "
      "\"12+7\"}}\n</tool_call><|im_end|>",
      "It is 19 🙂.<|im_end|>");
  // A data generator writes the environment's syntax; the template writes the model's.
  Transcript scripted(*format);
  Written got;
  scripted.AddSystem("Be brief.", "", {&kCalc, 1});
  scripted.AddObservation(Role::kUser, "What is 12+7? 好🙂");
  scripted.BeginModelTurn();
  scripted.AddModelTurn("Let me compute.<|tool_call|>calc(12+7)<|tool_call_end|>");
  scripted.AddStepResult(Role::kToolResult, "19", {}, false);
  scripted.AddModelTurn("It is 19 🙂.");
  scripted.AddStepResult(Role::kUser, "Correct.", {}, false);
  Keep(scripted, got);
  ASSERT_TRUE(scripted.status().ok()) << scripted.status().ToString();
  EXPECT_EQ(tok->DecodeBytes(got.tokens), tok->DecodeBytes(want.tokens));
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.roles, want.roles);
}

TEST(ChatTranscriptTest, KimiEpisodeIsTheTemplatesRendering) {
  const auto tok = TokenizerWith(
      {"<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
       "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
       "<|tool_call_argument_begin|>", "<|tool_call_end|>", "[BOS]", "[EOS]"});
  const ChatTemplate chat = LoadTemplate("kimi_k2");
  Result<std::shared_ptr<const transcript::Format>> format = MakeChatFormat(tok, chat);
  ASSERT_TRUE(format.ok()) << format.status().ToString();
  Transcript t(*format);
  const std::string call =
      "Let me compute.<|tool_calls_section_begin|><|tool_call_begin|>functions.calc:0"
      "<|tool_call_argument_begin|>{\"expression\": \"12+7\"}<|tool_call_end|>"
      "<|tool_calls_section_end|>";
  const Written w = WriteEpisode(t, *tok, call + "<|im_end|>", "It is 19 🙂.<|im_end|>");
  ASSERT_TRUE(t.status().ok()) << t.status().ToString();
  ChatRenderOptions options;
  options.tools = CalcTools();
  options.add_generation_prompt = true;
  Result<std::string> rendered =
      chat.Render(Conversation({{"expression", "12+7"}}, "functions.calc:0"), options);
  ASSERT_TRUE(rendered.ok()) << rendered.status().ToString();
  EXPECT_EQ(tok->DecodeBytes(w.tokens), *rendered);
  EXPECT_EQ(w.tokens, tok->Encode(*rendered));
  EXPECT_EQ((*format)->ToEnvironmentText(call),
            "Let me compute.\n<|tool_call|>calc(12+7)<|tool_call_end|>");
  // A later call's index is any number.
  const std::string later =
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.calc:12"
      "<|tool_call_argument_begin|>{\"expression\": \"1\"}<|tool_call_end|>"
      "<|tool_calls_section_end|>";
  EXPECT_EQ((*format)->ToEnvironmentText(later), "<|tool_call|>calc(1)<|tool_call_end|>");

  const size_t user = rendered->find("<|im_user|>");
  const size_t model_text = rendered->find("Let me compute.");
  const size_t call_at = rendered->find("<|tool_calls_section_begin|>", model_text);
  const size_t call_end = rendered->find("<|im_end|>", call_at);
  const size_t result_end = rendered->find("It is 19");
  const size_t answer_end = rendered->find("<|im_end|>", result_end) + 10;
  ExpectRoles(*tok, **format, w,
              {{Role::kSystem, rendered->substr(0, user)},
               {Role::kUser, rendered->substr(user, model_text - user)},
               {Role::kModel, rendered->substr(model_text, call_at - model_text)},
               {Role::kToolCall, rendered->substr(call_at, call_end - call_at)},
               {Role::kModel, "<|im_end|>"},
               {Role::kToolResult, rendered->substr(call_end + 10, result_end - call_end - 10)},
               {Role::kModel, rendered->substr(result_end, answer_end - result_end)},
               {Role::kUser, rendered->substr(answer_end)}});
}

// A model turn cut short (no end-of-turn sampled) is closed with the template's marker before
// the next observation, with the observation's role.
TEST(ChatTranscriptTest, TurnCutShortIsClosedByTheTemplatesMarker) {
  const auto tok = TokenizerWith({});
  Result<std::shared_ptr<const transcript::Format>> format =
      MakeChatFormat(tok, LoadTemplate("qwen2_5"));
  ASSERT_TRUE(format.ok()) << format.status().ToString();
  Transcript t(*format);
  t.AddSystem("", "");
  t.AddObservation(Role::kUser, "Count.");
  t.BeginModelTurn();
  Sample(t, *tok, "1 2 3");
  t.Take();
  EXPECT_TRUE(t.model_turn_open());
  t.AddStepResult(Role::kUser, "Stop.", {}, true);
  ASSERT_TRUE(t.status().ok()) << t.status().ToString();
  const std::vector<transcript::Run> runs = t.Take();
  ASSERT_FALSE(runs.empty());
  EXPECT_EQ(runs[0].role, Role::kUser);
  EXPECT_EQ(runs[0].tokens[0], (*format)->end_of_turn());
  std::vector<int32_t> tokens;
  for (const auto& run : runs) tokens.insert(tokens.end(), run.tokens.begin(), run.tokens.end());
  EXPECT_EQ(tok->DecodeBytes(tokens), "<|im_end|>\n<|im_start|>user\nStop.<|im_end|>\n");
}

TEST(ChatTranscriptTest, LoadsWhatAModelConfigNames) {
  TokenizerConfig config;
  config.file = DataPath("bpe_gpt2.json");
  config.chat_template = DataPath("chat/qwen2_5.jinja");
  Result<std::shared_ptr<const transcript::Format>> format = LoadChatFormat(config);
  ASSERT_TRUE(format.ok()) << format.status().ToString();
  EXPECT_EQ((*format)->end_of_turn_text(), "<|im_end|>");
  // Here <tool_call> is no token of its own: a call opens with the whole of its opening text.
  EXPECT_EQ((*format)->tool_call_start(), "<tool_call>\n{\"name\": \"");
  config.chat_template.clear();  // no tokenizer_config.json beside the file
  EXPECT_FALSE(LoadChatFormat(config).ok());
  config.chat_template = DataPath("chat/qwen2_5.jinja");
  config.format = "sentencepiece";
  EXPECT_FALSE(LoadChatFormat(config).ok());
  EXPECT_FALSE(ModelFormat(TokenizerConfig{}).value());  // the byte format
}

// The scripted policy, keeping the turns it wrote.
class Recording final : public envs::ScriptedPolicy {
 public:
  explicit Recording(std::unique_ptr<envs::ScriptedPolicy> inner) : inner_(std::move(inner)) {}
  Result<std::string> NextTurn(const std::vector<envs::Observation>& observations) override {
    Result<std::string> turn = inner_->NextTurn(observations);
    if (turn.ok()) turns.push_back(*turn);
    return turn;
  }
  std::vector<std::string> turns;

 private:
  std::unique_ptr<envs::ScriptedPolicy> inner_;
};

// The tool_use data generator writes its calculator transcripts in the model's format: each
// document is the template's rendering of the episode, replayed here from its seed.
TEST(ChatTranscriptTest, ToolUseDocumentsAreTheTemplatesRendering) {
  TokenizerConfig config;
  config.file = DataPath("bpe_gpt2.json");
  config.chat_template = DataPath("chat/qwen2_5.jinja");
  Result<std::shared_ptr<const transcript::Format>> format = LoadChatFormat(config);
  ASSERT_TRUE(format.ok()) << format.status().ToString();
  const ChatTemplate chat = ChatTemplate::Load(config.chat_template).value();
  data::GeneratorOptions options;
  options.format = *format;
  options.flawed_fraction = 0;
  options.environment.name = "calculator";
  options.environment.options = {{"difficulty", "1"}};
  for (int64_t index = 0; index < 3; ++index) {
    const data::GeneratedDocument document =
        data::Generate(data::GeneratorKind::kToolUse, options, 7, index);
    auto env = envs::MakeEnvironment(options.environment).value();
    Recording policy(envs::MakeScriptedPolicy(options.environment).value());
    const envs::EnvironmentSpec spec = env->Describe();
    std::vector<envs::StepResult> steps;
    const envs::EpisodeReport report =
        envs::PlayEpisode(*env, policy, document.episode_seed, spec.max_turns, {},
                          [&](const envs::StepResult& step) { steps.push_back(step); });
    ASSERT_FALSE(report.error) << report.end;
    Json messages = Json::array({{{"role", "system"}, {"content", spec.description}},
                                 {{"role", "user"}, {"content", report.observations[0].text}}});
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::string& turn = policy.turns[i];
      Json message = {{"role", "assistant"}, {"content", turn}};
      Result<std::optional<envs::ToolCall>> call = envs::ParseToolCall(turn);
      ASSERT_TRUE(call.ok()) << call.status().ToString();
      if (call->has_value()) {
        message["content"] = turn.substr(0, turn.find(envs::kToolCallOpen));
        message["tool_calls"] = Json::array(
            {{{"type", "function"},
              {"function",
               {{"name", (*call)->name}, {"arguments", {{"expression", (*call)->arguments}}}}}}});
      }
      messages.push_back(message);
      const bool tool = steps[i].observation.role == envs::ObservationRole::kToolResult;
      if (!steps[i].observation.text.empty() || !steps[i].done) {
        messages.push_back(
            {{"role", tool ? "tool" : "user"}, {"content", steps[i].observation.text}});
      }
    }
    ChatRenderOptions render;
    render.tools = CalcTools();
    render.tools[0]["function"]["description"] = spec.tools[0].description;
    Result<std::string> rendered = chat.Render(messages, render);
    ASSERT_TRUE(rendered.ok()) << rendered.status().ToString();
    const std::string text = (*format)->DecodeBytes(document.tokens);
    EXPECT_EQ(text, *rendered);
    EXPECT_NE(text.find("<tool_call>"), std::string::npos);
    // The model's turns, read back, are the assistant messages' text and calls.
    const std::vector<Role> roles = (*format)->ReadRoles(document.tokens);
    std::string actions;
    for (size_t i = 0; i < roles.size(); ++i) {
      if (transcript::IsAction(roles[i])) {
        actions += (*format)->DecodeBytes(std::span<const int32_t>(&document.tokens[i], 1));
      }
    }
    EXPECT_NE(actions.find("<tool_call>\n{\"name\": \"calc\""), std::string::npos) << actions;
    EXPECT_EQ(actions.find("<|im_start|>"), std::string::npos) << actions;
  }
}

}  // namespace
}  // namespace strider::tokenizer
