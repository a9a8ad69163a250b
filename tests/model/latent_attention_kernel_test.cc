// The blockwise latent attention kernels against the materialised reference
// (common/kernels/latent_attention.h): ragged and paged pasts, strided pages, every storage
// dtype, and sizes that cross the kernels' internal blocks (thread shares, tiles, key blocks).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/kernels/latent_attention.h"
#include "common/model/torch_status.h"

namespace strider::kernels {
namespace {

constexpr int64_t kLatentRank = 16;
constexpr int64_t kRopeDim = 8;
constexpr int64_t kHeads = 4;

struct Problem {
  at::Tensor query, new_latent, new_rope_key;
  LatentAttentionPages pages;
};

// Row b's past is split into pages of the given sizes. Pages are views of a wider buffer, so
// their rows are strided as in the engine's paged cache.
Problem MakeProblem(const std::vector<std::vector<int64_t>>& page_sizes, int64_t tokens,
                    at::ScalarType compute, at::ScalarType storage, int64_t seed) {
  at::manual_seed(seed);
  const int64_t batch = static_cast<int64_t>(page_sizes.size());
  const auto options = at::TensorOptions().dtype(compute);
  Problem p;
  // Scores of a few units, as after the model's scale: softmax neither flat nor one-hot.
  p.query = at::randn({batch, tokens, kHeads, kLatentRank + kRopeDim}, options) * 0.5;
  p.new_latent = at::randn({batch, tokens, kLatentRank}, options);
  p.new_rope_key = at::randn({batch, tokens, kRopeDim}, options);
  p.pages.resize(batch);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t n : page_sizes[b]) {
      at::Tensor block = at::randn({n, kLatentRank + kRopeDim + 3}, options).to(storage);
      p.pages[b].push_back(
          {block.narrow(1, 0, kLatentRank), block.narrow(1, kLatentRank, kRopeDim)});
    }
  }
  return p;
}

double MaxDifference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// The reference runs in fp64 on the same inputs, so the differences are the kernels' rounding.
void ExpectBothKernelsMatchTheReference(const Problem& p, double tolerance) {
  at::Tensor reference =
      LatentAttentionReference(p.query.to(at::kDouble), p.pages, p.new_latent.to(at::kDouble),
                               p.new_rope_key.to(at::kDouble));
  ASSERT_EQ(reference.sizes(),
            (std::vector<int64_t>{p.query.size(0), p.query.size(1), kHeads, kLatentRank}));
  at::Tensor decode = LatentAttentionDecode(p.query, p.pages, p.new_latent, p.new_rope_key);
  at::Tensor prefill = LatentAttentionPrefill(p.query, p.pages, p.new_latent, p.new_rope_key);
  at::Tensor chosen = LatentAttentionOverPages(p.query, p.pages, p.new_latent, p.new_rope_key);
  EXPECT_EQ(decode.scalar_type(), p.query.scalar_type());
  EXPECT_EQ(prefill.scalar_type(), p.query.scalar_type());
  EXPECT_LE(MaxDifference(decode, reference), tolerance);
  EXPECT_LE(MaxDifference(prefill, reference), tolerance);
  EXPECT_LE(MaxDifference(chosen, reference), tolerance);
}

TEST(LatentAttentionKernels, MatchTheReferenceOnRaggedPagedPasts) {
  // Row 0 has no past, row 1 one page, row 2 several pages of uneven sizes.
  const std::vector<std::vector<int64_t>> sizes = {{}, {37}, {16, 5, 64, 1}};
  for (int64_t tokens : {1, 2, 4, 5, 23}) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    ExpectBothKernelsMatchTheReference(MakeProblem(sizes, tokens, at::kFloat, at::kFloat, tokens),
                                       2e-6);
    ExpectBothKernelsMatchTheReference(MakeProblem(sizes, tokens, at::kDouble, at::kDouble, tokens),
                                       1e-12);
  }
}

TEST(LatentAttentionKernels, ReadEveryStorageDtypeAsStored) {
  // A bfloat16 past is widened row by row; the reference widens it whole.
  const std::vector<std::vector<int64_t>> sizes = {{40, 9}, {3}};
  ExpectBothKernelsMatchTheReference(MakeProblem(sizes, 3, at::kFloat, at::kBFloat16, 1), 2e-6);
  ExpectBothKernelsMatchTheReference(MakeProblem(sizes, 7, at::kDouble, at::kFloat, 2), 1e-12);
}

TEST(LatentAttentionKernels, MatchTheReferenceAcrossBlocks) {
  // A long past split over threads and merged (pages beyond one run of 4096 keys), and a
  // prefill with more tokens than one tile of queries and one block of new-token keys.
  // fp32 sums over thousands of keys round to a few 1e-6; fp64 shows the arithmetic is exact.
  for (at::ScalarType type : {at::kFloat, at::kDouble}) {
    const double tolerance = type == at::kFloat ? 2e-5 : 1e-12;
    ExpectBothKernelsMatchTheReference(MakeProblem({{5000, 4200}, {700}}, 2, type, type, 3),
                                       tolerance);
    ExpectBothKernelsMatchTheReference(MakeProblem({{300}}, 600, type, type, 4), tolerance);
  }
}

