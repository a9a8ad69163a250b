#include "common/model/sparse_experts.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <vector>

#include "common/kernels/routing.h"
#include "common/kernels/situ.h"
#include "common/model/expert_parallel.h"

namespace strider::model {
namespace {

// The routed experts' weighted sum in their input width (l, or d for full-width experts), for
// inference (no autograd): the
// (token, slot) pairs are bucketed by expert on the host from the chosen ids, so there is no
// argsort, bincount or copy of the counts per layer. An expert chosen by one token runs as
// matrix-vector products on that token's row (what batch-1 decode does in every layer). Experts
// are visited in ascending id, the order the training path adds them in, so both paths sum each
// token's contributions in the same order. latent: (M, l) (the tokens themselves, (M, d), for
// full-width experts); experts, weights: (M, k) on the CPU.
at::Tensor RoutedExpertsInference(const SparseExpertWeights& w, const FeedForwardConfig& c,
                                  const at::Tensor& latent, const at::Tensor& experts,
                                  const at::Tensor& weights) {
  at::Tensor chosen = experts.to(at::kLong).contiguous();
  at::Tensor flat_weights = weights.reshape({-1});
  const int64_t k = chosen.size(1);
  const int64_t pairs = chosen.numel();
  const int64_t* expert_of = chosen.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> pairs_of(c.routed_experts);
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t expert = expert_of[pair];
    TORCH_CHECK(expert >= 0 && expert < c.routed_experts, "routed expert id ", expert,
                " is outside [0, ", c.routed_experts, ")");
    pairs_of[expert].push_back(pair);
  }
  // Each expert's rows run on one thread, the experts spread over the threads: an expert's
  // matrices are small (a few rows at decode), so splitting one product across threads costs a
  // thread wake-up per product, more than the product itself. The weighted outputs are then
  // added one expert after another in ascending id, the training path's order.
  struct ExpertWork {
    int64_t expert = 0;
    std::vector<int64_t> tokens;  // rows of `latent`, one per chosen pair
    at::Tensor pair_index;        // the pairs' slots in the flattened (M * k) weights
    at::Tensor token_index;
    at::Tensor output;            // (rows, l), already weighted
  };
  std::vector<ExpertWork> work;
  for (int64_t expert = 0; expert < c.routed_experts; ++expert) {
    const std::vector<int64_t>& chosen_pairs = pairs_of[expert];
    if (chosen_pairs.empty()) continue;
    ExpertWork item;
    item.expert = expert;
    for (int64_t pair : chosen_pairs) item.tokens.push_back(pair / k);
    if (chosen_pairs.size() > 1) {
      item.pair_index = at::tensor(chosen_pairs, at::kLong);
      item.token_index = at::tensor(item.tokens, at::kLong);
    }
    work.push_back(std::move(item));
  }
  auto run = [&](int64_t begin, int64_t end) {
    // Grad mode is thread-local and on by default in the pool's threads; the fused inference
    // kernels below check it.
    at::NoGradGuard no_grad;
    for (int64_t i = begin; i < end; ++i) {
      ExpertWork& item = work[i];
      const at::Tensor gate = w.routed_gate.select(0, item.expert);
      const at::Tensor up = w.routed_up.select(0, item.expert);
      const at::Tensor down = w.routed_down.select(0, item.expert);
      if (item.tokens.size() == 1) {
        // One token: matrix-vector products on its row.
        item.output = GatedFeedForward(latent.select(0, item.tokens.front()), gate, up, down, c)
                          .mul_(flat_weights.select(0, pairs_of[item.expert].front()));
      } else {
        item.output =
            GatedFeedForward(latent.index_select(0, item.token_index), gate, up, down, c);
        item.output.mul_(flat_weights.index_select(0, item.pair_index).unsqueeze(1));
      }
    }
  };
  if (work.size() > 1) {
    at::parallel_for(0, static_cast<int64_t>(work.size()), 1, run);
  } else {
    run(0, static_cast<int64_t>(work.size()));
  }
  at::Tensor combined = at::zeros_like(latent);
  for (const ExpertWork& item : work) {
    if (item.tokens.size() == 1) {
      combined.select(0, item.tokens.front()).add_(item.output);
    } else {
      combined.index_add_(0, item.token_index, item.output);
    }
  }
  return combined;
}

// The routed experts' weighted sum in their input width, differentiable (training, and any
// caller with grad mode on). latent: (M, l), or (M, d) for full-width experts.
at::Tensor RoutedExpertsGrouped(const SparseExpertWeights& w, const FeedForwardConfig& c,
                                const at::Tensor& latent,
                                const kernels::RoutingDecision& decision) {
  at::Tensor combined = at::zeros_like(latent);
  // Group (token, slot) pairs by expert so each expert runs once over its tokens.
  at::Tensor flat_experts = decision.experts.reshape({-1});                 // (M*k)
  at::Tensor order = at::argsort(flat_experts);                             // stable enough:
  at::Tensor sorted_experts = flat_experts.index_select(0, order);          // ties keep no order
  at::Tensor counts = at::bincount(sorted_experts, {}, c.routed_experts).cpu();
  at::Tensor flat_weights = decision.weights.reshape({-1});
  const int64_t k = decision.experts.size(1);
  const int64_t* count = counts.data_ptr<int64_t>();
  int64_t begin = 0;
  for (int64_t expert = 0; expert < c.routed_experts; ++expert) {
    const int64_t n = count[expert];
    if (n == 0) continue;
    at::Tensor pairs = order.narrow(0, begin, n);  // indices into (M*k)
    begin += n;
    at::Tensor token_index = at::floor_divide(pairs, k);
    at::Tensor input = latent.index_select(0, token_index);  // (n, l)
    at::Tensor output = GatedFeedForward(input, w.routed_gate[expert], w.routed_up[expert],
                                         w.routed_down[expert], c);
    output = output * flat_weights.index_select(0, pairs).unsqueeze(1);
    combined = combined.index_add(0, token_index, output);
  }
  return combined;
}

}  // namespace

