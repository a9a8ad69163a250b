// Matrix products of the inference path: y = x W^T for any rows of x (a decode batch, one
// expert's share of it, a prefill or scoring chunk) against a weight matrix W as stored,
// (out, in) row-major.
//
// OpenBLAS packs W into a scratch layout on every call, which costs about as much as the
// product when x has 16 rows; these products read W in place, four rows of x against three rows
// of W at a time (twelve 8-lane accumulators along the shared dimension), and prefetch the
// next three rows of W while the first rows of x use the current ones. Measured against
// at::mm with weights cold in cache (2 cores): 16 rows 91 against 60 GFLOP/s on one thread,
// 64 rows 95 against 85.
//
// Every output is the same sum in the same order wherever its row sits in x, however many rows
// x has and however the columns are split across threads, so a sequence's numbers do not depend
// on the batch it is decoded with, and a learner scoring a trajectory in chunks of it computes
// the actor's products bit for bit (docs/rl_learner.md). The sum is that of 8-lane AVX2 on
// AVX-512 processors too, so the two instruction sets give the same bits.
#pragma once

#include <ATen/core/Tensor.h>

namespace strider::kernels {

// Rows of x multiplied against all of W at a time (a prefill chunk or a scoring chunk is
// several panels).
inline constexpr int64_t kRowsPerPanel = 256;

// Whether MultiplyByTransposed applies: no autograd, float32 on the CPU, a CPU with AVX2 and
// FMA, x 2-D with at least one row and unit inner stride, weight 2-D contiguous with x's inner
// size.
bool CanMultiplyByTransposed(const at::Tensor& x, const at::Tensor& weight);

// x (M, K) times weight (N, K) transposed: (M, N), contiguous. Columns are split across the
// intra-op threads when called outside a parallel region.
at::Tensor MultiplyByTransposed(const at::Tensor& x, const at::Tensor& weight);

}  // namespace strider::kernels
