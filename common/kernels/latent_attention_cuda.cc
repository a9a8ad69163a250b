#include "common/kernels/latent_attention_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/kernels/cuda/decode_kernels.h"

namespace strider::kernels::internal {
namespace {

// The page geometry the kernel reads: every page of a row but its last holds page_rows rows,
// rows are equally strided, and all of it is float32 on the query's device.
struct Geometry {
  int64_t page_rows = 0;
  int64_t max_pages = 0;
  int64_t latent_stride = -1;
  int64_t rope_stride = -1;
};

bool Describe(const at::Tensor& query, const LatentAttentionPages& pages, int64_t rope_dim,
              Geometry* g) {
  for (const std::vector<LatentAttentionPage>& row : pages) {
    int64_t used = 0;
    for (const LatentAttentionPage& page : row) {
      const int64_t n = page.latent.size(0);
      if (n == 0) continue;
      if (page.latent.scalar_type() != at::kFloat || page.rope_key.scalar_type() != at::kFloat ||
          page.latent.device() != query.device() || page.rope_key.device() != query.device()) {
        return false;
      }
      const int64_t latent_stride = n > 1 ? page.latent.stride(0) : g->latent_stride;
      const int64_t rope_stride = n > 1 ? page.rope_key.stride(0) : g->rope_stride;
      if (g->latent_stride < 0) g->latent_stride = latent_stride;
      if (g->rope_stride < 0) g->rope_stride = rope_stride;
      if (latent_stride != g->latent_stride || (rope_dim > 0 && rope_stride != g->rope_stride)) {
        return false;
      }
      ++used;
      g->page_rows = std::max(g->page_rows, n);
    }
    g->max_pages = std::max(g->max_pages, used);
  }
  // Every page but a row's last must be full.
  for (const std::vector<LatentAttentionPage>& row : pages) {
    std::vector<int64_t> sizes;
    for (const LatentAttentionPage& page : row) {
      if (page.latent.size(0) > 0) sizes.push_back(page.latent.size(0));
    }
    for (size_t i = 0; i + 1 < sizes.size(); ++i) {
      if (sizes[i] != g->page_rows) return false;
    }
  }
  g->page_rows = std::max<int64_t>(g->page_rows, 1);
  // A one-row page has no stride of its own; any value at least the width serves.
  if (g->latent_stride < 0) g->latent_stride = query.size(3) - rope_dim;
  if (g->rope_stride < 0) g->rope_stride = std::max<int64_t>(rope_dim, 1);
  return g->latent_stride >= query.size(3) - rope_dim && g->rope_stride >= rope_dim;
}

}  // namespace

at::Tensor LatentAttentionDecodeCuda(const at::Tensor& query, const LatentAttentionPages& pages,
                                     const at::Tensor& new_latent, const at::Tensor& new_rope_key) {
  if (!query.is_cuda() || query.scalar_type() != at::kFloat) return at::Tensor();
  const int64_t batch = query.size(0);
  const int64_t tokens = query.size(1);
  const int64_t heads = query.size(2);
  const int64_t latent_rank = new_latent.size(2);
  const int64_t rope_dim = new_rope_key.size(2);
  Geometry g;
  if (!Describe(query, pages, rope_dim, &g)) return at::Tensor();
  cuda::LatentAttentionDecodeDims dims;
  dims.batch = batch * tokens;
  dims.heads = heads;
  dims.latent_dim = latent_rank;
  dims.rope_dim = rope_dim;
  dims.capacity = g.max_pages * g.page_rows;
  dims.scale = 1.0f;  // the queries come scaled
  const size_t workspace_bytes = cuda::LatentAttentionDecodeWorkspaceBytes(dims);
  if (workspace_bytes == 0 && dims.batch > 0 && heads > 0) return at::Tensor();  // bad widths

  // Page tables and lengths: built on the host, where the engine keeps its block tables, and
  // sent in one pinned copy per call, queued behind the work that wrote the pages.
  const int64_t columns = std::max<int64_t>(g.max_pages, 1);
  const int64_t table_values = 2 * dims.batch * columns;
  at::Tensor host = at::empty({table_values + dims.batch},
                              at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  int64_t* latent_table = host.data_ptr<int64_t>();
  int64_t* rope_table = latent_table + dims.batch * columns;
  int64_t* lengths = rope_table + dims.batch * columns;
  std::fill(latent_table, latent_table + table_values, 0);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t page_index = 0, length = 0;
    for (const LatentAttentionPage& page : pages[b]) {
      if (page.latent.size(0) == 0) continue;
      for (int64_t t = 0; t < tokens; ++t) {
        const int64_t slot = (b * tokens + t) * columns + page_index;
        latent_table[slot] = reinterpret_cast<int64_t>(page.latent.data_ptr<float>());
        rope_table[slot] = reinterpret_cast<int64_t>(page.rope_key.data_ptr<float>());
      }
      ++page_index;
      length += page.latent.size(0);
    }
    for (int64_t t = 0; t < tokens; ++t) lengths[b * tokens + t] = length;
  }
  const c10::cuda::CUDAGuard guard(query.device());
  at::Tensor device_tables = host.to(query.device(), /*non_blocking=*/true);
  at::Tensor device_lengths = device_tables.narrow(0, table_values, dims.batch).to(at::kInt);

  at::Tensor absorbed =
      query.narrow(3, 0, latent_rank).reshape({dims.batch, heads, latent_rank}).contiguous();
  at::Tensor rope_query =
      query.narrow(3, latent_rank, rope_dim).reshape({dims.batch, heads, rope_dim}).contiguous();
  at::Tensor past = at::empty({batch, tokens, heads, latent_rank}, query.options());
  at::Tensor past_lse = at::empty({batch, tokens, heads}, query.options());
  at::Tensor workspace =
      at::empty({static_cast<int64_t>(workspace_bytes)}, query.options().dtype(at::kByte));
  cuda::LatentAttentionPagedCache cache;
  cache.latent_pages = reinterpret_cast<const float* const*>(device_tables.data_ptr<int64_t>());
  cache.rope_pages = reinterpret_cast<const float* const*>(device_tables.data_ptr<int64_t>() +
                                                           dims.batch * columns);
  cache.max_pages = g.max_pages;
  cache.page_rows = g.page_rows;
  cache.latent_row_stride = g.latent_stride;
  cache.rope_row_stride = g.rope_stride;
  const Status status = cuda::LatentAttentionDecodePaged(
      dims, absorbed.data_ptr<float>(), rope_dim > 0 ? rope_query.data_ptr<float>() : nullptr,
      cache, device_lengths.data_ptr<int32_t>(), past.data_ptr<float>(), past_lse.data_ptr<float>(),
      workspace.data_ptr(), workspace_bytes,
      c10::cuda::getCurrentCUDAStream(query.device().index()).stream());
  TORCH_CHECK(status.ok(), status.ToString());

  // The new tokens' own rows: token t sees new rows 0..t. Merged with the past through its
  // log-sum-exp (an empty past has lse = -inf and weight 0).
  at::Tensor keys = at::cat({new_latent, new_rope_key}, -1);        // (B, T, W)
  at::Tensor scores = at::einsum("bthw,bsw->bths", {query, keys});  // (B, T, H, T)
  at::Tensor future = at::ones({tokens, tokens}, query.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future.view({1, tokens, 1, tokens}),
                              -std::numeric_limits<float>::infinity());
  at::Tensor top = at::maximum(past_lse, std::get<0>(scores.max(-1)));  // (B, T, H)
  at::Tensor past_weight = at::exp(past_lse - top);
  at::Tensor p = at::exp(scores - top.unsqueeze(-1));
  at::Tensor total = past_weight + p.sum(-1);
  at::Tensor out = past * past_weight.unsqueeze(-1) + at::einsum("bths,bsc->bthc", {p, new_latent});
  return out / total.unsqueeze(-1);
}

}  // namespace strider::kernels::internal
