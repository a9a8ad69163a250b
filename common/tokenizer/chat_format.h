// A model's own transcript format (common/transcript.h, Format): its chat template renders the
// conversation and its tokenizer turns the text into ids, so actors, data generators, evaluation
// and the learner see the stream the model was trained and is served with (docs/tokenizers.md).
//
// Tool calls: the environment speaks NAME(ARGUMENTS) (envs/tools.h); the template writes a call
// as the model family does (Qwen's <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
// Kimi's <|tool_calls_section_begin|>...). The shape of a call is read once from a probe
// rendering (the text before the name, between the name and the arguments' JSON object, and
// after it), so the same few lines read calls back out of any template's model turns. A tool
// with one argument takes the environment's ARGUMENTS as that argument's value; otherwise
// ARGUMENTS is the JSON object itself.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "common/transcript.h"

namespace strider::tokenizer {

// The tokenizer file and template `config` names; `config.enabled()` must hold.
Result<std::shared_ptr<const transcript::Format>> LoadChatFormat(const TokenizerConfig& config);

// A format from a loaded tokenizer and template: the template's end-of-turn marker must be a
// special token of `tokenizer`.
Result<std::shared_ptr<const transcript::Format>> MakeChatFormat(
    std::shared_ptr<const Tokenizer> tokenizer, ChatTemplate chat);

// The tokens a model's pretraining documents begin and end with (docs/tokenizers.md,
// "Pretraining"). Begin: the template's bos_token where it names a special token of the
// tokenizer (Llama 3's <|begin_of_text|>), else none (-1: Qwen has none). End: the template's
// eos_token unless that is the end-of-turn marker (an instruct model's), else the tokenizer's
// <|endoftext|> or <|end_of_text|> (the document separator GPT-2, Qwen and Llama 3 pretrain
// with), else the template's eos_token, else the end-of-turn marker.
struct DocumentMarkers {
  int32_t begin_of_text = -1;
  int32_t end_of_text = -1;
};

// `format`'s markers; InvalidArgument for a format not made by this file.
Result<DocumentMarkers> ReadDocumentMarkers(const transcript::Format& format);

// A model's format: its own when its config names a tokenizer, else null (the byte format).
inline Result<std::shared_ptr<const transcript::Format>> ModelFormat(
    const TokenizerConfig& config) {
  if (!config.enabled()) return std::shared_ptr<const transcript::Format>();
  return LoadChatFormat(config);
}

}  // namespace strider::tokenizer
