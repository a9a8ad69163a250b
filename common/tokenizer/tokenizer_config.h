// The `tokenizer:` section of a model config, apart from the tokenizers themselves: the model
// config (common/model/config.h) holds it, and code compiled as C++17 (the snapshot fuzzer's
// LibTorch sources) reads that header, so nothing here may need C++20.
#pragma once

#include <string>

namespace strider::tokenizer {

// The tokenizer and chat template a model config names (docs/tokenizers.md, "A model's
// tokenizer"): the `tokenizer:` section of its model: section, paths resolved like other config
// paths. No file: the built-in byte tokenizer and transcript format.
struct TokenizerConfig {
  std::string file;            // tokenizer.json or tiktoken rank file
  std::string format = "auto"; // auto | tokenizer_json | tiktoken
  // tokenizer_config.json (its "chat_template", or chat_template.jinja beside it) or a .jinja
  // file; a tiktoken file's special tokens come from this config's added_tokens_decoder.
  std::string chat_template;
  std::string template_name;   // of a config that holds several; "" is "default"
  std::string pattern;         // tiktoken: the split pattern
  bool enabled() const { return !file.empty(); }
};

}  // namespace strider::tokenizer