TEST(LatentAttentionKernels, PrefillStaysAccurateWithSharpScores) {
  // Scores of tens of units: the softmax is nearly one-hot, most exponentials underflow, and
  // the running maximum moves late in a row. The fp32 scores themselves round by about 1e-5
  // here (|s| 1e-7 over 24 terms), which bounds what an fp32 kernel can match: the fused
  // kernel differs from the reference by 8e-5, ATen's tiles by 0.7-1.4e-4 on problems like it.
  Problem p = MakeProblem({{1000, 300}, {}}, 700, at::kFloat, at::kFloat, 6);
  p.query = p.query * 40.0;
  at::Tensor reference =
      LatentAttentionReference(p.query.to(at::kDouble), p.pages, p.new_latent.to(at::kDouble),
                               p.new_rope_key.to(at::kDouble));
  at::Tensor prefill = LatentAttentionPrefill(p.query, p.pages, p.new_latent, p.new_rope_key);
  EXPECT_LE(MaxDifference(prefill, reference), 2e-4);
  EXPECT_FALSE(prefill.isnan().any().item<bool>());
}

// Plain autograd through one materialised softmax: the blockwise function's reference.
at::Tensor MaterialisedAttention(const at::Tensor& query, const at::Tensor& latent,
                                 const at::Tensor& rope_key) {
  const int64_t tokens = query.size(1);
  const int64_t keys = latent.size(1);
  const int64_t past = keys - tokens;
  at::Tensor all_keys = at::cat({latent, rope_key}, 2);                  // (B, S, W)
  at::Tensor scores = at::einsum("bthw,bsw->bths", {query, all_keys});  // (B, T, H, S)
  at::Tensor future = at::arange(keys, at::kLong).unsqueeze(0) >
                      (at::arange(tokens, at::kLong) + past).unsqueeze(1);  // (T, S)
  scores = scores.masked_fill(future.unsqueeze(0).unsqueeze(2),
                              -std::numeric_limits<double>::infinity());
  return at::einsum("bths,bsc->bthc", {at::softmax(scores, -1), latent});
}

// Sizes that cross the blockwise function's tiles (1024 query rows: 256 tokens of 4 heads;
// 1024 keys) with a past, in fp64: output and every gradient equal plain autograd.
TEST(LatentAttentionBlockwise, ForwardAndGradientsEqualAutogradThroughTheMaterialisedSoftmax) {
  for (const auto& [past, tokens] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 1}, {0, 300}, {1500, 700}, {37, 1100}}) {
    at::manual_seed(past + tokens);
    const auto options = at::TensorOptions().dtype(at::kDouble);
    const int64_t batch = 2, keys = past + tokens;
    at::Tensor query =
        (at::randn({batch, tokens, kHeads, kLatentRank + kRopeDim}, options) * 0.5)
            .requires_grad_();
    at::Tensor latent = at::randn({batch, keys, kLatentRank}, options).requires_grad_();
    at::Tensor rope_key = at::randn({batch, keys, kRopeDim}, options).requires_grad_();
    at::Tensor upstream = at::randn({batch, tokens, kHeads, kLatentRank}, options);

    at::Tensor blockwise = LatentAttentionBlockwise(query, latent, rope_key);
    auto grads = torch::autograd::grad({(blockwise * upstream).sum()}, {query, latent, rope_key});
    at::Tensor reference = MaterialisedAttention(query, latent, rope_key);
    auto expected = torch::autograd::grad({(reference * upstream).sum()}, {query, latent, rope_key});

    const std::string where = "past " + std::to_string(past) + ", tokens " +
                              std::to_string(tokens);
    EXPECT_LT(MaxDifference(blockwise, reference), 1e-12) << where;
    const char* names[] = {"query", "latent", "rope key"};
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(MaxDifference(grads[i], expected[i]), 1e-10) << names[i] << ", " << where;
    }
  }
}

