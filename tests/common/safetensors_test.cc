#include "common/safetensors.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tests/scratch_dir.h"

namespace strider {
namespace {

namespace fs = std::filesystem;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void WriteBytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string LittleEndian64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

// A file assembled by hand: length prefix, header text, data bytes.
std::string RawFile(std::string_view header, std::string_view data) {
  return LittleEndian64(header.size()) + std::string(header) + std::string(data);
}

template <typename T>
std::string BytesOf(std::initializer_list<T> values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), values.begin(), bytes.size());
  return bytes;
}

// A tensor to write together with the bytes it points to.
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;

  TensorView View() const { return {name, dtype, shape, bytes.data(), bytes.size()}; }
};

std::vector<TensorView> Views(const std::vector<OwnedTensor>& tensors) {
  std::vector<TensorView> views;
  for (const OwnedTensor& tensor : tensors) views.push_back(tensor.View());
  return views;
}

// One tensor of every dtype, with the awkward shapes: scalar, zero-size, higher rank.
std::vector<OwnedTensor> SampleTensors() {
  return {
      {"f64", DType::kF64, {3}, BytesOf<double>({2.5, -0.125, 1024.0})},
      {"f32", DType::kF32, {2, 3}, BytesOf<float>({-1.5f, 0.0f, 2.25f, 3.0f, 4.0f, 5.0f})},
      // bfloat16 1.5 and -2.0; float16 scalar 0.5.
      {"bf16", DType::kBF16, {2}, BytesOf<uint16_t>({0x3FC0, 0xC000})},
      {"f16", DType::kF16, {}, BytesOf<uint16_t>({0x3800})},
      {"i64", DType::kI64, {2}, BytesOf<int64_t>({-3, int64_t{1} << 40})},
      {"i32", DType::kI32, {1, 2}, BytesOf<int32_t>({-7, 2147483647})},
      {"i16", DType::kI16, {2}, BytesOf<int16_t>({-32768, 5})},
      {"i8", DType::kI8, {3}, BytesOf<int8_t>({-128, 0, 127})},
      {"u8", DType::kU8, {2}, BytesOf<uint8_t>({255, 0})},
      {"bool", DType::kBool, {3}, BytesOf<uint8_t>({1, 0, 1})},
      {"empty", DType::kF32, {0, 4}, ""},
      {"empty3", DType::kI16, {2, 0, 3}, ""},
  };
}

const std::map<std::string, std::string> kMetadata = {{"format", "pt"}, {"note", "héllo"}};

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = scratch_.path(); }
  // A test may leave the directory read-only; scratch_ removes it after this.
  void TearDown() override { ::chmod(dir_.c_str(), 0755); }

  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  std::vector<std::string> DirectoryEntries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  // Writes `bytes` as a file, reads it, and expects a Corruption naming the file and every
  // fragment.
  void ExpectCorrupt(std::string_view bytes, std::initializer_list<std::string_view> fragments) {
    const std::string path = Path("bad.safetensors");
    WriteBytes(path, bytes);
    Result<SafetensorsContents> result = ReadSafetensors(path);
    ASSERT_FALSE(result.ok()) << "accepted a corrupt file";
    Status status = result.status();
    EXPECT_TRUE(status.IsCorruption()) << status.ToString();
    EXPECT_NE(status.message().find(path), std::string::npos) << status.ToString();
    for (std::string_view fragment : fragments) {
      EXPECT_NE(status.message().find(fragment), std::string::npos)
          << "missing '" << fragment << "' in " << status.ToString();
    }
  }

  testing::TempDir scratch_;
  std::string dir_;
};

void ExpectSameContents(const std::vector<OwnedTensor>& expected,
                        const SafetensorsContents& contents) {
  ASSERT_EQ(contents.tensors.size(), expected.size());
  for (const OwnedTensor& tensor : expected) {
    auto it = contents.tensors.find(tensor.name);
    ASSERT_NE(it, contents.tensors.end()) << tensor.name;
    EXPECT_EQ(it->second.dtype, tensor.dtype) << tensor.name;
    EXPECT_EQ(it->second.shape, tensor.shape) << tensor.name;
    EXPECT_EQ(std::string(it->second.bytes.begin(), it->second.bytes.end()), tensor.bytes)
        << tensor.name;
  }
}

