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

}  // namespace strider
