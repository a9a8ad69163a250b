// Writing shard directories: from plain UTF-8 text files (one document per file) and from the
// built-in generators. Used by `strider data build` and by pretraining stages whose mixture
// names a generator (the stage builds its shards in the run directory, then reads them back
// through the same memory-mapped path as any other data).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "learner/pretrain/data/generators.h"

namespace strider::data {

struct BuildOptions {
  int64_t shard_tokens = 16 << 20;  // start a new shard file after this many tokens
  // Text files: a model's own format (null: the byte format) and the tokens its documents begin
  // (-1: none) and end with (chat_format.h, DocumentMarkers).
  std::shared_ptr<const transcript::Format> format;
  int32_t begin_of_text = -1;
  int32_t end_of_text = -1;
};

struct BuildSummary {
  int64_t shards = 0;
  int64_t documents = 0;
  int64_t tokens = 0;
};

// Each file becomes one document: begin-of-text, its bytes, end-of-text. Text that is not valid
// UTF-8 is an error naming the file and the byte offset. `out_dir` is created; existing shards
// in it are an error (a directory is one data set). With `options.format` the text is encoded
// by the model's tokenizer as the reference libraries encode a string (a special token written
// in the text becomes its id) between the format's markers, and the shards record its id space.
Result<BuildSummary> BuildTextShards(const std::vector<std::string>& files,
                                     const std::string& out_dir, const BuildOptions& options = {});

// Documents index 0, 1, ... of a generator until `documents` documents (when > 0) or at least
// `tokens` tokens (when > 0) are written. With `generator.format` (retrieval and tool_use only)
// the shards record the format's id space.
Result<BuildSummary> BuildGeneratedShards(GeneratorKind kind, const GeneratorOptions& generator,
                                          uint64_t seed, int64_t documents, int64_t tokens,
                                          const std::string& out_dir,
                                          const BuildOptions& options = {});

// The id space shards of `format` record (shard.h): a fingerprint of every id's bytes and the
// vocabulary size, never 0; 0 for the byte format (null).
uint64_t IdSpace(const transcript::Format* format);

// Offset of the first byte that breaks UTF-8 (overlong forms, surrogates and code points past
// U+10FFFF included), or -1 when the text is valid.
int64_t FindInvalidUtf8(const std::string& text);

}  // namespace strider::data
