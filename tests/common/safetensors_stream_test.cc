// Header-only reads, mapped shards, element conversion and sharded checkpoints with an index
// (common/safetensors.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/safetensors.h"
#include "tests/file_contents.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::ReadFileBytes;
using strider::testing::WriteFileBytes;

namespace fs = std::filesystem;
using testing::TempDir;

TensorView ViewOf(const std::string& name, DType dtype, std::vector<int64_t> shape,
                  const std::vector<uint8_t>& bytes) {
  TensorView view;
  view.name = name;
  view.dtype = dtype;
  view.shape = std::move(shape);
  view.data = bytes.data();
  view.byte_size = bytes.size();
  return view;
}

std::vector<uint8_t> Pattern(size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7);
  return bytes;
}

TEST(SafetensorsStreamTest, MappedViewsMatchTheWholeFileRead) {
  TempDir dir;
  const std::vector<uint8_t> a = Pattern(4 * 3 * 5, 1), b = Pattern(2 * 7, 2), c = Pattern(9, 3);
  const std::string path = dir.Sub("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {ViewOf("a", DType::kF32, {3, 5}, a),
                                ViewOf("b", DType::kBF16, {7}, b), ViewOf("c", DType::kU8, {9}, c)},
                               {{"format", "pt"}})
                  .ok());
  Result<SafetensorsContents> whole = ReadSafetensors(path);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  Result<SafetensorsHeader> header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->metadata.at("format"), "pt");
  EXPECT_EQ(header->file_size, fs::file_size(path));
  ASSERT_EQ(header->entries.size(), 3u);
  // File order: largest element first, then by name.
  EXPECT_EQ(header->entries[0].name, "a");
  EXPECT_EQ(header->entries[1].name, "b");
  EXPECT_EQ(header->entries[0].Elements(), 15u);

  Result<std::unique_ptr<MappedSafetensors>> mapped = MappedSafetensors::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  for (const SafetensorsEntry& entry : (*mapped)->header().entries) {
    const LoadedTensor& expected = whole->tensors.at(entry.name);
    std::string_view bytes = (*mapped)->Bytes(entry);
    ASSERT_EQ(bytes.size(), expected.bytes.size()) << entry.name;
    EXPECT_EQ(std::memcmp(bytes.data(), expected.bytes.data(), bytes.size()), 0) << entry.name;
    (*mapped)->Release(entry);
    // Released pages come back from the file on the next access.
    EXPECT_EQ(std::memcmp((*mapped)->Bytes(entry).data(), expected.bytes.data(), bytes.size()), 0);
  }
  EXPECT_EQ((*mapped)->header().Find("c")->dtype, DType::kU8);
  EXPECT_EQ((*mapped)->header().Find("d"), nullptr);
}

TEST(SafetensorsStreamTest, HeaderReadRefusesATruncatedShardAndAMalformedHeader) {
  TempDir dir;
  const std::vector<uint8_t> a = Pattern(4096, 5);
  const std::string path = dir.Sub("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {ViewOf("layer.weight", DType::kF32, {1024}, a)}).ok());
  const std::string bytes = ReadFileBytes(path);

  WriteFileBytes(dir.Sub("short.safetensors"), bytes.substr(0, bytes.size() - 100));
  Result<SafetensorsHeader> truncated = ReadSafetensorsHeader(dir.Sub("short.safetensors"));
  ASSERT_FALSE(truncated.ok());
  EXPECT_TRUE(truncated.status().IsCorruption());
  EXPECT_NE(truncated.status().message().find("layer.weight"), std::string::npos)
      << truncated.status().ToString();
  EXPECT_FALSE(MappedSafetensors::Open(dir.Sub("short.safetensors")).ok());

  std::string broken = bytes;
  broken[9] = '[';  // the header's JSON no longer parses
  WriteFileBytes(dir.Sub("broken.safetensors"), broken);
  Result<SafetensorsHeader> malformed = ReadSafetensorsHeader(dir.Sub("broken.safetensors"));
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.status().message().find("not valid JSON"), std::string::npos)
      << malformed.status().ToString();

  WriteFileBytes(dir.Sub("tiny.safetensors"), "abc");
  EXPECT_TRUE(ReadSafetensorsHeader(dir.Sub("tiny.safetensors")).status().IsCorruption());
  EXPECT_TRUE(ReadSafetensorsHeader(dir.Sub("absent.safetensors")).status().IsNotFound());
}

