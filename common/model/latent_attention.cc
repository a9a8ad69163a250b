#include "common/model/latent_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include <cmath>
#include <limits>

namespace strider::model {

LatentAttentionWeights LatentAttentionWeights::Bind(const TensorMap& t, const std::string& p) {
  LatentAttentionWeights w;
  w.query_down = Lookup(t, p + "query_down");
  w.query_norm = Lookup(t, p + "query_norm");
  w.query_up = Lookup(t, p + "query_up");
  w.kv_down = Lookup(t, p + "kv_down");
  w.kv_norm = Lookup(t, p + "kv_norm");
  w.kv_up = Lookup(t, p + "kv_up");
  w.gate = Lookup(t, p + "gate");
  w.output = Lookup(t, p + "output");
  if (auto it = t.find(p + "joined_input"); it != t.end()) w.joined_input = it->second;
  return w;
}

LatentAttentionCache LatentAttentionCache::Empty(const LatentAttentionConfig& c, int64_t batch,
                                                 const at::TensorOptions& options) {
  LatentAttentionCache cache;
  cache.latent = at::empty({batch, 0, c.kv_rank}, options);
  cache.rope_key = at::empty({batch, 0, c.rope_dim}, options);
  return cache;
}

void LatentAttentionCache::Append(const at::Tensor& latent_rows, const at::Tensor& rope_rows) {
  const int64_t added = latent_rows.size(1);
  const int64_t needed = length + added;
  if (needed > latent.size(1) || *rows_written > length) {
    const int64_t capacity = std::max<int64_t>(needed, std::max<int64_t>(16, 2 * latent.size(1)));
    at::Tensor grown_latent =
        at::empty({latent.size(0), capacity, latent.size(2)}, latent.options());
    at::Tensor grown_rope =
        at::empty({rope_key.size(0), capacity, rope_key.size(2)}, rope_key.options());
    grown_latent.narrow(1, 0, length).copy_(latent.narrow(1, 0, length));
    grown_rope.narrow(1, 0, length).copy_(rope_key.narrow(1, 0, length));
    latent = grown_latent;
    rope_key = grown_rope;
    rows_written = std::make_shared<int64_t>(length);
  }
  latent.narrow(1, length, added).copy_(latent_rows);
  rope_key.narrow(1, length, added).copy_(rope_rows);
  length = needed;
  *rows_written = needed;
}

at::Tensor LatentAttentionCache::Latent() const { return latent.narrow(1, 0, length); }
at::Tensor LatentAttentionCache::RopeKey() const { return rope_key.narrow(1, 0, length); }

int64_t LatentAttentionCache::Bytes() const {
  return length * latent.size(0) * (latent.size(2) + rope_key.size(2)) *
         static_cast<int64_t>(latent.element_size());
}

namespace {

// Causal mask for T new queries at positions past_length.. against S = past_length + T keys:
// true where the key is in the query's future.
at::Tensor FutureMask(int64_t queries, int64_t keys, const at::Device& device) {
  const int64_t past = keys - queries;
  at::Tensor query_position = at::arange(queries, at::TensorOptions().device(device)) + past;
  at::Tensor key_position = at::arange(keys, at::TensorOptions().device(device));
  return key_position.unsqueeze(0) > query_position.unsqueeze(1);  // (T, S)
}

// ---- Blockwise absorbed attention over pages ------------------------------------------------
//
// Query rows are (token, head) pairs, each a vector [q~_h (Dc); q_rope_h (Dr)] already scaled, so
// one dot product with a cached row [c_kv; k_rope] is the score. Per query row the running
// maximum m, sum l and weighted latent acc (Dc) are updated block by block:
//   m' = max(m, max_j s_j);  l' = l e^(m - m') + sum_j e^(s_j - m');  acc' likewise.
// Two kernels share that scheme: plain loops for a few new tokens per row (decode: memory bound,
// one pass over each cached row for all heads, split over threads by pages), and tiles of matrix
// products for longer runs (prefill: compute bound).

constexpr int64_t kKeyChunk = 64;          // rows converted and scored together (loop kernel)
constexpr int64_t kLoopKernelQueries = 4;  // new tokens per row up to which the loop kernel runs
constexpr int64_t kMaxRunKeys = 4096;      // longer pages are split (parallel work granularity)
constexpr int64_t kMinItemKeys = 2048;     // smallest share of one thread in the loop kernel
constexpr int64_t kTileKeys = 512;         // new-token keys per tile (tile kernel)
constexpr int64_t kTileQueryRows = 2048;   // query rows (tokens x heads) per tile

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
at::Tensor LoopKernel(const at::Tensor& query, const std::vector<std::vector<LatentAttentionPage>>& pages,
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
        items.back().runs.push_back({page.latent.narrow(0, begin, count),
                                     page.rope_key.narrow(0, begin, count), false});
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

// Matrix-product tiles for many new tokens per row; same arguments as LoopKernel.
at::Tensor TileKernel(const at::Tensor& query,
                      const std::vector<std::vector<LatentAttentionPage>>& pages,
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
      for (const LatentAttentionPage& page : pages[b]) {
        at::Tensor latent = page.latent.to(type);
        at::Tensor scores = at::mm(q_latent, latent.t());
        scores.addmm_(q_rope, page.rope_key.to(type).t());
        state.Update(scores, latent, 0, rows);
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
          at::Tensor key_position = at::arange(k0, k0 + keys, at::kLong);
          at::Tensor token_position =
              at::arange(first, t0 + count, at::kLong).repeat_interleave(heads);
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

// Row b's past as pages: the given pages, or views of the padded tensors up to lengths[b].
std::vector<std::vector<LatentAttentionPage>> PastPages(const at::Tensor& past_latent,
                                                        const at::Tensor& past_rope_key,
                                                        const at::Tensor& past_lengths,
                                                        int64_t batch) {
  std::vector<std::vector<LatentAttentionPage>> pages(batch);
  if (!past_latent.defined() || past_latent.size(1) == 0) return pages;
  std::vector<int64_t> lengths(batch, past_latent.size(1));
  if (past_lengths.defined()) {
    at::Tensor cpu = past_lengths.to(at::kLong).cpu().contiguous();
    std::copy(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + batch, lengths.begin());
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (lengths[b] == 0) continue;
    pages[b].push_back({past_latent[b].narrow(0, 0, lengths[b]),
                        past_rope_key[b].narrow(0, 0, lengths[b])});
  }
  return pages;
}

// Pages copied into padded (B, P, .) tensors, for the forms that need the past as one tensor.
void PadPages(const std::vector<std::vector<LatentAttentionPage>>& pages, at::Tensor* latent,
              at::Tensor* rope_key, at::Tensor* lengths) {
  const int64_t batch = static_cast<int64_t>(pages.size());
  std::vector<int64_t> length(batch, 0);
  const LatentAttentionPage* sample = nullptr;
  for (int64_t b = 0; b < batch; ++b) {
    for (const LatentAttentionPage& page : pages[b]) {
      length[b] += page.latent.size(0);
      sample = &page;
    }
  }
  if (sample == nullptr) return;
  const int64_t longest = *std::max_element(length.begin(), length.end());
  *latent = at::zeros({batch, longest, sample->latent.size(1)}, sample->latent.options());
  *rope_key = at::zeros({batch, longest, sample->rope_key.size(1)}, sample->rope_key.options());
  for (int64_t b = 0; b < batch; ++b) {
    int64_t at_position = 0;
    for (const LatentAttentionPage& page : pages[b]) {
      const int64_t n = page.latent.size(0);
      (*latent)[b].narrow(0, at_position, n).copy_(page.latent);
      (*rope_key)[b].narrow(0, at_position, n).copy_(page.rope_key);
      at_position += n;
    }
  }
  *lengths = at::tensor(length, at::kLong);
}

// Shared by the cache form and the ragged form. The past is `past` (padded or paged; lengths
// undefined when every row has all P padded entries). The new rows are returned through
// *new_latent/*new_rope_key in x's dtype with their graph.
at::Tensor Attend(const LatentAttentionWeights& w, const LatentAttentionConfig& c,
                  const at::Tensor& x, const LatentAttentionPast& past, double norm_epsilon,
                  LatentAttentionForm form, at::Tensor* new_latent, at::Tensor* new_rope_key) {
  const int64_t batch = x.size(0);
  const int64_t length = x.size(1);
  const int64_t heads = c.heads;
  const int64_t qk_dim = c.nope_dim + c.rope_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(qk_dim));

  const std::vector<at::Tensor> inputs =
      LinearParts(x, w.joined_input, {&w.query_down, &w.kv_down, &w.gate});
  at::Tensor compressed_query = RmsNorm(inputs[0], w.query_norm, norm_epsilon);
  at::Tensor query = Linear(compressed_query, w.query_up).view({batch, length, heads, qk_dim});
  at::Tensor query_nope = query.narrow(-1, 0, c.nope_dim);          // (B, T, H, Dn)
  at::Tensor query_rope = query.narrow(-1, c.nope_dim, c.rope_dim);  // (B, T, H, Dr)

  const at::Tensor& kv = inputs[1];
  at::Tensor latent = RmsNorm(kv.narrow(-1, 0, c.kv_rank), w.kv_norm, norm_epsilon);  // (B,T,Dc)
  at::Tensor rope_key = kv.narrow(-1, c.kv_rank, c.rope_dim);                         // (B,T,Dr)
  *new_latent = latent;
  *new_rope_key = rope_key;

  // W_ukv per head: rows [k_nope (Dn); v (Dv)] of each head.
  at::Tensor kv_up = w.kv_up.view({heads, c.nope_dim + c.value_dim, c.kv_rank});
  at::Tensor key_up = kv_up.narrow(1, 0, c.nope_dim);              // (H, Dn, Dc)
  at::Tensor value_up = kv_up.narrow(1, c.nope_dim, c.value_dim);  // (H, Dv, Dc)

  const bool records = at::GradMode::is_enabled() &&
                       (x.requires_grad() || w.query_down.requires_grad() ||
                        w.kv_up.requires_grad() ||
                        (past.latent.defined() && past.latent.requires_grad()));
  at::Tensor head_output;  // (B, T, H, Dv)
  if (form == LatentAttentionForm::kAbsorbed && !records) {
    // Blockwise over the past where it lives; nothing of the past's size is allocated.
    const at::ScalarType compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    std::vector<std::vector<LatentAttentionPage>> pages =
        past.pages.empty() ? PastPages(past.latent, past.rope_key, past.lengths, batch)
                           : past.pages;
    TORCH_CHECK(static_cast<int64_t>(pages.size()) == batch, "latent attention: past has ",
                pages.size(), " rows of pages for a batch of ", batch);
    for (const auto& row : pages) {
      for (const LatentAttentionPage& page : row) {
        const at::ScalarType type = page.latent.scalar_type();
        TORCH_CHECK(type == at::kFloat || type == at::kDouble || type == at::kBFloat16,
                    "latent attention: cached rows must be float32, float64 or bfloat16");
        TORCH_CHECK(page.rope_key.scalar_type() == type && page.latent.dim() == 2 &&
                        page.rope_key.dim() == 2 && page.latent.size(1) == c.kv_rank &&
                        page.rope_key.size(1) == c.rope_dim &&
                        page.rope_key.size(0) == page.latent.size(0) &&
                        page.latent.stride(1) == 1 && page.rope_key.stride(1) == 1,
                    "latent attention: a page must be (n, ", c.kv_rank, ") and (n, ", c.rope_dim,
                    ") rows of one dtype with unit inner stride");
      }
    }
    // q~_h = W_uk,h^T q_nope_h lives in the latent space (Dc); with q_rope it scores a cached
    // row [c_kv; k_rope] in one dot product.
    at::Tensor absorbed_query = at::einsum("bthn,hnc->bthc", {query_nope, key_up});
    at::Tensor scaled_query =
        (at::cat({absorbed_query, query_rope}, -1) * scale).to(compute).contiguous();
    at::Tensor keys_latent = latent.to(compute).contiguous();
    at::Tensor keys_rope = rope_key.to(compute).contiguous();
    at::Tensor latent_output;  // (B, T, H, Dc)
    if (length <= kLoopKernelQueries) {
      latent_output = compute == at::kDouble
                          ? LoopKernel<double>(scaled_query, pages, keys_latent, keys_rope)
                          : LoopKernel<float>(scaled_query, pages, keys_latent, keys_rope);
    } else {
      latent_output = TileKernel(scaled_query, pages, keys_latent, keys_rope);
    }
    head_output = at::einsum("bthc,hvc->bthv", {latent_output.to(x.scalar_type()), value_up});
  } else {
    at::Tensor past_latent = past.latent;
    at::Tensor past_rope_key = past.rope_key;
    at::Tensor past_lengths = past.lengths;
    if (!past.pages.empty()) PadPages(past.pages, &past_latent, &past_rope_key, &past_lengths);
    at::Tensor all_latent = latent;
    at::Tensor all_rope_key = rope_key;
    const int64_t past_length = past_latent.defined() ? past_latent.size(1) : 0;
    if (past_length > 0) {
      // Past tokens come from the cache (possibly stored in lower precision); the new tokens
      // keep their exact values and their graph, so chunked training through this path works.
      all_latent = at::cat({past_latent.to(x.scalar_type()), latent}, 1);
      all_rope_key = at::cat({past_rope_key.to(x.scalar_type()), rope_key}, 1);
    }
    const int64_t keys = all_latent.size(1);
    // Masked where the key is in the query's future or, for ragged rows, is past padding.
    at::Tensor mask = FutureMask(length, keys, x.device());  // (T, S)
    if (past_lengths.defined() && past_length > 0) {
      at::Tensor key_position = at::arange(past_length, at::TensorOptions().device(x.device()));
      at::Tensor padding = key_position.unsqueeze(0) >= past_lengths.unsqueeze(1);  // (B, P)
      padding = at::cat({padding, at::zeros({batch, length}, padding.options())}, 1);
      mask = (mask.unsqueeze(0) | padding.unsqueeze(1)).unsqueeze(1);  // (B, 1, T, S)
    }
    at::Tensor rope_scores =
        at::einsum("bthr,bsr->bhts", {query_rope, all_rope_key});  // (B, H, T, S)
    if (form == LatentAttentionForm::kExplicit) {
      at::Tensor key_nope = at::einsum("bsc,hnc->bhsn", {all_latent, key_up});  // (B,H,S,Dn)
      at::Tensor value = at::einsum("bsc,hvc->bhsv", {all_latent, value_up});   // (B,H,S,Dv)
      at::Tensor scores = at::einsum("bthn,bhsn->bhts", {query_nope, key_nope}) + rope_scores;
      scores = scores * scale;
      scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
      at::Tensor probabilities = at::softmax(scores, -1);
      head_output = at::einsum("bhts,bhsv->bthv", {probabilities, value});
    } else {
      // Absorbed while autograd records (chunked training): materialised scores.
      at::Tensor absorbed_query = at::einsum("bthn,hnc->bhtc", {query_nope, key_up});
      at::Tensor scores =
          at::matmul(absorbed_query, all_latent.unsqueeze(1).transpose(-1, -2));
      scores = (scores + rope_scores) * scale;
      scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
      at::Tensor probabilities = at::softmax(scores, -1);  // (B, H, T, S)
      at::Tensor latent_output = at::matmul(probabilities, all_latent.unsqueeze(1));
      head_output = at::einsum("bhtc,hvc->bthv", {latent_output, value_up});
    }
  }
  at::Tensor gated =
      at::sigmoid(inputs[2]) * head_output.reshape({batch, length, heads * c.value_dim});
  return Linear(gated, w.output);
}

}  // namespace

at::Tensor LatentAttentionForward(const LatentAttentionWeights& w, const LatentAttentionConfig& c,
                                  const at::Tensor& x, LatentAttentionCache* cache,
                                  double norm_epsilon, LatentAttentionForm form) {
  at::Tensor past_latent, past_rope_key;
  // While autograd records, earlier chunks' rows are read from the graph-carrying copies (when
  // they cover the whole cache), so chunked training gets the gradients of one whole pass.
  const bool have_graph = cache != nullptr && at::GradMode::is_enabled() &&
                          cache->latent_graph.defined() &&
                          cache->latent_graph.size(1) == cache->length;
  if (have_graph) {
    past_latent = cache->latent_graph;
    past_rope_key = cache->rope_key_graph;
  } else if (cache != nullptr) {
    past_latent = cache->Latent();
    past_rope_key = cache->RopeKey();
  }
  at::Tensor latent, rope_key;
  LatentAttentionPast past;
  past.latent = past_latent;
  past.rope_key = past_rope_key;
  at::Tensor out = Attend(w, c, x, past, norm_epsilon, form, &latent, &rope_key);
  if (cache != nullptr) {
    cache->Append(latent.detach().to(cache->latent.scalar_type()),
                  rope_key.detach().to(cache->rope_key.scalar_type()));
    if (at::GradMode::is_enabled() && latent.requires_grad()) {
      if (past_latent.defined() && past_latent.size(1) > 0) {
        cache->latent_graph = at::cat({past_latent.to(x.scalar_type()), latent}, 1);
        cache->rope_key_graph = at::cat({past_rope_key.to(x.scalar_type()), rope_key}, 1);
      } else {
        cache->latent_graph = latent;
        cache->rope_key_graph = rope_key;
      }
    } else {
      cache->latent_graph = at::Tensor();
      cache->rope_key_graph = at::Tensor();
    }
  }
  return out;
}

at::Tensor LatentAttentionForwardRagged(const LatentAttentionWeights& w,
                                        const LatentAttentionConfig& c, const at::Tensor& x,
                                        const LatentAttentionPast& past, double norm_epsilon,
                                        LatentAttentionForm form, LatentAttentionRows* rows) {
  at::Tensor latent, rope_key;
  at::Tensor out = Attend(w, c, x, past, norm_epsilon, form, &latent, &rope_key);
  at::ScalarType stored = x.scalar_type();
  if (past.latent.defined()) {
    stored = past.latent.scalar_type();
  } else {
    for (const auto& row : past.pages) {
      if (!row.empty()) stored = row.front().latent.scalar_type();
    }
  }
  rows->latent = latent.detach().to(stored);
  rows->rope_key = rope_key.detach().to(stored);
  return out;
}

}  // namespace strider::model
