#include "common/kernels/latent_attention_prefill.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/kernels/cpu_features.h"

namespace strider::kernels::internal {
namespace {

// Why fused: with Dc 16 and Dr 8 (`tiny`) a score costs 24 multiply-adds and its share of the
// weighted latent 16 more, while the softmax around it (maximum, exponential, sum, rescaling)
// is about as many instructions again. As separate matrix products and ATen operations each
// step wrote and re-read a 2,048 x 512 tile of scores (4 MB, out of L2) and allocated it
// afresh; here a block of keys is packed once into the thread's scratch, and four query rows at
// a time take it through scores, softmax and weighted latent while the scores (4 x 256 floats)
// stay in L1.
//
// Per query row the running maximum m, sum l and weighted latent acc (Dc) are updated block by
// block: m' = max(m, max_j s_j); l' = l e^(m - m') + sum_j e^(s_j - m'); acc likewise.

constexpr int64_t kBlockKeys = 256;  // keys packed and scored together
constexpr int64_t kPanelKeys = 16;   // keys per register tile (two 8-lane vectors)
constexpr int kMicroRows = 4;        // query rows per register tile
constexpr int64_t kItemRows = 256;   // query rows (tokens x heads) per unit of thread work
constexpr int64_t kMinItemRows = 8;  // ... when there are few

constexpr float kLog2E = 1.44269504088896341f;
constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

int64_t RoundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

template <typename Storage>
inline float Widen(Storage value) {
  return static_cast<float>(value);
}
template <>
inline float Widen<uint16_t>(uint16_t value) {  // bfloat16: the high half of a float32
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float result;
  std::memcpy(&result, &bits, sizeof(result));
  return result;
}

// Keys [k0, k0 + count) of a page, packed for the register tiles:
//   panels: the keys in panels of kPanelKeys, each panel (W, kPanelKeys) so that a tile reads
//           one contiguous 64-byte row per shared dimension; keys past `count` are zero;
//   values: (count, Dc), the latent rows as float32.
template <typename Storage>
void PackTyped(const KeyPageView& page, int64_t k0, int64_t count, int64_t latent_rank,
               int64_t rope_dim, float* panels, float* values) {
  const int64_t width = latent_rank + rope_dim;
  const Storage* latent = static_cast<const Storage*>(page.latent);
  const Storage* rope = static_cast<const Storage*>(page.rope_key);
  const int64_t padded = RoundUp(count, kPanelKeys);
  for (int64_t j = 0; j < padded; ++j) {
    float* column = panels + (j / kPanelKeys) * width * kPanelKeys + (j % kPanelKeys);
    if (j >= count) {
      for (int64_t c = 0; c < width; ++c) column[c * kPanelKeys] = 0.0f;
      continue;
    }
    const Storage* l = latent + (k0 + j) * page.latent_stride;
    const Storage* r = rope + (k0 + j) * page.rope_stride;
    float* value = values + j * latent_rank;
    for (int64_t c = 0; c < latent_rank; ++c) {
      const float x = Widen(l[c]);
      value[c] = x;
      column[c * kPanelKeys] = x;
    }
    for (int64_t c = 0; c < rope_dim; ++c) {
      column[(latent_rank + c) * kPanelKeys] = Widen(r[c]);
    }
  }
}

void Pack(const KeyPageView& page, int64_t k0, int64_t count, int64_t latent_rank, int64_t rope_dim,
          float* panels, float* values) {
  switch (page.storage) {
    case KeyStorage::kFloat:
      return PackTyped<float>(page, k0, count, latent_rank, rope_dim, panels, values);
    case KeyStorage::kDouble:
      return PackTyped<double>(page, k0, count, latent_rank, rope_dim, panels, values);
    case KeyStorage::kBFloat16:
      return PackTyped<uint16_t>(page, k0, count, latent_rank, rope_dim, panels, values);
  }
}

#pragma GCC push_options
#pragma GCC optimize("O3")

// 2^x for x <= 0, 8 lanes: Cephes' exp2f (x = n + r with n the nearest integer, 2^r by a
// degree-6 polynomial on [-0.5, 0.5], 2^n built in the exponent bits), within 2e-7 of the value.
// Arguments below -126 (where 2^x leaves the normal floats), -inf among them, give 2^-126 times
// at most 1: the caller writes the zeros of masked keys itself.
__attribute__((target("avx2,fma"))) inline __m256 Exp2NonPositive(__m256 x) {
  // Adding 1.5 * 2^23 rounds to an integer in the low mantissa bits; the extra 127 is the
  // exponent's bias, so shifting those bits into the exponent field gives 2^n.
  const __m256 shifter = _mm256_set1_ps(12582912.0f + 127.0f);
  x = _mm256_max_ps(x, _mm256_set1_ps(-126.0f));
  const __m256 t = _mm256_add_ps(x, shifter);
  const __m256 r = _mm256_sub_ps(x, _mm256_sub_ps(t, shifter));
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i power = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(power));
}

__attribute__((target("avx2,fma"))) inline float MaxLanes(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

__attribute__((target("avx2,fma"))) inline float SumLanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Adds q[r][c0 .. c1) . key[c0 .. c1) for the 16 keys of one panel to sum[r] (zero when
// `first`), for Rows query rows.
template <int Rows>
__attribute__((target("avx2,fma"))) inline void ScorePart(const float* q, int64_t width,
                                                          const float* panel, int64_t c0,
                                                          int64_t c1, __m256 (*sum)[2]) {
  __m256 acc[Rows][2];
  for (int r = 0; r < Rows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t c = c0; c < c1; ++c) {
    const __m256 k0 = _mm256_loadu_ps(panel + c * kPanelKeys);
    const __m256 k1 = _mm256_loadu_ps(panel + c * kPanelKeys + 8);
    for (int r = 0; r < Rows; ++r) {
      const __m256 qc = _mm256_broadcast_ss(q + r * width + c);
      acc[r][0] = _mm256_fmadd_ps(qc, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(qc, k1, acc[r][1]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    sum[r][0] = acc[r][0];
    sum[r][1] = acc[r][1];
  }
}

// scores[r][j] = q[r] . key j for Rows query rows (stride `width`) and the first `keys`
// (a multiple of kPanelKeys) packed keys; row_max[r] = max_j scores[r][j]. Each score is two
// chains of multiply-adds over the halves of the shared dimension, then their sum: one chain
// over all 24 (`tiny`) rounded the scores twice as far from the fp64 reference as the BLAS
// did, and that was most of the kernel's error.
template <int Rows>
__attribute__((target("avx2,fma"))) void ScoreTile(const float* q, int64_t width,
                                                   const float* panels, int64_t keys, float* scores,
                                                   int64_t scores_stride, float* row_max) {
  const int64_t half = width / 2;
  __m256 top[Rows];
  for (int r = 0; r < Rows; ++r) top[r] = _mm256_set1_ps(kNegativeInfinity);
  for (int64_t j = 0; j < keys; j += kPanelKeys) {
    const float* panel = panels + (j / kPanelKeys) * width * kPanelKeys;
    __m256 first[Rows][2];
    ScorePart<Rows>(q, width, panel, 0, half, first);
    for (int r = 0; r < Rows; ++r) {
      _mm256_storeu_ps(scores + r * scores_stride + j, first[r][0]);
      _mm256_storeu_ps(scores + r * scores_stride + j + 8, first[r][1]);
    }
    __m256 second[Rows][2];
    ScorePart<Rows>(q, width, panel, half, width, second);
    for (int r = 0; r < Rows; ++r) {
      float* s = scores + r * scores_stride + j;
      const __m256 s0 = _mm256_add_ps(_mm256_loadu_ps(s), second[r][0]);
      const __m256 s1 = _mm256_add_ps(_mm256_loadu_ps(s + 8), second[r][1]);
      _mm256_storeu_ps(s, s0);
      _mm256_storeu_ps(s + 8, s1);
      top[r] = _mm256_max_ps(top[r], _mm256_max_ps(s0, s1));
    }
  }
  for (int r = 0; r < Rows; ++r) row_max[r] = MaxLanes(top[r]);
}

// acc[r][column .. column + 8 Vecs) = acc[r][...] * correction[r] + sum_j p[r][j] values[j][...]
// over `keys` keys, for Rows rows.
template <int Rows, int Vecs>  // Vecs 1 or 2
__attribute__((target("avx2,fma"))) void WeightTile(const float* p, int64_t p_stride,
                                                    const float* values, int64_t latent_rank,
                                                    int64_t keys, const float* correction,
                                                    float* acc, int64_t column) {
  // Zero-initialised accumulators (GCC keeps them in registers; started from `acc` it spilled
  // them to the stack on every key), merged into `acc` after the loop.
  __m256 sum[Rows][Vecs];
  for (int r = 0; r < Rows; ++r) {
    for (int v = 0; v < Vecs; ++v) sum[r][v] = _mm256_setzero_ps();
  }
  const float* value = values + column;
  for (int64_t j = 0; j < keys; ++j) {
    const __m256 x0 = _mm256_loadu_ps(value + j * latent_rank);
    const __m256 x1 = Vecs > 1 ? _mm256_loadu_ps(value + j * latent_rank + 8) : x0;
    for (int r = 0; r < Rows; ++r) {
      const __m256 weight = _mm256_broadcast_ss(p + r * p_stride + j);
      sum[r][0] = _mm256_fmadd_ps(weight, x0, sum[r][0]);
      if (Vecs > 1) sum[r][Vecs - 1] = _mm256_fmadd_ps(weight, x1, sum[r][Vecs - 1]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    const __m256 c = _mm256_broadcast_ss(correction + r);
    for (int v = 0; v < Vecs; ++v) {
      float* a = acc + r * latent_rank + column + 8 * v;
      _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_loadu_ps(a), c, sum[r][v]));
    }
  }
}

template <int Rows>
__attribute__((target("avx2,fma"))) void WeightRows(const float* p, int64_t p_stride,
                                                    const float* values, int64_t latent_rank,
                                                    int64_t keys, const float* correction,
                                                    float* acc) {
  int64_t column = 0;
  for (; column + 16 <= latent_rank; column += 16) {
    WeightTile<Rows, 2>(p, p_stride, values, latent_rank, keys, correction, acc, column);
  }
  if (column < latent_rank) {
    WeightTile<Rows, 1>(p, p_stride, values, latent_rank, keys, correction, acc, column);
  }
}

// The online-softmax step for one query row over `keys` scores (a multiple of 8), the first
// `visible` of them seen: rescales the running sum, leaves e^(s - m') in `scores` (zero past
// `visible`), and returns the factor e^(m - m') by which the row's weighted latent is rescaled.
// e^x is taken as 2^(x log2 e) of the difference x = s - m', so the product's rounding is
// relative to the difference rather than to the score, and a common offset of the scores costs
// no accuracy.
__attribute__((target("avx2,fma"))) float SoftmaxRow(float* scores, int64_t keys, int64_t visible,
                                                     float all_max, float* running_max,
                                                     float* running_sum) {
  float block_max = all_max;  // the maximum over all `keys`, right when all are visible
  if (visible < keys) {
    for (int64_t j = visible; j < keys; ++j) scores[j] = kNegativeInfinity;
    __m256 top = _mm256_set1_ps(kNegativeInfinity);
    for (int64_t j = 0; j < keys; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(scores + j));
    block_max = MaxLanes(top);
  }
  const float new_max = std::max(*running_max, block_max);
  if (new_max == kNegativeInfinity) {  // nothing seen yet: the row's weights stay zero
    std::fill(scores, scores + keys, 0.0f);
    return 1.0f;
  }
  // 0 from -inf; the maximum settles after the first blocks, and then no exponential is needed.
  const float correction = new_max == *running_max ? 1.0f : std::exp(*running_max - new_max);
  const __m256 shift = _mm256_set1_ps(new_max);
  const __m256 log2e = _mm256_set1_ps(kLog2E);
  __m256 sum = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= visible; j += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(scores + j), shift), log2e);
    const __m256 p = Exp2NonPositive(x);
    _mm256_storeu_ps(scores + j, p);
    sum = _mm256_add_ps(sum, p);
  }
  if (j < keys) {  // the last vector with masked keys, then the masked vectors
    alignas(32) float p[8];
    const __m256 x = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(scores + j), shift), log2e);
    _mm256_store_ps(p, Exp2NonPositive(x));
    for (int64_t i = 0; i < 8; ++i) p[i] = j + i < visible ? p[i] : 0.0f;
    const __m256 lanes = _mm256_load_ps(p);
    _mm256_storeu_ps(scores + j, lanes);
    sum = _mm256_add_ps(sum, lanes);
    std::fill(scores + j + 8, scores + keys, 0.0f);
  }
  *running_sum = *running_sum * correction + SumLanes(sum);
  *running_max = new_max;
  return correction;
}

// One register tile of Rows query rows through a packed block: scores, softmax, weighted latent.
template <int Rows>
__attribute__((target("avx2,fma"))) void RowsThroughBlock(const float* q, int64_t width,
                                                          int64_t latent_rank, const float* panels,
                                                          const float* values,
                                                          const int64_t* visible, float* scores,
                                                          int64_t scores_stride, float* running_max,
                                                          float* running_sum, float* acc) {
  int64_t most = 0;
  for (int r = 0; r < Rows; ++r) most = std::max(most, visible[r]);
  if (most == 0) return;
  const int64_t keys = RoundUp(most, kPanelKeys);
  float row_max[Rows];
  ScoreTile<Rows>(q, width, panels, keys, scores, scores_stride, row_max);
  float correction[Rows];
  for (int r = 0; r < Rows; ++r) {
    correction[r] = SoftmaxRow(scores + r * scores_stride, keys, visible[r], row_max[r],
                               running_max + r, running_sum + r);
  }
  WeightRows<Rows>(scores, scores_stride, values, latent_rank, most, correction, acc);
}

// RowsThroughBlock for 1 <= rows <= kMicroRows.
template <int Rows = kMicroRows>
void RowsThroughBlockAnyRows(int64_t rows, const float* q, int64_t width, int64_t latent_rank,
                             const float* panels, const float* values, const int64_t* visible,
                             float* scores, int64_t scores_stride, float* running_max,
                             float* running_sum, float* acc) {
  if constexpr (Rows > 1) {
    if (rows < Rows) {
      return RowsThroughBlockAnyRows<Rows - 1>(rows, q, width, latent_rank, panels, values, visible,
                                               scores, scores_stride, running_max, running_sum,
                                               acc);
    }
  }
  RowsThroughBlock<Rows>(q, width, latent_rank, panels, values, visible, scores, scores_stride,
                         running_max, running_sum, acc);
}

#pragma GCC pop_options

// A thread's scratch, allocated once per call.
struct Scratch {
  std::vector<float> panels, values, scores, max, sum, acc;
  std::vector<int64_t> visible;
};

// Query rows of tokens [t0, t1) of batch row b, against every key they see.
void RunItem(const FusedPrefillProblem& p, int64_t b, int64_t t0, int64_t t1, Scratch* s) {
  const int64_t heads = p.heads;
  const int64_t latent_rank = p.latent_rank;
  const int64_t width = p.latent_rank + p.rope_dim;
  const int64_t rows = (t1 - t0) * heads;
  const float* q = p.query + (b * p.tokens + t0) * heads * width;
  s->max.assign(rows, kNegativeInfinity);
  s->sum.assign(rows, 0.0f);
  s->acc.assign(rows * latent_rank, 0.0f);
  const int64_t scores_stride = RoundUp(kBlockKeys, kPanelKeys);

  // Keys [k0, k0 + count) of `page`; new-token keys when `causal` (key k0 + j is seen by the
  // tokens t >= k0 + j).
  auto block = [&](const KeyPageView& page, int64_t k0, int64_t count, bool causal) {
    Pack(page, k0, count, latent_rank, p.rope_dim, s->panels.data(), s->values.data());
    for (int64_t row = 0; row < rows; row += kMicroRows) {
      const int64_t n = std::min<int64_t>(kMicroRows, rows - row);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t token = t0 + (row + r) / heads;
        s->visible[r] = causal ? std::clamp<int64_t>(token - k0 + 1, 0, count) : count;
      }
      const float* q_rows = q + row * width;
      float* m = s->max.data() + row;
      float* l = s->sum.data() + row;
      float* a = s->acc.data() + row * latent_rank;
      RowsThroughBlockAnyRows(n, q_rows, width, latent_rank, s->panels.data(), s->values.data(),
                              s->visible.data(), s->scores.data(), scores_stride, m, l, a);
    }
  };

