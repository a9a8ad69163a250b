// Device discovery for the CUDA kernels: the tests and benchmarks skip cleanly on machines
// without a GPU (CI, development hosts), where the runtime library loads but finds no driver.
#include <cuda_runtime.h>

#include <string>

#include "common/kernels/cuda/decode_kernels.h"

namespace strider::kernels::cuda {

bool CudaDeviceAvailable(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // Clear the sticky error so later calls in the same process start clean.
    cudaGetLastError();
    if (why != nullptr) {
      *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(error) + ": " +
             cudaGetErrorString(error);
    }
    return false;
  }
  if (count == 0) {
    if (why != nullptr) *why = "cudaGetDeviceCount returned 0 devices";
    return false;
  }
  if (why != nullptr) why->clear();
  return true;
}

}  // namespace strider::kernels::cuda
