// common/tokenizer against ids the reference libraries produced (tests/tokenizer/
// make_fixtures.py, tokenizers 0.23.3 and tiktoken 0.14.0): over 1 MiB of mixed text, input
// that is not UTF-8, unusual characters, round trips of random text, and streaming decode with
// markers.
#include "common/tokenizer.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "tests/file_contents.h"

namespace strider::tokenizer {
namespace {

using strider::testing::ReadFileBytes;

std::string DataPath(const std::string& name) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return std::string(source ? source : ".") + "/tests/tokenizer/data/" + name;
}

std::vector<int32_t> ReadIds(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  EXPECT_NE(file, nullptr) << path;
  std::vector<int32_t> ids;
  if (file == nullptr) return ids;
  unsigned char buffer[1 << 16];
  std::string bytes;
  int n;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0)
    bytes.append(reinterpret_cast<char*>(buffer), n);
  gzclose(file);
  for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
    ids.push_back(static_cast<unsigned char>(bytes[i]) |
                  (static_cast<unsigned char>(bytes[i + 1]) << 8));
  }
  return ids;
}

// One test text and, per reference, its expected ids (absent: not covered by that reference).
struct Case {
  std::string text;
  std::vector<std::optional<std::vector<int32_t>>> expected;
};

// tiktoken_kimi: the tiktoken ranks split by Kimi K2's pattern (class intersections).
const std::vector<std::string> kReferences = {"bpe_llama3", "bpe_gpt2", "bpe_nfc", "tiktoken",
                                              "tiktoken_kimi"};

