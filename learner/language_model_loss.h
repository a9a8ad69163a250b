// The next-token loss of a batch of packed sequences along either model path, shared by
// pretraining and the RL learner's auxiliary language-model terms: one objective of the chunked
// pass (learner.h), which runs the model.
//
//   kTraining   one Model::Forward over whole sequences (chunkwise incremental attention,
//               explicit latent attention);
//   kInference  Model::Append in chunks of `chunk_tokens` with the autograd graph kept, carrying
//               the recurrent states, convolution tails and latent cache forward exactly as the
//               rollout engine does. With full backpropagation the gradients flow through the
//               carried state into every earlier chunk and equal the training path's; truncated
//               backpropagation runs backward per chunk and cuts the graph at chunk boundaries,
//               so memory grows with the chunk and the (linear) cache, not with the sequence.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/model/model.h"
#include "common/status.h"
#include "learner/learner.h"

namespace strider {

// A batch as the loss reads it; the data side builds it (MakeTokenBatch in
// learner/pretrain/token_batch.h for packed sequences, with their images rendered).
struct TokenBatch {
  at::Tensor tokens;     // (B, L) int64
  at::Tensor loss_mask;  // (B, L-1) float: 1 where the target tokens[:, t+1] is scored
  // Optional (B, L-1) float: the training objective's weight of each target (zero where the
  // mask is zero). When set, gradients are those of the weighted mean; LossResult::loss stays
  // the plain mean over the mask, so logged losses compare across weightings.
  at::Tensor loss_weight;
  std::vector<ImageInput> images;
};

struct LossOptions {
  TrainingPath path = TrainingPath::kTraining;
  int64_t chunk_tokens = 512;  // kInference: tokens per Append
  bool truncated = false;      // kInference: backward per chunk, graph cut between chunks
  bool backward = true;        // accumulate gradients into the parameters' .grad
  bool record_routing = false; // fill LossResult::routing (with router scores)
  bool keep_predictions = false;  // fill LossResult::predictions
};

struct LossResult {
  double loss = 0;      // mean over scored targets
  int64_t targets = 0;  // scored targets
  RoutingRecord routing;
  at::Tensor predictions;  // (B, L-1) int64 argmax next-token predictions
};

// Runs the model over the batch, and backward when asked (gradients of the mean loss). Without
// `backward` no graph is recorded.
Result<LossResult> LanguageModelLoss(const Model& model, const TokenBatch& batch,
                                     const LossOptions& options);

}  // namespace strider
