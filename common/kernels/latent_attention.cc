#include "common/kernels/latent_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/kernels/latent_attention_prefill.h"
#if defined(STRIDER_CUDA_DECODE)
#include "common/kernels/latent_attention_cuda.h"
#endif

namespace strider::kernels {
namespace {

// Query rows are (token, head) pairs, each a vector [q~_h (Dc); q_rope_h (Dr)] already scaled, so
// one dot product with a cached row [c_kv; k_rope] is the score. Per query row the running
// maximum m, sum l and weighted latent acc (Dc) are updated block by block:
//   m' = max(m, max_j s_j);  l' = l e^(m - m') + sum_j e^(s_j - m');  acc' likewise.
// Two kernels share that scheme: plain loops for a few new tokens per row (decode: memory bound,
// one pass over each cached row for all heads, split over threads by pages), and tiles of matrix
// products for longer runs (prefill: compute bound).

constexpr int64_t kKeyChunk = 64;         // rows converted and scored together (loop kernel)
constexpr int64_t kMaxRunKeys = 4096;     // longer pages are split (parallel work granularity)
constexpr int64_t kMinItemKeys = 2048;    // smallest share of one thread in the loop kernel
constexpr int64_t kTileKeys = 512;        // new-token keys per tile (tile kernel)
constexpr int64_t kTileQueryRows = 2048;  // query rows (tokens x heads) per tile

// Keys of one row for the loop kernel: a page of the past (seen by every new token) or the new
// tokens' own rows (key j seen by new tokens t >= j).
struct KeyRun {
  at::Tensor latent;    // (n, Dc)
  at::Tensor rope_key;  // (n, Dr)
  bool is_new = false;
};

template <typename Compute>
struct OnlineSoftmax {
  std::vector<Compute> max, sum, acc;  // per query row; acc (rows, Dc)
  void Init(int64_t rows, int64_t latent_rank) {
    max.assign(rows, -std::numeric_limits<Compute>::infinity());
    sum.assign(rows, 0);
    acc.assign(rows * latent_rank, 0);
  }
};

// The inner loops below have run-time trip counts (widths, visible keys); the project builds
// with -O2, whose cost model leaves such loops scalar. They are the whole decode cost at long
// context, so this one function is vectorised.
#pragma GCC push_options
#pragma GCC optimize("O3")
template <typename Storage, typename Compute>
void ScoreRun(const Compute* query, int64_t tokens, int64_t heads, const KeyRun& run,
              OnlineSoftmax<Compute>* state) {
  const int64_t latent_rank = run.latent.size(1);
  const int64_t rope_dim = run.rope_key.size(1);
  const int64_t width = latent_rank + rope_dim;
  const int64_t n = run.latent.size(0);
  const Storage* latent = run.latent.data_ptr<Storage>();
  const Storage* rope = run.rope_key.data_ptr<Storage>();
  const int64_t latent_stride = run.latent.stride(0);
  const int64_t rope_stride = run.rope_key.stride(0);
  // Each chunk of cached rows is converted once, row-major for the weighted sum and
  // column-major for the scores, so both inner loops run over contiguous memory.
  std::vector<Compute> rows(kKeyChunk * width), columns(width * kKeyChunk), scores(kKeyChunk);
  for (int64_t first = 0; first < n; first += kKeyChunk) {
    if (run.is_new && first > tokens - 1) break;  // no new token sees these keys
    const int64_t count = std::min(kKeyChunk, n - first);
    for (int64_t j = 0; j < count; ++j) {
      const Storage* l = latent + (first + j) * latent_stride;
      const Storage* r = rope + (first + j) * rope_stride;
      Compute* row = rows.data() + j * width;
      for (int64_t c = 0; c < latent_rank; ++c) row[c] = static_cast<Compute>(l[c]);
      for (int64_t c = 0; c < rope_dim; ++c) row[latent_rank + c] = static_cast<Compute>(r[c]);
      for (int64_t c = 0; c < width; ++c) columns[c * kKeyChunk + j] = row[c];
    }
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t visible = run.is_new ? std::min(count, t - first + 1) : count;
      if (visible <= 0) continue;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t index = t * heads + h;
        const Compute* q = query + index * width;
        std::fill(scores.begin(), scores.begin() + visible, Compute(0));
        for (int64_t c = 0; c < width; ++c) {
          const Compute qc = q[c];
          const Compute* column = columns.data() + c * kKeyChunk;
          for (int64_t j = 0; j < visible; ++j) scores[j] += qc * column[j];
        }
        Compute chunk_max = scores[0];
        for (int64_t j = 1; j < visible; ++j) chunk_max = std::max(chunk_max, scores[j]);
        Compute& running_max = state->max[index];
        Compute& running_sum = state->sum[index];
        Compute* acc = state->acc.data() + index * latent_rank;
        if (chunk_max > running_max) {
          const Compute correction = std::exp(running_max - chunk_max);  // 0 from -inf
          running_sum *= correction;
          for (int64_t c = 0; c < latent_rank; ++c) acc[c] *= correction;
          running_max = chunk_max;
        }
        for (int64_t j = 0; j < visible; ++j) {
          const Compute p = std::exp(scores[j] - running_max);
          running_sum += p;
          const Compute* row = rows.data() + j * width;
          for (int64_t c = 0; c < latent_rank; ++c) acc[c] += p * row[c];
        }
      }
    }
  }
}

