// Pretraining a model with its own tokenizer (docs/tokenizers.md, "Pretraining"): retrieval
// documents in its ids, padding masked by position, loss weights read from its bytes and roles,
// and a short run of the tiny chat model on retrieval and tool_use.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/model/config.h"
#include "common/tokenizer/chat_format.h"
#include "common/token_ids.h"
#include "learner/pretrain/data/builder.h"
#include "learner/pretrain/data/dataset.h"
#include "learner/pretrain/data/generators.h"
#include "learner/pretrain/data/shard.h"
#include "learner/pretrain/pretrain.h"
#include "learner/pretrain/pretrain_config.h"
#include "learner/pretrain/token_batch.h"
#include "tests/file_contents.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

std::string SourceDir() {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return source ? source : ".";
}

std::string TempDir(const std::string& name) {
  return strider::testing::ScratchDir("strider_pretrain_format_test_" + name);
}

const std::string& ChatModelPath() {
  static const std::string path = SourceDir() + "/tests/tokenizer/data/tiny_chat_model.yaml";
  return path;
}

const CorpusFormat& ChatCorpus() {
  static const CorpusFormat corpus = [] {
    Result<ModelConfig> model = LoadModelConfig(ChatModelPath());
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    Result<CorpusFormat> loaded = LoadCorpusFormat(*model);
    EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
    return *loaded;
  }();
  return corpus;
}

std::string Decode(const CorpusFormat& corpus, const std::vector<int32_t>& tokens, size_t begin,
                   size_t end) {
  return corpus.format->DecodeBytes(
      std::span<const int32_t>(tokens.data() + begin, end - begin));
}

// The committed BPE has no bos_token and its template no config beside it: documents start
// with their text and end with <|endoftext|> (id 0), not the template's <|im_end|>.
TEST(PretrainFormat, DocumentMarkersFollowTheTokenizer) {
  const CorpusFormat& corpus = ChatCorpus();
  ASSERT_TRUE(corpus.format);
  EXPECT_EQ(corpus.begin_of_text, -1);
  EXPECT_EQ(corpus.end_of_text, 0);
  EXPECT_EQ(corpus.format->DecodeBytes(std::vector<int32_t>{corpus.end_of_text}), "<|endoftext|>");
  EXPECT_NE(corpus.id_space, 0u);
  EXPECT_EQ(data::IdSpace(nullptr), 0u);
}

// The rule with a tokenizer config's special tokens: its bos_token begins a document, and an
// eos_token that is the template's end-of-turn marker (an instruct model's) gives way to the
// tokenizer's <|endoftext|>.
TEST(PretrainFormat, DocumentMarkersFromTheTokenizerConfig) {
  const std::string data = SourceDir() + "/tests/tokenizer/data/";
  Result<std::unique_ptr<tokenizer::Tokenizer>> loaded =
      tokenizer::LoadTokenizer(data + "bpe_gpt2.json", {});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const std::shared_ptr<const tokenizer::Tokenizer> bpe(std::move(*loaded));
  const std::string source = testing::ReadFileBytes(data + "chat/qwen2_5.jinja");
  const auto markers = [&](nlohmann::ordered_json special) {
    Result<tokenizer::ChatTemplate> chat = tokenizer::ChatTemplate::FromSource(source, special);
    EXPECT_TRUE(chat.ok()) << chat.status().ToString();
    Result<std::shared_ptr<const transcript::Format>> format =
        tokenizer::MakeChatFormat(bpe, std::move(*chat));
    EXPECT_TRUE(format.ok()) << format.status().ToString();
    Result<tokenizer::DocumentMarkers> read = tokenizer::ReadDocumentMarkers(**format);
    EXPECT_TRUE(read.ok()) << read.status().ToString();
    return std::make_pair(read->begin_of_text, read->end_of_text);
  };
  // Ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2.
  EXPECT_EQ(markers({{"eos_token", "<|im_end|>"}}), std::make_pair(-1, 0));
  EXPECT_EQ(markers({{"bos_token", "<|im_start|>"}, {"eos_token", "<|endoftext|>"}}),
            std::make_pair(1, 0));
  EXPECT_EQ(markers({{"bos_token", "not a special token"}}), std::make_pair(-1, 0));
}

