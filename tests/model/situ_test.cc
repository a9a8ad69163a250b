// SiTU-GLU against the fp64 values of docs/model_math.md#situ-glu-values.
#include "common/kernels/situ.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>

namespace strider::kernels {
namespace {

double Situ(double a, double b) {
  return SituGlu(at::scalar_tensor(a, at::kDouble), at::scalar_tensor(b, at::kDouble))
      .item<double>();
}

// Relative tolerance matches the 7-8 significant digits docs/model_math.md quotes.
void ExpectClose(double actual, double expected) {
  EXPECT_NEAR(actual, expected, 2e-7 * std::abs(expected)) << "expected " << expected;
}

TEST(SituGlu, MatchesReferenceValues) {
  ExpectClose(Situ(1, 1), 0.7158178);
  ExpectClose(Situ(-1, 1), -0.2633347);
  ExpectClose(Situ(2, 3), 4.8610666);
  ExpectClose(Situ(10, 10), 37.484606);
  ExpectClose(Situ(100, 100), 99.93293);
}

TEST(SituGlu, GateDerivativeAtZeroIsHalfTheCappedUp) {
  at::Tensor a = at::zeros({1}, at::kDouble).requires_grad_(true);
  at::Tensor b = at::ones({1}, at::kDouble);
  SituGlu(a, b).sum().backward();
  // d/da [4 tanh(a/4) sigmoid(a)] at 0 is 1/2, times 25 tanh(1/25) = 0.99946696.
  EXPECT_NEAR(a.grad().item<double>(), 0.49973, 5e-6);
}

TEST(SituGlu, MatchesSwiGluNearZeroAndStaysBounded) {
  at::Tensor small = 1e-3 * at::randn({1000}, at::kDouble);
  at::Tensor small_up = 1e-3 * at::randn({1000}, at::kDouble);
  at::Tensor swiglu = small * at::sigmoid(small) * small_up;
  // Second-order products are ~1e-6; the caps change them only at third order.
  EXPECT_LT((SituGlu(small, small_up) - swiglu).abs().max().item<double>(), 1e-10);

  at::Tensor large = 1e4 * at::randn({4096}, at::kDouble);
  at::Tensor large_up = 1e4 * at::randn({4096}, at::kDouble);
  at::Tensor out = SituGlu(large, large_up);
  EXPECT_LE(out.abs().max().item<double>(), 100.0);
  EXPECT_GT(out.abs().max().item<double>(), 99.0);  // the bound is approached, not just respected
  EXPECT_TRUE(at::isfinite(out).all().item<bool>());
  // Custom caps: bounded by their product.
  EXPECT_LE(SituGlu(large, large_up, 2, 3).abs().max().item<double>(), 6.0);
}

TEST(SituGlu, KeepsDtypeAndGradientsFlowToBothInputs) {
  at::Tensor a = at::randn({4, 8}).requires_grad_(true);
  at::Tensor b = at::randn({4, 8}).requires_grad_(true);
  at::Tensor out = SituGlu(a, b);
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  EXPECT_EQ(out.sizes(), a.sizes());
  out.sum().backward();
  EXPECT_GT(a.grad().abs().sum().item<double>(), 0.0);
  EXPECT_GT(b.grad().abs().sum().item<double>(), 0.0);
}

// Without autograd, fp32 inputs take one fused pass (AVX2 with glibc's vector tanh and exp where
// the CPU has it). It must give the operators' values for every width (full 8-lane blocks and
// tails), for views with a row stride (parts of a joined projection), at the caps, and give a
// value independent of where an element sits in its row.
TEST(SituGlu, FusedInferencePassEqualsTheOperators) {
  at::NoGradGuard no_grad;
  auto reference = [](const at::Tensor& a, const at::Tensor& b) {
    at::Tensor a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
    return (at::tanh(a64 / 4) * 4 * at::sigmoid(a64) * at::tanh(b64 / 25) * 25);
  };
  for (int64_t width : {1, 7, 8, 13, 384}) {
    at::Tensor a = 3 * at::randn({5, width});
    at::Tensor b = 30 * at::randn({5, width});
    at::Tensor out = SituGlu(a, b);
    ASSERT_EQ(out.sizes(), a.sizes());
    ASSERT_EQ(out.scalar_type(), at::kFloat);
    at::Tensor expected = reference(a, b);
    at::Tensor relative = (out.to(at::kDouble) - expected).abs() / (expected.abs() + 1e-3);
    EXPECT_LT(relative.max().item<double>(), 1e-5) << "width " << width;
  }
  // Parts of one (rows, 2 * width) tensor, as the shared expert's joined projection gives them.
  at::Tensor joined = at::randn({6, 2 * 24});
  at::Tensor out = SituGlu(joined.narrow(1, 0, 24), joined.narrow(1, 24, 24));
  EXPECT_LT((out.to(at::kDouble) - reference(joined.narrow(1, 0, 24), joined.narrow(1, 24, 24)))
                .abs()
                .max()
                .item<double>(),
            1e-5);
  // Far past the caps: bounded by their product, and finite.
  at::Tensor large = 1e4 * at::randn({3, 21});
  at::Tensor bounded = SituGlu(large, large);
  EXPECT_TRUE(at::isfinite(bounded).all().item<bool>());
  EXPECT_LE(bounded.abs().max().item<float>(), 100.0f);
  // One value in different places: the tail of a row and the middle of a longer one.
  at::Tensor row = at::randn({1, 16});
  at::Tensor row_up = at::randn({1, 16});
  at::Tensor whole = SituGlu(row, row_up);
  at::Tensor tail = SituGlu(row.narrow(1, 8, 5).contiguous(), row_up.narrow(1, 8, 5).contiguous());
  EXPECT_TRUE(at::equal(whole.narrow(1, 8, 5), tail));
}

}  // namespace
}  // namespace strider::kernels
