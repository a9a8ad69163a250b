// Packed training sequences as the language-model loss reads them (TokenBatch,
// learner/language_model_loss.h). Pretraining's data puts images in the token stream as a
// placeholder block followed by the caption that describes the picture (the image_text
// generator, data/generators.h): the pixels are rendered here, on the data side, so the loss
// and the chunked pass under it only ever see tokens and pixels.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/config.h"
#include "common/status.h"
#include "learner/language_model_loss.h"

namespace strider {

// Stacks packed sequences of equal length. Targets that are padding, begin-of-text (the start
// of the next packed document) or image markers and patches are not scored. Image blocks
// (image-start, patches, image-end, caption) get their pixels from data::RenderCaptionImage; a
// block cut by the sequence's end or without a renderable caption has its patches replaced by
// padding. Errors (InvalidArgument): no sequences, sequences of unequal length or shorter than
// two tokens.
Result<TokenBatch> MakeTokenBatch(const std::vector<std::vector<int32_t>>& sequences,
                                  const ModelConfig& config);

// The same for a model with its own tokenizer, whose vocabulary has ordinary tokens at the byte
// format's special ids: nothing is masked by id but `begin_of_text` (>= 0: the tokenizer's, which
// starts the next packed document), and row b's positions from `lengths[b]` on are padding and
// not scored. No images (image documents are byte-format only). Errors as above, and
// InvalidArgument for a length per row missing or outside [0, sequence length].
Result<TokenBatch> MakeTokenBatch(const std::vector<std::vector<int32_t>>& sequences,
                                  const std::vector<int64_t>& lengths, int32_t begin_of_text);

}  // namespace strider
