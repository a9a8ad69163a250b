#include "learner/language_model_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <string>

#include "common/tokenizer.h"
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

namespace {

// Images whose placeholders lie in [begin, end) of their row; an error when one straddles.
Result<std::vector<ImageInput>> ImagesInChunk(const TokenBatch& batch, int64_t begin,
                                              int64_t end) {
  std::vector<ImageInput> chosen;
  if (batch.images.empty()) return chosen;
  std::vector<int64_t> seen(batch.tokens.size(0), 0);
  // Every maximal run of placeholders in a row is one image, in stream order (MakeTokenBatch
  // keeps only complete blocks).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> runs(batch.tokens.size(0));
  at::Tensor cpu = batch.tokens.cpu();
  const int64_t* t = cpu.data_ptr<int64_t>();
  const int64_t length = batch.tokens.size(1);
  for (int64_t b = 0; b < batch.tokens.size(0); ++b) {
    for (int64_t i = 0; i < length; ++i) {
      if (t[b * length + i] != token::kImagePatch) continue;
      int64_t j = i;
      while (j < length && t[b * length + j] == token::kImagePatch) ++j;
      runs[b].emplace_back(i, j);
      i = j - 1;
    }
  }
  for (const ImageInput& image : batch.images) {
    const auto [first, last] = runs[image.sequence][seen[image.sequence]++];
    if (first >= begin && last <= end) {
      chosen.push_back(image);
    } else if (first < end && last > begin) {
      return Status::InvalidArgument(
          "an image's patches straddle a chunk boundary at token " + std::to_string(end) +
          "; train image data on the training path or align chunk_tokens");
    }
  }
  return chosen;
}

}  // namespace

Result<LossResult> LanguageModelLoss(const Model& model, const TokenBatch& batch,
                                     const LossOptions& options) {
  const int64_t length = batch.tokens.size(1);
  const int64_t rows = batch.tokens.size(0);
  LossResult result;
  try {
    at::AutoGradMode grad_mode(options.backward);
    const double targets = batch.loss_mask.sum().item<double>();
    result.targets = static_cast<int64_t>(targets);
    if (result.targets == 0) return Status::InvalidArgument("batch has no scored targets");
    const bool weighted = batch.loss_weight.defined();
    const double weight_sum = weighted ? batch.loss_weight.sum().item<double>() : targets;
    if (weighted && !(weight_sum > 0)) {
      return Status::InvalidArgument("loss weights of the batch sum to " +
                                     std::to_string(weight_sum));
    }
    const bool chunked = options.path == TrainingPath::kInference;
    const int64_t chunk = chunked ? std::max<int64_t>(1, options.chunk_tokens) : length;
    ForwardOptions forward;
    forward.record_routing = options.record_routing;
    forward.enable_grad = options.backward;
    InferenceState state;
    if (chunked) {
      STRIDER_ASSIGN_OR_RETURN(state, model.NewState(rows));
    }
    std::vector<RoutingRecord> records;
    std::vector<at::Tensor> predictions;
    at::Tensor total;  // summed loss of chunks not yet backpropagated
    double loss_sum = 0;
    for (int64_t begin = 0; begin < length; begin += chunk) {
      const int64_t count = std::min(chunk, length - begin);
      ModelInput input;
      input.tokens = batch.tokens.narrow(1, begin, count);
      STRIDER_ASSIGN_OR_RETURN(input.images, ImagesInChunk(batch, begin, begin + count));
      ForwardOutput out;
      if (chunked) {
        STRIDER_ASSIGN_OR_RETURN(out, model.Append(&state, input, forward));
      } else {
        STRIDER_ASSIGN_OR_RETURN(out, model.Forward(input, forward));
      }
      if (options.record_routing) records.push_back(std::move(out.routing));
      const int64_t scored = std::min(count, length - 1 - begin);  // last position: no target
      if (scored <= 0) continue;
      at::Tensor logits = out.logits.narrow(1, 0, scored);
      // fp32 at least: the loss of a bf16 model is still summed in fp32.
      at::Tensor log_probs = at::log_softmax(
          logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat), -1);
      at::Tensor target = batch.tokens.narrow(1, begin + 1, scored);
      at::Tensor mask = batch.loss_mask.narrow(1, begin, scored).to(log_probs.scalar_type());
      at::Tensor target_log_probs = log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1);
      at::Tensor chunk_loss = -(target_log_probs * mask).sum() / targets;
      if (options.keep_predictions) predictions.push_back(logits.argmax(-1).detach());
      loss_sum += chunk_loss.item<double>();
      if (!options.backward) continue;
      if (weighted) {
        at::Tensor weight =
            batch.loss_weight.narrow(1, begin, scored).to(log_probs.scalar_type());
        chunk_loss = -(target_log_probs * weight).sum() / weight_sum;
      }
      if (chunked && options.truncated) {
        chunk_loss.backward();
        state.DetachGraph();
      } else {
        total = total.defined() ? total + chunk_loss : chunk_loss;
      }
    }
    if (options.backward && total.defined()) total.backward();
    result.loss = loss_sum;
    if (options.record_routing) result.routing = RoutingRecord::Concatenate(records);
    if (options.keep_predictions) result.predictions = at::cat(predictions, 1);
  } catch (const c10::Error& error) {
    return Status::Internal(std::string("language-model loss: ") + error.what_without_backtrace());
  }
  return result;
}

}  // namespace strider