  for (const KeyPageView& page : (*p.pages)[b]) {
    for (int64_t k0 = 0; k0 < page.rows; k0 += kBlockKeys) {
      block(page, k0, std::min(kBlockKeys, page.rows - k0), false);
    }
  }
  const KeyPageView own = {p.new_latent + b * p.tokens * latent_rank,
                           p.new_rope_key + b * p.tokens * p.rope_dim,
                           p.tokens,
                           latent_rank,
                           p.rope_dim,
                           KeyStorage::kFloat};
  for (int64_t k0 = 0; k0 < t1; k0 += kBlockKeys) {
    const int64_t count = std::min(kBlockKeys, t1 - k0);
    block(own, k0, count, k0 + count - 1 > t0);
  }

  float* out = p.out + (b * p.tokens + t0) * heads * latent_rank;
  for (int64_t i = 0; i < rows; ++i) {
    const float inverse = 1.0f / s->sum[i];
    for (int64_t c = 0; c < latent_rank; ++c) {
      out[i * latent_rank + c] = s->acc[i * latent_rank + c] * inverse;
    }
  }
}

}  // namespace

bool CanRunFusedPrefill(int64_t latent_rank) {
  return CpuHasAvx2WithFma() && latent_rank > 0 && latent_rank % 8 == 0;
}

