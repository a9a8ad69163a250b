#include "learner/pretrain/token_batch.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>

#include "common/token_ids.h"
#include "learner/pretrain/data/generators.h"

namespace strider {

Result<TokenBatch> MakeTokenBatch(const std::vector<std::vector<int32_t>>& sequences,
                                  const ModelConfig& config) {
  if (sequences.empty()) return Status::InvalidArgument("empty batch");
  const int64_t length = static_cast<int64_t>(sequences[0].size());
  if (length < 2) return Status::InvalidArgument("sequences need at least two tokens");
  const int64_t batch = static_cast<int64_t>(sequences.size());
  TokenBatch out;
  at::Tensor tokens = at::empty({batch, length}, at::kLong);
  at::Tensor mask = at::ones({batch, length - 1}, at::kFloat);
  int64_t* t = tokens.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    if (static_cast<int64_t>(sequences[b].size()) != length) {
      return Status::InvalidArgument("sequences of a batch must have equal lengths");
    }
    std::vector<int32_t> row = sequences[b];
    // Images: find each complete block and render it from its caption.
    for (int64_t i = 0; i < length; ++i) {
      if (row[i] != token::kImageStart) continue;
      int64_t end = i + 1;
      while (end < length && row[end] == token::kImagePatch) ++end;
      const int64_t patches = end - i - 1;
      int64_t caption_end = end + 1;
      while (caption_end < length && row[caption_end] < token::kByteCount) ++caption_end;
      bool rendered = false;
      const int64_t grid = static_cast<int64_t>(std::llround(std::sqrt(patches)));
      if (config.vision.enabled && end < length && row[end] == token::kImageEnd &&
          caption_end < length && patches > 0 && grid * grid == patches &&
          grid <= config.vision.max_grid_rows && grid <= config.vision.max_grid_columns) {
        std::string caption(row.begin() + end + 1, row.begin() + caption_end);
        Result<std::vector<float>> pixels =
            data::RenderCaptionImage(caption, grid * config.vision.patch_size);
        if (pixels.ok()) {
          const int64_t side = grid * config.vision.patch_size;
          at::Tensor image = at::from_blob(pixels->data(), {side, side, 3}, at::kFloat).clone();
          out.images.push_back({b, image});
          rendered = true;
        }
      }
      if (!rendered) {
        for (int64_t k = i + 1; k < end; ++k) row[k] = token::kPad;
      }
      i = end - 1;
    }
    float* m = mask.data_ptr<float>() + b * (length - 1);
    for (int64_t i = 0; i < length; ++i) {
      t[b * length + i] = row[i];
      if (i == 0) continue;
      const int32_t target = row[i];
      if (target == token::kPad || target == token::kBeginOfText ||
          target == token::kImagePatch || target == token::kImageEnd) {
        m[i - 1] = 0;
      }
    }
  }
  out.tokens = tokens;
  out.loss_mask = mask;
  return out;
}

Result<TokenBatch> MakeTokenBatch(const std::vector<std::vector<int32_t>>& sequences,
                                  const std::vector<int64_t>& lengths, int32_t begin_of_text) {
  if (sequences.empty()) return Status::InvalidArgument("empty batch");
  const int64_t length = static_cast<int64_t>(sequences[0].size());
  if (length < 2) return Status::InvalidArgument("sequences need at least two tokens");
  const int64_t batch = static_cast<int64_t>(sequences.size());
  if (static_cast<int64_t>(lengths.size()) != batch) {
    return Status::InvalidArgument("one filled length per sequence is needed");
  }
  TokenBatch out;
  at::Tensor tokens = at::empty({batch, length}, at::kLong);
  at::Tensor mask = at::ones({batch, length - 1}, at::kFloat);
  int64_t* t = tokens.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int32_t>& row = sequences[b];
    if (static_cast<int64_t>(row.size()) != length) {
      return Status::InvalidArgument("sequences of a batch must have equal lengths");
    }
    if (lengths[b] < 0 || lengths[b] > length) {
      return Status::InvalidArgument("filled length " + std::to_string(lengths[b]) +
                                     " outside a sequence of " + std::to_string(length));
    }
    float* m = mask.data_ptr<float>() + b * (length - 1);
    for (int64_t i = 0; i < length; ++i) {
      t[b * length + i] = row[i];
      if (i == 0) continue;
      if (i >= lengths[b] || (begin_of_text >= 0 && row[i] == begin_of_text)) m[i - 1] = 0;
    }
  }
  out.tokens = tokens;
  out.loss_mask = mask;
  return out;
}

}  // namespace strider
