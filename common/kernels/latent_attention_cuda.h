// The CUDA path of kernels::LatentAttentionDecode (latent_attention.h): the paged decode kernel
// of common/kernels/cuda/ reading the pages where they are, for the LibTorch built with CUDA.
// Built only in that tree (STRIDER_CUDA_DECODE); elsewhere decode off the CPU runs as ATen ops.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/kernels/latent_attention.h"

namespace strider::kernels::internal {

// The decode of latent_attention.h's contract on the GPU, or an undefined tensor when the
// kernel does not take these arguments (not float32 on one CUDA device, a page geometry other
// than equal pages with a shorter last one, widths past the kernel's limits), for the caller's
// ATen path. Each of the T new tokens of a row reads that row's pages through the kernel (one
// virtual sequence per token, sharing the row's page table); its own and earlier new rows are
// merged after, through the kernel's log-sum-exp.
at::Tensor LatentAttentionDecodeCuda(const at::Tensor& query, const LatentAttentionPages& pages,
                                     const at::Tensor& new_latent, const at::Tensor& new_rope_key);

}  // namespace strider::kernels::internal