std::vector<Case> LoadCases(const std::string& prefix, const std::string& text_file) {
  const std::string text = ReadFileBytes(DataPath(text_file));
  std::vector<std::vector<int32_t>> ids;
  std::vector<size_t> next(kReferences.size(), 0);
  for (const std::string& name : kReferences)
    ids.push_back(ReadIds(DataPath(prefix + "." + name + ".ids.gz")));
  std::istringstream index(ReadFileBytes(DataPath(prefix + ".index")));
  std::string line;
  std::vector<Case> cases;
  while (std::getline(index, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    size_t offset, length;
    fields >> offset >> length;
    Case c;
    c.text = text.substr(offset, length);
    for (size_t r = 0; r < kReferences.size(); ++r) {
      std::string count;
      fields >> count;
      if (count == "-") {
        c.expected.emplace_back();
        continue;
      }
      const size_t n = std::stoul(count);
      EXPECT_LE(next[r] + n, ids[r].size()) << kReferences[r];
      if (next[r] + n > ids[r].size()) return {};
      c.expected.emplace_back(
          std::vector<int32_t>(ids[r].begin() + next[r], ids[r].begin() + next[r] + n));
      next[r] += n;
    }
    cases.push_back(std::move(c));
  }
  for (size_t r = 0; r < kReferences.size(); ++r)
    EXPECT_EQ(next[r], ids[r].size()) << kReferences[r];
  return cases;
}

std::unique_ptr<Tokenizer> LoadReference(const std::string& name) {
  TokenizerOptions options;
  std::string file = name + ".json";
  if (name.starts_with("tiktoken")) {
    const nlohmann::json meta = nlohmann::json::parse(ReadFileBytes(DataPath("ranks_meta.json")));
    options.tiktoken_pattern =
        meta.at(name == "tiktoken" ? "pattern" : "kimi_pattern").get<std::string>();
    for (const auto& [text, id] : meta.at("special_tokens").items()) {
      options.tiktoken_special_tokens.emplace_back(text, id.get<int32_t>());
    }
    file = "ranks.tiktoken";
  }
  Result<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(DataPath(file), options);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

// The first difference, for a failure message that points at the text.
std::string FirstDifference(const Tokenizer& tokenizer, const std::vector<int32_t>& got,
                            const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const auto around = [&](const std::vector<int32_t>& ids) {
    const size_t from = i >= 3 ? i - 3 : 0;
    const size_t to = std::min(ids.size(), i + 4);
    std::string out;
    for (size_t k = from; k < to; ++k) {
      out += std::to_string(ids[k]) + "'" + tokenizer.DecodeBytes(std::span(&ids[k], 1)) + "' ";
    }
    return out;
  };
  return "at id " + std::to_string(i) + "\n got:  " + around(got) + "\n want: " + around(want);
}

// Each reference layout, loaded afresh for every test.
class ReferenceTest : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    tokenizer_ = LoadReference(kReferences[reference_]);
    ASSERT_NE(tokenizer_, nullptr);
  }

  const size_t reference_ = GetParam();
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_P(ReferenceTest, MixedTextGivesTheReferenceIds) {
  const std::vector<Case> cases = LoadCases("mixed", "mixed.txt");
  ASSERT_GT(cases.size(), 100u);
  size_t checked_bytes = 0;
  int failures = 0;
  for (size_t i = 0; i < cases.size() && failures < 5; ++i) {
    if (!cases[i].expected[reference_]) continue;
    const std::vector<int32_t>& want = *cases[i].expected[reference_];
    const std::vector<int32_t> got = tokenizer_->Encode(cases[i].text);
    if (got != want) {
      ++failures;
      ADD_FAILURE() << kReferences[reference_] << " case " << i << " "
                    << FirstDifference(*tokenizer_, got, want);
    }
    if (kReferences[reference_] != "bpe_nfc") {
      EXPECT_EQ(tokenizer_->Decode(want), cases[i].text) << "case " << i;
    }
    checked_bytes += cases[i].text.size();
  }
  // bpe_llama3 and tiktoken cover all of it, the other layouts of their vocabularies the
  // first 256 KiB (tiktoken_kimi 128 KiB).
  const std::string& name = kReferences[reference_];
  EXPECT_GE(checked_bytes, name == "tiktoken_kimi"                   ? 128u << 10
                           : name == "bpe_gpt2" || name == "bpe_nfc" ? 256u << 10
                                                                     : 1u << 20);
}

TEST_P(ReferenceTest, UnusualCharactersGiveTheReferenceIds) {
  // White space of every kind (U+180E, NEL, ZWSP, BOM), marks, digits of other scripts, case
  // folding, tags, private use, unassigned code points, halves of special tokens.
  const std::vector<Case> cases = LoadCases("exotic", "exotic.txt");
  ASSERT_GE(cases.size(), 1000u);
  int failures = 0;
  for (size_t i = 0; i < cases.size() && failures < 5; ++i) {
    const std::vector<int32_t> got = tokenizer_->Encode(cases[i].text);
    if (got != *cases[i].expected[reference_]) {
      ++failures;
      ADD_FAILURE() << kReferences[reference_] << " case " << i << " "
                    << FirstDifference(*tokenizer_, got, *cases[i].expected[reference_]);
    }
  }
}

TEST_P(ReferenceTest, InvalidUtf8IsReplacedMaximalSubpartByMaximalSubpart) {
  // The rule: bytes that are not UTF-8 are tokenised as Python's
  // bytes.decode("utf-8", errors="replace") reads them, each maximal invalid subpart as U+FFFD.
  const std::vector<Case> cases = LoadCases("invalid", "invalid.bin");
  ASSERT_GT(cases.size(), 100u);
  size_t invalid = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    invalid += IsValidUtf8(cases[i].text) ? 0 : 1;
    EXPECT_EQ(tokenizer_->Encode(cases[i].text), *cases[i].expected[reference_]) << "case " << i;
    EXPECT_EQ(tokenizer_->Encode(cases[i].text),
              tokenizer_->Encode(ReplaceInvalidUtf8(cases[i].text)));
  }
  EXPECT_GT(invalid, 100u);
}

