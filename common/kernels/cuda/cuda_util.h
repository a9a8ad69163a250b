// Helpers shared by the .cu files of strider_cuda_kernels; not part of the public interface
// (decode_kernels.h), since this header names CUDA types.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/status.h"

namespace strider::kernels::cuda {

// A CUDA error as a Status naming the call that failed. OK for cudaSuccess.
inline Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string(what) + ": " + cudaGetErrorName(error) + ": " +
                          cudaGetErrorString(error));
}

// The error, if any, of the launch just made (bad configuration, no device, ...). It also
// clears the runtime's sticky last error so one failure is not reported twice.
inline Status LaunchStatus(const char* kernel) {
  return CudaStatus(cudaGetLastError(), kernel);
}

}  // namespace strider::kernels::cuda