// A past without a graph given separately (read in place, no gradient): the same output and
// the same gradients for the query and the new rows as the joined keys, with the past's rows
// split anywhere against the key blocks (1024) and the query tiles (256 tokens of 4 heads).
TEST(LatentAttentionBlockwise, ASeparatePastGivesTheJoinedKeysResultsForTheNewRows) {
  for (const auto& [past, fresh, tokens] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 5, 5}, {1500, 700, 700}, {1023, 1, 1}, {1024, 300, 300}, {2100, 60, 40}}) {
    at::manual_seed(past + fresh);
    const auto options = at::TensorOptions().dtype(at::kDouble);
    const int64_t batch = 2;
    at::Tensor query =
        (at::randn({batch, tokens, kHeads, kLatentRank + kRopeDim}, options) * 0.5)
            .requires_grad_();
    at::Tensor past_latent = at::randn({batch, past, kLatentRank}, options);
    at::Tensor past_rope = at::randn({batch, past, kRopeDim}, options);
    at::Tensor latent = at::randn({batch, fresh, kLatentRank}, options).requires_grad_();
    at::Tensor rope_key = at::randn({batch, fresh, kRopeDim}, options).requires_grad_();
    at::Tensor upstream = at::randn({batch, tokens, kHeads, kLatentRank}, options);

    at::Tensor separate = LatentAttentionBlockwise(query, latent, rope_key, past_latent, past_rope);
    auto grads = torch::autograd::grad({(separate * upstream).sum()}, {query, latent, rope_key});
    at::Tensor joined = LatentAttentionBlockwise(query, at::cat({past_latent, latent}, 1),
                                                 at::cat({past_rope, rope_key}, 1));
    auto expected = torch::autograd::grad({(joined * upstream).sum()}, {query, latent, rope_key});

    const std::string where = "past " + std::to_string(past) + ", new rows " +
                              std::to_string(fresh) + ", tokens " + std::to_string(tokens);
    EXPECT_LT(MaxDifference(separate, joined), 1e-12) << where;
    const char* names[] = {"query", "latent", "rope key"};
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(MaxDifference(grads[i], expected[i]), 1e-12) << names[i] << ", " << where;
    }
  }
  // A past with a graph cannot be given separately: its gradient would be lost.
  const auto options = at::TensorOptions().dtype(at::kFloat);
  at::Tensor query = at::randn({1, 4, kHeads, kLatentRank + kRopeDim}, options);
  EXPECT_THROW(LatentAttentionBlockwise(query, at::randn({1, 4, kLatentRank}, options),
                                        at::randn({1, 4, kRopeDim}, options),
                                        at::randn({1, 9, kLatentRank}, options).requires_grad_(),
                                        at::randn({1, 9, kRopeDim}, options)),
               c10::Error);
}

TEST(LatentAttentionBlockwise, AgreesWithTheInferenceKernelsInFloat32) {
  Problem p = MakeProblem({{900}}, 600, at::kFloat, at::kFloat, 5);
  at::Tensor latent = at::cat({p.pages[0][0].latent.contiguous(), p.new_latent[0]}, 0);
  at::Tensor rope = at::cat({p.pages[0][0].rope_key.contiguous(), p.new_rope_key[0]}, 0);
  at::Tensor blockwise =
      LatentAttentionBlockwise(p.query, latent.unsqueeze(0), rope.unsqueeze(0));
  at::Tensor prefill = LatentAttentionPrefill(p.query, p.pages, p.new_latent, p.new_rope_key);
  EXPECT_LT(MaxDifference(blockwise, prefill), 1e-5);
}

TEST(LatentAttentionBlockwise, RefusesMismatchedShapes) {
  const auto options = at::TensorOptions().dtype(at::kFloat);
  at::Tensor query = at::randn({1, 8, kHeads, kLatentRank + kRopeDim}, options);
  EXPECT_THROW(LatentAttentionBlockwise(query, at::randn({1, 4, kLatentRank}, options),
                                        at::randn({1, 4, kRopeDim}, options)),
               c10::Error)
      << "fewer keys than queries";
  EXPECT_THROW(LatentAttentionBlockwise(query, at::randn({1, 8, kLatentRank + 1}, options),
                                        at::randn({1, 8, kRopeDim}, options)),
               c10::Error);
  EXPECT_THROW(LatentAttentionBlockwise(query, at::randn({1, 8, kLatentRank}, options),
                                        at::randn({1, 8, kRopeDim}, options.dtype(at::kDouble))),
               c10::Error);
}

TEST(LatentAttentionKernels, RejectMalformedPages) {
  Problem p = MakeProblem({{8}}, 2, at::kFloat, at::kFloat, 5);
  p.pages[0][0].latent = at::zeros({8, kLatentRank + 1});
  const Status decoded = model::Guarded("decode", [&] {
    LatentAttentionDecode(p.query, p.pages, p.new_latent, p.new_rope_key);
  });
  ASSERT_FALSE(decoded.ok()) << "a page of the wrong width was accepted";
  EXPECT_NE(decoded.message().find("a page must be"), std::string::npos) << decoded.ToString();
  p = MakeProblem({{8}}, 2, at::kFloat, at::kFloat, 5);
  p.pages.push_back({});  // two rows of pages for a batch of one
  EXPECT_THROW(LatentAttentionPrefill(p.query, p.pages, p.new_latent, p.new_rope_key), c10::Error);
}

}  // namespace
}  // namespace strider::kernels