// A retrieval document in the model's ids is the byte format's text: lower-case filler with
// "\nKEY=VV\n" facts, then every key asked "\n?KEY=VV"; it is the tokenizer's own encoding of
// that text, at most the requested length (and close to it), and its answer spans are the
// value digits exactly.
TEST(PretrainFormat, RetrievalDocumentInTheModelsIds) {
  const CorpusFormat& corpus = ChatCorpus();
  ASSERT_TRUE(corpus.format);
  for (const auto& [length, letters] : std::vector<std::pair<int64_t, int64_t>>{
           {96, 1}, {256, 2}, {1024, 2}}) {
    data::GeneratorOptions options;
    options.length = length;
    options.min_length = 0;
    options.facts = 4;
    options.key_letters = letters;
    options.format = corpus.format;
    options.begin_of_text = corpus.begin_of_text;
    options.end_of_text = corpus.end_of_text;
    for (int64_t index = 0; index < 6; ++index) {
      SCOPED_TRACE("length " + std::to_string(length) + " document " + std::to_string(index));
      const data::GeneratedDocument document =
          data::Generate(data::GeneratorKind::kRetrieval, options, 11, index);
      const std::vector<int32_t>& tokens = document.tokens;
      ASSERT_GE(tokens.size(), 2u);
      EXPECT_LE(static_cast<int64_t>(tokens.size()), length);
      EXPECT_GE(static_cast<int64_t>(tokens.size()), length - length / 16);
      EXPECT_EQ(tokens.back(), corpus.end_of_text);
      const std::string text = Decode(corpus, tokens, 0, tokens.size() - 1);
      // Canonical: encoding the text again gives the same ids.
      EXPECT_EQ(corpus.format->Encode(text),
                std::vector<int32_t>(tokens.begin(), tokens.end() - 1));
      // The form: facts in the filler, then the queries, each key asked with its value.
      const size_t queries = text.find("\n?");
      ASSERT_NE(queries, std::string::npos);
      std::map<std::string, std::string> facts;
      const std::string body = text.substr(0, queries);
      size_t at = 0;
      while ((at = body.find('\n', at)) != std::string::npos) {
        const size_t equals = body.find('=', at);
        const size_t close = body.find('\n', at + 1);
        ASSERT_NE(equals, std::string::npos);
        ASSERT_NE(close, std::string::npos);
        facts[body.substr(at + 1, equals - at - 1)] = body.substr(equals + 1, close - equals - 1);
        at = close + 1;
      }
      ASSERT_EQ(facts.size(), 4u) << text;
      std::string filler;
      for (size_t i = 0; i < body.size(); ++i) {
        if (body[i] == '\n') {
          i = body.find('\n', i + 1);
          continue;
        }
        filler += body[i];
      }
      for (char c : filler) EXPECT_TRUE(c == ' ' || (c >= 'a' && c <= 'z')) << filler;
      std::vector<std::string> asked_values;
      std::istringstream lines(text.substr(queries + 1));
      for (std::string line; std::getline(lines, line);) {
        ASSERT_EQ(line[0], '?') << line;
        const size_t equals = line.find('=');
        const std::string key = line.substr(1, equals - 1);
        ASSERT_EQ(static_cast<int64_t>(key.size()), letters);
        ASSERT_TRUE(facts.count(key)) << key;
        EXPECT_EQ(line.substr(equals + 1), facts[key]);
        asked_values.push_back(facts[key]);
      }
      ASSERT_EQ(asked_values.size(), 4u);
      // Answers: the tokens of exactly each value's digits, in order.
      ASSERT_EQ(document.answers.size(), 4u);
      for (size_t q = 0; q < 4; ++q) {
        const auto [begin, end] = document.answers[q];
        EXPECT_EQ(Decode(corpus, tokens, begin, end), asked_values[q]);
      }
      // Found again from the tokens alone, as packed rows are weighted.
      EXPECT_EQ(data::FindRetrievalAnswers(*corpus.format, tokens.data(),
                                           static_cast<int64_t>(tokens.size())),
                document.answers);
      // Deterministic.
      EXPECT_EQ(data::Generate(data::GeneratorKind::kRetrieval, options, 11, index).tokens,
                tokens);
    }
  }
}