TEST(DType, NamesParseBackAndSizesMatchSafetensors) {
  const std::map<std::string, size_t> expected = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  for (const auto& [name, size] : expected) {
    Result<DType> dtype = ParseDType(name);
    ASSERT_TRUE(dtype.ok()) << name;
    EXPECT_EQ(DTypeName(*dtype), name);
    EXPECT_EQ(DTypeSize(*dtype), size) << name;
  }
  Result<DType> unknown = ParseDType("f32");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown dtype 'f32'"), std::string::npos);
}

TEST_F(SafetensorsTest, RoundTripsEveryDTypeScalarAndZeroSizeShapesWithMetadata) {
  std::vector<OwnedTensor> tensors = SampleTensors();
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, Views(tensors), kMetadata).ok());
  Result<SafetensorsContents> contents = ReadSafetensors(path);
  ASSERT_TRUE(contents.ok()) << contents.status().ToString();
  ExpectSameContents(tensors, *contents);
  EXPECT_EQ(contents->metadata, kMetadata);
  EXPECT_EQ(DirectoryEntries(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, RoundTripsAnEmptyFile) {
  const std::string path = Path("empty.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}).ok());
  Result<SafetensorsContents> contents = ReadSafetensors(path);
  ASSERT_TRUE(contents.ok()) << contents.status().ToString();
  EXPECT_TRUE(contents->tensors.empty());
  EXPECT_TRUE(contents->metadata.empty());
}

TEST_F(SafetensorsTest, HeaderIsPaddedAndEveryTensorAlignedToItsElementSize) {
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, Views(SampleTensors()), kMetadata).ok());
  std::string bytes = ReadBytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(header_size % 8, 0u);
  std::string header_text = bytes.substr(8, header_size);
  // Padding is spaces after the JSON, as the reference writer does.
  EXPECT_EQ(header_text.find_last_not_of(' '), header_text.rfind('}'));
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(header_text);
  EXPECT_EQ(header.begin().key(), "__metadata__");
  size_t previous_element_size = 8;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    size_t element_size = DTypeSize(*ParseDType(entry["dtype"].get<std::string>()));
    uint64_t begin = entry["data_offsets"][0].get<uint64_t>();
    EXPECT_EQ((8 + header_size + begin) % element_size, 0u) << name;
    // Larger elements first, so alignment holds without padding between tensors.
    EXPECT_LE(element_size, previous_element_size) << name;
    previous_element_size = element_size;
  }
}

TEST_F(SafetensorsTest, OutputDoesNotDependOnTheOrderTensorsAreGiven) {
  std::vector<OwnedTensor> tensors = SampleTensors();
  ASSERT_TRUE(WriteSafetensors(Path("a"), Views(tensors), kMetadata).ok());
  std::reverse(tensors.begin(), tensors.end());
  ASSERT_TRUE(WriteSafetensors(Path("b"), Views(tensors), kMetadata).ok());
  EXPECT_EQ(ReadBytes(Path("a")), ReadBytes(Path("b")));
}

