#include "common/model/expert_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <vector>

#include "common/model/ops.h"

namespace strider::model {
namespace {

// Rows to the ranks holding their experts and back, differentiable: the gradient of a row
// received is sent back to the rank it came from, so backward is the reverse exchange.
class ExchangeRows : public torch::autograd::Function<ExchangeRows> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& rows,
                            ExpertExchange* exchange, const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& recv_counts) {
    // The exchange outlives the graph (it is the learner's process group), so its address is
    // what the backward needs.
    ctx->saved_data["exchange"] = reinterpret_cast<int64_t>(exchange);
    ctx->saved_data["send"] = send_counts;
    ctx->saved_data["recv"] = recv_counts;
    return exchange->AllToAll(rows.contiguous(), send_counts, recv_counts);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* exchange = reinterpret_cast<ExpertExchange*>(ctx->saved_data["exchange"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    at::Tensor back = exchange->AllToAll(grads[0].contiguous(), recv, send);
    return {back, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Counts that size the exchanges: read on the host wherever they were counted (docs/cuda.md).
std::vector<int64_t> ToVector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

at::Tensor RoutedExpertsParallel(const SparseExpertWeights& w, const FeedForwardConfig& c,
                                 const at::Tensor& latent, const at::Tensor& experts,
                                 const at::Tensor& weights, ExpertExchange& exchange) {
  const int world = exchange.world_size();
  TORCH_CHECK(world >= 1 && c.routed_experts % world == 0, "expert parallelism: ",
              c.routed_experts, " routed experts do not split over ", world, " ranks");
  const int64_t per_rank = c.routed_experts / world;
  TORCH_CHECK(w.routed_gate.size(0) == per_rank, "expert parallelism: this rank holds ",
              w.routed_gate.size(0), " experts, not its shard of ", per_rank);
  const int64_t k = experts.size(1);

  // Pairs (token, slot) in expert order, hence in the order of the ranks that hold them.
  const at::Tensor flat_experts = experts.reshape({-1}).to(at::kLong);
  const at::Tensor order = at::argsort(flat_experts);
  const at::Tensor sorted = flat_experts.index_select(0, order);
  const at::Tensor owner = at::floor_divide(sorted, per_rank);
  const std::vector<int64_t> send_counts = ToVector(at::bincount(owner, {}, world));
  const at::Tensor token_index = at::floor_divide(order, k);

  // How many rows each rank will send here, then the experts they are for (local ids).
  const std::vector<int64_t> ones(static_cast<size_t>(world), 1);
  const at::Tensor counts_here = exchange.AllToAll(
      at::tensor(send_counts, at::kLong).reshape({world, 1}).to(latent.device()), ones, ones);
  const std::vector<int64_t> recv_counts = ToVector(counts_here);
  const at::Tensor local_ids =
      exchange.AllToAll((sorted - owner * per_rank).reshape({-1, 1}), send_counts, recv_counts)
          .reshape({-1});

  // The expert inputs there (latent rows, or the tokens for full-width experts), this rank's
  // experts over what came, the outputs back.
  const at::Tensor rows = latent.index_select(0, token_index);
  const at::Tensor arrived = ExchangeRows::apply(rows, &exchange, send_counts, recv_counts);
  // Zeros tied to `arrived`, so that the return exchange is in the graph (and its backward
  // runs on this rank, paired with the others') even when no row arrived here.
  at::Tensor computed = arrived * 0;
  if (arrived.size(0) > 0) {
    const at::Tensor by_expert = at::argsort(local_ids);
    const std::vector<int64_t> per_expert = ToVector(at::bincount(local_ids, {}, per_rank));
    int64_t begin = 0;
    for (int64_t e = 0; e < per_rank; ++e) {
      const int64_t n = per_expert[e];
      if (n == 0) continue;
      const at::Tensor index = by_expert.narrow(0, begin, n);
      begin += n;
      const at::Tensor output = GatedFeedForward(arrived.index_select(0, index), w.routed_gate[e],
                                                 w.routed_up[e], w.routed_down[e], c);
      computed = computed.index_add(0, index, output);
    }
  }
  const at::Tensor returned = ExchangeRows::apply(computed, &exchange, recv_counts, send_counts);
  const at::Tensor weighted =
      returned * weights.reshape({-1}).index_select(0, order).unsqueeze(1);
  return at::zeros_like(latent).index_add(0, token_index, weighted);
}

}  // namespace strider::model
