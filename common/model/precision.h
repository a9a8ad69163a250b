// The numeric precision a process computes in, chosen in its config (`precision:` of an actor,
// RL learner or pretraining config; docs/cuda.md, "Precision"):
//
//   float32   every product in IEEE fp32, TF32 off for matrix products and convolutions: what
//             the exactness contracts (the two paths, learner against actor) are stated in.
//   bfloat16  an actor holds and computes with bf16 weights; a learner keeps fp32 master
//             weights, fp32 AdamW moments and fp32 gradients, and runs its scoring and update
//             passes on a bf16 copy of the masters (learner.h, Trainer::compute_model): the
//             actor's arithmetic on the actor's weights, with products accumulated in fp32 by
//             the BLAS and gradients accumulated in fp32 on the masters. No loss scale: bf16
//             has fp32's exponent range.
//
// The enum and its names need no LibTorch, so config readers include this header.
#pragma once

#include <string>

#include "common/status.h"

namespace strider {

class Model;  // common/model/model.h

enum class Precision { kFloat32, kBFloat16 };

// "float32" or "bfloat16", the config spelling.
inline const char* PrecisionName(Precision precision) {
  return precision == Precision::kBFloat16 ? "bfloat16" : "float32";
}
// The config spelling back; InvalidArgument naming the values for anything else.
inline Result<Precision> ParsePrecision(const std::string& name) {
  if (name == "float32") return Precision::kFloat32;
  if (name == "bfloat16") return Precision::kBFloat16;
  return Status::InvalidArgument("must be float32 or bfloat16, got '" + name + "'");
}

// Process-wide: matrix products and convolutions of fp32 tensors in IEEE fp32, never TF32
// (cuBLAS and cuDNN alike). LibTorch's default lets cuDNN convolutions use TF32, which rounds
// inputs to 10 mantissa bits and breaks the 1e-5 contracts on a GPU. Set by every process that
// builds a model (ConfigurePrecision); bf16 processes keep it too, so their fp32 parts (losses,
// norms, masters) stay exact.
void DisallowTf32();
// Whether TF32 is allowed for cuBLAS matmuls or for cuDNN convolutions (tests read it back).
bool Tf32AllowedForMatmul();
bool Tf32AllowedForConvolution();

// What a process does once before its first model: DisallowTf32 for either precision.
void ConfigurePrecision(Precision precision);

// Gives `model` the weights an actor of `precision` holds: bf16 tensors for kBFloat16 (half the
// memory and bandwidth of every decode step), unchanged for kFloat32. A bf16 learner gives its
// compute copy the same (so it computes with the actor's very weights); its masters stay fp32.
Status ApplyWeightPrecision(Model* model, Precision precision);

}  // namespace strider
