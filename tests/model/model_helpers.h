// Small pieces the model tests share: a model from a config and a seed, random byte-token ids,
// a tensor of the model by name, one layer's weights at random, and latent attention's two
// forms with their gradients.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/latent_attention.h"
#include "common/model/model.h"
#include "common/model/ops.h"
#include "common/model/parameters.h"
#include "common/tokenizer.h"

namespace strider::testing {

// The model Model::Create makes on two threads; null (with a test failure) when it refuses.
inline std::unique_ptr<Model> MakeModel(const ModelConfig& config, uint64_t seed) {
  ConfigureRuntime(2);
  Result<std::unique_ptr<Model>> model = Model::Create(config, seed);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? std::move(model).value() : nullptr;
}

// (batch, length) byte-token ids, the same for the same seed.
inline at::Tensor RandomTokens(int64_t batch, int64_t length, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randint(0, token::kByteCount, {batch, length}, generator, at::kLong);
}

// The model's tensor `name`; undefined when it has none.
inline at::Tensor FindTensor(const Model& model, const std::string& name) {
  for (const auto& [tensor_name, tensor] : model.tensors()) {
    if (tensor_name == name) return tensor;
  }
  return at::Tensor();
}

// Weights of every parameter whose name starts with `prefix`, at order-one scale so every term
// of a layer's equations matters: std 1/sqrt(fan_in), norms around one, zero-initialised terms
// spread around zero, decay biases in [-4, 1] (with the softplus gate, alpha from near 1 to
// about 0.25 per step before exp(A_h)).
inline model::TensorMap RandomLayerWeights(const ModelConfig& config, const std::string& prefix,
                                           at::ScalarType dtype, uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);
  model::TensorMap map;
  for (const ParameterSpec& spec : ModelParameterSpecs(config)) {
    if (spec.name.compare(0, prefix.size(), prefix) != 0) continue;
    at::Tensor tensor;
    switch (spec.init) {
      case ParameterInit::kNormal:
        tensor = at::randn(spec.shape, generator, f64) /
                 std::sqrt(static_cast<double>(spec.shape.back()));
        break;
      case ParameterInit::kOnes:
        tensor = 1.0 + 0.2 * at::randn(spec.shape, generator, f64);
        break;
      case ParameterInit::kZeros:
        tensor = 0.3 * at::randn(spec.shape, generator, f64);
        break;
      case ParameterInit::kDecayBias:
        tensor = at::empty(spec.shape, f64).uniform_(-4.0, 1.0, generator);
        break;
    }
    map[spec.name] = tensor.to(dtype);
  }
  return map;
}

struct LatentFormResults {
  std::vector<at::Tensor> outputs;                  // absorbed, explicit
  std::vector<std::vector<at::Tensor>> gradients;  // per form: `leaves`, then the input
};

// `x` through latent attention after `cache` in the absorbed form and in the explicit form, each
// on its own copy of the cache, with the gradients of sum(y * upstream).
inline LatentFormResults BothLatentAttentionForms(const model::LatentAttentionWeights& weights,
                                                  const LatentAttentionConfig& c,
                                                  const at::Tensor& x,
                                                  const model::LatentAttentionCache& cache,
                                                  double eps, const std::vector<at::Tensor>& leaves,
                                                  const at::Tensor& upstream) {
  LatentFormResults results;
  for (const auto form :
       {model::LatentAttentionForm::kAbsorbed, model::LatentAttentionForm::kExplicit}) {
    for (at::Tensor leaf : leaves) leaf.requires_grad_(true);
    at::Tensor input = x.clone().requires_grad_(true);
    model::LatentAttentionCache copy = cache;
    at::Tensor y = model::LatentAttentionForward(weights, c, input, &copy, eps, form);
    std::vector<at::Tensor> wrt = leaves;
    wrt.push_back(input);
    results.gradients.push_back(torch::autograd::grad({(y * upstream).sum()}, wrt));
    results.outputs.push_back(y.detach());
    for (at::Tensor leaf : leaves) leaf.requires_grad_(false);
  }
  return results;
}

}  // namespace strider::testing