TEST_F(SafetensorsTest, ReadsAHandWrittenValidFile) {
  // The baseline the corruption cases below depart from, so each of them fails for its own
  // reason and not for a mistake in the template.
  const std::string path = Path("hand.safetensors");
  WriteBytes(path, RawFile(R"({"__metadata__":{"k":"v"},)"
                           R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})",
                           std::string(16, '\x01')));
  Result<SafetensorsContents> contents = ReadSafetensors(path);
  ASSERT_TRUE(contents.ok()) << contents.status().ToString();
  EXPECT_EQ(contents->tensors.at("w").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(contents->metadata.at("k"), "v");
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  Result<SafetensorsContents> result = ReadSafetensors(Path("absent.safetensors"));
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(result.status().IsNotFound()) << result.status().ToString();
  EXPECT_NE(result.status().message().find("absent.safetensors"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsBrokenLengthPrefix) {
  ExpectCorrupt("", {"0 bytes, shorter than the 8-byte header length"});
  ExpectCorrupt(std::string("\x10\x00\x00\x00\x00", 5),
                {"5 bytes, shorter than the 8-byte header length"});
  ExpectCorrupt(LittleEndian64(uint64_t{1} << 40) + "{}", {"exceeds the limit"});
  ExpectCorrupt(LittleEndian64(~uint64_t{0}) + "{}", {"exceeds the limit"});
  ExpectCorrupt(LittleEndian64(1000) + std::string(20, ' '), {"header length 1000 runs past the end"});
  ExpectCorrupt(LittleEndian64(3) + "{}", {"header length 3 runs past the end of the file (10 bytes)"});
}

TEST_F(SafetensorsTest, RejectsHeadersThatAreNotAJsonObject) {
  ExpectCorrupt(RawFile(R"({"w": {"dtype": "F32",)", ""), {"not valid JSON"});
  ExpectCorrupt(RawFile("", ""), {"not valid JSON"});
  ExpectCorrupt(RawFile(std::string("{\"w\0\": 1}", 10), ""), {"not valid JSON"});
  ExpectCorrupt(RawFile("{\"\xff\": {}}", ""), {"not valid JSON"});  // not UTF-8
  ExpectCorrupt(RawFile("[1, 2]", ""), {"header is a JSON array, expected an object"});
  ExpectCorrupt(RawFile("\"text\"", ""), {"header is a JSON string, expected an object"});
  ExpectCorrupt(RawFile(R"({"w": 3})", ""), {"tensor 'w'", "number, expected an object"});
  ExpectCorrupt(RawFile(R"({"w": null})", ""), {"tensor 'w'", "null, expected an object"});
}

TEST_F(SafetensorsTest, RejectsBadEntryFields) {
  const std::string data(16, '\0');
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,16]}})", data),
                {"tensor 'w'", "unknown dtype 'F8_E4M3'"});
  ExpectCorrupt(RawFile(R"({"w":{"dtype":4,"shape":[2,2],"data_offsets":[0,16]}})", data),
                {"tensor 'w'", "dtype is a JSON number"});
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[2,-2],"data_offsets":[0,16]}})", data),
                {"tensor 'w'", "shape[1] is -2, a negative dimension"});
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[2.0,2],"data_offsets":[0,16]}})", data),
                {"tensor 'w'", "shape[0] is 2.0, expected a non-negative integer"});
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})", data),
                {"tensor 'w'", "shape is a JSON number"});
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[2,2]}})", data),
                {"tensor 'w'", "missing field 'data_offsets'"});
  ExpectCorrupt(
      RawFile(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16],"extra":1}})", data),
      {"tensor 'w'", "unknown field 'extra'"});
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0]}})", data),
                {"tensor 'w'", "expected [begin, end]"});
  // Shapes whose byte size does not fit in 64 bits must not wrap around to a small number.
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],)"
                        R"("data_offsets":[0,0]}})",
                        ""),
                {"tensor 'w'", "too large"});
}

TEST_F(SafetensorsTest, RejectsBadDataOffsets) {
  const std::string data(16, '\0');
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", data),
                {"tensor 'w'", "out of range", "16 bytes"});
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[-16,0]}})", data),
                {"tensor 'w'", "out of range"});
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", data),
                {"tensor 'w'", "end before they begin"});
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data),
                {"tensor 'w'", "span 16 bytes", "needs 12 bytes"});
  ExpectCorrupt(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        std::string(12, '\0')),
                {"tensor 'b'", "overlap tensor 'a'"});
  ExpectCorrupt(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                        std::string(12, '\0')),
                {"tensor 'b'", "gap of 4 bytes"});
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        std::string(8, '\0')),
                {"tensor 'w'", "gap of 4 bytes"});
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                        std::string(20, '\0')),
                {"4 trailing bytes after the last tensor ('w')"});
  ExpectCorrupt(RawFile("{}", "abcd"), {"4 trailing bytes"});
}

