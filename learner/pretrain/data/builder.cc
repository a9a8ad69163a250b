#include "learner/pretrain/data/builder.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/tokenizer.h"
#include "learner/pretrain/data/shard.h"

namespace strider::data {
namespace {

Status PrepareDirectory(const std::string& out_dir) {
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  if (error) return Status::IoError("cannot create " + out_dir + ": " + error.message());
  for (const auto& entry : std::filesystem::directory_iterator(out_dir, error)) {
    if (entry.path().extension() == ".shard") {
      return Status::AlreadyExists(out_dir + " already holds shards (" +
                                   entry.path().filename().string() + ")");
    }
  }
  return Status::Ok();
}

// Writes the pending shard when it is big enough (or `force` and non-empty).
Status Flush(ShardWriter& writer, const std::string& out_dir, BuildSummary& summary,
             bool force, const BuildOptions& options) {
  if (writer.documents() == 0) return Status::Ok();
  if (!force && writer.tokens() < options.shard_tokens) return Status::Ok();
  summary.documents += writer.documents();
  summary.tokens += writer.tokens();
  STRIDER_RETURN_IF_ERROR(
      writer.Write(out_dir + "/" + ShardFileName(summary.shards)));
  ++summary.shards;
  return Status::Ok();
}

// A writer for ids of `format` (null: the byte format): two bytes a token while the vocabulary
// fits them, and the format's id space in each shard's header.
ShardWriter WriterFor(const transcript::Format* format) {
  return ShardWriter(format != nullptr && format->vocabulary_size() > 65536 ? 4 : 2,
                     IdSpace(format));
}

}  // namespace

uint64_t IdSpace(const transcript::Format* format) {
  if (format == nullptr) return 0;
  // FNV-1a over the vocabulary size and each id's bytes, each preceded by its length.
  uint64_t hash = 0xCBF29CE484222325ull;
  auto mix = [&](uint64_t value) {
    for (int k = 0; k < 8; ++k) {
      hash ^= (value >> (8 * k)) & 0xFF;
      hash *= 0x100000001B3ull;
    }
  };
  const int32_t size = format->vocabulary_size();
  mix(static_cast<uint64_t>(size));
  for (int32_t id = 0; id < size; ++id) {
    const std::string bytes = format->DecodeBytes({&id, 1});
    mix(bytes.size());
    for (unsigned char c : bytes) {
      hash ^= c;
      hash *= 0x100000001B3ull;
    }
  }
  return hash == 0 ? 1 : hash;
}

int64_t FindInvalidUtf8(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    int extra = 0;
    uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, code = c & 0x07;
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + extra >= n) return static_cast<int64_t>(i);  // truncated sequence
    for (int k = 1; k <= extra; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      code = (code << 6) | (s[i + k] & 0x3F);
    }
    const uint32_t smallest[] = {0, 0x80, 0x800, 0x10000};
    if (code < smallest[extra] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return static_cast<int64_t>(i);
    }
    i += extra + 1;
  }
  return -1;
}

Result<BuildSummary> BuildTextShards(const std::vector<std::string>& files,
                                     const std::string& out_dir, const BuildOptions& options) {
  if (files.empty()) return Status::InvalidArgument("no text files given");
  STRIDER_RETURN_IF_ERROR(PrepareDirectory(out_dir));
  const transcript::Format* format = options.format.get();
  ShardWriter writer = WriterFor(format);
  BuildSummary summary;
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Status::NotFound("cannot open text file " + file);
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string text = buffer.str();
    const int64_t bad = FindInvalidUtf8(text);
    if (bad >= 0) {
      return Status::InvalidArgument(file + ": invalid UTF-8 at byte offset " +
                                     std::to_string(bad));
    }
    std::vector<int32_t> tokens;
    if (format != nullptr) {
      if (options.begin_of_text >= 0) tokens.push_back(options.begin_of_text);
      const std::vector<int32_t> ids = format->Encode(text);
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      tokens.push_back(options.end_of_text >= 0 ? options.end_of_text
                                                : format->stop_tokens().back());
    } else {
      tokens.reserve(text.size() + 2);
      tokens.push_back(token::kBeginOfText);
      for (int32_t id : Tokenizer::Encode(text)) tokens.push_back(id);
      tokens.push_back(token::kEndOfText);
    }
    STRIDER_RETURN_IF_ERROR(writer.Add(tokens));
    STRIDER_RETURN_IF_ERROR(Flush(writer, out_dir, summary, false, options));
  }
  STRIDER_RETURN_IF_ERROR(Flush(writer, out_dir, summary, true, options));
  return summary;
}

Result<BuildSummary> BuildGeneratedShards(GeneratorKind kind, const GeneratorOptions& generator,
                                          uint64_t seed, int64_t documents, int64_t tokens,
                                          const std::string& out_dir,
                                          const BuildOptions& options) {
  if (documents <= 0 && tokens <= 0) {
    return Status::InvalidArgument("give a document count or a token count to generate");
  }
  if (generator.format && kind == GeneratorKind::kImageText) {
    return Status::InvalidArgument(
        "the image_text generator writes the byte format's image placeholders, not a model's "
        "own tokenizer's ids");
  }
  STRIDER_RETURN_IF_ERROR(PrepareDirectory(out_dir));
  ShardWriter writer = WriterFor(generator.format.get());
  BuildSummary summary;
  int64_t written_tokens = 0;
  for (int64_t index = 0;; ++index) {
    if (documents > 0 && index >= documents) break;
    if (documents <= 0 && written_tokens >= tokens) break;
    GeneratedDocument document = Generate(kind, generator, seed, index);
    written_tokens += static_cast<int64_t>(document.tokens.size());
    STRIDER_RETURN_IF_ERROR(writer.Add(document.tokens));
    STRIDER_RETURN_IF_ERROR(Flush(writer, out_dir, summary, false, options));
  }
  STRIDER_RETURN_IF_ERROR(Flush(writer, out_dir, summary, true, options));
  return summary;
}

}  // namespace strider::data
