// Shards, generators and packing (no LibTorch): round trips, determinism, document boundaries,
// and corrupt or truncated files reported with the file and byte offset.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "common/tokenizer.h"
#include "common/transcript.h"
#include "envs/environment.h"
#include "envs/tools.h"
#include "learner/pretrain/data/builder.h"
#include "learner/pretrain/data/dataset.h"
#include "learner/pretrain/data/generators.h"
#include "learner/pretrain/data/shard.h"
#include "tests/scratch_dir.h"

namespace strider::data {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  return strider::testing::ScratchDir("strider_data_test_" + name);
}

std::vector<std::vector<int32_t>> SomeDocuments(int count, uint32_t seed, int max_length) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> documents;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> doc(1 + rng() % max_length);
    for (int32_t& t : doc) t = static_cast<int32_t>(rng() % 288);
    documents.push_back(doc);
  }
  return documents;
}

std::string WriteShard(const std::string& dir, const std::vector<std::vector<int32_t>>& docs,
                       int token_bytes = 2, int64_t index = 0) {
  ShardWriter writer(token_bytes);
  for (const auto& doc : docs) EXPECT_TRUE(writer.Add(doc).ok());
  const std::string path = dir + "/" + ShardFileName(index);
  EXPECT_TRUE(writer.Write(path).ok());
  return path;
}

TEST(Shard, WriteThenReadBackBothWidths) {
  const std::string dir = TempDir("roundtrip");
  const auto docs = SomeDocuments(50, 1, 300);
  for (int width : {2, 4}) {
    const std::string path = WriteShard(dir, docs, width, width);
    Result<std::unique_ptr<Shard>> shard = Shard::Open(path);
    ASSERT_TRUE(shard.ok()) << shard.status().ToString();
    ASSERT_EQ((*shard)->documents(), 50);
    for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ((*shard)->Document(i), docs[i]);
    std::vector<int32_t> middle(3);
    if (docs[7].size() >= 4) {
      (*shard)->CopyTokens(7, 1, 4, middle.data());
      EXPECT_EQ(middle, std::vector<int32_t>(docs[7].begin() + 1, docs[7].begin() + 4));
    }
  }
}

TEST(Shard, RejectsIdsThatDoNotFit) {
  ShardWriter writer(2);
  EXPECT_FALSE(writer.Add({1, 70000}).ok());
  EXPECT_FALSE(writer.Add({-1}).ok());
  EXPECT_EQ(writer.documents(), 0);
}

void Corrupt(const std::string& path, size_t offset, uint8_t value) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(offset);
  file.put(static_cast<char>(value));
}

TEST(Shard, CorruptAndTruncatedFilesNameFileAndOffset) {
  const std::string dir = TempDir("corrupt");
  const auto docs = SomeDocuments(10, 2, 100);
  int64_t tokens = 0;
  for (const auto& d : docs) tokens += d.size();
  const size_t data_offset = kShardHeaderBytes + 8 * (docs.size() + 1);
  const size_t size = data_offset + 2 * tokens;

  // Truncated.
  std::string path = WriteShard(dir, docs);
  fs::resize_file(path, size - 3);
  Result<std::unique_ptr<Shard>> shard = Shard::Open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_TRUE(shard.status().IsCorruption());
  EXPECT_NE(shard.status().message().find(path), std::string::npos);
  EXPECT_NE(shard.status().message().find("truncated"), std::string::npos);
  EXPECT_NE(shard.status().message().find("offset " + std::to_string(size - 3)), std::string::npos);

  // A flipped token byte: checksum mismatch in the token data.
  path = WriteShard(dir, docs);
  Corrupt(path, data_offset + 5, 0xFF);
  shard = Shard::Open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_NE(shard.status().message().find("token data"), std::string::npos);
  EXPECT_NE(shard.status().message().find("offset " + std::to_string(data_offset)),
            std::string::npos);

  // A broken offsets entry is located.
  path = WriteShard(dir, docs);
  Corrupt(path, kShardHeaderBytes + 8 * 3 + 6, 0x7F);
  shard = Shard::Open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_NE(shard.status().message().find("entry 3"), std::string::npos)
      << shard.status().message();

  // Header damage and a foreign file.
  path = WriteShard(dir, docs);
  Corrupt(path, 20, 0x01);
  shard = Shard::Open(path);
  ASSERT_FALSE(shard.ok());
  EXPECT_NE(shard.status().message().find("header checksum"), std::string::npos);
  std::ofstream(dir + "/junk.shard") << std::string(100, 'j');  // longer than a header
  shard = Shard::Open(dir + "/junk.shard");
  ASSERT_FALSE(shard.ok());
  EXPECT_NE(shard.status().message().find("magic"), std::string::npos);
  // Trailing bytes.
  path = WriteShard(dir, docs);
  { std::ofstream(path, std::ios::app | std::ios::binary) << "xx"; }
  EXPECT_FALSE(Shard::Open(path).ok());
}