void RunFusedPrefill(const FusedPrefillProblem& p) {
  const int64_t width = p.latent_rank + p.rope_dim;
  // Runs of tokens of up to kItemRows query rows; fewer when there are few tokens, so that every
  // thread gets several (each run reads the whole past, so runs stay at kMinItemRows or more).
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const int64_t item_tokens = std::clamp<int64_t>((p.tokens + 4 * threads - 1) / (4 * threads),
                                                  (kMinItemRows + p.heads - 1) / p.heads,
                                                  std::max<int64_t>(1, kItemRows / p.heads));
  struct Item {
    int64_t b, t0, t1, cost;
  };
  std::vector<Item> items;
  for (int64_t b = 0; b < p.batch; ++b) {
    int64_t past = 0;
    for (const KeyPageView& page : (*p.pages)[b]) past += page.rows;
    for (int64_t t0 = 0; t0 < p.tokens; t0 += item_tokens) {
      const int64_t t1 = std::min(p.tokens, t0 + item_tokens);
      items.push_back({b, t0, t1, (t1 - t0) * (past + t1)});
    }
  }
  // The costliest first, so the threads finish together.
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& x, const Item& y) { return x.cost > y.cost; });
  std::atomic<int64_t> next{0};
  auto worker = [&]() {
    Scratch s;
    const int64_t padded = RoundUp(kBlockKeys, kPanelKeys);
    s.panels.resize(padded * width);
    s.values.resize(kBlockKeys * p.latent_rank);
    s.scores.resize(kMicroRows * padded);
    s.visible.resize(kMicroRows);
    s.max.reserve(item_tokens * p.heads);
    s.sum.reserve(item_tokens * p.heads);
    s.acc.reserve(item_tokens * p.heads * p.latent_rank);
    for (int64_t i = next++; i < static_cast<int64_t>(items.size()); i = next++) {
      RunItem(p, items[i].b, items[i].t0, items[i].t1, &s);
    }
  };
  if (threads <= 1 || items.size() <= 1) {
    worker();
  } else {
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) worker();
    });
  }
}

}  // namespace strider::kernels::internal
