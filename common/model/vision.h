// Native vision input by patch embedding (docs/model_math.md#vision-input).
//
// An image (H x W x C, values in [0, 1]) is cut into P x P patches in row-major order; each
// patch is flattened (P, P, C) and projected to the model width, plus learned row and column
// embeddings of its place on the patch grid. The vectors replace the image-patch placeholder
// tokens of the stream, which sit between image-start and image-end markers; nothing downstream
// knows a position came from an image.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "common/model/config.h"
#include "common/model/ops.h"
#include "common/status.h"

namespace strider::model {

struct VisionWeights {
  at::Tensor patch_projection;  // (d, P*P*C)
  at::Tensor patch_bias;        // (d)
  at::Tensor row_embedding;     // (max_grid_rows, d)
  at::Tensor column_embedding;  // (max_grid_columns, d)

  static VisionWeights Bind(const TensorMap& tensors, const std::string& prefix);
};

// Checks an image against the config: 3-D, channels, sides multiples of P within the grid.
Status ValidateImage(const VisionConfig& config, const at::Tensor& pixels);

// Patches of one image in row-major grid order: (rows * columns, d).
at::Tensor EmbedImagePatches(const VisionWeights& weights, const VisionConfig& config,
                             const at::Tensor& pixels);

// Number of patch positions the image occupies in the token stream.
int64_t PatchCount(const VisionConfig& config, const at::Tensor& pixels);

}  // namespace strider::model