std::vector<DataSource> OneSource(const std::string& dir) {
  Result<std::vector<std::unique_ptr<Shard>>> shards = OpenShardDirectory(dir);
  EXPECT_TRUE(shards.ok()) << shards.status().ToString();
  std::vector<DataSource> sources(1);
  sources[0].name = dir;
  sources[0].shards = std::move(shards).value();
  return sources;
}

TEST(Packer, ShuffleIsDeterministicBySeed) {
  const std::string dir = TempDir("shuffle");
  WriteShard(dir, SomeDocuments(40, 3, 60), 2, 0);
  WriteShard(dir, SomeDocuments(40, 4, 60), 2, 1);
  auto run = [&](uint64_t seed) {
    auto packer = Packer::Create(OneSource(dir), 128, seed);
    EXPECT_TRUE(packer.ok());
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < 30; ++i) out.push_back((*packer)->Next());  // past one epoch
    return out;
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

TEST(Packer, RespectsDocumentBoundariesAndResumes) {
  const std::string dir = TempDir("pack");
  // Documents tagged by their first token so each piece can be traced; lengths 1..100 and some
  // longer than the sequence (150) to exercise splitting.
  std::vector<std::vector<int32_t>> docs;
  std::mt19937 rng(7);
  for (int i = 0; i < 60; ++i) {
    const int length = (i % 10 == 0) ? 150 + static_cast<int>(rng() % 200) : 1 + rng() % 100;
    std::vector<int32_t> doc(length, 1000 + i);
    docs.push_back(doc);
  }
  WriteShard(dir, docs, 4);
  auto packer = Packer::Create(OneSource(dir), 128, 9);
  ASSERT_TRUE(packer.ok());
  std::vector<std::vector<int32_t>> sequences;
  for (int i = 0; i < 40; ++i) sequences.push_back((*packer)->Next());
  for (const auto& sequence : sequences) {
    ASSERT_EQ(sequence.size(), 128u);
    // Runs of one document id: every short document appears whole within one sequence.
    for (size_t i = 0; i < sequence.size();) {
      size_t j = i;
      while (j < sequence.size() && sequence[j] == sequence[i]) ++j;
      const int32_t id = sequence[i];
      if (id != token::kPad) {
        const int64_t full = static_cast<int64_t>(docs[id - 1000].size());
        if (full <= 128) {
          // Consecutive equal-tag documents could merge only if the same document repeats
          // back to back, which one epoch's permutation never does.
          EXPECT_EQ(static_cast<int64_t>(j - i) % full, 0) << "document " << id << " was cut";
        }
      } else {
        EXPECT_EQ(j, sequence.size()) << "padding only at the end of a sequence";
      }
      i = j;
    }
  }
  // Resume: a new packer skipped to position 17 continues with the same sequences.
  auto resumed = Packer::Create(OneSource(dir), 128, 9);
  ASSERT_TRUE(resumed.ok());
  (*resumed)->SkipTo(17);
  for (int i = 17; i < 40; ++i) EXPECT_EQ((*resumed)->Next(), sequences[i]) << "sequence " << i;
}

TEST(Packer, MixtureFollowsWeights) {
  const std::string a = TempDir("mix_a"), b = TempDir("mix_b");
  WriteShard(a, std::vector<std::vector<int32_t>>(100, std::vector<int32_t>(10, 1)));
  WriteShard(b, std::vector<std::vector<int32_t>>(100, std::vector<int32_t>(10, 2)));
  std::vector<DataSource> sources = OneSource(a);
  std::vector<DataSource> second = OneSource(b);
  sources[0].weight = 3;
  second[0].weight = 1;
  sources.push_back(std::move(second[0]));
  auto packer = Packer::Create(std::move(sources), 100, 1);
  ASSERT_TRUE(packer.ok());
  for (int i = 0; i < 400; ++i) (*packer)->Next();
  const double share = static_cast<double>((*packer)->drawn()[0]) /
                       ((*packer)->drawn()[0] + (*packer)->drawn()[1]);
  EXPECT_NEAR(share, 0.75, 0.03);
}

TEST(Generators, RetrievalDocumentsHaveExactLengthAndAnswers) {
  GeneratorOptions options;
  for (int64_t length : {64, 256, 4096, 100000}) {
    options.length = length;
    GeneratedDocument doc = Generate(GeneratorKind::kRetrieval, options, 1, 3);
    ASSERT_EQ(static_cast<int64_t>(doc.tokens.size()), length);
    EXPECT_EQ(doc.tokens.front(), token::kBeginOfText);
    EXPECT_EQ(doc.tokens.back(), token::kEndOfText);
    ASSERT_EQ(doc.answers.size(), 4u);
    const std::string text = Tokenizer::Decode(doc.tokens);
    for (const auto& [begin, end] : doc.answers) {
      // The query's key is right before "=" before the answer; the fact "\nKEY=VALUE\n" exists.
      const std::string key(doc.tokens.begin() + begin - 3, doc.tokens.begin() + begin - 1);
      const std::string value(doc.tokens.begin() + begin, doc.tokens.begin() + end);
      EXPECT_NE(text.find("\n" + key + "=" + value + "\n"), std::string::npos);
    }
  }
  // Same (seed, index): same document; different index: different document.
  options.length = 512;
  EXPECT_EQ(Generate(GeneratorKind::kRetrieval, options, 1, 3).tokens,
            Generate(GeneratorKind::kRetrieval, options, 1, 3).tokens);
  EXPECT_NE(Generate(GeneratorKind::kRetrieval, options, 1, 3).tokens,
            Generate(GeneratorKind::kRetrieval, options, 1, 4).tokens);
}

TEST(Generators, RetrievalAnswersAreFoundByTheirFormInPackedStreams) {
  GeneratorOptions options;
  options.length = 300;
  options.facts = 6;
  // Two documents back to back, as packing puts them, the second cut inside its last answer.
  GeneratedDocument first = Generate(GeneratorKind::kRetrieval, options, 5, 0);
  GeneratedDocument second = Generate(GeneratorKind::kRetrieval, options, 5, 1);
  std::vector<int32_t> stream = first.tokens;
  const int64_t offset = static_cast<int64_t>(stream.size());
  const int64_t cut = second.answers.back().first + 1;  // keeps one digit of the last answer
  stream.insert(stream.end(), second.tokens.begin(), second.tokens.begin() + cut);
  std::vector<std::pair<int64_t, int64_t>> expected = first.answers;
  for (const auto& [begin, end] : second.answers) {
    expected.emplace_back(offset + begin, std::min<int64_t>(offset + end, offset + cut));
  }
  // Sorted by position, like the generator's, which lists them in document order.
  EXPECT_EQ(FindRetrievalAnswers(stream.data(), static_cast<int64_t>(stream.size())), expected);
  // Facts ("\nKQ=73\n") are not queries.
  const std::string fact = "ab\nKQ=73\ncd";
  const std::vector<int32_t> tokens(fact.begin(), fact.end());
  EXPECT_TRUE(FindRetrievalAnswers(tokens.data(), static_cast<int64_t>(tokens.size())).empty());
}

TEST(Generators, ToolUseHasRolesAndSomeFlawedTranscripts) {
  GeneratorOptions options;
  int flawed = 0;
  for (int i = 0; i < 200; ++i) {
    GeneratedDocument doc = Generate(GeneratorKind::kToolUse, options, 2, i);
    flawed += doc.flawed;
    EXPECT_EQ(std::count(doc.tokens.begin(), doc.tokens.end(), token::kUser), 1);
    EXPECT_GE(std::count(doc.tokens.begin(), doc.tokens.end(), token::kModel), 1);
  }
  EXPECT_GT(flawed, 20);
  EXPECT_LT(flawed, 70);

  // flawed_fraction 0: every transcript is the scripted policy's own, solved.
  options.flawed_fraction = 0.0;
  for (int i = 0; i < 200; ++i) {
    EXPECT_FALSE(Generate(GeneratorKind::kToolUse, options, 2, i).flawed) << i;
  }
}

// The model turns of a token stream, each without its end-of-turn, found by their roles.
std::vector<std::string> ModelTurns(const std::vector<int32_t>& tokens) {
  const std::vector<transcript::Role> roles = transcript::ReadRoles(tokens);
  std::vector<std::string> turns;
  std::vector<int32_t> turn;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!transcript::IsAction(roles[i])) continue;
    if (tokens[i] == token::kEndOfTurn) {
      turns.push_back(Tokenizer::Decode(turn));
      turn.clear();
    } else {
      turn.push_back(tokens[i]);
    }
  }
  return turns;
}