TEST_F(SafetensorsTest, RejectsDuplicateKeys) {
  ExpectCorrupt(RawFile(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                        std::string(16, '\0')),
                {"duplicate key 'w'", "two tensors of the same name"});
  ExpectCorrupt(
      RawFile(R"({"w":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
              std::string(8, '\0')),
      {"duplicate key 'dtype'"});
}

TEST_F(SafetensorsTest, RejectsBadMetadata) {
  const std::string tensor = R"("w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  ExpectCorrupt(RawFile(R"({"__metadata__":{"k":1},)" + tensor + "}", "x"),
                {"__metadata__ value of 'k' is a JSON number, expected a string"});
  ExpectCorrupt(RawFile(R"({"__metadata__":["k"],)" + tensor + "}", "x"),
                {"__metadata__ is a JSON array"});
}

TEST_F(SafetensorsTest, RejectsEveryTruncationOfAValidFile) {
  const std::string path = Path("model.safetensors");
  std::vector<OwnedTensor> tensors = SampleTensors();
  std::string big(3000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31);
  tensors.push_back({"big", DType::kU8, {3000}, big});
  ASSERT_TRUE(WriteSafetensors(path, Views(tensors), kMetadata).ok());
  const std::string bytes = ReadBytes(path);
  ASSERT_GT(bytes.size(), 3000u);
  const std::string cut_path = Path("cut.safetensors");
  int cuts = 0;
  for (size_t size = 0; size < bytes.size(); size += 97, ++cuts) {
    WriteBytes(cut_path, std::string_view(bytes).substr(0, size));
    Result<SafetensorsContents> result = ReadSafetensors(cut_path);
    EXPECT_FALSE(result.ok()) << "accepted a file cut to " << size << " of " << bytes.size();
    EXPECT_TRUE(result.status().IsCorruption()) << result.status().ToString();
  }
  EXPECT_GT(cuts, 30);
}

TEST_F(SafetensorsTest, InMemoryBytesAreTheFileBytesAndDecodeAsTheFileReads) {
  std::vector<OwnedTensor> tensors = SampleTensors();
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, Views(tensors), kMetadata).ok());
  Result<std::string> bytes = EncodeSafetensors(Views(tensors), kMetadata);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*bytes, ReadBytes(path));
  Result<SafetensorsContents> decoded = DecodeSafetensors(*bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ExpectSameContents(tensors, *decoded);
  EXPECT_EQ(decoded->metadata, kMetadata);
  // Encoding writes nothing beside the file already there.
  EXPECT_EQ(DirectoryEntries(), std::vector<std::string>{"model.safetensors"});
  // Arguments the file writer refuses are refused in memory too.
  tensors.push_back(tensors.front());
  EXPECT_TRUE(EncodeSafetensors(Views(tensors)).status().IsInvalidArgument());
}

TEST_F(SafetensorsTest, DecodeRejectsEveryTruncationAndNamesTheBuffer) {
  std::vector<OwnedTensor> tensors = SampleTensors();
  std::string big(3000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31);
  tensors.push_back({"big", DType::kU8, {3000}, big});
  Result<std::string> bytes = EncodeSafetensors(Views(tensors), kMetadata);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  int cuts = 0;
  for (size_t size = 0; size < bytes->size(); size += 97, ++cuts) {
    Result<SafetensorsContents> result =
        DecodeSafetensors(std::string_view(*bytes).substr(0, size), "weights v3");
    ASSERT_FALSE(result.ok()) << "accepted a buffer cut to " << size << " of " << bytes->size();
    EXPECT_TRUE(result.status().IsCorruption()) << result.status().ToString();
    EXPECT_NE(result.status().message().find("weights v3"), std::string::npos)
        << result.status().ToString();
  }
  EXPECT_GT(cuts, 30);
}