DenseFeedForwardWeights DenseFeedForwardWeights::Bind(const TensorMap& t, const std::string& p) {
  DenseFeedForwardWeights w{Lookup(t, p + "gate"), Lookup(t, p + "up"), Lookup(t, p + "down")};
  if (auto it = t.find(p + "joined_input"); it != t.end()) w.joined_input = it->second;
  return w;
}

at::Tensor GatedActivation(const at::Tensor& gate_preactivation,
                           const at::Tensor& up_preactivation, const FeedForwardConfig& c) {
  if (c.activation == "silu") return kernels::SwiGlu(gate_preactivation, up_preactivation);
  return kernels::SituGlu(gate_preactivation, up_preactivation, c.gate_cap, c.up_cap);
}

at::Tensor GatedFeedForward(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& down, const FeedForwardConfig& c) {
  if (c.activation == "silu") {
    return Linear(kernels::SwiGlu(Linear(x, gate), Linear(x, up)), down);
  }
  return SituGluFeedForward(x, gate, up, down, c.gate_cap, c.up_cap);
}

kernels::RouterOptions RouterOptionsOf(const FeedForwardConfig& c) {
  kernels::RouterOptions options;
  options.renormalize = c.renormalize;
  options.renormalize_epsilon = c.renormalize_epsilon;
  options.scaling = c.routed_scaling_factor;
  options.groups = c.expert_groups;
  options.groups_per_token = c.groups_per_token;
  return options;
}

at::Tensor DenseFeedForward(const DenseFeedForwardWeights& w, const FeedForwardConfig& c,
                            const at::Tensor& x) {
  const std::vector<at::Tensor> inputs = LinearParts(x, w.joined_input, {&w.gate, &w.up});
  return Linear(GatedActivation(inputs[0], inputs[1], c), w.down);
}

