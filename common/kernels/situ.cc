#include "common/kernels/situ.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <immintrin.h>

#include <algorithm>

#include "common/kernels/cpu_features.h"

// glibc's vector math library (libmvec): 8-lane float tanh and exp for AVX2, the functions GCC
// calls when it vectorises tanhf and expf.
extern "C" {
__attribute__((target("avx2,fma"))) __m256 _ZGVdN8v_tanhf(__m256 x);
__attribute__((target("avx2,fma"))) __m256 _ZGVdN8v_expf(__m256 x);
}

namespace strider::kernels {
namespace {

// Eight activations at once; every lane is computed the same way wherever it sits in a row.
__attribute__((target("avx2,fma"))) inline __m256 SituGluLanes(__m256 a, __m256 b,
                                                               __m256 gate_cap,
                                                               __m256 inverse_gate_cap,
                                                               __m256 up_cap,
                                                               __m256 inverse_up_cap) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 capped_gate = _mm256_mul_ps(_ZGVdN8v_tanhf(_mm256_mul_ps(a, inverse_gate_cap)),
                                           gate_cap);
  const __m256 negated = _mm256_sub_ps(_mm256_setzero_ps(), a);
  const __m256 sigmoid = _mm256_div_ps(one, _mm256_add_ps(one, _ZGVdN8v_expf(negated)));
  const __m256 capped_up = _mm256_mul_ps(_ZGVdN8v_tanhf(_mm256_mul_ps(b, inverse_up_cap)),
                                         up_cap);
  return _mm256_mul_ps(_mm256_mul_ps(capped_gate, sigmoid), capped_up);
}

// Rows [begin, end) of (rows, width) inputs with their own row strides; out is contiguous.
__attribute__((target("avx2,fma"))) void SituGluRowsAvx2(
    const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float* out,
    int64_t width, int64_t begin, int64_t end, float gate_cap, float up_cap) {
  const __m256 gate_cap_lanes = _mm256_set1_ps(gate_cap);
  const __m256 inverse_gate_cap = _mm256_set1_ps(1.0f / gate_cap);
  const __m256 up_cap_lanes = _mm256_set1_ps(up_cap);
  const __m256 inverse_up_cap = _mm256_set1_ps(1.0f / up_cap);
  for (int64_t r = begin; r < end; ++r) {
    const float* a = gate + r * gate_stride;
    const float* b = up + r * up_stride;
    float* y = out + r * width;
    int64_t c = 0;
    for (; c + 8 <= width; c += 8) {
      _mm256_storeu_ps(y + c, SituGluLanes(_mm256_loadu_ps(a + c), _mm256_loadu_ps(b + c),
                                           gate_cap_lanes, inverse_gate_cap, up_cap_lanes,
                                           inverse_up_cap));
    }
    if (c < width) {  // the tail through the same lanes, so its values match a full block's
      alignas(32) float tail_a[8] = {0}, tail_b[8] = {0}, tail_y[8];
      std::copy(a + c, a + width, tail_a);
      std::copy(b + c, b + width, tail_b);
      _mm256_store_ps(tail_y, SituGluLanes(_mm256_load_ps(tail_a), _mm256_load_ps(tail_b),
                                           gate_cap_lanes, inverse_gate_cap, up_cap_lanes,
                                           inverse_up_cap));
      std::copy(tail_y, tail_y + (width - c), y + c);
    }
  }
}

// Inference (no autograd, fp32, CPU, same shapes, unit inner stride): one pass over the
// elements instead of eight operations with a temporary each. Decode runs it on every expert's
// few rows in every layer, where the operations' dispatch cost as much as their arithmetic.
bool CanFuse(const at::Tensor& a, const at::Tensor& b) {
  return !c10::GradMode::is_enabled() && CpuHasAvx2WithFma() &&
         a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.device().is_cpu() &&
         b.device().is_cpu() && a.dim() >= 1 && a.sizes() == b.sizes() && a.numel() > 0;
}

at::Tensor SituGluFused(const at::Tensor& gate_preactivation,
                        const at::Tensor& up_preactivation, double gate_cap, double up_cap) {
  const int64_t width = gate_preactivation.size(-1);
  // Views with a row stride (the parts of a joined projection) stay views here.
  at::Tensor a = gate_preactivation.reshape({-1, width});
  at::Tensor b = up_preactivation.reshape({-1, width});
  if (a.stride(1) != 1) a = a.contiguous();
  if (b.stride(1) != 1) b = b.contiguous();
  const int64_t rows = a.size(0);
  at::Tensor out = at::empty({rows, width}, a.options());
  const float* a_data = a.data_ptr<float>();
  const float* b_data = b.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const int64_t a_stride = a.stride(0);
  const int64_t b_stride = b.stride(0);
  const float c1 = static_cast<float>(gate_cap);
  const float c2 = static_cast<float>(up_cap);
  // Split across threads only for work worth a wake-up (about 16K activations per thread).
  const int64_t grain = std::max<int64_t>(1, 16384 / width);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    SituGluRowsAvx2(a_data, a_stride, b_data, b_stride, out_data, width, begin, end, c1, c2);
  });
  return out.view(gate_preactivation.sizes());
}

}  // namespace

at::Tensor SituGlu(const at::Tensor& gate_preactivation, const at::Tensor& up_preactivation,
                   double gate_cap, double up_cap) {
  TORCH_CHECK(gate_cap > 0 && up_cap > 0, "SituGlu: caps must be positive, got ", gate_cap, " and ",
              up_cap);
  if (CanFuse(gate_preactivation, up_preactivation)) {
    return SituGluFused(gate_preactivation, up_preactivation, gate_cap, up_cap);
  }
  // c tanh(x / c) rather than a clamp: smooth, so gradients stay nonzero past the cap.
  at::Tensor gate =
      at::tanh(gate_preactivation / gate_cap) * gate_cap * at::sigmoid(gate_preactivation);
  at::Tensor up = at::tanh(up_preactivation / up_cap) * up_cap;
  return gate * up;
}

at::Tensor SwiGlu(const at::Tensor& gate_preactivation, const at::Tensor& up_preactivation) {
  return at::silu(gate_preactivation) * up_preactivation;
}

}  // namespace strider::kernels
