// CUDA decode kernels (common/kernels/cuda/decode_kernels.h) against fp64 references written
// here in plain C++, so the test needs neither LibTorch nor a CUDA-enabled build of it.
//
// Every case that launches a kernel skips with the runtime's reason when no device is present
// (CI and the development hosts have none). Argument checks happen before any CUDA call, so
// those cases run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "common/kernels/cuda/decode_kernels.h"
#include "common/random.h"

namespace strider::kernels::cuda {
namespace {

// Relative to the largest reference magnitude of each row (head): fp32 against fp64.
constexpr double kTolerance = 1e-5;

#define STRIDER_SKIP_WITHOUT_DEVICE()                                          \
  do {                                                                         \
    std::string why;                                                           \
    if (!CudaDeviceAvailable(&why)) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (false)

// Deterministic, fast uniform numbers (splitmix64): the long-context case fills ~230M values.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return SplitMix64Next(&state_); }
  // Uniform in [lo, hi).
  float Uniform(float lo, float hi) {
    const double u = static_cast<double>(Next() >> 11) * 0x1.0p-53;
    return static_cast<float>(lo + (hi - lo) * u);
  }
  std::vector<float> Vector(size_t n, float lo, float hi) {
    std::vector<float> out(n);
    for (float& x : out) x = Uniform(lo, hi);
    return out;
  }

 private:
  uint64_t state_;
};

// Device memory owned by the test; freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  ::testing::AssertionResult Allocate(size_t count) {
    count_ = count;
    const cudaError_t error = cudaMalloc(&ptr_, std::max<size_t>(count, 1) * sizeof(T));
    if (error != cudaSuccess) {
      return ::testing::AssertionFailure() << "cudaMalloc: " << cudaGetErrorString(error);
    }
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult Upload(const std::vector<T>& host) {
    auto allocated = Allocate(host.size());
    if (!allocated) return allocated;
    const cudaError_t error =
        cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    if (error != cudaSuccess) {
      return ::testing::AssertionFailure() << "cudaMemcpy to device: " << cudaGetErrorString(error);
    }
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult Download(std::vector<T>* host) const {
    host->resize(count_);
    const cudaError_t error =
        cudaMemcpy(host->data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
    if (error != cudaSuccess) {
      return ::testing::AssertionFailure() << "cudaMemcpy to host: " << cudaGetErrorString(error);
    }
    return ::testing::AssertionSuccess();
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

::testing::AssertionResult Synchronize() {
  const cudaError_t error = cudaDeviceSynchronize();
  if (error != cudaSuccess) {
    return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(error);
  }
  return ::testing::AssertionSuccess();
}

// Largest over rows of max|gpu - ref| / max|ref| within the row; rows of `row_len` values.
double MaxRowRelativeError(const std::vector<float>& gpu, const std::vector<double>& ref,
                           size_t row_len) {
  double worst = 0.0;
  for (size_t row = 0; row * row_len < ref.size(); ++row) {
    double err = 0.0, scale = 0.0;
    for (size_t i = row * row_len; i < (row + 1) * row_len; ++i) {
      err = std::max(err, std::abs(static_cast<double>(gpu[i]) - ref[i]));
      scale = std::max(scale, std::abs(ref[i]));
    }
    worst = std::max(worst, err / std::max(scale, 1e-30));
  }
  return worst;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Runs fn(i) for i in [0, n) on all hardware threads: the long-context reference is ~2 GFMA.
template <typename Fn>
void ParallelFor(int64_t n, Fn fn) {
  const int64_t workers =
      std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(n, 1));
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (int64_t i = w; i < n; i += workers) fn(i);
    });
  }
  for (auto& t : threads) t.join();
}

// ---------------------------------------------------------------------------------------------
// Gated delta rule

struct DecodeInputs {
  std::vector<float> query, key, value, log_decay, beta;
};

// Inputs shaped like the model's: unit keys, queries of norm Dk^-1/2, g in (-5, 0].
DecodeInputs RandomDecodeInputs(const GatedDeltaRuleDecodeDims& d, Rng& rng) {
  const size_t bh = d.batch * d.heads;
  DecodeInputs in;
  in.query = rng.Vector(bh * d.key_dim, -1, 1);
  in.key = rng.Vector(bh * d.key_dim, -1, 1);
  for (size_t row = 0; row < bh; ++row) {
    double qn = 0, kn = 0;
    for (int64_t i = 0; i < d.key_dim; ++i) {
      qn += std::pow(in.query[row * d.key_dim + i], 2);
      kn += std::pow(in.key[row * d.key_dim + i], 2);
    }
    const double q_scale = 1.0 / std::sqrt(qn * d.key_dim);
    for (int64_t i = 0; i < d.key_dim; ++i) {
      in.query[row * d.key_dim + i] *= q_scale;
      in.key[row * d.key_dim + i] /= std::sqrt(kn);
    }
  }
  in.value = rng.Vector(bh * d.value_dim, -1, 1);
  in.log_decay.resize(bh * d.key_dim);
  for (float& g : in.log_decay) {
    const float u = rng.Uniform(0, 1);
    g = -5.0f * u * u;  // many channels near 0 (long memory), some near g_min
  }
  in.beta = rng.Vector(bh, 0, 1);
  return in;
}

// One step in fp64: S <- Diag(exp g) S; S <- S + beta k (v - S^T k)^T; o = S^T q.
void ReferenceDecodeStep(const GatedDeltaRuleDecodeDims& d, const DecodeInputs& in,
                         std::vector<double>* state, std::vector<double>* output) {
  const int64_t dk = d.key_dim, dv = d.value_dim;
  output->assign(d.batch * d.heads * dv, 0.0);
  for (int64_t bh = 0; bh < d.batch * d.heads; ++bh) {
    double* s = state->data() + bh * dk * dv;
    for (int64_t i = 0; i < dk; ++i) {
      const double alpha = std::exp(static_cast<double>(in.log_decay[bh * dk + i]));
      for (int64_t j = 0; j < dv; ++j) s[i * dv + j] *= alpha;
    }
    for (int64_t j = 0; j < dv; ++j) {
      double kts = 0;
      for (int64_t i = 0; i < dk; ++i) kts += in.key[bh * dk + i] * s[i * dv + j];
      const double u = in.beta[bh] * (in.value[bh * dv + j] - kts);
      for (int64_t i = 0; i < dk; ++i) s[i * dv + j] += in.key[bh * dk + i] * u;
    }
    for (int64_t j = 0; j < dv; ++j) {
      double o = 0;
      for (int64_t i = 0; i < dk; ++i) o += in.query[bh * dk + i] * s[i * dv + j];
      (*output)[bh * dv + j] = o;
    }
  }
}

struct GpuDecodeInputs {
  DeviceArray<float> query, key, value, log_decay, beta;
  ::testing::AssertionResult Upload(const DecodeInputs& in) {
    for (auto [dev, host] :
         {std::pair{&query, &in.query}, std::pair{&key, &in.key}, std::pair{&value, &in.value},
          std::pair{&log_decay, &in.log_decay}, std::pair{&beta, &in.beta}}) {
      auto uploaded = dev->Upload(*host);
      if (!uploaded) return uploaded;
    }
    return ::testing::AssertionSuccess();
  }
};

class GatedDeltaRuleDecodeShapes : public ::testing::TestWithParam<GatedDeltaRuleDecodeDims> {};

// Several consecutive steps from a nonzero state: outputs and the in-place state follow the
// fp64 recurrence.
TEST_P(GatedDeltaRuleDecodeShapes, MatchesFp64RecurrenceOverSteps) {
  STRIDER_SKIP_WITHOUT_DEVICE();
  const GatedDeltaRuleDecodeDims d = GetParam();
  Rng rng(1234 + d.key_dim * 131 + d.value_dim);
  const size_t state_size = d.batch * d.heads * d.key_dim * d.value_dim;
  std::vector<float> state0 = rng.Vector(state_size, -1, 1);
  std::vector<double> ref_state(state0.begin(), state0.end());
  DeviceArray<float> state, output;
  ASSERT_TRUE(state.Upload(state0));
  ASSERT_TRUE(output.Allocate(d.batch * d.heads * d.value_dim));

  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const DecodeInputs in = RandomDecodeInputs(d, rng);
    GpuDecodeInputs gpu;
    ASSERT_TRUE(gpu.Upload(in));
    const Status status =
        GatedDeltaRuleDecodeStep(d, state.get(), gpu.query.get(), gpu.key.get(), gpu.value.get(),
                                 gpu.log_decay.get(), gpu.beta.get(), output.get(), nullptr);
    ASSERT_TRUE(status.ok()) << status.ToString();
    ASSERT_TRUE(Synchronize());
    std::vector<double> ref_output;
    ReferenceDecodeStep(d, in, &ref_state, &ref_output);
    std::vector<float> got_output, got_state;
    ASSERT_TRUE(output.Download(&got_output));
    ASSERT_TRUE(state.Download(&got_state));
    EXPECT_LE(MaxRowRelativeError(got_output, ref_output, d.value_dim), kTolerance);
    EXPECT_LE(MaxRowRelativeError(got_state, ref_state, d.key_dim * d.value_dim), kTolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GatedDeltaRuleDecodeShapes,
    ::testing::Values(GatedDeltaRuleDecodeDims{96, 4, 128, 128},  // reference widths
                      GatedDeltaRuleDecodeDims{4, 96, 128, 128},  // reference heads
                      GatedDeltaRuleDecodeDims{2, 3, 64, 32},
                      GatedDeltaRuleDecodeDims{3, 2, 100, 72},  // widths not powers of 2
                      GatedDeltaRuleDecodeDims{1, 5, 17, 128},
                      GatedDeltaRuleDecodeDims{2, 2, 128, 1}, GatedDeltaRuleDecodeDims{1, 1, 1, 1}),
    [](const auto& info) {
      const auto& d = info.param;
      return "B" + std::to_string(d.batch) + "H" + std::to_string(d.heads) + "Dk" +
             std::to_string(d.key_dim) + "Dv" + std::to_string(d.value_dim);
    });

// docs/model_math.md#gated-delta-rule-invariants: with beta = 1 and a unit key, S^T k = v after the
// write.
TEST(GatedDeltaRuleDecode, UnitKeyWithBetaOneStoresValue) {
  STRIDER_SKIP_WITHOUT_DEVICE();
  const GatedDeltaRuleDecodeDims d{8, 4, 128, 128};
  Rng rng(7);
  DecodeInputs in = RandomDecodeInputs(d, rng);
  std::fill(in.beta.begin(), in.beta.end(), 1.0f);
  DeviceArray<float> state, output;
  ASSERT_TRUE(state.Upload(rng.Vector(d.batch * d.heads * d.key_dim * d.value_dim, -1, 1)));
  ASSERT_TRUE(output.Allocate(d.batch * d.heads * d.value_dim));
  GpuDecodeInputs gpu;
  ASSERT_TRUE(gpu.Upload(in));
  const Status status =
      GatedDeltaRuleDecodeStep(d, state.get(), gpu.query.get(), gpu.key.get(), gpu.value.get(),
                               gpu.log_decay.get(), gpu.beta.get(), output.get(), nullptr);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_TRUE(Synchronize());
  std::vector<float> got;
  ASSERT_TRUE(state.Download(&got));
  double worst = 0;
  for (int64_t bh = 0; bh < d.batch * d.heads; ++bh) {
    for (int64_t j = 0; j < d.value_dim; ++j) {
      double kts = 0;
      for (int64_t i = 0; i < d.key_dim; ++i) {
        kts += static_cast<double>(in.key[bh * d.key_dim + i]) *
               got[(bh * d.key_dim + i) * d.value_dim + j];
      }
      worst = std::max(worst, std::abs(kts - in.value[bh * d.value_dim + j]));
    }
  }
  EXPECT_LE(worst, kTolerance);  // values are in [-1, 1]
}

// docs/model_math.md#gated-delta-rule-invariants: with beta = 0 the step only decays the state.
TEST(GatedDeltaRuleDecode, BetaZeroOnlyDecays) {
  STRIDER_SKIP_WITHOUT_DEVICE();
  const GatedDeltaRuleDecodeDims d{3, 4, 128, 96};
  Rng rng(11);
  DecodeInputs in = RandomDecodeInputs(d, rng);
  std::fill(in.beta.begin(), in.beta.end(), 0.0f);
  const std::vector<float> state0 = rng.Vector(d.batch * d.heads * d.key_dim * d.value_dim, -1, 1);
  DeviceArray<float> state, output;
  ASSERT_TRUE(state.Upload(state0));
  ASSERT_TRUE(output.Allocate(d.batch * d.heads * d.value_dim));
  GpuDecodeInputs gpu;
  ASSERT_TRUE(gpu.Upload(in));
  const Status status =
      GatedDeltaRuleDecodeStep(d, state.get(), gpu.query.get(), gpu.key.get(), gpu.value.get(),
                               gpu.log_decay.get(), gpu.beta.get(), output.get(), nullptr);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_TRUE(Synchronize());
  std::vector<float> got;
  ASSERT_TRUE(state.Download(&got));
  std::vector<double> expected(state0.size());
  for (int64_t bh = 0; bh < d.batch * d.heads; ++bh) {
    for (int64_t i = 0; i < d.key_dim; ++i) {
      const double alpha = std::exp(static_cast<double>(in.log_decay[bh * d.key_dim + i]));
      for (int64_t j = 0; j < d.value_dim; ++j) {
        const size_t at = (bh * d.key_dim + i) * d.value_dim + j;
        expected[at] = state0[at] * alpha;
      }
    }
  }
  EXPECT_LE(MaxRowRelativeError(got, expected, d.key_dim * d.value_dim), 1e-6);
}

// Runs without a device: shapes are checked before any CUDA call.
TEST(GatedDeltaRuleDecode, RejectsBadDims) {
  float dummy = 0;
  float* p = &dummy;
  auto call = [&](GatedDeltaRuleDecodeDims d, float* ptr) {
    return GatedDeltaRuleDecodeStep(d, ptr, ptr, ptr, ptr, ptr, ptr, ptr, nullptr);
  };
  EXPECT_TRUE(call({1, 1, 129, 128}, p).IsInvalidArgument());
  EXPECT_TRUE(call({1, 1, 128, 129}, p).IsInvalidArgument());
  EXPECT_TRUE(call({1, 1, 0, 128}, p).IsInvalidArgument());
  EXPECT_TRUE(call({-1, 1, 128, 128}, p).IsInvalidArgument());
  EXPECT_TRUE(call({2, 2, 128, 128}, nullptr).IsInvalidArgument());
  // An empty batch is a no-op that touches nothing.
  EXPECT_TRUE(call({0, 4, 128, 128}, nullptr).ok());
}

// ---------------------------------------------------------------------------------------------
// Latent attention

struct LatentCase {
  std::string name;
  LatentAttentionDecodeDims dims;
  std::vector<int32_t> lengths;  // (B)
};

void PrintTo(const LatentCase& c, std::ostream* os) { *os << c.name; }

// fp64 softmax over the first lengths[b] rows; output (B, H, Dc) and lse (B, H).
void ReferenceLatentDecode(const LatentAttentionDecodeDims& d, const std::vector<float>& aq,
                           const std::vector<float>& rq, const std::vector<float>& latent,
                           const std::vector<float>& rope, const std::vector<int32_t>& lengths,
                           std::vector<double>* output, std::vector<double>* lse) {
  const int64_t dc = d.latent_dim, dr = d.rope_dim;
  output->assign(d.batch * d.heads * dc, 0.0);
  lse->assign(d.batch * d.heads, -std::numeric_limits<double>::infinity());
  ParallelFor(d.batch * d.heads, [&](int64_t bh) {
    const int64_t b = bh / d.heads;
    const int64_t length = std::min<int64_t>(lengths[b], d.capacity);
    if (length <= 0) return;
    std::vector<double> scores(length);
    double max_score = -std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s < length; ++s) {
      const float* c = latent.data() + (b * d.capacity + s) * dc;
      const float* kr = rope.data() + (b * d.capacity + s) * dr;
      double dot = 0;
      for (int64_t i = 0; i < dc; ++i) dot += static_cast<double>(aq[bh * dc + i]) * c[i];
      for (int64_t i = 0; i < dr; ++i) dot += static_cast<double>(rq[bh * dr + i]) * kr[i];
      scores[s] = dot * d.scale;
      max_score = std::max(max_score, scores[s]);
    }
    double total = 0;
    std::vector<double> acc(dc, 0.0);
    for (int64_t s = 0; s < length; ++s) {
      const double p = std::exp(scores[s] - max_score);
      total += p;
      const float* c = latent.data() + (b * d.capacity + s) * dc;
      for (int64_t i = 0; i < dc; ++i) acc[i] += p * c[i];
    }
    for (int64_t i = 0; i < dc; ++i) (*output)[bh * dc + i] = acc[i] / total;
    (*lse)[bh] = max_score + std::log(total);
  });
}

// After a latent decode launch that returned `status`: waits for it and downloads its outputs
// and log-sum-exps. Fatal failures return early: callers wrap the call in
// ASSERT_NO_FATAL_FAILURE.
void FinishDecode(const Status& status, const DeviceArray<float>& out_d,
                  const DeviceArray<float>& lse_d, std::vector<float>* out,
                  std::vector<float>* lse) {
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_TRUE(Synchronize());
  ASSERT_TRUE(out_d.Download(out));
  ASSERT_TRUE(lse_d.Download(lse));
}

class LatentAttentionDecodeCases : public ::testing::TestWithParam<LatentCase> {};

TEST_P(LatentAttentionDecodeCases, MatchesFp64Softmax) {
  STRIDER_SKIP_WITHOUT_DEVICE();
  const LatentCase& c = GetParam();
  const LatentAttentionDecodeDims& d = c.dims;
  ASSERT_EQ(c.lengths.size(), static_cast<size_t>(d.batch));
  Rng rng(99 + d.latent_dim + d.capacity);
  // Unit-variance latents (c_kv is RMS-normalised) and queries giving scores of spread ~1.
  const float a = std::sqrt(3.0f);
  const std::vector<float> aq = rng.Vector(d.batch * d.heads * d.latent_dim, -1, 1);
  const std::vector<float> rq = rng.Vector(d.batch * d.heads * d.rope_dim, -1, 1);
  const std::vector<float> latent = rng.Vector(d.batch * d.capacity * d.latent_dim, -a, a);
  const std::vector<float> rope = rng.Vector(d.batch * d.capacity * d.rope_dim, -a, a);

  DeviceArray<float> aq_d, rq_d, latent_d, rope_d, out_d, lse_d;
  DeviceArray<int32_t> lengths_d;
  DeviceArray<char> workspace;
  ASSERT_TRUE(aq_d.Upload(aq));
  ASSERT_TRUE(latent_d.Upload(latent));
  ASSERT_TRUE(lengths_d.Upload(c.lengths));
  if (d.rope_dim > 0) {
    ASSERT_TRUE(rq_d.Upload(rq));
    ASSERT_TRUE(rope_d.Upload(rope));
  }
  ASSERT_TRUE(out_d.Allocate(d.batch * d.heads * d.latent_dim));
  ASSERT_TRUE(lse_d.Allocate(d.batch * d.heads));
  const size_t workspace_bytes = LatentAttentionDecodeWorkspaceBytes(d);
  ASSERT_GT(workspace_bytes, 0u);
  ASSERT_TRUE(workspace.Allocate(workspace_bytes));

  const Status status = LatentAttentionDecode(
      d, aq_d.get(), rq_d.get(), latent_d.get(), rope_d.get(), lengths_d.get(), out_d.get(),
      lse_d.get(), workspace.get(), workspace_bytes, nullptr);
  std::vector<float> got, got_lse;
  ASSERT_NO_FATAL_FAILURE(FinishDecode(status, out_d, lse_d, &got, &got_lse));

  std::vector<double> ref, ref_lse;
  ReferenceLatentDecode(d, aq, rq, latent, rope, c.lengths, &ref, &ref_lse);
  for (int64_t b = 0; b < d.batch; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b) + " of length " + std::to_string(c.lengths[b]));
    const size_t row = b * d.heads * d.latent_dim;
    const size_t size = d.heads * d.latent_dim;
    if (c.lengths[b] <= 0) {
      // Empty past: zeros and lse = -inf by contract.
      for (size_t i = row; i < row + size; ++i) ASSERT_EQ(got[i], 0.0f);
      for (int64_t h = 0; h < d.heads; ++h) EXPECT_EQ(got_lse[b * d.heads + h], -INFINITY);
      continue;
    }
    const std::vector<float> got_b(got.begin() + row, got.begin() + row + size);
    const std::vector<double> ref_b(ref.begin() + row, ref.begin() + row + size);
    EXPECT_LE(MaxRowRelativeError(got_b, ref_b, d.latent_dim), kTolerance);
    for (int64_t h = 0; h < d.heads; ++h) {
      const double want = ref_lse[b * d.heads + h];
      EXPECT_NEAR(got_lse[b * d.heads + h], want, kTolerance * std::max(1.0, std::abs(want)));
    }
  }
}

