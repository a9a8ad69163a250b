// An actor whose model config names a real tokenizer and chat template stores trajectories
// whose text is the template's own rendering of the conversation: the environment's system
// prompt and tools, its first observation, and every model turn and environment answer,
// replayed here from the episode's seed and rendered by ChatTemplate. Everything but the model's
// own tokens is the tokenizer's encoding of that text, and only the model's own tokens are
// actions, as the format reads them back. The verifier replays the stored trajectories in the
// same format (reward/verifiers.h). Two models: the Strider-native tiny model with the committed
// byte-level BPE and Qwen 2.5's template (tests/tokenizer/data/tiny_chat_model.yaml), and a tiny
// Kimi Linear checkpoint in the Hugging Face layout with a Kimi tiktoken.model, its split
// pattern and Kimi K2's template, imported by `strider model import`.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/tokenizer/chat_format.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "envs/environment.h"
#include "envs/tools.h"
#include "replay/inspect.h"
#include "reward/verifiers.h"
#include "tests/file_contents.h"
#include "tests/integration/child_process.h"
#include "tests/model/kimi_checkpoint.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using Json = nlohmann::ordered_json;
using strider::testing::ChildProcess;
using strider::testing::ReadFileBytes;
using strider::testing::RunCommand;
using strider::testing::RunResult;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;
using strider::testing::WaitEvent;
using strider::testing::WriteFileBytes;

struct Trajectory {
  std::vector<int32_t> tokens;
  std::vector<schema::Role> roles;
  std::map<std::string, std::string> metadata;
};

std::vector<Trajectory> ReadTrajectories(const std::string& db) {
  std::vector<Trajectory> out;
  auto inspector = replay::Inspector::Open(db);
  EXPECT_TRUE(inspector.ok()) << inspector.status().ToString();
  if (!inspector.ok()) return out;
  auto summaries = (*inspector)->List({});
  EXPECT_TRUE(summaries.ok());
  for (const schema::TrajectorySummary& summary : *summaries) {
    EXPECT_TRUE(summary.complete) << summary.trajectory_id.Hex();
    auto segments = (*inspector)->Trajectory(summary.trajectory_id);
    EXPECT_TRUE(segments.ok());
    Trajectory t;
    for (const auto& stored : *segments) {
      const schema::SegmentData& s = stored.segment;
      EXPECT_EQ(s.token_begin, t.tokens.size());
      t.tokens.insert(t.tokens.end(), s.tokens.begin(), s.tokens.end());
      t.roles.insert(t.roles.end(), s.roles.begin(), s.roles.end());
      for (const auto& [k, v] : s.metadata) t.metadata[k] = v;
    }
    out.push_back(std::move(t));
  }
  return out;
}

// The environment's tools as the template's tool list (docs/tokenizers.md: a flat
// {"name": "type"} becomes an object schema with every argument required).
Json ToolsOf(const envs::EnvironmentSpec& spec) {
  Json tools = Json::array();
  for (const envs::ToolSpec& tool : spec.tools) {
    Json properties = Json::object();
    Json required = Json::array();
    const Json arguments = Json::parse(tool.arguments);
    for (const auto& [name, type] : arguments.items()) {
      properties[name] = {{"type", type}};
      required.push_back(name);
    }
    tools.push_back(
        {{"type", "function"},
         {"function",
          {{"name", tool.name},
           {"description", tool.description},
           {"parameters",
            {{"type", "object"}, {"properties", properties}, {"required", required}}}}}});
  }
  return tools;
}

// The model an actor runs and what the test needs to read its trajectories independently of
// the actor's own format: the tokenizer as the reference library builds it, and the text the
// template writes after a turn's end-of-turn marker.
struct ChatModel {
  std::string config;   // model YAML
  std::string weights;  // safetensors; empty: random initialisation
  tokenizer::TokenizerOptions tokenizer;
  std::string after_turn;  // "\n" in Qwen's template, nothing in Kimi's
};