#pragma GCC pop_options

template <typename Compute>
void ScoreRunAnyStorage(const Compute* query, int64_t tokens, int64_t heads, const KeyRun& run,
                        OnlineSoftmax<Compute>* state) {
  switch (run.latent.scalar_type()) {
    case at::kFloat: return ScoreRun<float, Compute>(query, tokens, heads, run, state);
    case at::kDouble: return ScoreRun<double, Compute>(query, tokens, heads, run, state);
    case at::kBFloat16: return ScoreRun<c10::BFloat16, Compute>(query, tokens, heads, run, state);
    default: break;  // rejected before the parallel region
  }
}

// Merges `part` (later keys) into `into`.
template <typename Compute>
void MergeOnline(OnlineSoftmax<Compute>* into, const OnlineSoftmax<Compute>& part,
                 int64_t latent_rank) {
  for (size_t i = 0; i < into->max.size(); ++i) {
    if (part.max[i] == -std::numeric_limits<Compute>::infinity()) continue;
    const Compute top = std::max(into->max[i], part.max[i]);
    const Compute a = std::exp(into->max[i] - top);
    const Compute b = std::exp(part.max[i] - top);
    into->sum[i] = into->sum[i] * a + part.sum[i] * b;
    for (int64_t c = 0; c < latent_rank; ++c) {
      Compute& value = into->acc[i * latent_rank + c];
      value = value * a + part.acc[i * latent_rank + c] * b;
    }
    into->max[i] = top;
  }
}

// query (B, T, H, W) contiguous; new rows (B, T, .) in the compute dtype. Returns (B, T, H, Dc).
template <typename Compute>
at::Tensor LoopKernel(const at::Tensor& query, const LatentAttentionPages& pages,
                      const at::Tensor& new_latent, const at::Tensor& new_rope_key) {
  const int64_t batch = query.size(0);
  const int64_t tokens = query.size(1);
  const int64_t heads = query.size(2);
  const int64_t latent_rank = new_latent.size(2);
  const int64_t width = query.size(3);
  // Work items: consecutive runs of one row, about an equal share of keys each.
  struct Item {
    int64_t row;
    std::vector<KeyRun> runs;
  };
  int64_t total = 0;
  for (const auto& row : pages) {
    for (const LatentAttentionPage& page : row) total += page.latent.size(0);
  }
  const int64_t share =
      std::max(kMinItemKeys, total / std::max<int64_t>(1, 4 * at::get_num_threads()));
  std::vector<Item> items;
  std::vector<int64_t> first_item(batch);
  for (int64_t b = 0; b < batch; ++b) {
    first_item[b] = static_cast<int64_t>(items.size());
    items.push_back({b, {}});
    int64_t keys = 0;
    for (const LatentAttentionPage& page : pages[b]) {
      const int64_t n = page.latent.size(0);
      for (int64_t begin = 0; begin < n; begin += kMaxRunKeys) {
        const int64_t count = std::min(kMaxRunKeys, n - begin);
        if (keys >= share) {
          items.push_back({b, {}});
          keys = 0;
        }
        items.back().runs.push_back(
            {page.latent.narrow(0, begin, count), page.rope_key.narrow(0, begin, count), false});
        keys += count;
      }
    }
    items.back().runs.push_back({new_latent[b], new_rope_key[b], true});
  }
  std::vector<OnlineSoftmax<Compute>> states(items.size());
  const Compute* query_data = query.data_ptr<Compute>();
  auto work = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      states[i].Init(tokens * heads, latent_rank);
      const Compute* q = query_data + items[i].row * tokens * heads * width;
      for (const KeyRun& run : items[i].runs) {
        ScoreRunAnyStorage<Compute>(q, tokens, heads, run, &states[i]);
      }
    }
  };
  // One item (a short past, one row) runs here: waking the other threads costs more than it.
  if (items.size() == 1) {
    work(0, 1);
  } else {
    at::parallel_for(0, static_cast<int64_t>(items.size()), 1, work);
  }
  at::Tensor out = at::empty({batch, tokens, heads, latent_rank}, query.options());
  Compute* out_data = out.data_ptr<Compute>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t last = b + 1 < batch ? first_item[b + 1] : static_cast<int64_t>(items.size());
    OnlineSoftmax<Compute>& total_state = states[first_item[b]];
    for (int64_t i = first_item[b] + 1; i < last; ++i) {
      MergeOnline(&total_state, states[i], latent_rank);
    }
    Compute* o = out_data + b * tokens * heads * latent_rank;
    for (int64_t i = 0; i < tokens * heads; ++i) {
      for (int64_t c = 0; c < latent_rank; ++c) {
        o[i * latent_rank + c] = total_state.acc[i * latent_rank + c] / total_state.sum[i];
      }
    }
  }
  return out;
}