TEST_P(ReferenceTest, RandomValidUtf8RoundTrips) {
  std::mt19937_64 rng(44);
  const char32_t kRanges[][2] = {{0x20, 0x7E},       {0x09, 0x0D},        {0x4E00, 0x9FFF},
                                 {0x1F300, 0x1FAFF}, {0x80, 0x7FF},       {0x800, 0xD7FF},
                                 {0xE000, 0xFFFD},   {0x10000, 0x10FFFF}, {0x2000, 0x206F}};
  // NFC rewrites some characters by design: that layout gets the ranges NFC leaves alone
  // (ASCII, CJK ideographs, emoji), the others everything.
  const size_t ranges = kReferences[reference_] == "bpe_nfc" ? 4 : std::size(kRanges);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int length = static_cast<int>(rng() % 64);
    for (int k = 0; k < length; ++k) {
      const auto& range = kRanges[rng() % ranges];
      const char32_t c = range[0] + static_cast<char32_t>(rng() % (range[1] - range[0] + 1));
      if (c < 0x80) {
        text += static_cast<char>(c);
      } else if (c < 0x800) {
        text += static_cast<char>(0xC0 | (c >> 6));
        text += static_cast<char>(0x80 | (c & 0x3F));
      } else if (c < 0x10000) {
        text += static_cast<char>(0xE0 | (c >> 12));
        text += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        text += static_cast<char>(0x80 | (c & 0x3F));
      } else {
        text += static_cast<char>(0xF0 | (c >> 18));
        text += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
        text += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        text += static_cast<char>(0x80 | (c & 0x3F));
      }
    }
    ASSERT_TRUE(IsValidUtf8(text));
    const std::vector<int32_t> ids = tokenizer_->Encode(text);
    ASSERT_EQ(tokenizer_->Decode(ids), text) << "trial " << trial;
    ASSERT_EQ(tokenizer_->DecodeBytes(ids), text) << "trial " << trial;
  }
}

TEST_P(ReferenceTest, ThreadsGetTheSameIdsAsOneThread) {
  const std::string text = ReadFileBytes(DataPath("corpus_sample.txt"));
  const std::vector<int32_t> want = tokenizer_->Encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] { got[t] = tokenizer_->Encode(text); });
  }
  for (std::thread& thread : threads) thread.join();
  for (const auto& ids : got) EXPECT_EQ(ids, want);
}

INSTANTIATE_TEST_SUITE_P(References, ReferenceTest, ::testing::Range<size_t>(0, kReferences.size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return kReferences[info.param];
                         });