// Runs `strider actor` on the calculator with `model` against a real replay server and checks
// every stored trajectory against the template's rendering of its conversation.
void ExpectTrajectoriesAreTheTemplatesRendering(const ChatModel& model) {
  Result<ModelConfig> config_file = LoadModelConfig(model.config);
  ASSERT_TRUE(config_file.ok()) << config_file.status().ToString();
  Result<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::LoadTokenizer(config_file->tokenizer.file, model.tokenizer);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  Result<tokenizer::ChatTemplate> chat =
      tokenizer::ChatTemplate::Load(config_file->tokenizer.chat_template);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  Result<std::shared_ptr<const transcript::Format>> format =
      tokenizer::LoadChatFormat(config_file->tokenizer);
  ASSERT_TRUE(format.ok()) << format.status().ToString();

  TempDir dir;
  ChildProcess server;
  ASSERT_TRUE(server.Start({StriderBinary(), "replay", "serve", "--db", dir.Sub("db"), "--bind",
                            "tcp://127.0.0.1:0", "--sample-bind", "tcp://127.0.0.1:0"}));
  nlohmann::json ready = WaitEvent(server, "ready", 30000);
  ASSERT_TRUE(ready.is_object()) << "no ready line from the replay server";
  const std::string config = dir.Sub("actor.yaml");
  {
    std::ofstream out(config);
    out << "actor:\n"
        << "  model: " << model.config << "\n";
    if (!model.weights.empty()) out << "  weights: " << model.weights << "\n";
    out << "  model_seed: 0\n  threads: 2\n  episodes: 4\n  episodes_in_flight: 4\n"
        << "  group_size: 2\n  max_turns: 3\n  max_episode_tokens: 4096\n  seed: 5\n"
        << "  segment_tokens: 128\n  sampling: {temperature: 1.0, max_new_tokens: 24}\n"
        << "  engine: {cache_budget_mb: 64}\n"
        << "  replay: {endpoint: tcp://127.0.0.1:1, spill_after_ms: 1000}\n"
        << "  metrics: {interval_s: 0.5, progress: false}\n"
        << "env:\n  name: calculator\n  options: {difficulty: 1}\n";
  }
  ChildProcess actor;
  ASSERT_TRUE(
      actor.Start({StriderBinary(), "actor", "--config", config, "--replay",
                   ready["actor_endpoint"].get<std::string>(), "--spill-dir", dir.Sub("spill")}));
  nlohmann::json finished = WaitEvent(actor, "finished", 120000);
  ASSERT_EQ(actor.Wait(), 0);
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(finished["metrics"]["episodes"], 4);

  const std::vector<Trajectory> trajectories = ReadTrajectories(dir.Sub("db"));
  ASSERT_EQ(trajectories.size(), 4u);
  const int32_t end_of_turn = (*format)->end_of_turn();
  const std::string end_of_turn_text = (*tok)->Decode(std::vector<int32_t>{end_of_turn});
  for (const Trajectory& t : trajectories) {
    EXPECT_EQ(t.metadata.at("status"), "max_turns") << "a random model never answers";
    // Every id of the model's vocabulary may be sampled, the byte format's image-patch id too.
    EXPECT_EQ(t.metadata.at("sampling.banned"), "");
    envs::EnvironmentConfig env_config;
    env_config.name = "calculator";
    env_config.options = {{"difficulty", "1"}};
    Result<std::unique_ptr<envs::Environment>> env = envs::MakeEnvironment(env_config);
    ASSERT_TRUE(env.ok()) << env.status().ToString();
    const envs::EnvironmentSpec spec = (*env)->Describe();
    Result<envs::Observation> first = (*env)->Reset(std::stoull(t.metadata.at("seed")), {});
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    Json messages = Json::array({{{"role", "system"}, {"content", spec.description}},
                                 {{"role", "user"}, {"content", first->text}}});
    // The model's turns are the stored action runs; the environment answers each as it did.
    bool last_closed = false;
    for (size_t at = 0; at < t.tokens.size();) {
      if (!schema::IsAction(t.roles[at])) {
        ++at;
        continue;
      }
      std::vector<int32_t> turn;
      while (at < t.tokens.size() && schema::IsAction(t.roles[at])) turn.push_back(t.tokens[at++]);
      last_closed = turn.back() == end_of_turn;
      if (last_closed) turn.pop_back();
      const std::string text = (*tok)->Decode(turn);
      messages.push_back({{"role", "assistant"}, {"content", text}});
      Result<envs::StepResult> step =
          (*env)->Step(envs::MakeAction((*format)->ToEnvironmentText(text)));
      ASSERT_TRUE(step.ok()) << step.status().ToString();
      if (at == t.tokens.size()) break;  // the last turn: the episode ended at max_turns
      const bool tool = step->observation.role == envs::ObservationRole::kToolResult;
      messages.push_back({{"role", tool ? "tool" : "user"}, {"content", step->observation.text}});
    }
    tokenizer::ChatRenderOptions options;
    options.tools = ToolsOf(spec);
    Result<std::string> rendered = chat->Render(messages, options);
    ASSERT_TRUE(rendered.ok()) << rendered.status().ToString();
    // The trajectory stops after the model's last token; the template closes that turn.
    const std::string stored =
        (*tok)->Decode(t.tokens) + (last_closed ? "" : end_of_turn_text) + model.after_turn;
    EXPECT_EQ(stored, *rendered);
    // Between the model's turns, the ids are the tokenizer's own for the template's text (the
    // model's turns are what it sampled, not necessarily the shortest encoding of their text).
    std::vector<int32_t> expected;
    for (size_t at = 0; at < t.tokens.size();) {
      const bool action = schema::IsAction(t.roles[at]);
      size_t end = at;
      while (end < t.tokens.size() && schema::IsAction(t.roles[end]) == action) ++end;
      const std::span<const int32_t> run(t.tokens.data() + at, end - at);
      if (action) {
        expected.insert(expected.end(), run.begin(), run.end());
      } else {
        const std::vector<int32_t> encoded = (*tok)->Encode((*tok)->DecodeBytes(run));
        expected.insert(expected.end(), encoded.begin(), encoded.end());
      }
      at = end;
    }
    EXPECT_EQ(t.tokens, expected);
    // Only the model's own tokens are actions, as the format reads the stream back.
    const std::vector<transcript::Role> read = transcript::ReadRoles(format->get(), t.tokens);
    ASSERT_EQ(read.size(), t.roles.size());
    for (size_t i = 0; i < read.size(); ++i) {
      // As in every format, the marker that closes a turn cut short reads as the model's.
      if (t.tokens[i] == end_of_turn && i > 0 && schema::IsAction(t.roles[i - 1])) continue;
      EXPECT_EQ(transcript::IsAction(read[i]), schema::IsAction(t.roles[i])) << "token " << i;
    }
  }
  // The verifier reads them in the model's format: every turn replays against the environment
  // and gets its verdict. Read as the byte format, they are not the episodes stored.
  Result<std::vector<reward::StoreRescore>> rescored =
      reward::RescoreStore(dir.Sub("db"), {}, {}, *format);
  ASSERT_TRUE(rescored.ok()) << rescored.status().ToString();
  ASSERT_EQ(rescored->size(), 4u);
  for (const reward::StoreRescore& entry : *rescored) {
    ASSERT_TRUE(entry.status.ok()) << entry.status.ToString();
    EXPECT_EQ(entry.rescored.env, "calculator");
    EXPECT_EQ(entry.rescored.steps.size(), 3u) << "max_turns";
    for (const reward::StepVerdict& verdict : entry.rescored.steps) {
      EXPECT_TRUE(verdict.error.empty()) << verdict.error;
    }
  }
  Result<std::vector<reward::StoreRescore>> as_bytes = reward::RescoreStore(dir.Sub("db"), {});
  ASSERT_TRUE(as_bytes.ok()) << as_bytes.status().ToString();
  for (const reward::StoreRescore& entry : *as_bytes) {
    EXPECT_EQ(entry.status.code(), StatusCode::kFailedPrecondition) << entry.status.ToString();
  }
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0);
}