SparseExpertWeights SparseExpertWeights::Bind(const TensorMap& t, const std::string& p,
                                              bool has_shared_experts, bool latent_experts) {
  SparseExpertWeights w;
  w.router = Lookup(t, p + "router");
  w.router_bias = Lookup(t, p + "router_bias");
  if (latent_experts) {
    w.latent_down = Lookup(t, p + "latent_down");
    w.latent_norm = Lookup(t, p + "latent_norm");
    w.latent_up = Lookup(t, p + "latent_up");
  }
  w.routed_gate = Lookup(t, p + "routed_gate");
  w.routed_up = Lookup(t, p + "routed_up");
  w.routed_down = Lookup(t, p + "routed_down");
  if (has_shared_experts) {
    w.shared_gate = Lookup(t, p + "shared_gate");
    w.shared_up = Lookup(t, p + "shared_up");
    w.shared_down = Lookup(t, p + "shared_down");
  }
  if (auto it = t.find(p + "joined_input"); it != t.end()) w.joined_input = it->second;
  return w;
}

at::Tensor SparseExpertForward(const SparseExpertWeights& w, const FeedForwardConfig& c,
                               const at::Tensor& x, const at::Tensor& replay_experts,
                               RoutingRecordEntry* record, double norm_epsilon,
                               ExpertExchange* exchange) {
  const int64_t batch = x.size(0);
  const int64_t length = x.size(1);
  const int64_t width = x.size(2);
  at::Tensor tokens = x.reshape({batch * length, width});  // (M, d)

  // The products that read the tokens, in Model::Bind's row order: router, latent_down (latent
  // experts only), then the shared experts' gate and up.
  const bool latent_experts = w.latent_down.defined();
  const bool shared = w.shared_gate.defined();
  std::vector<at::Tensor> inputs;
  if (latent_experts && shared) {
    inputs = LinearParts(tokens, w.joined_input,
                         {&w.router, &w.latent_down, &w.shared_gate, &w.shared_up});
  } else if (latent_experts) {
    inputs = LinearParts(tokens, w.joined_input, {&w.router, &w.latent_down});
  } else if (shared) {
    inputs = LinearParts(tokens, w.joined_input, {&w.router, &w.shared_gate, &w.shared_up});
  } else {
    inputs = LinearParts(tokens, w.joined_input, {&w.router});
  }
  const at::Tensor& logits = inputs[0];  // (M, n)
  const at::Tensor scores =
      c.router_activation == "softmax" ? at::softmax(logits, -1) : at::sigmoid(logits);
  const kernels::RouterOptions options = RouterOptionsOf(c);
  kernels::RoutingDecision decision =
      replay_experts.defined()
          ? kernels::RouteWithExperts(scores, replay_experts, options)
          : kernels::RouteTopK(scores, w.router_bias, c.experts_per_token, options);
  if (record != nullptr) {
    record->experts = decision.experts;
    record->scores = scores.detach();
  }

  // The routed experts read the latent projection, or the tokens themselves at full width.
  const at::Tensor latent = latent_experts ? inputs[1] : tokens;  // (M, l) or (M, d)
  at::Tensor combined;
  if (exchange != nullptr) {
    combined = RoutedExpertsParallel(w, c, latent, decision.experts, decision.weights, *exchange);
  } else if (!c10::GradMode::is_enabled() && decision.experts.device().is_cpu()) {
    combined = RoutedExpertsInference(w, c, latent, decision.experts, decision.weights);
  } else {
    combined = RoutedExpertsGrouped(w, c, latent, decision);
  }
  at::Tensor y =
      latent_experts ? Linear(RmsNorm(combined, w.latent_norm, norm_epsilon), w.latent_up)
                     : combined;
  if (shared) {
    const at::Tensor& shared_gate = inputs[latent_experts ? 2 : 1];
    const at::Tensor& shared_up = inputs[latent_experts ? 3 : 2];
    const int64_t hidden = w.shared_gate.size(1);
    for (int64_t j = 0; j < w.shared_gate.size(0); ++j) {
      at::Tensor activation = GatedActivation(shared_gate.narrow(-1, j * hidden, hidden),
                                              shared_up.narrow(-1, j * hidden, hidden), c);
      y = y + Linear(activation, w.shared_down[j]);
    }
  }
  return y.view({batch, length, width});
}

}  // namespace strider::model