TEST(Generators, ToolUseTranscriptsAreCalculatorEpisodesAsAnActorShowsThem) {
  envs::EnvironmentConfig calculator;
  calculator.name = "calculator";
  calculator.options = {{"difficulty", "1"}};
  GeneratorOptions options;
  int flawed = 0;
  int paid = 0;
  for (int i = 0; i < 100; ++i) {
    const GeneratedDocument doc = Generate(GeneratorKind::kToolUse, options, 5, i);
    Result<std::unique_ptr<envs::Environment>> env = envs::MakeEnvironment(calculator);
    ASSERT_TRUE(env.ok()) << env.status().ToString();
    const envs::EnvironmentSpec spec = (*env)->Describe();
    Result<envs::Observation> first = (*env)->Reset(doc.episode_seed, {});
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    // The actor's prompt: the environment's description and tool list, the task, the header.
    std::string expected = "<|begin_of_text|><|system|>" + spec.description + "\n" +
                           envs::RenderToolList(spec.tools) + "<|end_of_turn|><|user|>" +
                           first->text + "<|end_of_turn|><|model|>";
    // Each model turn played again: the environment answers what the transcript says it
    // answered, and pays the last answer exactly when the document is not flawed.
    bool incorrect_step = false;
    double outcome = -1;
    std::string last_turn;
    std::string truth;
    for (const std::string& turn : ModelTurns(doc.tokens)) {
      ASSERT_LT(outcome, 0) << "a model turn after the episode ended";
      expected += turn + "<|end_of_turn|>";
      Result<envs::StepResult> step = (*env)->Step(envs::MakeAction(turn));
      ASSERT_TRUE(step.ok()) << step.status().ToString();
      incorrect_step |= step->label == envs::StepLabel::kIncorrect;
      last_turn = turn;
      if (step->done) {
        outcome = step->outcome_reward.value_or(0.0);
        truth = step->info["answer"];
        continue;
      }
      expected += "<|" + std::string(envs::ObservationRoleName(step->observation.role)) + "|>" +
                  step->observation.text + "<|end_of_turn|><|model|>";
    }
    EXPECT_EQ(Tokenizer::Decode(doc.tokens), expected + "<|end_of_text|>");
    EXPECT_EQ(doc.flawed, incorrect_step || outcome != 1.0) << Tokenizer::Decode(doc.tokens);
    if (!doc.flawed) EXPECT_EQ(last_turn, "Answer: " + truth);
    flawed += doc.flawed;
    paid += outcome == 1.0;
  }
  EXPECT_GT(flawed, 5);
  EXPECT_LT(flawed, 40);
  EXPECT_GE(paid, 60);
}