TEST(ActorChatFormat, TrajectoriesAreTheTemplatesRenderingOfTheConversation) {
  ExpectTrajectoriesAreTheTemplatesRendering(
      {SourceDir() + "/tests/tokenizer/data/tiny_chat_model.yaml", "", {}, "\n"});
}

// Kimi K2's special tokens that its template and tokenizer_config.json name, numbered after the
// ranks as Kimi's follow its 163,584; reserved tokens fill the rest of the vocabulary, as Kimi's
// do up to 163,840.
const char* const kKimiSpecialTokens[] = {"[BOS]",
                                          "[EOS]",
                                          "<|im_end|>",
                                          "<|im_user|>",
                                          "<|im_assistant|>",
                                          "<|im_system|>",
                                          "<|im_middle|>",
                                          "<|tool_calls_section_begin|>",
                                          "<|tool_calls_section_end|>",
                                          "<|tool_call_begin|>",
                                          "<|tool_call_argument_begin|>",
                                          "<|tool_call_end|>",
                                          "<|media_start|>",
                                          "<|media_content|>",
                                          "<|media_end|>",
                                          "<|media_pad|>"};

// A tiny Kimi Linear checkpoint as published (config.json, bf16 shards, tiktoken.model,
// tokenization_kimi.py with the split pattern, tokenizer_config.json with Kimi K2's template and
// added tokens), imported by the binary as a user does, then run by an actor: the import names
// the tokenizer and template, and the actor renders in them, not in the byte format.
TEST(ActorChatFormat, ImportedKimiCheckpointRendersInItsTokenizerAndTemplate) {
  TempDir dir;
  const std::string data = SourceDir() + "/tests/tokenizer/data";
  const std::string ranks = ReadFileBytes(data + "/ranks.tiktoken");
  const int32_t first_special = static_cast<int32_t>(std::count(ranks.begin(), ranks.end(), '\n'));
  const std::string pattern =
      Json::parse(ReadFileBytes(data + "/ranks_meta.json")).at("kimi_pattern").get<std::string>();

  const std::string source = dir.Sub("kimi_tiny");
  Json hf_config = Json::parse(testing::kTinyKimiConfig);
  hf_config["vocab_size"] = 4096;  // the ranks, then special and reserved tokens
  hf_config["bos_token_id"] = first_special;
  hf_config["eos_token_id"] = first_special + 2;  // <|im_end|>, as in Kimi's instruct models
  const Status written = testing::WriteKimiCheckpoint(source, hf_config.dump(2));
  ASSERT_TRUE(written.ok()) << written.ToString();
  WriteFileBytes(source + "/tiktoken.model", ranks);
  WriteFileBytes(source + "/tokenization_kimi.py", testing::KimiTokenizationPy(pattern));
  tokenizer::TokenizerOptions reference;
  reference.format = tokenizer::TokenizerFormat::kTiktoken;
  reference.tiktoken_pattern = pattern;
  Json added = Json::object();
  int32_t id = first_special;
  std::vector<std::string> special(std::begin(kKimiSpecialTokens), std::end(kKimiSpecialTokens));
  const int32_t vocabulary = hf_config["vocab_size"].get<int32_t>();
  while (first_special + static_cast<int32_t>(special.size()) < vocabulary) {
    special.push_back("<|reserved_token_" + std::to_string(first_special + special.size()) + "|>");
  }
  for (const std::string& text : special) {
    added[std::to_string(id)] = {{"content", text}, {"lstrip", false},      {"normalized", false},
                                 {"rstrip", false}, {"single_word", false}, {"special", true}};
    reference.tiktoken_special_tokens.emplace_back(text, id++);
  }
  const Json tokenizer_config = {{"added_tokens_decoder", added},
                                 {"bos_token", "[BOS]"},
                                 {"eos_token", "[EOS]"},
                                 {"chat_template", ReadFileBytes(data + "/chat/kimi_k2.jinja")},
                                 {"tokenizer_class", "TikTokenTokenizer"}};
  WriteFileBytes(source + "/tokenizer_config.json", tokenizer_config.dump(2));

  const std::string out = dir.Sub("imported");
  const RunResult run =
      RunCommand({StriderBinary(), "model", "import", "--from-hf", source, "--out", out});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Json imported = Json::parse(run.output);
  EXPECT_EQ(imported["tokenizer"], "hf/tiktoken.model");
  const std::string model_yaml = imported["config"].get<std::string>();
  EXPECT_EQ(std::filesystem::path(model_yaml), std::filesystem::path(out + "/model.yaml"));
  // As written (relative to the model's directory), then as loaded.
  const YAML::Node written_tokenizer = YAML::LoadFile(model_yaml)["model"]["tokenizer"];
  ASSERT_TRUE(written_tokenizer.IsMap()) << ReadFileBytes(model_yaml);
  EXPECT_EQ(written_tokenizer["file"].as<std::string>(), "hf/tiktoken.model");
  EXPECT_EQ(written_tokenizer["chat_template"].as<std::string>(), "hf/tokenizer_config.json");
  Result<ModelConfig> model = LoadModelConfig(model_yaml);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(model->tokenizer.format, "tiktoken");
  EXPECT_EQ(model->tokenizer.pattern, pattern);

  ExpectTrajectoriesAreTheTemplatesRendering(
      {model_yaml, imported["weights"].get<std::string>(), reference, ""});
}

}  // namespace
}  // namespace strider
