// The CUDA path of kernels::GatedDeltaRuleRecurrent (gated_delta_rule.h) for one decode
// position: the delta rule step of common/kernels/cuda/, for the LibTorch built with CUDA. Built
// only in that tree (STRIDER_CUDA_DECODE); elsewhere the recurrence off the CPU runs as ATen ops.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/kernels/gated_delta_rule.h"

namespace strider::kernels::internal {

// One position of the recurrence on the GPU, with gated_delta_rule.h's shapes and T = 1, or
// undefined tensors when the kernel does not take these arguments (not float32, not all on one
// CUDA device, T other than 1, Dk or Dv outside 1..128, no heads, or a gradient asked for), for
// the caller's ATen path. initial_state is left as it is: the step runs on a copy.
GatedDeltaRuleOutput GatedDeltaRuleDecodeCuda(const at::Tensor& query, const at::Tensor& key,
                                              const at::Tensor& value, const at::Tensor& log_decay,
                                              const at::Tensor& beta,
                                              const at::Tensor& initial_state);

}  // namespace strider::kernels::internal