// `flaws: [no_tool]`: every flawed transcript answers at once with a guess, the others are the
// scripted policy's calls; the documents not drawn flawed are the same as with all three kinds.
TEST(Generators, ToolUseFlawsDrawOnlyTheNamedKinds) {
  GeneratorOptions all;
  all.flawed_fraction = 0.5;
  GeneratorOptions guesses = all;
  guesses.flaws = {ToolUseFlaw::kNoTool};
  int guessed = 0;
  for (int i = 0; i < 100; ++i) {
    const GeneratedDocument doc = Generate(GeneratorKind::kToolUse, guesses, 4, i);
    const std::vector<std::string> turns = ModelTurns(doc.tokens);
    ASSERT_FALSE(turns.empty());
    const bool guess = turns.size() == 1;
    if (guess) {
      EXPECT_EQ(turns[0].rfind("Answer: ", 0), 0u) << turns[0];
      ++guessed;
    } else {
      // A call first, the right answer last: nothing but a guess is ever wrong.
      EXPECT_NE(turns[0].find("<|tool_call|>calc("), std::string::npos) << turns[0];
      EXPECT_FALSE(doc.flawed) << Tokenizer::Decode(doc.tokens);
      EXPECT_EQ(doc.tokens, Generate(GeneratorKind::kToolUse, all, 4, i).tokens) << i;
    }
  }
  EXPECT_GT(guessed, 30);
  EXPECT_LT(guessed, 70);
  EXPECT_FALSE(ParseToolUseFlaw("typo").ok());
}