TEST_F(SafetensorsTest, SurvivesEveryChangedHeaderByte) {
  // Any header byte replaced: the reader must return an error or a self-consistent result,
  // never crash or return tensors whose bytes disagree with their shapes. A small file keeps
  // the number of cases (header bytes times replacements) to a few hundred.
  const std::string path = Path("model.safetensors");
  std::vector<OwnedTensor> tensors = {
      {"a", DType::kF32, {2}, BytesOf<float>({1, 2})},
      {"b", DType::kI8, {}, BytesOf<int8_t>({3})},
      {"c", DType::kU8, {0}, ""}};
  ASSERT_TRUE(WriteSafetensors(path, Views(tensors), {{"k", "v"}}).ok());
  const std::string bytes = ReadBytes(path);
  const size_t header_end = 8 + static_cast<uint8_t>(bytes[0]);
  ASSERT_LT(header_end, bytes.size());
  ASSERT_EQ(bytes[1], '\0');
  const std::string mutated_path = Path("mutated.safetensors");
  int accepted = 0;
  for (size_t i = 0; i < header_end; ++i) {
    for (char replacement : {'\0', '9', '"'}) {
      std::string mutated = bytes;
      if (mutated[i] == replacement) continue;
      mutated[i] = replacement;
      WriteBytes(mutated_path, mutated);
      Result<SafetensorsContents> result = ReadSafetensors(mutated_path);
      if (!result.ok()) continue;
      ++accepted;
      for (const auto& [name, tensor] : result->tensors) {
        uint64_t elements = 1;
        for (int64_t dim : tensor.shape) elements *= static_cast<uint64_t>(dim);
        EXPECT_EQ(tensor.bytes.size(), elements * DTypeSize(tensor.dtype))
            << "byte " << i << " -> " << static_cast<int>(replacement) << ", tensor " << name;
      }
    }
  }
  // Changes inside names and metadata values are legitimate files; most others are not.
  EXPECT_GT(accepted, 0);
}