// Padding is masked by position: in a real vocabulary the byte format's padding and
// begin-of-text ids are ordinary tokens and are scored where they are text.
TEST(PretrainFormat, PaddingIsMaskedByPositionNotById) {
  const std::string dir = TempDir("padding");
  data::ShardWriter writer(2, 7);
  const std::vector<int32_t> first = {40, token::kPad, token::kBeginOfText, token::kImagePatch, 0};
  const std::vector<int32_t> second = {41, 42, 43, 44, 45, 46, 0};
  ASSERT_TRUE(writer.Add(first).ok());
  ASSERT_TRUE(writer.Add(second).ok());
  ASSERT_TRUE(writer.Write(dir + "/" + data::ShardFileName(0)).ok());
  Result<std::vector<std::unique_ptr<data::Shard>>> shards = data::OpenShardDirectory(dir);
  ASSERT_TRUE(shards.ok()) << shards.status().ToString();
  EXPECT_EQ((*shards)[0]->id_space(), 7u);
  std::vector<data::DataSource> sources(1);
  sources[0].name = dir;
  sources[0].shards = std::move(*shards);
  Result<std::unique_ptr<data::Packer>> packer =
      data::Packer::Create(std::move(sources), 8, 5, /*pad=*/0);
  ASSERT_TRUE(packer.ok()) << packer.status().ToString();
  // Each document fits a row alone, never two together: every row is one document, then pad.
  std::vector<std::vector<int32_t>> rows;
  std::vector<int64_t> filled;
  for (int r = 0; r < 4; ++r) {
    rows.push_back((*packer)->Next());
    filled.push_back((*packer)->filled());
  }
  for (int r = 0; r < 4; ++r) {
    const std::vector<int32_t>& document = filled[r] == 5 ? first : second;
    ASSERT_TRUE(filled[r] == 5 || filled[r] == 7) << filled[r];
    EXPECT_EQ(std::vector<int32_t>(rows[r].begin(), rows[r].begin() + filled[r]), document);
    for (int64_t i = filled[r]; i < 8; ++i) EXPECT_EQ(rows[r][i], 0);
  }
  Result<TokenBatch> batch = MakeTokenBatch(rows, filled, /*begin_of_text=*/-1);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  at::Tensor mask = batch->loss_mask.contiguous();
  for (int r = 0; r < 4; ++r) {
    for (int64_t i = 1; i < 8; ++i) {
      EXPECT_EQ(mask[r][i - 1].item<float>(), i < filled[r] ? 1.0f : 0.0f)
          << "row " << r << " target " << i;
    }
  }
  // The tokenizer's own begin-of-text starts the next document: not a target.
  Result<TokenBatch> with_bos = MakeTokenBatch({first}, {5}, /*begin_of_text=*/token::kPad);
  ASSERT_TRUE(with_bos.ok());
  EXPECT_EQ(with_bos->loss_mask[0][0].item<float>(), 0.0f);
  EXPECT_EQ(with_bos->loss_mask[0][1].item<float>(), 1.0f);
  EXPECT_FALSE(MakeTokenBatch({first}, {6}, -1).ok());
  EXPECT_FALSE(MakeTokenBatch({first, first}, {5}, -1).ok());
}

std::string WriteChatRunConfig(const std::string& dir, const std::string& data) {
  std::ostringstream yaml;
  yaml << "mode: pretrain\n"
       << "model_config: " << ChatModelPath() << "\n"
       << "seed: 3\nthreads: 1\n"
       << "optimizer: {learning_rate: 0.01, warmup_steps: 2}\n"
       << "balance: {enabled: true, warmup_steps: 1}\n"
       << "retrieval: {facts: 2, key_letters: 1, answer_weight: 4}\n"
       << "tool_use: {action_weight: 2}\n"
       << "evaluation: {documents: 4, batch: 4, chunk_tokens: 64}\n"
       << "stages:\n"
       << "  - name: a\n    context: 128\n    tokens: 20480\n    batch_tokens: 512\n"
       << "    objective: long_context_adaptation\n"
       << data;
  const std::string path = dir + "/run.yaml";
  std::ofstream(path) << yaml.str();
  return path;
}

