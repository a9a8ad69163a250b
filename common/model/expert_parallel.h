// Expert parallelism: the routed experts of every sparse layer split across ranks, so a layer
// with more experts than one machine holds (896 in the reference) spans machines.
//
// Rank r of W holds experts [r n / W, (r + 1) n / W) of each layer (n divisible by W) and
// everything else whole (router, latent projections, shared experts, attention). A sparse
// layer on rank r routes its own tokens as the unsharded layer would, sends each (token,
// expert) pair's expert input (its latent row, or the token itself for full-width experts) to
// the rank holding the expert (all-to-all), runs its experts on the rows it received, and sends
// the outputs back (all-to-all); the sender weighs and sums them. The exchange is
// differentiable: its backward is the reverse all-to-all, so expert weights collect gradients
// from every rank's tokens. Forward and backward equal the unsharded layer's within fp32
// rounding (tests/learner/expert_parallel_test.cc).
//
// The collective is behind ExpertExchange, so model code stays free of c10d; the learner's
// LearnerGroup (learner/distributed.h) provides one over Gloo.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/model/parameters.h"
#include "common/model/sparse_experts.h"

namespace strider::model {

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Rows (sum(send_counts), C) go to ranks 0.. in order, send_counts[r] of them to rank r;
  // returns the rows received, (sum(recv_counts), C), rank 0's first. Every rank calls it the
  // same number of times in the same order. Failures throw c10::Error (it runs inside
  // LibTorch's forward and backward).
  virtual at::Tensor AllToAll(const at::Tensor& rows, const std::vector<int64_t>& send_counts,
                              const std::vector<int64_t>& recv_counts) = 0;
};

// The shard of each layer's experts a rank holds, and what it costs per rank:
// ExpertShardOf and ExpertParallelFootprintOf in common/model/parameters.h (no LibTorch).

// The routed experts' weighted sum in their input width across ranks: what SparseExpertForward
// (sparse_experts.h) computes when given an exchange. w.routed_* hold this rank's shard only;
// latent (M, l) (the tokens (M, d) for full-width experts) is what the experts read, experts
// and weights (M, k) are this rank's tokens' routing.
at::Tensor RoutedExpertsParallel(const SparseExpertWeights& w, const FeedForwardConfig& c,
                                 const at::Tensor& latent, const at::Tensor& experts,
                                 const at::Tensor& weights, ExpertExchange& exchange);

}  // namespace strider::model