TEST_F(SafetensorsTest, ReplacesAnExistingFile) {
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, Views(SampleTensors()), kMetadata).ok());
  std::vector<OwnedTensor> second = {{"only", DType::kI32, {1}, BytesOf<int32_t>({42})}};
  ASSERT_TRUE(WriteSafetensors(path, Views(second)).ok());
  Result<SafetensorsContents> contents = ReadSafetensors(path);
  ASSERT_TRUE(contents.ok()) << contents.status().ToString();
  ExpectSameContents(second, *contents);
  EXPECT_TRUE(contents->metadata.empty());
  EXPECT_EQ(DirectoryEntries(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, RejectedArgumentsLeaveTheOldFileIntact) {
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, Views(SampleTensors()), kMetadata).ok());
  const std::string before = ReadBytes(path);
  const float values[3] = {1, 2, 3};

  std::vector<TensorView> wrong_size = {{"w", DType::kF32, {4}, values, sizeof(values)}};
  Status status = WriteSafetensors(path, wrong_size);
  EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
  EXPECT_NE(status.message().find("tensor 'w': byte_size is 12, but shape [4] of F32 needs 16"),
            std::string::npos)
      << status.ToString();

  std::vector<TensorView> duplicate = {{"w", DType::kF32, {3}, values, sizeof(values)},
                                       {"w", DType::kF32, {3}, values, sizeof(values)}};
  status = WriteSafetensors(path, duplicate);
  EXPECT_NE(status.message().find("tensor 'w': duplicate tensor name"), std::string::npos)
      << status.ToString();

  std::vector<TensorView> negative = {{"w", DType::kF32, {-1, -3}, values, sizeof(values)}};
  status = WriteSafetensors(path, negative);
  EXPECT_NE(status.message().find("negative dimension"), std::string::npos) << status.ToString();

  std::vector<TensorView> null_data = {{"w", DType::kF32, {3}, nullptr, sizeof(values)}};
  status = WriteSafetensors(path, null_data);
  EXPECT_NE(status.message().find("data is null"), std::string::npos) << status.ToString();

  std::vector<TensorView> reserved = {{"__metadata__", DType::kF32, {3}, values, sizeof(values)}};
  status = WriteSafetensors(path, reserved);
  EXPECT_NE(status.message().find("reserved"), std::string::npos) << status.ToString();

  std::vector<TensorView> not_utf8 = {{"w\xff", DType::kF32, {3}, values, sizeof(values)}};
  status = WriteSafetensors(path, not_utf8);
  EXPECT_NE(status.message().find("not valid UTF-8"), std::string::npos) << status.ToString();

  EXPECT_EQ(ReadBytes(path), before);
  EXPECT_EQ(DirectoryEntries(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, FailedDataWriteLeavesTheOldFileAndNoTemporary) {
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, Views(SampleTensors()), kMetadata).ok());
  const std::string before = ReadBytes(path);
  // Memory the kernel cannot read: write(2) fails with EFAULT in the middle of the data, after
  // the temporary file has been created and partly written. Works as root, unlike permissions.
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* unreadable = ::mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(unreadable, MAP_FAILED);
  const double good[2] = {1, 2};
  std::vector<TensorView> views = {{"a_good", DType::kF64, {2}, good, sizeof(good)},
                                   {"b_unreadable", DType::kU8, {static_cast<int64_t>(page)},
                                    unreadable, page}};
  Status status = WriteSafetensors(path, views);
  ::munmap(unreadable, page);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kIoError) << status.ToString();
  EXPECT_NE(status.message().find("b_unreadable"), std::string::npos) << status.ToString();
  EXPECT_EQ(ReadBytes(path), before);
  EXPECT_EQ(DirectoryEntries(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, UnwritableDirectoryLeavesTheOldFileIntact) {
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, Views(SampleTensors()), kMetadata).ok());
  const std::string before = ReadBytes(path);
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root, which permission bits do not stop; "
                    "FailedDataWriteLeavesTheOldFileAndNoTemporary covers the failure path";
  }
  ASSERT_EQ(::chmod(dir_.c_str(), 0555), 0);
  std::vector<OwnedTensor> second = {{"only", DType::kI32, {1}, BytesOf<int32_t>({42})}};
  Status status = WriteSafetensors(path, Views(second));
  ::chmod(dir_.c_str(), 0755);
  EXPECT_EQ(status.code(), StatusCode::kIoError) << status.ToString();
  EXPECT_NE(status.message().find(path), std::string::npos) << status.ToString();
  EXPECT_EQ(ReadBytes(path), before);
}

TEST_F(SafetensorsTest, WriteIntoMissingDirectoryIsAnIoError) {
  Status status = WriteSafetensors(Path("no/such/dir/model.safetensors"), Views(SampleTensors()));
  EXPECT_EQ(status.code(), StatusCode::kIoError) << status.ToString();
  EXPECT_NE(status.message().find("no/such/dir/model.safetensors"), std::string::npos);
}

// ---- Cross-check with PyTorch, an independent reader and writer of the same bytes ----

// Reads a file by parsing the header by hand and viewing the data with torch.frombuffer, then
// writes another the same way from torch tensors. Output: one line per metadata entry and tensor,
// sorted by name, values as Python floats.
constexpr const char* kCrossCheckScript = R"PY(
import json, struct, sys
import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
SAME_SIZE_INT = {torch.float64: torch.int64, torch.float32: torch.int32,
                 torch.float16: torch.int16, torch.bfloat16: torch.int16}

