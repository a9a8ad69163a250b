#include "common/tokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

namespace strider {
namespace {

std::string AllBytes() {
  std::string text;
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  return text;
}

TEST(Tokenizer, EveryByteMapsToItsOwnId) {
  std::vector<int32_t> ids = Tokenizer::Encode(AllBytes());
  ASSERT_EQ(ids.size(), 256u);
  for (int32_t b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
}

TEST(Tokenizer, RoundTripsMultibyteUtf8) {
  using namespace std::string_literals;
  const std::string text = "héllo wörld — 日本語 🙂 \t\n\r\0end"s;
  ASSERT_EQ(text.back(), 'd');
  std::vector<int32_t> ids = Tokenizer::Encode(text);
  EXPECT_EQ(ids.size(), text.size());  // one id per byte, not per code point
  EXPECT_EQ(Tokenizer::Decode(ids), text);
}

TEST(Tokenizer, RoundTripsInvalidUtf8Unchanged) {
  // Lone continuation byte, truncated 3-byte sequence, overlong encoding, surrogate, 0xff.
  const std::string text = "a\x80" "b\xe2\x82" "c\xc0\xaf" "\xed\xa0\x80" "\xff\xfe";
  ASSERT_EQ(text.size(), 13u);
  EXPECT_EQ(Tokenizer::Decode(Tokenizer::Encode(text)), text);
}

TEST(Tokenizer, RoundTripsRandomBytes) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(static_cast<size_t>(trial * 7), '\0');
    for (char& c : text) c = static_cast<char>(byte(rng));
    ASSERT_EQ(Tokenizer::Decode(Tokenizer::Encode(text)), text) << "trial " << trial;
  }
}

TEST(Tokenizer, EncodeNeverProducesSpecialIds) {
  // Text that spells special tokens stays plain bytes, so user input cannot forge a role marker.
  const std::string text = "<|user|><|tool_call|><|id:300|>" + AllBytes();
  for (int32_t id : Tokenizer::Encode(text)) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, token::kByteCount);
    EXPECT_FALSE(Tokenizer::IsSpecial(id));
  }
}

TEST(Tokenizer, DecodeRendersSpecialTokensByName) {
  std::vector<int32_t> ids = {token::kBeginOfText, token::kUser};
  for (int32_t id : Tokenizer::Encode("hi")) ids.push_back(id);
  ids.insert(ids.end(), {token::kEndOfTurn, token::kModel, token::kToolCall, token::kToolCallEnd,
                         token::kToolResult, token::kImageStart, token::kImagePatch,
                         token::kImageEnd, token::kSystem, token::kPad, token::kEndOfText});
  EXPECT_EQ(Tokenizer::Decode(ids),
            "<|begin_of_text|><|user|>hi<|end_of_turn|><|model|><|tool_call|><|tool_call_end|>"
            "<|tool_result|><|image_start|><|image_patch|><|image_end|><|system|><|pad|>"
            "<|end_of_text|>");
}

TEST(Tokenizer, DecodeShowsReservedOutOfVocabularyAndNegativeIds) {
  std::vector<int32_t> ids = {token::kFirstReserved, token::kVocabularySize - 1,
                              token::kVocabularySize, 163839, -1, -2147483647 - 1};
  EXPECT_EQ(Tokenizer::Decode(ids),
            "<|id:269|><|id:287|><|id:288|><|id:163839|><|id:-1|><|id:-2147483648|>");
  // Nothing is dropped between ordinary bytes either.
  std::vector<int32_t> mixed = {'a', -7, 'b'};
  EXPECT_EQ(Tokenizer::Decode(mixed), "a<|id:-7|>b");
}

TEST(Tokenizer, SpecialIdAndSpecialNameAreInverse) {
  std::set<std::string> names;
  for (int32_t id = token::kByteCount; id < token::kFirstReserved; ++id) {
    std::string_view name = Tokenizer::SpecialName(id);
    ASSERT_FALSE(name.empty()) << id;
    EXPECT_TRUE(names.insert(std::string(name)).second) << "duplicate name " << name;
    EXPECT_EQ(Tokenizer::SpecialId(name), id) << name;
  }
  EXPECT_EQ(names.size(), 13u);
  EXPECT_EQ(Tokenizer::SpecialId("user"), token::kUser);
  EXPECT_EQ(Tokenizer::SpecialId("tool_call_end"), token::kToolCallEnd);
  EXPECT_EQ(Tokenizer::SpecialName(token::kImagePatch), "image_patch");
}

TEST(Tokenizer, UnknownNamesAndUnnamedIdsHaveNoMapping) {
  EXPECT_EQ(Tokenizer::SpecialId("User"), std::nullopt);
  EXPECT_EQ(Tokenizer::SpecialId("<|user|>"), std::nullopt);
  EXPECT_EQ(Tokenizer::SpecialId(""), std::nullopt);
  EXPECT_EQ(Tokenizer::SpecialId("id:300"), std::nullopt);
  for (int32_t id : {-1, 0, int32_t{'a'}, 255, token::kFirstReserved, token::kVocabularySize, 100000}) {
    EXPECT_TRUE(Tokenizer::SpecialName(id).empty()) << id;
  }
}

}  // namespace
}  // namespace strider
