// Matrix products of the decode path: y = x W^T for a few rows of x (a decode batch, or one
// expert's share of it) against a weight matrix W as stored, (out, in) row-major.
//
// OpenBLAS packs W into a scratch layout on every call, which costs about as much as the
// product when x has 16 rows; these products read W in place, four rows of x against three rows
// of W at a time (twelve 8-lane accumulators along the shared dimension), and prefetch the
// next three rows of W while the first rows of x use the current ones. Measured against
// at::mm with weights cold in cache (2 cores): 16 rows 91 against 60 GFLOP/s on one thread,
// 64 rows 95 against 85.
//
// Every output is the same sum in the same order wherever its row sits in x and however the
// columns are split across threads, so a sequence's numbers do not depend on the batch it is
// decoded with.
#pragma once

#include <ATen/core/Tensor.h>

namespace strider::kernels {

// Rows of x up to which the in-place product is used; above it (prefill chunks, training) the
// packed product of the BLAS library is faster.
inline constexpr int64_t kInPlaceProductMaxRows = 256;

// Whether MultiplyByTransposed applies: no autograd, float32 on the CPU, a CPU with AVX2 and
// FMA, x 2-D with 2 to kInPlaceProductMaxRows rows and unit inner stride, weight 2-D contiguous
// with x's inner size.
bool CanMultiplyByTransposed(const at::Tensor& x, const at::Tensor& weight);

// x (M, K) times weight (N, K) transposed: (M, N), contiguous. Columns are split across the
// intra-op threads when called outside a parallel region.
at::Tensor MultiplyByTransposed(const at::Tensor& x, const at::Tensor& weight);

}  // namespace strider::kernels