LatentAttentionDecodeDims LatentDims(int64_t batch, int64_t heads, int64_t dc, int64_t dr,
                                     int64_t capacity) {
  LatentAttentionDecodeDims d;
  d.batch = batch;
  d.heads = heads;
  d.latent_dim = dc;
  d.rope_dim = dr;
  d.capacity = capacity;
  d.scale = static_cast<float>(1.0 / std::sqrt(128.0 + 64.0));  // reference d_nope + d_rope
  return d;
}

std::vector<int32_t> UnevenLengths(int64_t batch, int32_t capacity) {
  Rng rng(5);
  std::vector<int32_t> lengths(batch);
  for (int32_t& l : lengths) l = 1 + static_cast<int32_t>(rng.Next() % capacity);
  lengths[0] = 1;
  lengths[1] = 17;
  lengths[2] = capacity;
  return lengths;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LatentAttentionDecodeCases,
    ::testing::Values(
        // Reference widths; contexts of 1 to 100,000 rows in one uneven batch, so one sequence
        // spans hundreds of splits while others end in the first.
        LatentCase{"LongContext", LatentDims(4, 16, 512, 64, 100000), {4096, 1, 100000, 17}},
        // B x H = 96 x 4: one head group per sequence, many sequences of random lengths.
        LatentCase{"ManySequences", LatentDims(96, 4, 512, 64, 2048), UnevenLengths(96, 2048)},
        // All 96 reference heads: six head groups share each cache row.
        LatentCase{"ReferenceHeads", LatentDims(2, 96, 512, 64, 1000), {300, 1000}},
        // Odd widths, a partial head group and partial tiles.
        LatentCase{"OddWidths", LatentDims(3, 5, 40, 7, 70), {1, 33, 70}},
        // The widest row the kernel takes (16 columns per thread), two head groups.
        LatentCase{"WideLatent", LatentDims(2, 20, 1024, 128, 5000), {4999, 64}},
        // No rope part: null rope pointers are allowed.
        LatentCase{"NoRope", LatentDims(2, 3, 64, 0, 300), {5, 300}},
        // An empty past gives zeros; its neighbour is unaffected.
        LatentCase{"EmptySequence", LatentDims(2, 4, 512, 64, 64), {0, 10}}),
    [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Paged latent attention: the rollout engine's layout (rollout_engine/paged_cache.h). One pool of
// blocks, each (block_tokens, Dc + Dr) with the latent and rope parts side by side in a row;
// every sequence owns a table of blocks in position order, blocks are scattered through the
// pool, and forked sequences share their prefix's blocks.

struct PagedCase {
  std::string name;
  int64_t heads, dc, dr, page_rows;
  std::vector<int32_t> lengths;  // (B)
  bool share_prefix;             // sequence 1 reads sequence 0's first blocks (a fork)
};

void PrintTo(const PagedCase& c, std::ostream* os) { *os << c.name; }

class LatentAttentionDecodePagedCases : public ::testing::TestWithParam<PagedCase> {};

TEST_P(LatentAttentionDecodePagedCases, MatchesFp64AndTheContiguousKernel) {
  STRIDER_SKIP_WITHOUT_DEVICE();
  const PagedCase& c = GetParam();
  const int64_t batch = static_cast<int64_t>(c.lengths.size());
  const int64_t width = c.dc + c.dr;
  int64_t max_pages = 1;
  for (int32_t length : c.lengths)
    max_pages = std::max<int64_t>(max_pages, CeilDiv(length, c.page_rows));
  // A pool larger than the tables need, block order shuffled: neighbouring positions live in
  // unrelated blocks, and a wrong page index reads some other sequence's values.
  const int64_t pool_blocks = batch * max_pages + 7;
  Rng rng(31 + c.dc + c.page_rows);
  const float a = std::sqrt(3.0f);
  const std::vector<float> pool = rng.Vector(pool_blocks * c.page_rows * width, -a, a);
  std::vector<int64_t> order(pool_blocks);
  for (int64_t i = 0; i < pool_blocks; ++i) order[i] = i;
  for (int64_t i = pool_blocks - 1; i > 0; --i) {
    std::swap(order[i], order[static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(i + 1))]);
  }
  std::vector<int64_t> table(batch * max_pages, -1);  // block ids; -1 past a sequence's end
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t p = 0; p < CeilDiv(c.lengths[b], c.page_rows); ++p) {
      table[b * max_pages + p] =
          (c.share_prefix && b == 1 && p + 1 < CeilDiv(c.lengths[0], c.page_rows)) ? table[p]
                                                                                   : order[next++];
    }
  }

  // The same rows gathered into a contiguous cache, for the fp64 reference and the contiguous
  // kernel; padding past each length is poison that must never be read.
  LatentAttentionDecodeDims d = LatentDims(batch, c.heads, c.dc, c.dr, max_pages * c.page_rows);
  std::vector<float> latent(batch * d.capacity * c.dc, std::nanf(""));
  std::vector<float> rope(batch * d.capacity * c.dr, std::nanf(""));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < c.lengths[b]; ++s) {
      const float* row =
          pool.data() +
          (table[b * max_pages + s / c.page_rows] * c.page_rows + s % c.page_rows) * width;
      std::copy(row, row + c.dc, latent.begin() + (b * d.capacity + s) * c.dc);
      std::copy(row + c.dc, row + width, rope.begin() + (b * d.capacity + s) * c.dr);
    }
  }
  const std::vector<float> aq = rng.Vector(batch * c.heads * c.dc, -1, 1);
  const std::vector<float> rq = rng.Vector(batch * c.heads * c.dr, -1, 1);

  DeviceArray<float> pool_d, aq_d, rq_d, latent_d, rope_d, out_d, lse_d, out_contig_d, lse_contig_d;
  DeviceArray<int32_t> lengths_d;
  DeviceArray<const float*> latent_pages_d, rope_pages_d;
  DeviceArray<char> workspace;
  ASSERT_TRUE(pool_d.Upload(pool));
  ASSERT_TRUE(aq_d.Upload(aq));
  ASSERT_TRUE(rq_d.Upload(rq));
  ASSERT_TRUE(latent_d.Upload(latent));
  ASSERT_TRUE(rope_d.Upload(rope));
  ASSERT_TRUE(lengths_d.Upload(c.lengths));
  std::vector<const float*> latent_pages(batch * max_pages, nullptr);
  std::vector<const float*> rope_pages(batch * max_pages, nullptr);
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i] < 0) continue;
    latent_pages[i] = pool_d.get() + table[i] * c.page_rows * width;
    rope_pages[i] = latent_pages[i] + c.dc;
  }
  ASSERT_TRUE(latent_pages_d.Upload(latent_pages));
  ASSERT_TRUE(rope_pages_d.Upload(rope_pages));
  for (auto* out : {&out_d, &out_contig_d}) ASSERT_TRUE(out->Allocate(batch * c.heads * c.dc));
  for (auto* out : {&lse_d, &lse_contig_d}) ASSERT_TRUE(out->Allocate(batch * c.heads));
  const size_t workspace_bytes = LatentAttentionDecodeWorkspaceBytes(d);
  ASSERT_TRUE(workspace.Allocate(workspace_bytes));

  LatentAttentionPagedCache cache;
  cache.latent_pages = latent_pages_d.get();
  cache.rope_pages = rope_pages_d.get();
  cache.max_pages = max_pages;
  cache.page_rows = c.page_rows;
  cache.latent_row_stride = width;
  cache.rope_row_stride = width;
  Status status =
      LatentAttentionDecodePaged(d, aq_d.get(), rq_d.get(), cache, lengths_d.get(), out_d.get(),
                                 lse_d.get(), workspace.get(), workspace_bytes, nullptr);
  std::vector<float> got, got_lse;
  ASSERT_NO_FATAL_FAILURE(FinishDecode(status, out_d, lse_d, &got, &got_lse));
  status = LatentAttentionDecode(d, aq_d.get(), rq_d.get(), latent_d.get(), rope_d.get(),
                                 lengths_d.get(), out_contig_d.get(), lse_contig_d.get(),
                                 workspace.get(), workspace_bytes, nullptr);
  std::vector<float> contiguous, contiguous_lse;
  ASSERT_NO_FATAL_FAILURE(
      FinishDecode(status, out_contig_d, lse_contig_d, &contiguous, &contiguous_lse));

  std::vector<double> ref, ref_lse;
  ReferenceLatentDecode(d, aq, rq, latent, rope, c.lengths, &ref, &ref_lse);
  for (int64_t b = 0; b < batch; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b) + " of length " + std::to_string(c.lengths[b]));
    const size_t row = b * c.heads * c.dc;
    const size_t size = c.heads * c.dc;
    if (c.lengths[b] <= 0) {
      for (size_t i = row; i < row + size; ++i) ASSERT_EQ(got[i], 0.0f);
      continue;
    }
    const std::vector<float> got_b(got.begin() + row, got.begin() + row + size);
    const std::vector<double> ref_b(ref.begin() + row, ref.begin() + row + size);
    EXPECT_LE(MaxRowRelativeError(got_b, ref_b, c.dc), kTolerance);
    for (int64_t h = 0; h < c.heads; ++h) {
      const double want = ref_lse[b * c.heads + h];
      EXPECT_NEAR(got_lse[b * c.heads + h], want, kTolerance * std::max(1.0, std::abs(want)));
    }
  }
  // Same split plan, same sums in the same order: the paged form equals the contiguous one.
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], contiguous[i]) << "value " << i;
  for (size_t i = 0; i < got_lse.size(); ++i) ASSERT_EQ(got_lse[i], contiguous_lse[i]);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LatentAttentionDecodePagedCases,
    ::testing::Values(
        // The engine's default blocks (256 tokens) at the reference widths; lengths ending
        // inside, at and just past a block; one empty sequence.
        PagedCase{"EngineBlocks", 16, 512, 64, 256, {1, 255, 256, 257, 5000, 0}, false},
        // A fork: sequence 1 reads sequence 0's full blocks, then its own.
        PagedCase{"SharedPrefix", 8, 512, 64, 256, {1000, 1300}, true},
        // Pages smaller and not a multiple of the kernel's 32-row tile: tiles span pages.
        PagedCase{"OddPages", 5, 40, 7, 13, {1, 33, 70, 129}, false},
        // A long context over many pages with all reference heads.
        PagedCase{"LongContext", 96, 512, 64, 256, {60000, 3}, false},
        // No rope part.
        PagedCase{"NoRope", 3, 64, 0, 16, {5, 300}, false}),
    [](const auto& info) { return info.param.name; });

