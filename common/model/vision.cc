#include "common/model/vision.h"

#include <ATen/ATen.h>

namespace strider::model {

VisionWeights VisionWeights::Bind(const TensorMap& t, const std::string& p) {
  return {Lookup(t, p + "patch_projection"), Lookup(t, p + "patch_bias"),
          Lookup(t, p + "row_embedding"), Lookup(t, p + "column_embedding")};
}

Status ValidateImage(const VisionConfig& c, const at::Tensor& pixels) {
  if (!c.enabled) return Status::InvalidArgument("image given but vision is disabled in the config");
  if (!pixels.defined() || pixels.dim() != 3) {
    return Status::InvalidArgument("image must be a (height, width, channels) tensor");
  }
  const int64_t height = pixels.size(0);
  const int64_t width = pixels.size(1);
  if (pixels.size(2) != c.channels) {
    return Status::InvalidArgument("image has " + std::to_string(pixels.size(2)) +
                                   " channels, the model expects " + std::to_string(c.channels));
  }
  if (height == 0 || width == 0 || height % c.patch_size != 0 || width % c.patch_size != 0) {
    return Status::InvalidArgument("image of " + std::to_string(height) + "x" +
                                   std::to_string(width) + " pixels: both sides must be positive "
                                   "multiples of the patch size " + std::to_string(c.patch_size));
  }
  if (height / c.patch_size > c.max_grid_rows || width / c.patch_size > c.max_grid_columns) {
    return Status::InvalidArgument(
        "image of " + std::to_string(height) + "x" + std::to_string(width) +
        " pixels exceeds the largest patch grid " + std::to_string(c.max_grid_rows) + "x" +
        std::to_string(c.max_grid_columns) + " of " + std::to_string(c.patch_size) + "-pixel patches");
  }
  if (!pixels.is_floating_point()) {
    return Status::InvalidArgument("image pixels must be floating point values in [0, 1]");
  }
  return Status::Ok();
}

int64_t PatchCount(const VisionConfig& c, const at::Tensor& pixels) {
  return (pixels.size(0) / c.patch_size) * (pixels.size(1) / c.patch_size);
}

at::Tensor EmbedImagePatches(const VisionWeights& w, const VisionConfig& c,
                             const at::Tensor& pixels) {
  const int64_t p = c.patch_size;
  const int64_t rows = pixels.size(0) / p;
  const int64_t columns = pixels.size(1) / p;
  // (rows, P, columns, P, C) -> (rows, columns, P, P, C) -> (rows*columns, P*P*C)
  at::Tensor patches = pixels.to(w.patch_projection.scalar_type())
                           .reshape({rows, p, columns, p, c.channels})
                           .permute({0, 2, 1, 3, 4})
                           .reshape({rows * columns, p * p * c.channels});
  at::Tensor embedded = Linear(patches, w.patch_projection) + w.patch_bias;
  at::Tensor position = w.row_embedding.narrow(0, 0, rows).unsqueeze(1) +
                        w.column_embedding.narrow(0, 0, columns).unsqueeze(0);  // (R, C, d)
  return embedded + position.reshape({rows * columns, -1});
}

}  // namespace strider::model
