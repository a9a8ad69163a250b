#include "common/model/two_path_check.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace strider {

std::vector<int64_t> UnevenChunkSizes(int64_t total, int64_t kernel_chunk_size) {
  const std::vector<int64_t> pattern = {1, 1, 7, 1, kernel_chunk_size + 13, 3,
                                        1, 2 * kernel_chunk_size - 1, 5};
  std::vector<int64_t> sizes;
  int64_t done = 0;
  for (size_t i = 0; done < total; ++i) {
    const int64_t size = std::min(pattern[i % pattern.size()], total - done);
    sizes.push_back(size);
    done += size;
  }
  return sizes;
}

Result<TwoPathReport> CheckTwoPaths(const Model& model, const at::Tensor& tokens,
                                    std::vector<int64_t> chunk_sizes) {
  if (!tokens.defined() || tokens.dim() != 2) {
    return Status::InvalidArgument("tokens must be a (batch, length) tensor");
  }
  const int64_t total = tokens.size(1);
  if (chunk_sizes.empty()) {
    chunk_sizes = UnevenChunkSizes(total, model.config().incremental.chunk_size);
  }
  int64_t covered = 0;
  for (int64_t size : chunk_sizes) covered += size;
  if (covered != total) {
    return Status::InvalidArgument("chunk sizes cover " + std::to_string(covered) +
                                   " tokens, the input has " + std::to_string(total));
  }

  TwoPathReport report;
  STRIDER_ASSIGN_OR_RETURN(InferenceState state, model.NewState(tokens.size(0)));
  std::vector<at::Tensor> logits;
  std::vector<RoutingRecord> records;
  ForwardOptions record;
  record.record_routing = true;
  int64_t begin = 0;
  for (int64_t size : chunk_sizes) {
    ModelInput chunk{tokens.narrow(1, begin, size), {}};
    STRIDER_ASSIGN_OR_RETURN(ForwardOutput out, model.Append(&state, chunk, record));
    logits.push_back(out.logits);
    records.push_back(std::move(out.routing));
    begin += size;
    ++report.inference_chunks;
  }
  at::NoGradGuard no_grad;
  at::Tensor inference_logits = at::cat(logits, 1);
  RoutingRecord inference_routing = RoutingRecord::Concatenate(records);

  ForwardOptions replay;
  replay.replay_routing = &inference_routing;
  STRIDER_ASSIGN_OR_RETURN(ForwardOutput replayed, model.Forward({tokens, {}}, replay));
  report.max_abs_logprob_diff = (NextTokenLogProbs(replayed.logits, tokens) -
                                 NextTokenLogProbs(inference_logits, tokens))
                                    .abs()
                                    .max()
                                    .item<double>();

  STRIDER_ASSIGN_OR_RETURN(ForwardOutput alone, model.Forward({tokens, {}}, record));
  int64_t same = 0;
  for (size_t layer = 0; layer < alone.routing.layers.size(); ++layer) {
    // Compare chosen sets: the order within top-k does not change the layer's output.
    at::Tensor a = std::get<0>(alone.routing.layers[layer].experts.sort(-1));
    at::Tensor b = std::get<0>(inference_routing.layers[layer].experts.sort(-1));
    at::Tensor agree = (a == b).all(-1);
    same += agree.sum().item<int64_t>();
    report.routing_decisions += agree.numel();
  }
  if (report.routing_decisions > 0) {
    report.routing_agreement =
        static_cast<double>(same) / static_cast<double>(report.routing_decisions);
  }
  return report;
}

}  // namespace strider