// A short run of the tiny chat model on retrieval and tool_use in its own ids: it finishes, its
// loss falls, and eval.jsonl has the retrieval figures.
TEST(PretrainFormat, TinyChatModelPretrainsInItsOwnIds) {
  const std::string dir = TempDir("run");
  Result<PretrainConfig> config = LoadPretrainConfig(WriteChatRunConfig(
      dir, "    data:\n      - {generator: retrieval, weight: 0.7}\n"
           "      - {generator: tool_use, weight: 0.3}\n"));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  PretrainOptions options;
  options.run_dir = dir + "/run";
  options.bar = 0;
  Result<std::vector<StageSummary>> summaries = RunPretraining(*config, options);
  ASSERT_TRUE(summaries.ok()) << summaries.status().ToString();
  ASSERT_EQ(summaries->size(), 1u);
  const StageSummary& stage = (*summaries)[0];
  EXPECT_EQ(stage.steps, 40);
  EXPECT_LT(stage.last_loss, stage.first_loss - 1.0) << stage.first_loss << " " << stage.last_loss;
  // Both generators wrote the model's ids, recorded as its id space.
  const CorpusFormat& corpus = ChatCorpus();
  int sources = 0;
  for (const auto& entry : std::filesystem::directory_iterator(options.run_dir + "/data/a")) {
    Result<std::vector<std::unique_ptr<data::Shard>>> shards =
        data::OpenShardDirectory(entry.path().string());
    ASSERT_TRUE(shards.ok()) << shards.status().ToString();
    for (const auto& shard : *shards) EXPECT_EQ(shard->id_space(), corpus.id_space);
    ++sources;
  }
  EXPECT_EQ(sources, 2);
  std::ifstream eval(options.run_dir + "/eval.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(eval, line));
  const nlohmann::json row = nlohmann::json::parse(line);
  EXPECT_EQ(row["context"], 128);
  EXPECT_EQ(row["queries"], 8);  // 4 documents of 2 facts
  EXPECT_GE(row["retrieval_accuracy"].get<double>(), 0.0);
  EXPECT_LE(row["retrieval_accuracy"].get<double>(), 1.0);
  EXPECT_LT(row["loss"].get<double>(), stage.first_loss);
}

// Shards of another id space are refused before training: here byte-format text shards.
TEST(PretrainFormat, RefusesShardsInAnotherIdSpace) {
  const std::string dir = TempDir("id_space");
  std::ofstream(dir + "/doc.txt") << "plain text, written in the byte format\n";
  ASSERT_TRUE(data::BuildTextShards({dir + "/doc.txt"}, dir + "/bytes").ok());
  Result<PretrainConfig> config = LoadPretrainConfig(
      WriteChatRunConfig(dir, "    data:\n      - {shards: " + dir + "/bytes}\n"));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  PretrainOptions options;
  options.run_dir = dir + "/run";
  options.bar = 0;
  Result<std::vector<StageSummary>> refused = RunPretraining(*config, options);
  ASSERT_TRUE(refused.status().IsInvalidArgument()) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("byte-format ids"), std::string::npos)
      << refused.status().ToString();
  // The model's own text shards: its tokenizer's encoding between its markers.
  const CorpusFormat& corpus = ChatCorpus();
  data::BuildOptions build;
  build.format = corpus.format;
  build.begin_of_text = corpus.begin_of_text;
  build.end_of_text = corpus.end_of_text;
  ASSERT_TRUE(data::BuildTextShards({dir + "/doc.txt"}, dir + "/own", build).ok());
  Result<std::vector<std::unique_ptr<data::Shard>>> own = data::OpenShardDirectory(dir + "/own");
  ASSERT_TRUE(own.ok());
  EXPECT_EQ((*own)[0]->id_space(), corpus.id_space);
  std::vector<int32_t> expected =
      corpus.format->Encode("plain text, written in the byte format\n");
  expected.push_back(corpus.end_of_text);
  EXPECT_EQ((*own)[0]->Document(0), expected);
}

// Image documents are byte-format placeholders: refused at config load, naming the generator
// and the tokenizer, whether the mixture names image_text or a modality_alignment stage has it
// by default.
TEST(PretrainFormat, RefusesImageTextForAModelWithItsOwnTokenizer) {
  const std::string dir = TempDir("image_text");
  for (const std::string& stage :
       {std::string("  - {name: a, context: 64, tokens: 1024, objective: modality_alignment}\n"),
        std::string("  - {name: a, context: 64, tokens: 1024, objective: long_context_adaptation,"
                    " data: [{generator: retrieval}, {generator: image_text}]}\n")}) {
    std::ofstream(dir + "/run.yaml") << "mode: pretrain\nmodel_config: " << ChatModelPath()
                                     << "\nstages:\n"
                                     << stage;
    Result<PretrainConfig> config = LoadPretrainConfig(dir + "/run.yaml");
    ASSERT_TRUE(config.status().IsInvalidArgument()) << config.status().ToString();
    EXPECT_NE(config.status().message().find("image_text"), std::string::npos);
    EXPECT_NE(config.status().message().find("bpe_gpt2.json"), std::string::npos)
        << config.status().ToString();
  }
  data::GeneratorOptions generator;
  generator.format = ChatCorpus().format;
  EXPECT_TRUE(data::BuildGeneratedShards(data::GeneratorKind::kImageText, generator, 1, 2, 0,
                                         dir + "/images")
                  .status()
                  .IsInvalidArgument());
}

}  // namespace
}  // namespace strider