TEST(ReplaceInvalidUtf8Test, FollowsTheMaximalSubpartRule) {
  EXPECT_EQ(ReplaceInvalidUtf8("plain 好😀"), "plain 好😀");
  EXPECT_EQ(ReplaceInvalidUtf8("\x80"), "\uFFFD");
  // E0 needs A0..BF next: E0 alone is one subpart, then two stray continuation bytes.
  EXPECT_EQ(ReplaceInvalidUtf8("\xE0\x80\xAF"), "\uFFFD\uFFFD\uFFFD");
  // A truncated emoji is one subpart, whatever follows.
  EXPECT_EQ(ReplaceInvalidUtf8("\xF0\x9F\x98"
                               "A"),
            "\uFFFD"
            "A");
  EXPECT_EQ(ReplaceInvalidUtf8("a\xF0\x9F\x98"), "a\uFFFD");
  // Surrogates and code points past U+10FFFF are not UTF-8.
  EXPECT_EQ(ReplaceInvalidUtf8("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(ReplaceInvalidUtf8("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(ReplaceInvalidUtf8("\xC0\xAF"), "\uFFFD\uFFFD");
  EXPECT_FALSE(IsValidUtf8("\xC3"));
  EXPECT_TRUE(IsValidUtf8("\xC3\xA9"));
}

TEST(TokenizerTest, SpecialTokensAreTextWhenSplitSpecialTokensIsSet) {
  std::unique_ptr<Tokenizer> tokenizer = LoadReference("bpe_llama3");
  ASSERT_NE(tokenizer, nullptr);
  const std::optional<int32_t> end = tokenizer->SpecialTokenId("<|im_end|>");
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(tokenizer->IsSpecial(*end));
  EXPECT_FALSE(tokenizer->IsSpecial(300));
  const std::string text = "done<|im_end|>";
  const std::vector<int32_t> matched = tokenizer->Encode(text);
  ASSERT_FALSE(matched.empty());
  EXPECT_EQ(matched.back(), *end);
  EncodeOptions options;
  options.split_special_tokens = true;
  const std::vector<int32_t> split = tokenizer->Encode(text, options);
  for (int32_t id : split) EXPECT_FALSE(tokenizer->IsSpecial(id));
  EXPECT_EQ(tokenizer->Decode(split), text);
  // An id outside the vocabulary is shown, not dropped.
  const std::vector<int32_t> outside = {tokenizer->VocabSize() + 5};
  EXPECT_EQ(tokenizer->Decode(outside),
            "<|id:" + std::to_string(tokenizer->VocabSize() + 5) + "|>");
}

TEST(TokenizerTest, LoadErrorsNameTheFileAndTheProblem) {
  Result<std::unique_ptr<Tokenizer>> missing = LoadTokenizer("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  // A rank file without its pattern.
  Result<std::unique_ptr<Tokenizer>> no_pattern = LoadTokenizer(DataPath("ranks.tiktoken"));
  ASSERT_FALSE(no_pattern.ok());
  EXPECT_EQ(no_pattern.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_pattern.status().message().find("ranks.tiktoken"), std::string::npos);
  TokenizerOptions options;
  options.format = TokenizerFormat::kTokenizerJson;
  EXPECT_EQ(ParseTokenizer("{\"model\": 3}", options).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(ParseTokenizer("not json", options).status().code(), StatusCode::kCorruption);
  const std::string metaspace = R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},)"
                                R"("pre_tokenizer":{"type":"Metaspace","replacement":"▁"}})";
  EXPECT_EQ(ParseTokenizer(metaspace, options).status().code(), StatusCode::kUnimplemented);
  const std::string bad_merge = R"({"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]},)"
                                R"("pre_tokenizer":{"type":"ByteLevel"}})";
  EXPECT_EQ(ParseTokenizer(bad_merge, options).status().code(), StatusCode::kInvalidArgument);
  options.format = TokenizerFormat::kTiktoken;
  options.tiktoken_pattern = "\\p{L}+";
  EXPECT_EQ(ParseTokenizer("YQ== x\n", options).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(ParseTokenizer("YQ== 0\nYQ== 1\n", options).status().code(), StatusCode::kCorruption);
  options.tiktoken_pattern = "[\\p{L}";
  EXPECT_EQ(ParseTokenizer("YQ== 0\n", options).status().code(), StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, SplitBehavioursAndPrefixSpaceFollowTokenizers) {
  // Bytes a..z and space as tokens 0..26, and two merges, (a, b) then (Ġ, a): merges never
  // cross a piece, so the ids show where each behaviour cut the text.
  std::string vocab = "{";
  for (int c = 0; c < 26; ++c)
    vocab += "\"" + std::string(1, static_cast<char>('a' + c)) + "\":" + std::to_string(c) + ",";
  vocab += "\"Ġ\":26,\"ab\":27,\"Ġa\":28}";
  const auto make = [&](const std::string& pre) {
    const std::string json = R"({"model":{"type":"BPE","vocab":)" + vocab +
                             R"(,"merges":[["a","b"],["Ġ","a"]]},"pre_tokenizer":)" + pre + "}";
    TokenizerOptions options;
    Result<std::unique_ptr<Tokenizer>> tokenizer = ParseTokenizer(json, options);
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
  };
  const auto split = [](const std::string& behavior) {
    return R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"String":"b"},)"
           R"("behavior":")" +
           behavior + R"(","invert":false},{"type":"ByteLevel","use_regex":false}]})";
  };
  // "abab": Isolated cuts a|b|a|b, MergedWithPrevious ab|ab, MergedWithNext a|ba|b, Removed a|a.
  EXPECT_EQ(make(split("Isolated"))->Encode("abab"), (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(make(split("MergedWithPrevious"))->Encode("abab"), (std::vector<int32_t>{27, 27}));
  EXPECT_EQ(make(split("MergedWithNext"))->Encode("abab"), (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(make(split("Removed"))->Encode("abab"), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(make(split("Contiguous"))->Encode("abbab"), (std::vector<int32_t>{0, 1, 1, 0, 1}));
  // GPT-2's leading ByteLevel with add_prefix_space: " ab" and " a", where (a, b) merges
  // before (Ġ, a).
  EXPECT_EQ(make(R"({"type":"ByteLevel","add_prefix_space":true})")->Encode("ab a"),
            (std::vector<int32_t>{26, 27, 28}));
}

TEST(ByteTokenizerTest, IsTheBuiltInTokenizerBehindTheInterface) {
  std::unique_ptr<Tokenizer> bytes = MakeByteTokenizer();
  const std::string text = "héllo 好 😀";
  EXPECT_EQ(bytes->Encode(text), ::strider::Tokenizer::Encode(text));
  EXPECT_EQ(bytes->Decode(bytes->Encode(text)), text);
  EXPECT_EQ(bytes->Encode("a\xFF"), ::strider::Tokenizer::Encode("a\uFFFD"));
  const std::vector<int32_t> user = {token::kUser};
  EXPECT_EQ(bytes->Decode(user), "<|user|>");
  EXPECT_EQ(bytes->SpecialTokenId("<|user|>").value_or(-1), token::kUser);
  EXPECT_TRUE(bytes->IsSpecial(token::kUser));
  EXPECT_FALSE(bytes->IsSpecial('a'));
  EXPECT_EQ(bytes->VocabSize(), token::kVocabularySize);
}

TEST(StreamDecoderTest, NeverSplitsACharacterAndEqualsDecode) {
  for (const std::string& name : kReferences) {
    std::unique_ptr<Tokenizer> tokenizer = LoadReference(name);
    ASSERT_NE(tokenizer, nullptr);
    const std::string text =
        "答案是 42 😀👨‍👩‍👧‍👦 🇯🇵 — naïve ünïcödé 한국어 "
        "テキスト<|im_end|>";
    const std::vector<int32_t> ids = tokenizer->Encode(text);
    StreamDecoder decoder(*tokenizer);
    std::string streamed;
    bool held = false;
    for (int32_t id : ids) {
      const std::string piece = decoder.Push(id);
      EXPECT_TRUE(IsValidUtf8(piece)) << name;
      held = held || decoder.held_bytes() > 0;
      streamed += piece;
      EXPECT_EQ(streamed, text.substr(0, streamed.size())) << name;
    }
    streamed += decoder.Finish();
    EXPECT_EQ(streamed, text) << name;
    // With a few thousand tokens, CJK and emoji come in byte pieces: something was held back.
    EXPECT_TRUE(held) << name;
  }
  // Any ids at all, cut anywhere: the stream equals Decode, and every piece is valid UTF-8.
  std::unique_ptr<Tokenizer> tokenizer = LoadReference("bpe_llama3");
  ASSERT_NE(tokenizer, nullptr);
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int32_t> ids(rng() % 20);
    for (int32_t& id : ids)
      id = static_cast<int32_t>(rng() % static_cast<uint64_t>(tokenizer->VocabSize()));
    StreamDecoder decoder(*tokenizer);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = decoder.Push(id);
      ASSERT_TRUE(IsValidUtf8(piece));
      streamed += piece;
    }
    streamed += decoder.Finish();
    ASSERT_EQ(streamed, tokenizer->Decode(ids)) << "trial " << trial;
  }
}

std::vector<MarkerMatcher::Piece> Joined(std::vector<MarkerMatcher::Piece> pieces) {
  // Adjacent text pieces as one, so results from different cuts compare equal.
  std::vector<MarkerMatcher::Piece> out;
  for (auto& piece : pieces) {
    if (piece.marker < 0 && !out.empty() && out.back().marker < 0) {
      out.back().text += piece.text;
    } else if (piece.marker >= 0 || !piece.text.empty()) {
      out.push_back(std::move(piece));
    }
  }
  return out;
}

std::vector<MarkerMatcher::Piece> MatchInChunks(const std::vector<std::string>& markers,
                                                const std::vector<std::string>& chunks) {
  MarkerMatcher matcher(markers);
  std::vector<MarkerMatcher::Piece> pieces;
  for (const std::string& chunk : chunks) {
    for (auto& piece : matcher.Feed(chunk)) pieces.push_back(std::move(piece));
  }
  for (auto& piece : matcher.Finish()) pieces.push_back(std::move(piece));
  return Joined(std::move(pieces));
}

TEST(MarkerMatcherTest, FindsMarkersBetweenCjkAndEmojiWhateverTheCuts) {
  const std::vector<std::string> markers = {"<tool_call>", "</tool_call>", "<|im_end|>", "<tool",
                                            "停止"};
  const std::string text =
      "思考中😀<tool_call>{\"城市\": \"東京🗼\"}</tool_call>🎉完成<|im_end|>尾<tool>x<too停止";
  const std::vector<MarkerMatcher::Piece> want = {
      {"思考中😀", -1},     {"<tool_call>", 0}, {"{\"城市\": \"東京🗼\"}", -1},
      {"</tool_call>", 1}, {"🎉完成", -1},      {"<|im_end|>", 2},
      {"尾", -1},          {"<tool", 3},       {">x<too", -1},
      {"停止", 4}};
  EXPECT_EQ(MatchInChunks(markers, {text}), want);
  // Every single cut, and byte by byte: the same pieces.
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ASSERT_EQ(MatchInChunks(markers, {text.substr(0, cut), text.substr(cut)}), want) << cut;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(MatchInChunks(markers, bytes), want);
  // A marker prefix at the end is held back until it is decided, then let go as text.
  MarkerMatcher matcher(markers);
  EXPECT_EQ(Joined(matcher.Feed("好<tool_ca")), (std::vector<MarkerMatcher::Piece>{{"好", -1}}));
  EXPECT_EQ(matcher.held_bytes(), std::string("<tool_ca").size());
  EXPECT_EQ(Joined(matcher.Finish()),
            (std::vector<MarkerMatcher::Piece>{{"<tool", 3}, {"_ca", -1}}));
}

TEST(MarkerMatcherTest, WorksOnAStreamOfTokens) {
  std::unique_ptr<Tokenizer> tokenizer = LoadReference("bpe_llama3");
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<std::string> markers = {"</tool_call>", "<|im_end|>"};
  const std::string text = "调用工具🔧</tool_call>结果😀😀<|im_end|>";
  StreamDecoder decoder(*tokenizer);
  MarkerMatcher matcher(markers);
  std::vector<MarkerMatcher::Piece> pieces;
  for (int32_t id : tokenizer->Encode(text)) {
    for (auto& piece : matcher.Feed(decoder.Push(id))) {
      EXPECT_TRUE(IsValidUtf8(piece.text));
      pieces.push_back(std::move(piece));
    }
  }
  for (auto& piece : matcher.Feed(decoder.Finish())) pieces.push_back(std::move(piece));
  for (auto& piece : matcher.Finish()) pieces.push_back(std::move(piece));
  EXPECT_EQ(Joined(std::move(pieces)),
            (std::vector<MarkerMatcher::Piece>{
                {"调用工具🔧", -1}, {"</tool_call>", 0}, {"结果😀😀", -1}, {"<|im_end|>", 1}}));
}

}  // namespace
}  // namespace strider::tokenizer
