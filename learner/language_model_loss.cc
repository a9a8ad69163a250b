#include "learner/language_model_loss.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/model/torch_status.h"

namespace strider {

Result<LossResult> LanguageModelLoss(const Model& model, const TokenBatch& batch,
                                     const LossOptions& options) {
  const int64_t length = batch.tokens.size(1);
  LossResult result;
  STRIDER_RETURN_IF_ERROR(strider::model::Guarded("language-model loss", [&]() -> Status {
    const double targets = batch.loss_mask.sum().item<double>();
    result.targets = static_cast<int64_t>(targets);
    if (result.targets == 0) return Status::InvalidArgument("batch has no scored targets");
    const bool weighted = batch.loss_weight.defined();
    const double weight_sum = weighted ? batch.loss_weight.sum().item<double>() : targets;
    if (weighted && !(weight_sum > 0)) {
      return Status::InvalidArgument("loss weights of the batch sum to " +
                                     std::to_string(weight_sum));
    }
    ChunkedPassOptions pass;
    pass.path = options.path;
    pass.chunk_tokens = options.chunk_tokens;
    pass.truncated = options.truncated;
    pass.backward = options.backward;
    pass.record_routing = options.record_routing;
    ModelInput input;
    input.tokens = batch.tokens;
    input.images = batch.images;
    std::vector<at::Tensor> predictions;
    double loss_sum = 0;
    auto objective = [&](const ChunkView& chunk) -> Result<at::Tensor> {
      const int64_t scored = std::min(chunk.count, length - 1 - chunk.begin);  // last: no target
      if (scored <= 0) return at::Tensor();
      at::Tensor logits = chunk.logits.narrow(1, 0, scored);
      // fp32 at least: the loss of a bf16 model is still summed in fp32.
      at::Tensor log_probs =
          at::log_softmax(logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat), -1);
      at::Tensor target = batch.tokens.narrow(1, chunk.begin + 1, scored);
      at::Tensor mask = batch.loss_mask.narrow(1, chunk.begin, scored).to(log_probs.scalar_type());
      at::Tensor target_log_probs = log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1);
      at::Tensor chunk_loss = -(target_log_probs * mask).sum() / targets;
      if (options.keep_predictions) predictions.push_back(logits.argmax(-1).detach());
      loss_sum += chunk_loss.item<double>();
      if (!options.backward) return at::Tensor();
      if (weighted) {
        at::Tensor weight =
            batch.loss_weight.narrow(1, chunk.begin, scored).to(log_probs.scalar_type());
        chunk_loss = -(target_log_probs * weight).sum() / weight_sum;
      }
      return chunk_loss;
    };
    STRIDER_ASSIGN_OR_RETURN(ChunkedPassResult out, RunChunkedPass(model, input, pass, objective));
    result.loss = loss_sum;
    if (options.record_routing) result.routing = std::move(out.routing);
    if (options.keep_predictions) result.predictions = at::cat(predictions, 1);
    return Status::Ok();
  }));
  return result;
}

}  // namespace strider
