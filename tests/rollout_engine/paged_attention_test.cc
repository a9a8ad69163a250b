// Latent attention over a paged past, read in place (the blockwise absorbed form the engine
// uses), against the explicit form over the same past copied into one padded tensor.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/latent_attention.h"
#include "common/model/model.h"
#include "common/model/torch_status.h"

namespace strider {
namespace {

// ctest sets STRIDER_SOURCE_DIR; a run by hand from the repository root needs nothing.
std::string SourceDir() {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return source ? source : ".";
}

double RelativeError(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).norm() / b.to(at::kDouble).norm())
      .item<double>();
}

// Weights of the tiny config's latent layer, with the query and key maps scaled up so that the
// softmax is far from uniform (a uniform one would hide errors in the running maximum).
model::TensorMap LatentWeights(const ModelConfig& config, at::ScalarType dtype) {
  auto created = Model::Create(config, 7);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  model::TensorMap tensors;
  for (const auto& [name, tensor] : (*created)->tensors()) {
    at::Tensor copy = tensor.detach().to(dtype).clone();
    if (name.find("latent.query_up") != std::string::npos ||
        name.find("latent.kv_up") != std::string::npos) {
      copy.mul_(20.0);
    }
    tensors[name] = copy;
  }
  return tensors;
}

struct PagedPast {
  std::vector<at::Tensor> pools;  // per row: (blocks, block_tokens, Dc + Dr)
  model::LatentAttentionPast past;
};

// Row b holds lengths[b] random cached rows in blocks of `block` tokens, the last one partial.
PagedPast MakePast(const LatentAttentionConfig& c, const std::vector<int64_t>& lengths,
                   int64_t block, at::ScalarType storage, uint64_t seed) {
  PagedPast paged;
  at::Generator generator = at::detail::createCPUGenerator(seed);
  paged.past.pages.resize(lengths.size());
  for (size_t b = 0; b < lengths.size(); ++b) {
    const int64_t blocks = (lengths[b] + block - 1) / block;
    at::Tensor pool = at::randn({std::max<int64_t>(blocks, 1), block, c.kv_rank + c.rope_dim},
                                generator, at::kDouble)
                          .to(storage);
    paged.pools.push_back(pool);
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t n = std::min(block, lengths[b] - i * block);
      at::Tensor page = pool[i].narrow(0, 0, n);
      paged.past.pages[b].push_back(
          {page.narrow(1, 0, c.kv_rank), page.narrow(1, c.kv_rank, c.rope_dim)});
    }
  }
  paged.past.lengths = at::tensor(lengths, at::kLong);
  return paged;
}

TEST(PagedLatentAttention, InPlaceBlockwiseEqualsExplicitOverThePaddedPast) {
  ConfigureRuntime(2);  // as the engine runs (freed blocks stay in the heap)
  ModelConfig config =
      *LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
  const LatentAttentionConfig& c = config.latent;
  const double eps = config.norm_epsilon;
  struct Case {
    at::ScalarType compute;
    at::ScalarType storage;
    double tolerance;
  };
  // Row lengths: empty, under one block, and long enough to be split among threads.
  const std::vector<int64_t> lengths = {0, 300, 2600};
  for (const Case& k : {Case{at::kFloat, at::kFloat, 2e-6}, Case{at::kFloat, at::kBFloat16, 2e-6},
                        Case{at::kDouble, at::kDouble, 1e-12}}) {
    const model::TensorMap tensors = LatentWeights(config, k.compute);
    const auto weights = model::LatentAttentionWeights::Bind(tensors, "layers.3.latent.");
    PagedPast paged = MakePast(c, lengths, 256, k.storage, 11);
    // 1 and 3 new tokens take the loop kernel, 530 the tiles (several key tiles).
    for (int64_t tokens : {1, 3, 530}) {
      at::Generator generator = at::detail::createCPUGenerator(tokens);
      at::Tensor x = at::randn({static_cast<int64_t>(lengths.size()), tokens, config.width},
                               generator, at::kDouble)
                         .to(k.compute);
      model::LatentAttentionRows in_place_rows, explicit_rows;
      at::Tensor in_place, reference;
      {
        at::NoGradGuard no_grad;
        in_place = model::LatentAttentionForwardRagged(weights, c, x, paged.past, eps,
                                                       model::LatentAttentionForm::kAbsorbed,
                                                       &in_place_rows);
        reference = model::LatentAttentionForwardRagged(weights, c, x, paged.past, eps,
                                                        model::LatentAttentionForm::kExplicit,
                                                        &explicit_rows);
      }
      const double error = RelativeError(in_place, reference);
      std::printf("paged latent attention (%s compute, %s cache, %lld new): rel err %.3g\n",
                  c10::toString(k.compute), c10::toString(k.storage),
                  static_cast<long long>(tokens), error);
      EXPECT_LT(error, k.tolerance);
      EXPECT_EQ(in_place_rows.latent.scalar_type(), k.storage);
      EXPECT_TRUE(at::equal(in_place_rows.latent, explicit_rows.latent));
      EXPECT_TRUE(at::equal(in_place_rows.rope_key, explicit_rows.rope_key));
      // A changed cached row changes the output: the pages are really read.
      if (tokens == 1) {
        paged.pools[2][3][10].mul_(-3.0);
        at::NoGradGuard no_grad;
        at::Tensor changed = model::LatentAttentionForwardRagged(
            weights, c, x, paged.past, eps, model::LatentAttentionForm::kAbsorbed,
            &in_place_rows);
        EXPECT_GT(RelativeError(changed[2], in_place[2]), 1e-9);
        EXPECT_TRUE(at::equal(changed[1], in_place[1]));
        paged.pools[2][3][10].div_(-3.0);
      }
    }
  }
}

TEST(PagedLatentAttention, RejectsPagesOfTheWrongShape) {
  ModelConfig config =
      *LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
  const LatentAttentionConfig& c = config.latent;
  const model::TensorMap tensors = LatentWeights(config, at::kFloat);
  const auto weights = model::LatentAttentionWeights::Bind(tensors, "layers.3.latent.");
  model::LatentAttentionPast past;
  past.pages.resize(1);
  past.pages[0].push_back({at::zeros({4, c.kv_rank + 1}), at::zeros({4, c.rope_dim})});
  past.lengths = at::tensor(std::vector<int64_t>{4}, at::kLong);
  model::LatentAttentionRows rows;
  at::NoGradGuard no_grad;
  const Status forward = model::Guarded("ragged forward", [&] {
    model::LatentAttentionForwardRagged(weights, c, at::zeros({1, 1, config.width}), past,
                                        config.norm_epsilon,
                                        model::LatentAttentionForm::kAbsorbed, &rows);
  });
  ASSERT_FALSE(forward.ok()) << "a page of the wrong width was accepted";
  EXPECT_NE(forward.message().find("a page must be"), std::string::npos) << forward.ToString();
}

}  // namespace
}  // namespace strider