// One block of keys for the query rows [row, row + rows) of a tile.
struct TileState {
  at::Tensor max, sum, acc;  // (rows), (rows), (rows, Dc)
  void Update(const at::Tensor& scores, const at::Tensor& latent, int64_t row, int64_t rows) {
    at::Tensor m = max.narrow(0, row, rows);
    at::Tensor top = at::maximum(m, std::get<0>(scores.max(1)));
    at::Tensor correction = at::exp(m - top);
    at::Tensor p = at::exp(scores - top.unsqueeze(1));
    sum.narrow(0, row, rows).mul_(correction).add_(p.sum(1));
    at::Tensor a = acc.narrow(0, row, rows);
    a.mul_(correction.unsqueeze(1)).addmm_(p, latent);
    m.copy_(top);
  }
};

// Matrix-product tiles for many new tokens per row; same arguments as LoopKernel. The float32
// prefill runs the fused kernel instead where the CPU has AVX2 (latent_attention_prefill.h);
// this is the float64 path, the fallback, and every form off the CPU (ATen ops only, so it runs
// where the tensors are).
at::Tensor TileKernel(const at::Tensor& query, const LatentAttentionPages& pages,
                      const at::Tensor& new_latent, const at::Tensor& new_rope_key) {
  const int64_t batch = query.size(0);
  const int64_t tokens = query.size(1);
  const int64_t heads = query.size(2);
  const int64_t latent_rank = new_latent.size(2);
  const int64_t rope_dim = new_rope_key.size(2);
  const at::ScalarType type = query.scalar_type();
  at::Tensor out = at::empty({batch, tokens, heads, latent_rank}, query.options());
  const int64_t tile_tokens = std::max<int64_t>(1, kTileQueryRows / heads);
  for (int64_t b = 0; b < batch; ++b) {
    at::Tensor q = query[b].reshape({tokens * heads, latent_rank + rope_dim});
    at::Tensor out_rows = out[b].view({tokens * heads, latent_rank});
    for (int64_t t0 = 0; t0 < tokens; t0 += tile_tokens) {
      const int64_t count = std::min(tile_tokens, tokens - t0);
      const int64_t rows = count * heads;
      at::Tensor q_tile = q.narrow(0, t0 * heads, rows);
      at::Tensor q_latent = q_tile.narrow(1, 0, latent_rank);
      at::Tensor q_rope = q_tile.narrow(1, latent_rank, rope_dim);
      TileState state{at::full({rows}, -std::numeric_limits<double>::infinity(), q.options()),
                      at::zeros({rows}, q.options()), at::zeros({rows, latent_rank}, q.options())};
      // The past in blocks of kTileKeys: a page may be a whole contiguous cache (256K rows),
      // whose scores against a tile would be gigabytes.
      for (const LatentAttentionPage& page : pages[b]) {
        const int64_t n = page.latent.size(0);
        for (int64_t k0 = 0; k0 < n; k0 += kTileKeys) {
          const int64_t keys = std::min(kTileKeys, n - k0);
          at::Tensor latent = page.latent.narrow(0, k0, keys).to(type);
          at::Tensor scores = at::mm(q_latent, latent.t());
          scores.addmm_(q_rope, page.rope_key.narrow(0, k0, keys).to(type).t());
          state.Update(scores, latent, 0, rows);
        }
      }
      // The new tokens' own rows: key k is seen by tokens t >= k.
      for (int64_t k0 = 0; k0 < t0 + count; k0 += kTileKeys) {
        const int64_t keys = std::min(kTileKeys, t0 + count - k0);
        const int64_t first = std::max(t0, k0);  // first token of the tile that sees key k0
        const int64_t row = (first - t0) * heads;
        const int64_t seeing = (t0 + count - first) * heads;
        at::Tensor latent = new_latent[b].narrow(0, k0, keys);
        at::Tensor scores = at::mm(q_latent.narrow(0, row, seeing), latent.t());
        scores.addmm_(q_rope.narrow(0, row, seeing), new_rope_key[b].narrow(0, k0, keys).t());
        if (k0 + keys - 1 > first) {
          const at::TensorOptions positions = scores.options().dtype(at::kLong);
          at::Tensor key_position = at::arange(k0, k0 + keys, positions);
          at::Tensor token_position = at::arange(first, t0 + count, positions)
                                          .unsqueeze(1)
                                          .expand({t0 + count - first, heads})
                                          .reshape({-1});
          scores.masked_fill_(key_position.unsqueeze(0) > token_position.unsqueeze(1),
                              -std::numeric_limits<double>::infinity());
        }
        state.Update(scores, latent, row, seeing);
      }
      out_rows.narrow(0, t0 * heads, rows).copy_(state.acc / state.sum.unsqueeze(1));
    }
  }
  return out;
}