// Any built-in environment's scripted episodes: the retrieval environment's reading, searches
// and answer, every one solved (the calculator's own flaws do not apply), different per index.
TEST(Generators, ToolUsePlaysTheNamedEnvironment) {
  GeneratorOptions options;
  options.flawed_fraction = 0.2;
  options.flaws = {ToolUseFlaw::kWrongCall, ToolUseFlaw::kMisread};
  options.environment.name = "retrieval";
  options.environment.options = {{"total_tokens", "1024"}, {"parts", "4"}};
  std::set<std::string> answers;
  for (int i = 0; i < 20; ++i) {
    const GeneratedDocument doc = Generate(GeneratorKind::kToolUse, options, 3, i);
    EXPECT_FALSE(doc.flawed) << i;
    const std::vector<std::string> turns = ModelTurns(doc.tokens);
    // The first part comes with the question: three "next", two searches, the answer.
    ASSERT_EQ(turns.size(), 6u) << Tokenizer::Decode(doc.tokens);
    EXPECT_EQ(turns[0], "next");
    EXPECT_NE(turns[3].find("<|tool_call|>search(Agent "), std::string::npos) << turns[3];
    EXPECT_NE(turns[4].find("<|tool_call|>search(Badge "), std::string::npos) << turns[4];
    ASSERT_EQ(turns[5].rfind("Answer: ", 0), 0u) << turns[5];
    answers.insert(turns[5]);
    EXPECT_GT(doc.tokens.size(), 1024u);
    EXPECT_EQ(doc.tokens.back(), token::kEndOfText);
  }
  EXPECT_GE(answers.size(), 19u);
}

// no_tool elsewhere: the scripted reading goes on, and the first tool call becomes a guess.
TEST(Generators, AnotherEnvironmentsFlawedTranscriptGuessesInPlaceOfItsFirstCall) {
  GeneratorOptions options;
  options.flawed_fraction = 0.5;
  options.flaws = {ToolUseFlaw::kNoTool};
  options.environment.name = "retrieval";
  options.environment.options = {{"total_tokens", "1024"}, {"parts", "4"}};
  int guessed = 0;
  for (int i = 0; i < 40; ++i) {
    const GeneratedDocument doc = Generate(GeneratorKind::kToolUse, options, 3, i);
    const std::vector<std::string> turns = ModelTurns(doc.tokens);
    ASSERT_GE(turns.size(), 4u) << Tokenizer::Decode(doc.tokens);
    EXPECT_EQ(turns[0], "next");
    EXPECT_EQ(turns[2], "next");
    if (doc.flawed) {
      ++guessed;
      ASSERT_EQ(turns.size(), 4u) << Tokenizer::Decode(doc.tokens);  // three "next", the guess
      EXPECT_EQ(turns[3].rfind("Answer: ", 0), 0u) << turns[3];
    } else {
      ASSERT_EQ(turns.size(), 6u);
      EXPECT_NE(turns[3].find("<|tool_call|>search(Agent "), std::string::npos) << turns[3];
    }
  }
  EXPECT_GT(guessed, 10);
  EXPECT_LT(guessed, 30);
}

