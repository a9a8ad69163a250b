// What the CPU we run on offers, for kernels compiled for a wider instruction set than the
// build's baseline (function target attributes) and chosen at run time.
#pragma once

namespace strider::kernels {

// AVX2 with fused multiply-add: the in-place decode products (matmul.h) and the fused SiTU-GLU
// (situ.h) need both; without them callers keep the LibTorch operators.
inline bool CpuHasAvx2WithFma() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return have;
}

}  // namespace strider::kernels