def read(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0, "header length %d is not a multiple of 8" % n
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    for key in sorted(meta):
        print("meta", key, meta[key])
    for name in sorted(header):
        info = header[name]
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        if end > begin:
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(info["shape"])
        else:
            t = torch.empty(info["shape"], dtype=dtype)
        assert (8 + n + begin) % t.element_size() == 0, "%s is not aligned" % name
        values = [repr(float(v)) for v in t.reshape(-1).tolist()]
        print(" ".join(["tensor", name, info["dtype"], json.dumps(list(t.shape))] + values))

def write(path):
    tensors = {
        "bf16": torch.tensor([[1.5, -2.0], [0.25, 3.0]], dtype=torch.bfloat16),
        "f16": torch.tensor(0.5, dtype=torch.float16),
        "i64": torch.tensor([1, -2, 3], dtype=torch.int64),
        "mask": torch.tensor([True, False]),
    }
    names = {v: k for k, v in DTYPES.items()}
    header, chunks, offset = {"__metadata__": {"source": "torch"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        as_int = t.to(torch.uint8) if t.dtype == torch.bool else t.view(SAME_SIZE_INT.get(t.dtype, t.dtype))
        raw = as_int.numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))

read(sys.argv[1])
write(sys.argv[2])
)PY";

// Runs the script (read `to_read`, then write `to_write`); returns its exit status and fills
// `output` with stdout and stderr.
int RunPython(const std::string& script_path, const std::string& to_read,
              const std::string& to_write, std::string* output) {
  std::string command = "PYTHONIOENCODING=utf-8 /usr/bin/python3 '" + script_path + "' '" +
                        to_read + "' '" + to_write + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output->append(buffer, got);
  return ::pclose(pipe);
}

bool PythonWithTorchAvailable() {
  return std::system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") == 0;
}

// One Python start for both directions: importing torch takes seconds.
TEST_F(SafetensorsTest, PyTorchReadsWhatWeWriteAndWeReadWhatItWrites) {
  if (!PythonWithTorchAvailable()) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch and numpy (Debian: python3-torch "
                    "python3-numpy); cross-check skipped";
  }
  const std::string script = Path("crosscheck.py");
  WriteBytes(script, kCrossCheckScript);
  const std::string ours = Path("ours.safetensors");
  const std::string theirs = Path("theirs.safetensors");
  ASSERT_TRUE(WriteSafetensors(ours, Views(SampleTensors()), kMetadata).ok());
  std::string output;
  ASSERT_EQ(RunPython(script, ours, theirs, &output), 0) << output;
  EXPECT_EQ(output,
            "meta format pt\n"
            "meta note héllo\n"
            "tensor bf16 BF16 [2] 1.5 -2.0\n"
            "tensor bool BOOL [3] 1.0 0.0 1.0\n"
            "tensor empty F32 [0, 4]\n"
            "tensor empty3 I16 [2, 0, 3]\n"
            "tensor f16 F16 [] 0.5\n"
            "tensor f32 F32 [2, 3] -1.5 0.0 2.25 3.0 4.0 5.0\n"
            "tensor f64 F64 [3] 2.5 -0.125 1024.0\n"
            "tensor i16 I16 [2] -32768.0 5.0\n"
            "tensor i32 I32 [1, 2] -7.0 2147483647.0\n"
            "tensor i64 I64 [2] -3.0 1099511627776.0\n"
            "tensor i8 I8 [3] -128.0 0.0 127.0\n"
            "tensor u8 U8 [2] 255.0 0.0\n");

  Result<SafetensorsContents> contents = ReadSafetensors(theirs);
  ASSERT_TRUE(contents.ok()) << contents.status().ToString();
  ExpectSameContents(
      {{"bf16", DType::kBF16, {2, 2}, BytesOf<uint16_t>({0x3FC0, 0xC000, 0x3E80, 0x4040})},
       {"f16", DType::kF16, {}, BytesOf<uint16_t>({0x3800})},
       {"i64", DType::kI64, {3}, BytesOf<int64_t>({1, -2, 3})},
       {"mask", DType::kBool, {2}, BytesOf<uint8_t>({1, 0})}},
      *contents);
  EXPECT_EQ(contents->metadata, (std::map<std::string, std::string>{{"source", "torch"}}));
}

}  // namespace
}  // namespace strider