TEST(Generators, ImageCaptionsRenderToTheirPicture) {
  GeneratorOptions options;
  options.image_size = 24;
  options.patch_size = 4;
  GeneratedDocument doc = Generate(GeneratorKind::kImageText, options, 3, 0);
  EXPECT_EQ(std::count(doc.tokens.begin(), doc.tokens.end(), token::kImagePatch), 36);
  Result<std::vector<float>> pixels =
      RenderCaptionImage("a red square at the top left on a blue background", 30);
  ASSERT_TRUE(pixels.ok());
  // Centre of the top-left cell is red, the bottom-right corner blue.
  const auto at = [&](int y, int x, int c) { return (*pixels)[(y * 30 + x) * 3 + c]; };
  EXPECT_GT(at(5, 5, 0), 0.8f);
  EXPECT_LT(at(5, 5, 2), 0.2f);
  EXPECT_GT(at(28, 28, 2), 0.8f);
  EXPECT_FALSE(RenderCaptionImage("a purple square at the top left on a blue background", 30).ok());
}

TEST(Builder, TextFilesAndGeneratorsToShards) {
  const std::string dir = TempDir("build");
  std::ofstream(dir + "/a.txt") << "hello world";
  std::ofstream(dir + "/b.txt") << "caf\xc3\xa9";
  Result<BuildSummary> built = BuildTextShards({dir + "/a.txt", dir + "/b.txt"}, dir + "/out");
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  auto shards = OpenShardDirectory(dir + "/out");
  ASSERT_TRUE(shards.ok());
  EXPECT_EQ(Tokenizer::Decode((*shards)[0]->Document(1)), "<|begin_of_text|>caf\xc3\xa9<|end_of_text|>")
      << Tokenizer::Decode((*shards)[0]->Document(1));
  // Building into a directory that already has shards is refused.
  EXPECT_FALSE(BuildTextShards({dir + "/a.txt"}, dir + "/out").ok());
  std::ofstream(dir + "/bad.txt") << "ok\xff";
  Result<BuildSummary> bad = BuildTextShards({dir + "/bad.txt"}, dir + "/bad");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("byte offset 2"), std::string::npos);

  BuildOptions small;
  small.shard_tokens = 2000;
  Result<BuildSummary> generated =
      BuildGeneratedShards(GeneratorKind::kRetrieval, GeneratorOptions{}, 1, 10, 0, dir + "/gen", small);
  ASSERT_TRUE(generated.ok());
  EXPECT_EQ(generated->documents, 10);
  EXPECT_GT(generated->shards, 1);
  auto gen = OpenShardDirectory(dir + "/gen");
  ASSERT_TRUE(gen.ok());
  EXPECT_EQ((*gen)[0]->Document(0), Generate(GeneratorKind::kRetrieval, GeneratorOptions{}, 1, 0).tokens);
}

TEST(Utf8, FindsFirstInvalidByte) {
  EXPECT_EQ(FindInvalidUtf8("plain"), -1);
  EXPECT_EQ(FindInvalidUtf8("\xe2\x82\xac ok"), -1);
  EXPECT_EQ(FindInvalidUtf8("ab\xc0\xaf"), 2);      // overlong
  EXPECT_EQ(FindInvalidUtf8("a\xed\xa0\x80"), 1);   // surrogate
  EXPECT_EQ(FindInvalidUtf8("abc\xe2\x82"), 3);     // truncated
}

}  // namespace
}  // namespace strider::data
