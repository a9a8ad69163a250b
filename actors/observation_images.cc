#include "actors/observation_images.h"

#include <ATen/ops/from_blob.h>

#include <string>
#include <utility>

#include "common/model/torch_status.h"
#include "common/model/vision.h"

namespace strider::actors {
namespace {

constexpr bool SameValue(schema::Role stored, transcript::Role role) {
  return static_cast<uint8_t>(stored) == static_cast<uint8_t>(role);
}
static_assert(SameValue(schema::Role::kSystem, transcript::Role::kSystem) &&
              SameValue(schema::Role::kUser, transcript::Role::kUser) &&
              SameValue(schema::Role::kModel, transcript::Role::kModel) &&
              SameValue(schema::Role::kToolCall, transcript::Role::kToolCall) &&
              SameValue(schema::Role::kToolResult, transcript::Role::kToolResult) &&
              SameValue(schema::Role::kImage, transcript::Role::kImage));

}  // namespace

Result<ObservationImages> ReadImages(const VisionConfig& vision,
                                     const std::vector<envs::Image>& images) {
  ObservationImages out;
  for (size_t i = 0; i < images.size(); ++i) {
    const envs::Image& image = images[i];
    const std::string what = "observation image " + std::to_string(i);
    if (image.width <= 0 || image.height <= 0 || image.channels <= 0 || image.channels > 255 ||
        image.pixels.size() !=
            static_cast<size_t>(image.width) * image.height * image.channels) {
      return Status::InvalidArgument(what + ": " + std::to_string(image.pixels.size()) +
                                     " pixel bytes for " + std::to_string(image.width) + "x" +
                                     std::to_string(image.height) + "x" +
                                     std::to_string(image.channels));
    }
    Result<at::Tensor> pixels = model::Guarded(what.c_str(), [&]() -> Result<at::Tensor> {
      return at::from_blob(const_cast<char*>(image.pixels.data()),
                           {image.height, image.width, image.channels}, at::kByte)
          .to(at::kFloat)
          .div_(255.0);
    });
    // An image LibTorch cannot take is the environment's fault, as a wrong size is.
    if (!pixels.ok()) return Status::InvalidArgument(pixels.status().message());
    STRIDER_RETURN_IF_ERROR(model::ValidateImage(vision, *pixels).WithContext(what));
    out.patches.push_back(model::PatchCount(vision, *pixels));
    out.stored.push_back(schema::Image{0, static_cast<uint32_t>(image.width),
                                       static_cast<uint32_t>(image.height),
                                       static_cast<uint8_t>(image.channels), image.pixels});
    out.pixels.push_back(std::move(*pixels));
  }
  return out;
}

std::vector<PromptPiece> ToPieces(std::vector<transcript::Run> runs,
                                  const std::vector<schema::Image>& images) {
  std::vector<PromptPiece> pieces;
  size_t image = 0;
  for (transcript::Run& run : runs) {
    PromptPiece piece;
    piece.tokens = std::move(run.tokens);
    piece.role = SchemaRole(run.role);
    if (run.role == transcript::Role::kImage && image < images.size()) {
      piece.image = images[image++];
    }
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

Result<int64_t> AddPieces(Segmenter& segmenter, const std::vector<PromptPiece>& pieces) {
  int64_t added = 0;
  for (const PromptPiece& piece : pieces) {
    if (piece.image) STRIDER_RETURN_IF_ERROR(segmenter.AddImage(*piece.image));
    STRIDER_RETURN_IF_ERROR(segmenter.AddContext(piece.tokens, piece.role));
    added += static_cast<int64_t>(piece.tokens.size());
  }
  return added;
}

std::vector<int64_t> Concatenate(const std::vector<PromptPiece>& pieces) {
  std::vector<int64_t> tokens;
  for (const PromptPiece& piece : pieces) {
    tokens.insert(tokens.end(), piece.tokens.begin(), piece.tokens.end());
  }
  return tokens;
}

}  // namespace strider::actors
