#include "common/kernels/matmul.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "common/kernels/cpu_features.h"

namespace strider::kernels {
namespace {

constexpr int kRowsPerTile = 4;     // rows of x
constexpr int kColumnsPerTile = 3;  // rows of W: 12 accumulators, 3 W loads and one x load

#pragma GCC push_options
#pragma GCC optimize("O3")

__attribute__((target("avx2,fma"))) inline float SumLanes(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// y[i][j] = sum_k x[i][k] w[j][k] for Rows x Columns outputs. Every tile shape runs the same
// per-output sequence (lane-wise fused multiply-adds over k in steps of 8, the lanes summed in
// one fixed order, the remaining k added one by one), so an output's value does not depend on
// which tile computed it. Prefetch: the Columns rows of W after these ones.
template <int Rows, int Columns, bool Prefetch>
__attribute__((target("avx2,fma"))) inline void Tile(const float* x, int64_t x_stride,
                                                     const float* w, int64_t k_size, float* y,
                                                     int64_t y_stride) {
  __m256 sum[Rows][Columns];
  for (int i = 0; i < Rows; ++i) {
    for (int j = 0; j < Columns; ++j) sum[i][j] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 8 <= k_size; k += 8) {
    __m256 weight[Columns];
    for (int j = 0; j < Columns; ++j) weight[j] = _mm256_loadu_ps(w + j * k_size + k);
    if (Prefetch && (k & 15) == 0) {
      for (int j = 0; j < Columns; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(w + (Columns + j) * k_size + k),
                     _MM_HINT_T0);
      }
    }
    for (int i = 0; i < Rows; ++i) {
      const __m256 input = _mm256_loadu_ps(x + i * x_stride + k);
      for (int j = 0; j < Columns; ++j) sum[i][j] = _mm256_fmadd_ps(input, weight[j], sum[i][j]);
    }
  }
  for (int i = 0; i < Rows; ++i) {
    for (int j = 0; j < Columns; ++j) {
      float total = SumLanes(sum[i][j]);
      for (int64_t rest = k; rest < k_size; ++rest) {
        total = std::fma(x[i * x_stride + rest], w[j * k_size + rest], total);
      }
      y[i * y_stride + j] = total;
    }
  }
}

// Output columns [column_begin, column_end) for all rows.
__attribute__((target("avx2,fma"))) void MultiplyColumns(const float* x, int64_t x_stride,
                                                         const float* w, float* y,
                                                         int64_t rows, int64_t columns,
                                                         int64_t k_size, int64_t column_begin,
                                                         int64_t column_end) {
  int64_t n = column_begin;
  for (; n + kColumnsPerTile <= column_end; n += kColumnsPerTile) {
    const float* w_block = w + n * k_size;
    int64_t m = 0;
    if (rows >= kRowsPerTile) {
      // The first rows pull the next block of W towards the cache for the block after this.
      Tile<kRowsPerTile, kColumnsPerTile, true>(x, x_stride, w_block, k_size, y + n, columns);
      m = kRowsPerTile;
    }
    for (; m + kRowsPerTile <= rows; m += kRowsPerTile) {
      Tile<kRowsPerTile, kColumnsPerTile, false>(x + m * x_stride, x_stride, w_block, k_size,
                                                 y + m * columns + n, columns);
    }
    for (; m < rows; ++m) {
      Tile<1, kColumnsPerTile, false>(x + m * x_stride, x_stride, w_block, k_size,
                                      y + m * columns + n, columns);
    }
  }
  for (; n < column_end; ++n) {
    const float* w_row = w + n * k_size;
    int64_t m = 0;
    for (; m + kRowsPerTile <= rows; m += kRowsPerTile) {
      Tile<kRowsPerTile, 1, false>(x + m * x_stride, x_stride, w_row, k_size,
                                   y + m * columns + n, columns);
    }
    for (; m < rows; ++m) {
      Tile<1, 1, false>(x + m * x_stride, x_stride, w_row, k_size, y + m * columns + n, columns);
    }
  }
}

#pragma GCC pop_options

}  // namespace

bool CanMultiplyByTransposed(const at::Tensor& x, const at::Tensor& weight) {
  return !c10::GradMode::is_enabled() && CpuHasAvx2WithFma() && x.dim() == 2 &&
         weight.dim() == 2 && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
         x.device().is_cpu() && weight.device().is_cpu() && x.size(0) >= 1 &&
         x.size(1) == weight.size(1) && x.size(1) > 0 && x.stride(1) == 1 &&
         weight.is_contiguous();
}

at::Tensor MultiplyByTransposed(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(CanMultiplyByTransposed(x, weight),
              "MultiplyByTransposed: needs float32 (M, K) rows with unit inner stride and a "
              "contiguous (N, K) weight");
  const int64_t rows = x.size(0);
  const int64_t k_size = x.size(1);
  const int64_t columns = weight.size(0);
  at::Tensor y = at::empty({rows, columns}, x.options());
  const float* x_data = x.data_ptr<float>();
  const float* w_data = weight.data_ptr<float>();
  float* y_data = y.data_ptr<float>();
  const int64_t x_stride = x.stride(0);
  const int64_t blocks = (columns + kColumnsPerTile - 1) / kColumnsPerTile;
  // Panels of rows, each against all of W: a panel's rows stay in the cache while W streams
  // past them once, where all rows of a long prefill chunk would be read again for every block
  // of W. Panels and the column split change which tile computes an output, never its sum.
  for (int64_t first = 0; first < rows; first += kRowsPerPanel) {
    const int64_t panel = std::min(kRowsPerPanel, rows - first);
    // Blocks of columns; a thread takes enough of them (about 256K multiply-adds) to be worth
    // waking it.
    const int64_t per_block = panel * k_size * kColumnsPerTile;
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / per_block);
    at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
      MultiplyColumns(x_data + first * x_stride, x_stride, w_data, y_data + first * columns,
                      panel, columns, k_size, begin * kColumnsPerTile,
                      std::min(columns, end * kColumnsPerTile));
    });
  }
  return y;
}

}  // namespace strider::kernels