// Checked before any kernel runs, so a bad page is an error rather than a read out of bounds
// inside a parallel region.
void CheckArguments(const at::Tensor& query, const LatentAttentionPages& pages,
                    const at::Tensor& new_latent, const at::Tensor& new_rope_key) {
  const int64_t batch = query.size(0);
  const int64_t latent_rank = new_latent.size(2);
  const int64_t rope_dim = new_rope_key.size(2);
  TORCH_CHECK(static_cast<int64_t>(pages.size()) == batch, "latent attention: past has ",
              pages.size(), " rows of pages for a batch of ", batch);
  for (const auto& row : pages) {
    for (const LatentAttentionPage& page : row) {
      const at::ScalarType type = page.latent.scalar_type();
      TORCH_CHECK(type == at::kFloat || type == at::kDouble || type == at::kBFloat16,
                  "latent attention: cached rows must be float32, float64 or bfloat16");
      TORCH_CHECK(page.rope_key.scalar_type() == type && page.latent.dim() == 2 &&
                      page.rope_key.dim() == 2 && page.latent.size(1) == latent_rank &&
                      page.rope_key.size(1) == rope_dim &&
                      page.rope_key.size(0) == page.latent.size(0) && page.latent.stride(1) == 1 &&
                      page.rope_key.stride(1) == 1,
                  "latent attention: a page must be (n, ", latent_rank, ") and (n, ", rope_dim,
                  ") rows of one dtype with unit inner stride");
    }
  }
  const at::ScalarType compute = query.scalar_type();
  TORCH_CHECK(compute == at::kFloat || compute == at::kDouble,
              "latent attention: queries must be float32 or float64");
  TORCH_CHECK(query.dim() == 4 && query.size(3) == latent_rank + rope_dim &&
                  query.is_contiguous() && new_latent.scalar_type() == compute &&
                  new_rope_key.scalar_type() == compute && new_latent.is_contiguous() &&
                  new_rope_key.is_contiguous() && new_latent.size(0) == batch &&
                  new_rope_key.size(0) == batch && new_latent.size(1) == query.size(1) &&
                  new_rope_key.size(1) == query.size(1),
              "latent attention: query (B, T, H, Dc+Dr) and new rows (B, T, Dc), (B, T, Dr) "
              "must be contiguous in one compute dtype");
}

}  // namespace

at::Tensor LatentAttentionOverPages(const at::Tensor& query, const LatentAttentionPages& pages,
                                    const at::Tensor& new_latent, const at::Tensor& new_rope_key) {
  if (query.size(1) <= kLatentAttentionDecodeMaxTokens) {
    return LatentAttentionDecode(query, pages, new_latent, new_rope_key);
  }
  return LatentAttentionPrefill(query, pages, new_latent, new_rope_key);
}