TEST(SafetensorsStreamTest, ConvertsEveryReadableDtypeToFloat) {
  // bf16: 1.0 = 0x3f80, -2.5 = 0xc020; fp16: 1.0 = 0x3c00, -2.5 = 0xc100, the smallest
  // subnormal 0x0001 = 2^-24, infinity 0x7c00.
  const uint16_t bf16[] = {0x3f80, 0xc020};
  const uint16_t fp16[] = {0x3c00, 0xc100, 0x0001, 0x7c00};
  float out[4];
  ASSERT_TRUE(ConvertElements(DType::kBF16, bf16, 2, DType::kF32, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  ASSERT_TRUE(ConvertElements(DType::kF16, fp16, 4, DType::kF32, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[3], std::numeric_limits<float>::infinity());

  const double f64[] = {0.125, -3.0};
  double wide[2];
  ASSERT_TRUE(ConvertElements(DType::kF64, f64, 2, DType::kF64, wide).ok());
  EXPECT_EQ(wide[1], -3.0);
  const float f32[] = {0.5f, 7.0f};
  ASSERT_TRUE(ConvertElements(DType::kF32, f32, 2, DType::kF64, wide).ok());
  EXPECT_EQ(wide[0], 0.5);
  const int64_t i64[] = {-4, 1LL << 40};
  ASSERT_TRUE(ConvertElements(DType::kI64, i64, 2, DType::kF64, wide).ok());
  EXPECT_EQ(wide[0], -4.0);
  EXPECT_EQ(wide[1], std::ldexp(1.0, 40));
  const int8_t i8[] = {-128, 127};
  ASSERT_TRUE(ConvertElements(DType::kI8, i8, 2, DType::kF32, out).ok());
  EXPECT_EQ(out[0], -128.0f);
  const uint8_t u8[] = {255, 3};
  ASSERT_TRUE(ConvertElements(DType::kU8, u8, 2, DType::kF32, out).ok());
  EXPECT_EQ(out[0], 255.0f);

  // Unaligned sources: a tensor in a mapped file may start at any byte.
  uint8_t unaligned[1 + sizeof(float)];
  const float value = 1.75f;
  std::memcpy(unaligned + 1, &value, sizeof(value));
  ASSERT_TRUE(ConvertElements(DType::kF32, unaligned + 1, 1, DType::kF32, out).ok());
  EXPECT_EQ(out[0], 1.75f);

  const bool flags[] = {true};
  Status refused = ConvertElements(DType::kBool, flags, 1, DType::kF32, out);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("BOOL"), std::string::npos);
  EXPECT_FALSE(ConvertElements(DType::kF32, f32, 2, DType::kBF16, out).ok());
}

TEST(SafetensorsStreamTest, ShardedWriteSplitsBySizeAndIndexesEveryTensor) {
  TempDir dir;
  const std::vector<uint8_t> a = Pattern(400, 1), b = Pattern(400, 2), c = Pattern(1000, 3),
                             d = Pattern(8, 4);
  std::vector<TensorView> views = {
      ViewOf("a", DType::kF32, {100}, a), ViewOf("b", DType::kF32, {100}, b),
      ViewOf("c", DType::kBF16, {500}, c), ViewOf("d", DType::kI64, {1}, d)};
  Result<SafetensorsIndex> written = WriteShardedSafetensors(dir.path(), views, 800);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  // a and b fill the first shard; c is larger than the limit and gets one to itself.
  EXPECT_EQ(written->weight_map.at("a"), "model-00001-of-00003.safetensors");
  EXPECT_EQ(written->weight_map.at("b"), "model-00001-of-00003.safetensors");
  EXPECT_EQ(written->weight_map.at("c"), "model-00002-of-00003.safetensors");
  EXPECT_EQ(written->weight_map.at("d"), "model-00003-of-00003.safetensors");

  Result<SafetensorsIndex> index = ReadSafetensorsIndex(dir.Sub(kSafetensorsIndexName));
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->weight_map, written->weight_map);
  EXPECT_EQ(index->total_size, 400u + 400u + 1000u + 8u);
  EXPECT_EQ(index->total_parameters, 100u + 100u + 500u + 1u);
  ASSERT_EQ(index->Shards().size(), 3u);
  uint64_t bytes = 0;
  for (const std::string& shard : index->Shards()) {
    Result<SafetensorsHeader> header = ReadSafetensorsHeader(dir.Sub(shard));
    ASSERT_TRUE(header.ok()) << header.status().ToString();
    for (const SafetensorsEntry& entry : header->entries) {
      EXPECT_EQ(index->weight_map.at(entry.name), shard);
      bytes += entry.end - entry.begin;
    }
  }
  EXPECT_EQ(bytes, *index->total_size);

  TempDir single;
  ASSERT_TRUE(WriteShardedSafetensors(single.path(), views, 1 << 20).ok());
  EXPECT_TRUE(fs::exists(single.Sub("model.safetensors")));
  EXPECT_FALSE(fs::exists(single.Sub(kSafetensorsIndexName)));

  views.push_back(ViewOf("a", DType::kF32, {100}, a));
  EXPECT_FALSE(WriteShardedSafetensors(single.path(), views, 1 << 20).ok());
}

TEST(SafetensorsStreamTest, ProducedTensorsMustFillTheBytesTheHeaderPromised) {
  TempDir dir;
  std::vector<TensorView> tensors = {ViewOf("a", DType::kF32, {3}, {}),
                                     ViewOf("b", DType::kU8, {5}, {})};
  tensors[0].byte_size = 12;
  tensors[1].byte_size = 5;
  const std::vector<uint8_t> a = Pattern(12, 1), b = Pattern(5, 2);
  auto produce = [&](const TensorView& view,
                     const std::function<Status(std::string_view)>& append) {
    const std::vector<uint8_t>& bytes = view.name == "a" ? a : b;
    // Two appends per tensor: producers write slices.
    STRIDER_RETURN_IF_ERROR(
        append(std::string_view(reinterpret_cast<const char*>(bytes.data()), 2)));
    return append(
        std::string_view(reinterpret_cast<const char*>(bytes.data()) + 2, bytes.size() - 2));
  };
  ASSERT_TRUE(WriteSafetensorsProduced(dir.Sub("p.safetensors"), tensors, produce).ok());
  ASSERT_TRUE(WriteSafetensors(dir.Sub("v.safetensors"),
                               {ViewOf("a", DType::kF32, {3}, a), ViewOf("b", DType::kU8, {5}, b)})
                  .ok());
  EXPECT_EQ(ReadFileBytes(dir.Sub("p.safetensors")), ReadFileBytes(dir.Sub("v.safetensors")));

  auto short_by_one = [&](const TensorView& view,
                          const std::function<Status(std::string_view)>& append) {
    return append(std::string(view.byte_size - 1, 'x'));
  };
  Status status = WriteSafetensorsProduced(dir.Sub("s.safetensors"), tensors, short_by_one);
  EXPECT_NE(status.message().find("produced 11 of its 12 bytes"), std::string::npos)
      << status.ToString();
  EXPECT_FALSE(fs::exists(dir.Sub("s.safetensors")));
  auto one_too_many = [&](const TensorView& view,
                          const std::function<Status(std::string_view)>& append) {
    return append(std::string(view.byte_size + 1, 'x'));
  };
  EXPECT_FALSE(WriteSafetensorsProduced(dir.Sub("s.safetensors"), tensors, one_too_many).ok());
  EXPECT_FALSE(fs::exists(dir.Sub("s.safetensors")));
}

TEST(SafetensorsStreamTest, IndexReadRefusesShardsOutsideItsDirectoryAndBadMetadata) {
  TempDir dir;
  const std::string path = dir.Sub(kSafetensorsIndexName);
  WriteFileBytes(path, R"({"metadata": {"total_size": "1234"}, "weight_map": {"a": "m.safetensors"}})");
  Result<SafetensorsIndex> index = ReadSafetensorsIndex(path);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->total_size, 1234u);
  EXPECT_FALSE(index->total_parameters.has_value());

  WriteFileBytes(path, R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
  Status outside = ReadSafetensorsIndex(path).status();
  EXPECT_TRUE(outside.IsCorruption());
  EXPECT_NE(outside.message().find("'a'"), std::string::npos) << outside.ToString();
  WriteFileBytes(path, R"({"metadata": {"total_size": -1}, "weight_map": {}})");
  EXPECT_TRUE(ReadSafetensorsIndex(path).status().IsCorruption());
  WriteFileBytes(path, R"({"weight_map": {"a": "x", "a": "y"}})");
  EXPECT_TRUE(ReadSafetensorsIndex(path).status().IsCorruption());
  WriteFileBytes(path, R"({"metadata": {}})");
  EXPECT_TRUE(ReadSafetensorsIndex(path).status().IsCorruption());
}

}  // namespace
}  // namespace strider
