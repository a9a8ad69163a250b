// The decode path's in-place products against at::mm, and the property the engine relies on:
// a row's outputs are bitwise the same whatever batch it is multiplied in.
#include "common/kernels/matmul.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "common/kernels/cpu_features.h"

namespace strider::kernels {
namespace {

// The products are built for AVX2 with FMA; elsewhere Linear keeps the library's product.
#define SKIP_WITHOUT_AVX2()                           \
  if (!CpuHasAvx2WithFma()) {                         \
    GTEST_SKIP() << "this CPU has no AVX2 with FMA"; \
  }

TEST(MultiplyByTransposed, EqualsTheLibraryProductForEdgeShapes) {
  SKIP_WITHOUT_AVX2();
  at::NoGradGuard no_grad;
  at::manual_seed(3);
  // Rows, columns and the shared size around the tile sizes (4 rows, 3 columns, 8 lanes).
  for (int64_t rows : {1, 2, 3, 4, 5, 16, 64, 255}) {
    for (int64_t columns : {1, 2, 3, 7, 384}) {
      for (int64_t k_size : {1, 7, 8, 9, 256}) {
        at::Tensor x = at::randn({rows, k_size});
        at::Tensor weight = at::randn({columns, k_size});
        ASSERT_TRUE(CanMultiplyByTransposed(x, weight));
        at::Tensor y = MultiplyByTransposed(x, weight);
        at::Tensor expected = at::mm(x.to(at::kDouble), weight.to(at::kDouble).t());
        const double scale = std::sqrt(static_cast<double>(k_size));
        EXPECT_LT((y.to(at::kDouble) - expected).abs().max().item<double>(), 2e-6 * scale)
            << rows << "x" << k_size << " times " << columns << "x" << k_size;
      }
    }
  }
}

TEST(MultiplyByTransposed, RowsWithAStrideAndAnyBatchGiveTheSameBits) {
  SKIP_WITHOUT_AVX2();
  at::NoGradGuard no_grad;
  at::Tensor joined = at::randn({64, 600});
  at::Tensor x = joined.narrow(1, 40, 512);  // row stride 600, as parts of a joined projection
  at::Tensor weight = at::randn({389, 512});
  at::Tensor all = MultiplyByTransposed(x, weight);
  EXPECT_LT((all - at::mm(x, weight.t())).abs().max().item<float>(), 1e-3);
  // The same rows in smaller batches and at other positions (other tiles, tails of rows).
  for (int64_t begin : {0, 1, 5, 61}) {
    at::Tensor part = MultiplyByTransposed(x.narrow(0, begin, 3), weight);
    EXPECT_TRUE(at::equal(part, all.narrow(0, begin, 3))) << "rows from " << begin;
  }
  // One thread or all of them: the columns' split does not change a value.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  at::Tensor serial = MultiplyByTransposed(x, weight);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(serial, all));
  // One row alone (a batch-1 decode step): the same bits as in any batch.
  for (int64_t row : {0, 3, 63}) {
    EXPECT_TRUE(at::equal(MultiplyByTransposed(x.narrow(0, row, 1), weight),
                          all.narrow(0, row, 1)))
        << "row " << row;
  }
}

// A scoring or prefill chunk of several panels gives each row the bits it has in a decode batch:
// the learner's scoring of a trajectory equals the actor's batched decode of it.
TEST(MultiplyByTransposed, RowsOfALongChunkGiveTheBitsOfADecodeBatch) {
  SKIP_WITHOUT_AVX2();
  at::NoGradGuard no_grad;
  at::manual_seed(5);
  const int64_t rows = 2 * kRowsPerPanel + 37;
  at::Tensor x = at::randn({rows, 96});
  at::Tensor weight = at::randn({288, 96});
  at::Tensor chunk = MultiplyByTransposed(x, weight);
  EXPECT_LT((chunk - at::mm(x, weight.t())).abs().max().item<float>(), 1e-4);
  for (int64_t begin : {int64_t{0}, kRowsPerPanel - 2, rows - 5}) {
    EXPECT_TRUE(at::equal(MultiplyByTransposed(x.narrow(0, begin, 5), weight),
                          chunk.narrow(0, begin, 5)))
        << "rows from " << begin;
    EXPECT_TRUE(at::equal(MultiplyByTransposed(x.narrow(0, begin, 1), weight),
                          chunk.narrow(0, begin, 1)))
        << "row " << begin;
  }
}

TEST(MultiplyByTransposed, AppliesOnlyWhereItIsExact) {
  SKIP_WITHOUT_AVX2();
  at::Tensor x = at::randn({8, 16});
  at::Tensor weight = at::randn({4, 16});
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(CanMultiplyByTransposed(x, weight));
    EXPECT_TRUE(CanMultiplyByTransposed(x.narrow(0, 0, 1), weight));
    EXPECT_TRUE(CanMultiplyByTransposed(at::randn({kRowsPerPanel + 1, 16}), weight));
    EXPECT_FALSE(CanMultiplyByTransposed(x.narrow(0, 0, 0), weight));
    EXPECT_FALSE(CanMultiplyByTransposed(x.to(at::kDouble), weight.to(at::kDouble)));
    EXPECT_FALSE(CanMultiplyByTransposed(x.t(), at::randn({4, 8})));  // inner stride 8
    EXPECT_FALSE(CanMultiplyByTransposed(x, at::randn({16, 4}).t()));  // weight not contiguous
    EXPECT_FALSE(CanMultiplyByTransposed(x, at::randn({4, 15})));
  }
  EXPECT_FALSE(CanMultiplyByTransposed(x, weight));  // autograd on: the library's product
}

}  // namespace
}  // namespace strider::kernels