// Runs without a device: the page geometry is checked before any CUDA call.
TEST(LatentAttentionDecodePaged, RejectsBadPages) {
  float dummy = 0;
  float* p = &dummy;
  const float* page = p;
  int32_t length = 1;
  const LatentAttentionDecodeDims d = LatentDims(1, 8, 512, 64, 512);
  const size_t bytes = LatentAttentionDecodeWorkspaceBytes(d);
  LatentAttentionPagedCache good;
  good.latent_pages = &page;
  good.rope_pages = &page;
  good.max_pages = 2;
  good.page_rows = 256;
  good.latent_row_stride = 576;
  good.rope_row_stride = 576;
  auto call = [&](const LatentAttentionPagedCache& cache, size_t workspace_bytes) {
    return LatentAttentionDecodePaged(d, p, p, cache, &length, p, nullptr, p, workspace_bytes,
                                      nullptr);
  };
  EXPECT_TRUE(call(good, bytes - 1).IsInvalidArgument());
  LatentAttentionPagedCache bad = good;
  bad.page_rows = 0;
  EXPECT_TRUE(call(bad, bytes).IsInvalidArgument());
  bad = good;
  bad.max_pages = 3;  // capacity is not max_pages x page_rows
  EXPECT_TRUE(call(bad, bytes).IsInvalidArgument());
  bad = good;
  bad.latent_row_stride = 511;
  EXPECT_TRUE(call(bad, bytes).IsInvalidArgument());
  bad = good;
  bad.rope_row_stride = 63;
  EXPECT_TRUE(call(bad, bytes).IsInvalidArgument());
  bad = good;
  bad.rope_pages = nullptr;
  EXPECT_TRUE(call(bad, bytes).IsInvalidArgument());
  bad = good;
  bad.latent_pages = nullptr;
  EXPECT_TRUE(call(bad, bytes).IsInvalidArgument());
}

