// The fused float32 prefill kernel behind kernels::LatentAttentionPrefill
// (common/kernels/latent_attention.h): one pass of AVX2 register tiles over each block of keys
// that computes the scores, the online softmax (maximum, exponential, sum, rescaling) and the
// weighted latent without leaving the core's caches, split over threads by runs of query tokens.
//
// Private to common/kernels: latent_attention.cc checks the tensors and turns them into the raw
// views below; nothing here includes ATen's operators, so the vector code compiles quickly.
#pragma once

#include <cstdint>
#include <vector>

namespace strider::kernels::internal {

enum class KeyStorage { kFloat, kDouble, kBFloat16 };

// A page of the past as stored: `rows` keys, each a latent row (Dc values at latent +
// i * latent_stride) and a rope-key row (Dr values at rope_key + i * rope_stride).
struct KeyPageView {
  const void* latent = nullptr;
  const void* rope_key = nullptr;
  int64_t rows = 0;
  int64_t latent_stride = 0;
  int64_t rope_stride = 0;
  KeyStorage storage = KeyStorage::kFloat;
};

// Shapes as in latent_attention.h, all float32 and contiguous except the pages.
struct FusedPrefillProblem {
  const float* query = nullptr;                                  // (B, T, H, Dc + Dr), scaled
  const float* new_latent = nullptr;                             // (B, T, Dc)
  const float* new_rope_key = nullptr;                           // (B, T, Dr)
  const std::vector<std::vector<KeyPageView>>* pages = nullptr;  // [B][pages]
  float* out = nullptr;                                          // (B, T, H, Dc)
  int64_t batch = 0, tokens = 0, heads = 0, latent_rank = 0, rope_dim = 0;
};

// Whether the fused kernel runs here: a CPU with AVX2 and FMA, and a latent rank that is a
// multiple of 8 (one vector of the weighted latent). Otherwise the caller keeps the ATen tiles.
bool CanRunFusedPrefill(int64_t latent_rank);

// Fills problem.out. Splits the work over the intra-op threads (or runs on the calling thread
// inside a parallel region). Allocates its scratch once per thread per call.
void RunFusedPrefill(const FusedPrefillProblem& problem);

}  // namespace strider::kernels::internal
