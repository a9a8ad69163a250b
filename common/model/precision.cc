#include "common/model/precision.h"

#include <ATen/Context.h>
#include <torch/version.h>

#include "common/model/model.h"

namespace strider {

void DisallowTf32() {
#if TORCH_VERSION_MAJOR >= 2
  // The per-backend settings that replaced the two allow_tf32 flags (which still read them).
  at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL,
                                          at::Float32Precision::IEEE);
  at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV,
                                          at::Float32Precision::IEEE);
#else
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
#endif
}

bool Tf32AllowedForMatmul() {
#if TORCH_VERSION_MAJOR >= 2
  return at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) ==
         at::Float32Precision::TF32;
#else
  return at::globalContext().allowTF32CuBLAS();
#endif
}

bool Tf32AllowedForConvolution() {
#if TORCH_VERSION_MAJOR >= 2
  return at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV) ==
         at::Float32Precision::TF32;
#else
  return at::globalContext().allowTF32CuDNN();
#endif
}

void ConfigurePrecision(Precision) { DisallowTf32(); }

Status ApplyWeightPrecision(Model* model, Precision precision) {
  if (precision != Precision::kBFloat16 || model->dtype() == at::kBFloat16) return Status::Ok();
  return model->ConvertTo(at::kBFloat16);
}

}  // namespace strider