// Runs without a device: shapes and workspace are checked before any CUDA call.
TEST(LatentAttentionDecode, RejectsBadDims) {
  float dummy = 0;
  float* p = &dummy;
  int32_t length = 1;
  auto call = [&](const LatentAttentionDecodeDims& d, size_t workspace_bytes) {
    return LatentAttentionDecode(d, p, p, p, p, &length, p, nullptr, p, workspace_bytes, nullptr);
  };
  const LatentAttentionDecodeDims good = LatentDims(2, 8, 512, 64, 100);
  const size_t bytes = LatentAttentionDecodeWorkspaceBytes(good);
  EXPECT_GT(bytes, 0u);
  EXPECT_TRUE(call(good, bytes - 1).IsInvalidArgument());  // workspace too small
  EXPECT_TRUE(call(LatentDims(2, 8, 0, 64, 100), bytes).IsInvalidArgument());
  EXPECT_TRUE(call(LatentDims(2, 8, 1025, 0, 100), bytes).IsInvalidArgument());
  EXPECT_TRUE(call(LatentDims(2, 8, 512, 257, 100), bytes).IsInvalidArgument());
  EXPECT_TRUE(call(LatentDims(2, 8, 1024, 256, 100), bytes).IsInvalidArgument());  // > 1152
  EXPECT_TRUE(call(LatentDims(-1, 8, 512, 64, 100), bytes).IsInvalidArgument());
  LatentAttentionDecodeDims no_scale = good;
  no_scale.scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(call(no_scale, bytes).IsInvalidArgument());
  EXPECT_TRUE(LatentAttentionDecode(good, nullptr, p, p, p, &length, p, nullptr, p, bytes, nullptr)
                  .IsInvalidArgument());
  // Nothing to do: no workspace, no CUDA call.
  EXPECT_EQ(LatentAttentionDecodeWorkspaceBytes(LatentDims(0, 8, 512, 64, 100)), 0u);
  EXPECT_TRUE(call(LatentDims(0, 8, 512, 64, 100), 0).ok());
}

// The workspace grows with the context only through the split count, which is capped.
TEST(LatentAttentionDecode, WorkspaceIsBoundedByTheSplitCap) {
  const size_t small = LatentAttentionDecodeWorkspaceBytes(LatentDims(1, 16, 512, 64, 1 << 20));
  const size_t large = LatentAttentionDecodeWorkspaceBytes(LatentDims(1, 16, 512, 64, 1 << 30));
  EXPECT_EQ(small, large);
  EXPECT_LE(small, size_t{1024} * 16 * (512 + 2) * sizeof(float));
}

}  // namespace
}  // namespace strider::kernels::cuda
