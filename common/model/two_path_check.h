// The two-path contract as a reusable check (docs/design.md#two-paths-one-model): run tokens
// through the inference path in uneven appended chunks, then through the training path with the
// inference path's expert choices replayed, and again with each path routing on its own.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/model/model.h"
#include "common/status.h"

namespace strider {

struct TwoPathReport {
  double max_abs_logprob_diff = 0;  // training (routing replayed) vs inference, next-token
  double routing_agreement = 1;     // fraction of (token, sparse layer) expert sets that agree
  int64_t routing_decisions = 0;
  int64_t inference_chunks = 0;
};

// Chunk sizes covering `total` tokens: single tokens, odd sizes and chunks longer than the
// incremental kernel's chunk, so every kernel form and chunk boundary is exercised.
std::vector<int64_t> UnevenChunkSizes(int64_t total, int64_t kernel_chunk_size);

// tokens: (B, T). `chunk_sizes` must sum to T; empty means UnevenChunkSizes.
Result<TwoPathReport> CheckTwoPaths(const Model& model, const at::Tensor& tokens,
                                    std::vector<int64_t> chunk_sizes = {});

}  // namespace strider
