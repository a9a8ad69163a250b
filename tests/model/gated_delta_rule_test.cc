// Invariants of the gated delta rule (docs/model_math.md#gated-delta-rule-invariants): the
// chunkwise form equals the recurrence, prefill plus decode equals one pass, the delta-rule write
// stores a value exactly, beta = 0 only decays, gradients match finite differences, the state does
// not grow.
#include "common/kernels/gated_delta_rule.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

namespace strider::kernels {
namespace {

struct Inputs {
  at::Tensor q;   // (B, H, T, Dk) unit norm times Dk^-1/2
  at::Tensor k;   // (B, H, T, Dk) unit norm
  at::Tensor v;   // (B, H, T, Dv)
  at::Tensor g;   // (B, H, T, Dk) in (-5, 0)
  at::Tensor b;   // (B, H, T) in (0, 1)
  at::Tensor s0;  // (B, H, Dk, Dv)

  std::vector<at::Tensor*> All() { return {&q, &k, &v, &g, &b, &s0}; }
};

// Realistic inputs, drawn in fp64 and then cast so fp32 and fp64 runs see the same values.
// The decay gate follows docs/model_math.md#gated-delta-rule (g = -5 sigmoid(z)) with a per-channel
// offset, so some channels barely decay and others lose up to e^-5 per step: exp(+G) would overflow
// in a chunk.
Inputs MakeInputs(int64_t b, int64_t h, int64_t t, int64_t dk, int64_t dv, at::ScalarType dtype,
                  uint64_t seed) {
  at::manual_seed(seed);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto unit = [&](int64_t width) {
    auto x = at::randn({b, h, t, width}, f64);
    return x / x.norm(2, {-1}, /*keepdim=*/true);
  };
  Inputs in;
  in.q = unit(dk) / std::sqrt(static_cast<double>(dk));
  in.k = unit(dk);
  in.v = at::randn({b, h, t, dv}, f64);
  auto channel_offset = at::linspace(-4.0, 4.0, dk, f64);  // (Dk)
  in.g = -5.0 * at::sigmoid(at::randn({b, h, t, dk}, f64) + channel_offset);
  in.b = at::sigmoid(at::randn({b, h, t}, f64));
  in.s0 = 0.5 * at::randn({b, h, dk, dv}, f64);
  for (at::Tensor* x : in.All()) *x = x->to(dtype);
  return in;
}

// max |a - b| / max |b|: the error relative to the scale of the reference.
double RelErr(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

GatedDeltaRuleOutput Recurrent(const Inputs& in) {
  return GatedDeltaRuleRecurrent(in.q, in.k, in.v, in.g, in.b, in.s0);
}

GatedDeltaRuleOutput Chunkwise(const Inputs& in, int64_t chunk) {
  return GatedDeltaRuleChunkwise(in.q, in.k, in.v, in.g, in.b, in.s0, chunk);
}

// Positions [start, start + len) of every per-position input; the state is left as is.
Inputs Slice(const Inputs& in, int64_t start, int64_t len) {
  Inputs out = in;
  out.q = in.q.narrow(2, start, len);
  out.k = in.k.narrow(2, start, len);
  out.v = in.v.narrow(2, start, len);
  out.g = in.g.narrow(2, start, len);
  out.b = in.b.narrow(2, start, len);
  return out;
}

void ExpectChunkwiseMatchesRecurrence(at::ScalarType dtype, double tolerance) {
  for (int64_t chunk : {16, 32, 64}) {
    for (int64_t t : {100, 130, 128, 7}) {
      const Inputs in = MakeInputs(2, 3, t, 16, 12, dtype, 1000 + t + chunk);
      const auto ref = Recurrent(in);
      const auto got = Chunkwise(in, chunk);
      ASSERT_EQ(got.output.sizes(), ref.output.sizes());
      ASSERT_EQ(got.final_state.sizes(), ref.final_state.sizes());
      const double out_err = RelErr(got.output, ref.output);
      const double state_err = RelErr(got.final_state, ref.final_state);
      std::printf("  %s C=%ld T=%ld: output rel err %.3g, state rel err %.3g\n",
                  dtype == at::kDouble ? "fp64" : "fp32", static_cast<long>(chunk),
                  static_cast<long>(t), out_err, state_err);
      EXPECT_LT(out_err, tolerance) << "C=" << chunk << " T=" << t;
      EXPECT_LT(state_err, tolerance) << "C=" << chunk << " T=" << t;
    }
  }
}

TEST(GatedDeltaRule, ChunkwiseMatchesRecurrenceFp64) {
  ExpectChunkwiseMatchesRecurrence(at::kDouble, 1e-10);
}

TEST(GatedDeltaRule, ChunkwiseMatchesRecurrenceFp32) {
  ExpectChunkwiseMatchesRecurrence(at::kFloat, 1e-5);
}

TEST(GatedDeltaRule, ChunkwiseMatchesRecurrenceForChunkNotMultipleOfSubBlock) {
  const Inputs in = MakeInputs(1, 2, 50, 8, 5, at::kDouble, 7);
  const auto ref = Recurrent(in);
  for (int64_t chunk : {1, 5, 24, 48}) {
    const auto got = Chunkwise(in, chunk);
    EXPECT_LT(RelErr(got.output, ref.output), 1e-10) << "C=" << chunk;
    EXPECT_LT(RelErr(got.final_state, ref.final_state), 1e-10) << "C=" << chunk;
  }
}

TEST(GatedDeltaRule, SplitCallsEqualOneCall) {
  const int64_t t = 100;
  const Inputs in = MakeInputs(2, 3, t, 16, 12, at::kDouble, 11);
  const auto whole_rec = Recurrent(in);
  const auto whole_chunk = Chunkwise(in, 32);

  for (int64_t split : {45, 64}) {
    Inputs first = Slice(in, 0, split);
    Inputs second = Slice(in, split, t - split);

    const auto rec1 = Recurrent(first);
    second.s0 = rec1.final_state;
    const auto rec2 = Recurrent(second);
    EXPECT_LT(RelErr(at::cat({rec1.output, rec2.output}, 2), whole_rec.output), 1e-12);
    EXPECT_LT(RelErr(rec2.final_state, whole_rec.final_state), 1e-12);

    const auto chunk1 = Chunkwise(first, 32);
    second.s0 = chunk1.final_state;
    const auto chunk2 = Chunkwise(second, 32);
    EXPECT_LT(RelErr(at::cat({chunk1.output, chunk2.output}, 2), whole_chunk.output), 1e-12);
    EXPECT_LT(RelErr(chunk2.final_state, whole_chunk.final_state), 1e-12);

    // Prefill with the chunkwise form, then decode one token per call with the recurrent one.
    std::vector<at::Tensor> outputs{chunk1.output};
    at::Tensor state = chunk1.final_state;
    for (int64_t pos = split; pos < t; ++pos) {
      Inputs step = Slice(in, pos, 1);
      step.s0 = state;
      const auto out = Recurrent(step);
      outputs.push_back(out.output);
      state = out.final_state;
    }
    EXPECT_LT(RelErr(at::cat(outputs, 2), whole_rec.output), 1e-10) << "split " << split;
    EXPECT_LT(RelErr(state, whole_rec.final_state), 1e-10) << "split " << split;
  }
}

// beta = 1 with a unit key overwrites what the state returns for that key: S_t^T k_t = v_t.
// Reading with q_t = k_t returns it through o_t, whatever the decay and the earlier state.
TEST(GatedDeltaRule, UnitKeyWithBetaOneStoresValue) {
  const int64_t t = 40;
  for (int64_t pos : {int64_t{0}, int64_t{17}, t - 1}) {
    Inputs in = MakeInputs(2, 3, t, 16, 12, at::kDouble, 21 + pos);
    in.b.select(2, pos).fill_(1.0);
    in.q.select(2, pos).copy_(in.k.select(2, pos));
    const auto v_pos = in.v.select(2, pos);  // (B, H, Dv)
    for (const auto& out : {Recurrent(in), Chunkwise(in, 16)}) {
      EXPECT_LT((out.output.select(2, pos) - v_pos).abs().max().item<double>(), 1e-12);
      if (pos == t - 1) {
        // S^T k from the returned state: (B, H, Dv).
        const auto read = at::matmul(in.k.select(2, pos).unsqueeze(-2), out.final_state)
                              .squeeze(-2);
        EXPECT_LT((read - v_pos).abs().max().item<double>(), 1e-12);
      }
    }
  }
}

// beta = 0 writes nothing: S_t = Diag(alpha_t) S_{t-1}, hence o_t = (exp(sum g) * S_0)^T q_t.
TEST(GatedDeltaRule, ZeroBetaOnlyDecays) {
  Inputs in = MakeInputs(2, 3, 70, 16, 12, at::kDouble, 31);
  in.b.zero_();
  const auto cum = in.g.cumsum(2).exp();                                   // (B, H, T, Dk)
  const auto expected_out = at::matmul((in.q * cum).unsqueeze(-2), in.s0.unsqueeze(2))
                                .squeeze(-2);                              // (B, H, T, Dv)
  const auto expected_state = cum.select(2, 69).unsqueeze(-1) * in.s0;     // (B, H, Dk, Dv)
  for (const auto& out : {Recurrent(in), Chunkwise(in, 32)}) {
    EXPECT_LT(RelErr(out.output, expected_out), 1e-12);
    EXPECT_LT(RelErr(out.final_state, expected_state), 1e-12);
  }
  // One step: exactly the decayed state.
  const Inputs one = Slice(in, 0, 1);
  const auto step = Recurrent(one);
  const auto decayed = one.g.select(2, 0).exp().unsqueeze(-1) * in.s0;
  EXPECT_LT((step.final_state - decayed).abs().max().item<double>(), 1e-15);
}

TEST(GatedDeltaRule, StateSizeDoesNotDependOnLength) {
  for (int64_t t : {1, 64, 1000}) {
    const Inputs in = MakeInputs(2, 3, t, 16, 12, at::kFloat, 41);
    for (const auto& out : {Recurrent(in), Chunkwise(in, 64)}) {
      EXPECT_EQ(out.final_state.sizes(), (at::IntArrayRef{2, 3, 16, 12})) << "T=" << t;
      EXPECT_EQ(out.output.sizes(), (at::IntArrayRef{2, 3, t, 12})) << "T=" << t;
    }
  }
}

// The decode loop updates a copy in place; the caller's state must survive, and the result must
// equal the differentiable loop's.
TEST(GatedDeltaRule, RecurrentInPlacePathMatchesDifferentiablePath) {
  Inputs in = MakeInputs(2, 3, 20, 16, 12, at::kDouble, 51);
  const auto s0_copy = in.s0.clone();
  const auto fast = Recurrent(in);
  EXPECT_TRUE(at::equal(in.s0, s0_copy));
  in.v.requires_grad_(true);
  const auto graded = Recurrent(in);
  ASSERT_TRUE(graded.output.requires_grad());
  EXPECT_LT(RelErr(fast.output, graded.output.detach()), 1e-14);
  EXPECT_LT(RelErr(fast.final_state, graded.final_state.detach()), 1e-14);
}

using Kernel = std::function<GatedDeltaRuleOutput(const Inputs&)>;

// A scalar loss that weighs every output and every final-state entry differently.
at::Tensor Loss(const GatedDeltaRuleOutput& out, const at::Tensor& w_out,
                const at::Tensor& w_state) {
  return (out.output * w_out).sum() + (out.final_state * w_state).sum();
}

// Gradients of all six inputs by backward(), for a fixed loss.
std::vector<at::Tensor> AnalyticGradients(const Kernel& kernel, Inputs in, const at::Tensor& w_out,
                                          const at::Tensor& w_state) {
  for (at::Tensor* x : in.All()) *x = x->detach().clone().requires_grad_(true);
  Loss(kernel(in), w_out, w_state).backward();
  std::vector<at::Tensor> grads;
  for (at::Tensor* x : in.All()) grads.push_back(x->grad().clone());
  return grads;
}

void ExpectGradientsMatchFiniteDifferences(const Kernel& kernel, const Inputs& in) {
  const auto w_out = at::randn(in.v.sizes(), in.v.options());
  const auto w_state = at::randn(in.s0.sizes(), in.s0.options());
  const auto analytic = AnalyticGradients(kernel, in, w_out, w_state);
  const double eps = 1e-6;
  const char* names[] = {"query", "key", "value", "log_decay", "beta", "initial_state"};
  Inputs probe = in;
  for (at::Tensor* x : probe.All()) *x = x->clone();
  const auto tensors = probe.All();
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto flat = tensors[i]->view({-1});
    auto grad = analytic[i].reshape({-1});
    double max_err = 0;
    for (int64_t j = 0; j < flat.numel(); ++j) {
      const double x0 = flat[j].item<double>();
      flat[j].fill_(x0 + eps);
      const double up = Loss(kernel(probe), w_out, w_state).item<double>();
      flat[j].fill_(x0 - eps);
      const double down = Loss(kernel(probe), w_out, w_state).item<double>();
      flat[j].fill_(x0);
      const double numeric = (up - down) / (2 * eps);
      max_err = std::max(max_err, std::abs(numeric - grad[j].item<double>()) /
                                      (1.0 + std::abs(numeric)));
    }
    std::printf("  gradient wrt %s: max err vs finite differences %.3g\n", names[i], max_err);
    EXPECT_LT(max_err, 1e-7) << names[i];
  }
}

TEST(GatedDeltaRule, RecurrentGradientsMatchFiniteDifferences) {
  const Inputs in = MakeInputs(1, 2, 5, 3, 2, at::kDouble, 61);
  ExpectGradientsMatchFiniteDifferences([](const Inputs& x) { return Recurrent(x); }, in);
}

TEST(GatedDeltaRule, ChunkwiseGradientsMatchFiniteDifferences) {
  // C = 2 over T = 5: three chunks, the last one padded.
  const Inputs tiny = MakeInputs(1, 2, 5, 3, 2, at::kDouble, 62);
  ExpectGradientsMatchFiniteDifferences([](const Inputs& x) { return Chunkwise(x, 2); }, tiny);
  // C = 32 over T = 37: two sub-blocks per chunk, so the factored off-diagonal terms count too.
  const Inputs sub = MakeInputs(1, 1, 37, 3, 2, at::kDouble, 63);
  ExpectGradientsMatchFiniteDifferences([](const Inputs& x) { return Chunkwise(x, 32); }, sub);
}

// On the full-size case with strongly decaying channels the two forms' gradients agree and are
// finite: an unmasked exp(G_s - G_r) would overflow and turn gradients into NaN.
TEST(GatedDeltaRule, ChunkwiseGradientsMatchRecurrentGradients) {
  const Inputs in = MakeInputs(2, 3, 130, 16, 12, at::kDouble, 71);
  const auto w_out = at::randn(in.v.sizes(), in.v.options());
  const auto w_state = at::randn(in.s0.sizes(), in.s0.options());
  const auto ref = AnalyticGradients([](const Inputs& x) { return Recurrent(x); }, in, w_out,
                                     w_state);
  const auto got = AnalyticGradients([](const Inputs& x) { return Chunkwise(x, 64); }, in, w_out,
                                     w_state);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(at::isfinite(got[i]).all().item<bool>()) << "input " << i;
    EXPECT_LT(RelErr(got[i], ref[i]), 1e-10) << "input " << i;
  }
}

}  // namespace
}  // namespace strider::kernels
