// Latent attention's equations (docs/model_math.md#latent-attention) and its compressed cache. The
// absorbed form's blockwise softmax over a paged past is a kernel:
// common/kernels/latent_attention.h.
#include "common/model/latent_attention.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/kernels/latent_attention.h"

namespace strider::model {

LatentAttentionWeights LatentAttentionWeights::Bind(const TensorMap& t, const std::string& p) {
  const auto optional = [&](const std::string& name) {
    auto it = t.find(p + name);
    return it != t.end() ? it->second : at::Tensor();
  };
  LatentAttentionWeights w;
  w.query_down = optional("query_down");
  w.query_norm = optional("query_norm");
  w.query_up = optional("query_up");
  w.query = optional("query");
  w.kv_down = Lookup(t, p + "kv_down");
  w.kv_norm = Lookup(t, p + "kv_norm");
  w.kv_up = Lookup(t, p + "kv_up");
  w.gate = optional("gate");
  w.output = Lookup(t, p + "output");
  w.joined_input = optional("joined_input");
  return w;
}

std::vector<std::string> LatentAttentionInputNames(const LatentAttentionConfig& c,
                                                   const std::string& prefix) {
  std::vector<std::string> names = {prefix + (c.query_rank > 0 ? "query_down" : "query"),
                                    prefix + "kv_down"};
  if (c.output_gate) names.push_back(prefix + "gate");
  return names;
}

LatentAttentionCache LatentAttentionCache::Empty(const LatentAttentionConfig& c, int64_t batch,
                                                 const at::TensorOptions& options) {
  LatentAttentionCache cache;
  cache.latent = at::empty({batch, 0, c.kv_rank}, options);
  cache.rope_key = at::empty({batch, 0, c.rope_dim}, options);
  return cache;
}

void LatentAttentionCache::MoveTo(int64_t capacity) {
  at::Tensor grown_latent = at::empty({latent.size(0), capacity, latent.size(2)}, latent.options());
  at::Tensor grown_rope =
      at::empty({rope_key.size(0), capacity, rope_key.size(2)}, rope_key.options());
  grown_latent.narrow(1, 0, length).copy_(latent.narrow(1, 0, length));
  grown_rope.narrow(1, 0, length).copy_(rope_key.narrow(1, 0, length));
  latent = grown_latent;
  rope_key = grown_rope;
  rows_written = std::make_shared<int64_t>(length);
}

void LatentAttentionCache::Reserve(int64_t tokens) {
  if (latent.defined() && tokens > latent.size(1)) MoveTo(tokens);
}

void LatentAttentionCache::Append(const at::Tensor& latent_rows, const at::Tensor& rope_rows) {
  const int64_t added = latent_rows.size(1);
  const int64_t needed = length + added;
  if (needed > latent.size(1) || *rows_written > length) {
    MoveTo(std::max<int64_t>(needed, std::max<int64_t>(16, 2 * latent.size(1))));
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

// Row b's past as pages: the given pages, or views of the padded tensors up to lengths[b]. Reads
// the lengths on the host: for the CPU only (Attend keeps a device's padded past on the device).
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
  *lengths = at::tensor(length, at::kLong).to(sample->latent.device());
}

// x (B, T, H, K) times each head's (N, K) rows of `weights` (H, N, K): (B, T, H, N) as Linear
// computes it, a row's values the same whatever rows share the call. The batched matrix product
// an einsum becomes sums a decode step's single row (below 400 multiply-adds a head) in ATen's
// own loop and a batch of rows in the BLAS library, rounded differently.
at::Tensor PerHeadLinear(const at::Tensor& x, const at::Tensor& weights) {
  std::vector<at::Tensor> heads;
  heads.reserve(weights.size(0));
  for (int64_t h = 0; h < weights.size(0); ++h) {
    heads.push_back(Linear(x.select(2, h), weights[h].contiguous()));
  }
  return at::stack(heads, 2);
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
  if (c.norm_epsilon > 0) norm_epsilon = c.norm_epsilon;
  const bool compressed = c.query_rank > 0;
  TORCH_CHECK(compressed
                  ? (w.query_down.defined() && w.query_norm.defined() && w.query_up.defined())
                  : w.query.defined(),
              "latent attention with query_rank ", c.query_rank, " needs the weights ",
              compressed ? "query_down, query_norm and query_up" : "query");
  TORCH_CHECK(!c.output_gate || w.gate.defined(),
              "latent attention with an output gate needs the weight gate");

  // c_q = RMSNorm(W_dq x); [q_nope_h; q_rope_h] = (W_uq c_q)_h, or (W_q x)_h for a full-rank
  // query. The query's first map, W_dkv and W_g read the same x, so inference applies them as
  // one product (LatentAttentionInputNames).
  const at::Tensor& query_in = compressed ? w.query_down : w.query;
  const std::vector<at::Tensor> inputs =
      c.output_gate ? LinearParts(x, w.joined_input, {&query_in, &w.kv_down, &w.gate})
                    : LinearParts(x, w.joined_input, {&query_in, &w.kv_down});
  at::Tensor query =
      (compressed ? Linear(RmsNorm(inputs[0], w.query_norm, norm_epsilon), w.query_up) : inputs[0])
          .reshape({batch, length, heads, qk_dim});
  at::Tensor query_nope = query.narrow(-1, 0, c.nope_dim);           // (B, T, H, Dn)
  at::Tensor query_rope = query.narrow(-1, c.nope_dim, c.rope_dim);  // (B, T, H, Dr)

  // [c_kv; k_rope] = W_dkv x, c_kv <- RMSNorm(c_kv): what the cache stores.
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
                       (x.requires_grad() || query_in.requires_grad() ||
                        w.kv_up.requires_grad() ||
                        (past.latent.defined() && past.latent.requires_grad()));
  // Off the CPU a padded past with per-row lengths stays one tensor: cutting it into pages would
  // read the lengths on the host every layer; the masked forms below keep it on the device.
  const bool padded_ragged = past.pages.empty() && past.lengths.defined() &&
                             past.latent.defined() && past.latent.size(1) > 0;
  at::Tensor head_output;  // (B, T, H, Dv)
  if (form == LatentAttentionForm::kAbsorbed && !records &&
      (x.device().is_cpu() || !padded_ragged)) {
    // Blockwise over the past where it lives; nothing of the past's size is allocated.
    const at::ScalarType compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    std::vector<std::vector<LatentAttentionPage>> pages =
        past.pages.empty() ? PastPages(past.latent, past.rope_key, past.lengths, batch)
                           : past.pages;
    // q~_h = W_uk,h^T q_nope_h lives in the latent space (Dc); with q_rope it scores a cached
    // row [c_kv; k_rope] in one dot product.
    at::Tensor absorbed_query = PerHeadLinear(query_nope, key_up.transpose(1, 2));
    at::Tensor scaled_query =
        (at::cat({absorbed_query, query_rope}, -1) * scale).to(compute).contiguous();
    at::Tensor latent_output = kernels::LatentAttentionOverPages(  // (B, T, H, Dc)
        scaled_query, pages, latent.to(compute).contiguous(), rope_key.to(compute).contiguous());
    // o_h = W_uv,h o~_h.
    head_output = PerHeadLinear(latent_output.to(x.scalar_type()), value_up);
  } else {
    at::Tensor past_latent = past.latent;
    at::Tensor past_rope_key = past.rope_key;
    at::Tensor past_lengths = past.lengths;
    if (!past.pages.empty()) PadPages(past.pages, &past_latent, &past_rope_key, &past_lengths);
    at::Tensor all_latent = latent;
    at::Tensor all_rope_key = rope_key;
    const int64_t past_length = past_latent.defined() ? past_latent.size(1) : 0;
    // A past without a graph, for the blockwise kernel: read in place, no joined copy.
    const bool separate_past = form == LatentAttentionForm::kAbsorbed && past_length > 0 &&
                               !past_lengths.defined() && !past_latent.requires_grad() &&
                               !past_rope_key.requires_grad();
    if (past_length > 0 && !separate_past) {
      // Past tokens come from the cache (possibly stored in lower precision); the new tokens
      // keep their exact values and their graph, so chunked training through this path works.
      all_latent = at::cat({past_latent.to(x.scalar_type()), latent}, 1);
      all_rope_key = at::cat({past_rope_key.to(x.scalar_type()), rope_key}, 1);
    }
    const int64_t keys = past_length + length;
    // Masked where the key is in the query's future or, for ragged rows, is past padding; for
    // the forms that materialise scores.
    const auto future_mask = [&] {
      at::Tensor mask = FutureMask(length, keys, x.device());  // (T, S)
      if (past_lengths.defined() && past_length > 0) {
        at::Tensor key_position =
            at::arange(past_length, at::TensorOptions().device(x.device()));
        at::Tensor padding = key_position.unsqueeze(0) >= past_lengths.unsqueeze(1);  // (B, P)
        padding = at::cat({padding, at::zeros({batch, length}, padding.options())}, 1);
        mask = (mask.unsqueeze(0) | padding.unsqueeze(1)).unsqueeze(1);  // (B, 1, T, S)
      }
      return mask;
    };
    const auto rope_scores = [&] {  // (B, H, T, S), for the forms that materialise scores
      return at::einsum("bthr,bsr->bhts", {query_rope, all_rope_key});
    };
    if (form == LatentAttentionForm::kExplicit) {
      // [k_nope_h; v_h] = (W_ukv c_kv)_h; scores (q_nope . k_nope + q_rope . k_rope) * scale,
      // causal softmax, o_h = sum_s p_s v_s.
      at::Tensor key_nope = at::einsum("bsc,hnc->bhsn", {all_latent, key_up});  // (B,H,S,Dn)
      at::Tensor value = at::einsum("bsc,hvc->bhsv", {all_latent, value_up});   // (B,H,S,Dv)
      at::Tensor scores = at::einsum("bthn,bhsn->bhts", {query_nope, key_nope}) + rope_scores();
      scores = scores * scale;
      scores = scores.masked_fill(future_mask(), -std::numeric_limits<double>::infinity());
      at::Tensor probabilities = at::softmax(scores, -1);
      head_output = at::einsum("bhts,bhsv->bthv", {probabilities, value});
    } else if (!(past_lengths.defined() && past_length > 0)) {
      // Absorbed while autograd records (chunked training through the inference path): the
      // differentiable blockwise kernel, whose memory is one tile of scores, not (T x S).
      at::Tensor absorbed_query = at::einsum("bthn,hnc->bthc", {query_nope, key_up});
      // The kernel computes in fp32 or fp64: a bf16 model's rows enter it widened (casts are
      // free for fp32) and its output returns to the model's dtype.
      const at::ScalarType compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      at::Tensor scaled_query = (at::cat({absorbed_query, query_rope}, -1) * scale).to(compute);
      at::Tensor latent_output =
          separate_past
              ? kernels::LatentAttentionBlockwise(scaled_query, latent.to(compute),
                                                  rope_key.to(compute), past_latent.to(compute),
                                                  past_rope_key.to(compute))
              : kernels::LatentAttentionBlockwise(scaled_query, all_latent.to(compute),
                                                  all_rope_key.to(compute));
      head_output = at::einsum("bthc,hvc->bthv", {latent_output.to(x.scalar_type()), value_up});
    } else {
      // Ragged rows while autograd records (not a training path today), or a padded ragged past
      // off the CPU: materialised scores, masked on the device.
      at::Tensor absorbed_query = at::einsum("bthn,hnc->bhtc", {query_nope, key_up});
      at::Tensor scores =
          at::matmul(absorbed_query, all_latent.unsqueeze(1).transpose(-1, -2));
      scores = (scores + rope_scores()) * scale;
      scores = scores.masked_fill(future_mask(), -std::numeric_limits<double>::infinity());
      at::Tensor probabilities = at::softmax(scores, -1);  // (B, H, T, S)
      at::Tensor latent_output = at::matmul(probabilities, all_latent.unsqueeze(1));
      head_output = at::einsum("bhtc,hvc->bthv", {latent_output, value_up});
    }
  }
  // y = W_o [sigmoid(W_g x) * concat_h o_h]: the gate sits between W_uv and W_o. Without it,
  // y = W_o concat_h o_h.
  at::Tensor heads_output = head_output.reshape({batch, length, heads * c.value_dim});
  if (c.output_gate) heads_output = at::sigmoid(inputs[2]) * heads_output;
  return Linear(heads_output, w.output);
}

}  // namespace

at::Tensor LatentAttentionForward(const LatentAttentionWeights& w, const LatentAttentionConfig& c,
                                  const at::Tensor& x, LatentAttentionCache* cache,
                                  double norm_epsilon, LatentAttentionForm form) {
  at::Tensor past_latent, past_rope_key;
  // While autograd records, earlier chunks' rows are read from the graph-carrying copies (when
  // they reach the cache's end), so chunked training gets the gradients of one whole pass. Rows
  // before graph_begin have none and come from the storage.
  const bool have_graph = cache != nullptr && at::GradMode::is_enabled() &&
                          cache->latent_graph.defined() &&
                          cache->graph_begin + cache->latent_graph.size(1) == cache->length;
  if (have_graph && cache->graph_begin == 0) {
    past_latent = cache->latent_graph;
    past_rope_key = cache->rope_key_graph;
  } else if (have_graph) {
    const int64_t detached = cache->graph_begin;
    past_latent =
        at::cat({cache->latent.narrow(1, 0, detached).to(x.scalar_type()), cache->latent_graph}, 1);
    past_rope_key = at::cat(
        {cache->rope_key.narrow(1, 0, detached).to(x.scalar_type()), cache->rope_key_graph}, 1);
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
      if (have_graph) {
        cache->latent_graph = at::cat({cache->latent_graph, latent}, 1);
        cache->rope_key_graph = at::cat({cache->rope_key_graph, rope_key}, 1);
      } else {
        // Only the new rows: the past has no graph, and a copy of it joined to them would be
        // the past's size again (a chunk after a million detached tokens). A later chunk that
        // records joins them then (above); truncated backpropagation never does.
        cache->latent_graph = latent;
        cache->rope_key_graph = rope_key;
        cache->graph_begin = past_latent.defined() ? past_latent.size(1) : 0;
      }
    } else {
      cache->latent_graph = at::Tensor();
      cache->rope_key_graph = at::Tensor();
      cache->graph_begin = 0;
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