at::Tensor LatentAttentionDecode(const at::Tensor& query, const LatentAttentionPages& pages,
                                 const at::Tensor& new_latent, const at::Tensor& new_rope_key) {
  CheckArguments(query, pages, new_latent, new_rope_key);
#if defined(STRIDER_CUDA_DECODE)
  // On a GPU the paged CUDA kernel reads every page in one launch (docs/cuda.md); the tile
  // kernel below would launch ATen operations per page.
  if (query.is_cuda()) {
    at::Tensor out = internal::LatentAttentionDecodeCuda(query, pages, new_latent, new_rope_key);
    if (out.defined()) return out;
  }
#endif
  // The loop kernel reads the rows through host pointers.
  if (!query.device().is_cpu()) return TileKernel(query, pages, new_latent, new_rope_key);
  return query.scalar_type() == at::kDouble
             ? LoopKernel<double>(query, pages, new_latent, new_rope_key)
             : LoopKernel<float>(query, pages, new_latent, new_rope_key);
}

at::Tensor LatentAttentionPrefill(const at::Tensor& query, const LatentAttentionPages& pages,
                                  const at::Tensor& new_latent, const at::Tensor& new_rope_key) {
  CheckArguments(query, pages, new_latent, new_rope_key);
  const int64_t latent_rank = new_latent.size(2);
  // float32 on a CPU with AVX2: the fused kernel (latent_attention_prefill.h); otherwise (float64,
  // no AVX2, or another device) tiles of ATen products.
  if (query.scalar_type() != at::kFloat || !query.device().is_cpu() ||
      !internal::CanRunFusedPrefill(latent_rank)) {
    return TileKernel(query, pages, new_latent, new_rope_key);
  }
  std::vector<std::vector<internal::KeyPageView>> views(pages.size());
  for (size_t b = 0; b < pages.size(); ++b) {
    for (const LatentAttentionPage& page : pages[b]) {
      if (page.latent.size(0) == 0) continue;
      const at::ScalarType type = page.latent.scalar_type();
      views[b].push_back({page.latent.data_ptr(), page.rope_key.data_ptr(), page.latent.size(0),
                          page.latent.stride(0), page.rope_key.stride(0),
                          type == at::kFloat    ? internal::KeyStorage::kFloat
                          : type == at::kDouble ? internal::KeyStorage::kDouble
                                                : internal::KeyStorage::kBFloat16});
    }
  }
  at::Tensor out = at::empty({query.size(0), query.size(1), query.size(2), latent_rank},
                             query.options());
  internal::FusedPrefillProblem problem;
  problem.query = query.data_ptr<float>();
  problem.new_latent = new_latent.data_ptr<float>();
  problem.new_rope_key = new_rope_key.data_ptr<float>();
  problem.pages = &views;
  problem.out = out.data_ptr<float>();
  problem.batch = query.size(0);
  problem.tokens = query.size(1);
  problem.heads = query.size(2);
  problem.latent_rank = latent_rank;
  problem.rope_dim = new_rope_key.size(2);
  internal::RunFusedPrefill(problem);
  return out;
}

at::Tensor LatentAttentionReference(const at::Tensor& query, const LatentAttentionPages& pages,
                                    const at::Tensor& new_latent, const at::Tensor& new_rope_key) {
  CheckArguments(query, pages, new_latent, new_rope_key);
  const int64_t batch = query.size(0);
  const int64_t tokens = query.size(1);
  const int64_t heads = query.size(2);
  const int64_t latent_rank = new_latent.size(2);
  const at::ScalarType type = query.scalar_type();
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<at::Tensor> latents, ropes;
    for (const LatentAttentionPage& page : pages[b]) {
      latents.push_back(page.latent.to(type));
      ropes.push_back(page.rope_key.to(type));
    }
    latents.push_back(new_latent[b]);
    ropes.push_back(new_rope_key[b]);
    at::Tensor keys = at::cat({at::cat(latents, 0), at::cat(ropes, 0)}, 1);  // (S, W)
    const int64_t past = keys.size(0) - tokens;
    at::Tensor scores = at::einsum("thw,sw->ths", {query[b], keys});  // (T, H, S)
    // Key s is in token t's future when s > past + t.
    const at::TensorOptions positions = scores.options().dtype(at::kLong);
    at::Tensor future = at::arange(past + tokens, positions).unsqueeze(0) >
                        (at::arange(tokens, positions) + past).unsqueeze(1);  // (T, S)
    scores.masked_fill_(future.unsqueeze(1), -std::numeric_limits<double>::infinity());
    rows.push_back(
        at::einsum("ths,sc->thc", {at::softmax(scores, -1), keys.narrow(1, 0, latent_rank)}));
  }
  return at::stack(rows, 0).view({batch, tokens, heads, latent_rank});
}

}  // namespace strider::kernels
