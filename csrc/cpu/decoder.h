// One pass of a Llama-family decoder (RMSNorm, rotary attention with grouped KV heads, SwiGLU
// MLP) over M tokens, all layers in one OpenMP parallel region: the threads meet at a
// barrier between the steps of a layer (9 per layer) instead of being woken and joined
// around each of the ~25 torch ops a layer takes in eager mode. No torch headers.
//
// Tokens may belong to different sequences (rows) of a batch: token m is at position pos[m]
// of row row[m]; its key and value go to that row's cache slot slot[m], and it attends to the
// row's slots 0..pos[m] - 1 and to its own slot. A row's slots below its tokens' positions
// hold its earlier tokens, so causality needs no mask: a token never reads a slot past its
// own position. A token usually sits in the slot of its position (slot = pos); an alternative
// to a token (a sibling: same position, seeing what that token sees) sits past the chain.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "simd.h"
#include "integer_linear.h"
#include "skinny_linear.h"

namespace specdec {

// y = x W^T with W [out, in] stored as `kind` says: fp32, bf16, int8 with scale [out], or in
// blocks (skinny_linear.h: codes, and scale [out, in / 32, 2] or [out, in / 32]) taken in fp32
// (kQ4_1, kQ8_0: the fp32 matrix they hold) or against x quantised to 8 bits (kQ4_1Integer,
// kQ8_0Integer: integer_linear.h).
struct Linear {
  enum class Kind { kFloat, kBFloat16, kInt8Rows, kQ4_1, kQ8_0, kQ4_1Integer, kQ8_0Integer } kind;
  const void* weight;
  const float* scale;
  int64_t out, in;
  bool integer() const { return kind == Kind::kQ4_1Integer || kind == Kind::kQ8_0Integer; }
};

struct DecoderLayer {
  const float* attn_norm;  // [d]
  Linear qkv;              // [(H + 2 Hkv) hd, d]: the q, k and v projections stacked
  const float* qkv_bias;   // [(H + 2 Hkv) hd] or null
  Linear o;                // [d, H hd]
  const float* mlp_norm;   // [d]
  Linear gate_up;          // [2 I, d]: gate then up
  Linear down;             // [d, I]
};

struct DecoderShape {
  int64_t d, heads, kv_heads, head_dim, inter;
  float eps;
};

// The KV cache of every row: [rows, layers, 2 (key, value), kv_heads, capacity, head_dim] fp32.
struct KVCache {
  float* data;
  int64_t layers, kv_heads, capacity, head_dim;
  float* slot(int64_t row, int64_t layer, int64_t kv, int64_t head, int64_t pos) const {
    return data + ((((row * layers + layer) * 2 + kv) * kv_heads + head) * capacity + pos) * head_dim;
  }
};

// The M tokens of a pass: their rows, positions and cache slots, and the rotary tables cos,
// sin [M, hd].
struct PassTokens {
  int64_t M;
  const int64_t* row;
  const int64_t* pos;
  const int64_t* slot;
  const float* cos;
  const float* sin;
};

// Work buffers of a pass (fp32, row-major): h [M, d], qkv [M, (H + 2 Hkv) hd], attn [M, H hd],
// gate_up [M, 2 I], act [M, I], tmp [M, d]; for the integer kinds, room to quantise a linear's
// input (codes: M max(d, H hd, I) int8; code_scales: QuantizedRows::floats of that), else null.
struct DecoderScratch {
  float *h, *qkv, *attn, *gate_up, *act, *tmp;
  int8_t* codes;
  float* code_scales;
};

constexpr int64_t kLinearChunk = 16;  // output rows per work item

// Columns [n0, n1) of y [M, out] = x [M, in] L^T (xq: x quantised, for the integer kinds).
inline void linear_columns(const float* x, const QuantizedRows& xq, int64_t M, const Linear& L, float* y, int64_t n0, int64_t n1) {
  switch (L.kind) {
    case Linear::Kind::kFloat:
      return skinny_linear(x, M, static_cast<const float*>(L.weight), nullptr, y, L.in, L.out, n0, n1);
    case Linear::Kind::kBFloat16:
      return skinny_linear(x, M, static_cast<const BFloat16*>(L.weight), nullptr, y, L.in, L.out, n0, n1);
    case Linear::Kind::kInt8Rows:
      return skinny_linear(x, M, static_cast<const int8_t*>(L.weight), L.scale, y, L.in, L.out, n0, n1);
    case Linear::Kind::kQ4_1:
      return skinny_linear_blocks<BlockFormat::kQ4_1>(x, M, L.weight, L.scale, y, L.in, L.out, n0, n1);
    case Linear::Kind::kQ8_0:
      return skinny_linear_blocks<BlockFormat::kQ8_0>(x, M, L.weight, L.scale, y, L.in, L.out, n0, n1);
    case Linear::Kind::kQ4_1Integer:
      return integer_linear_blocks<BlockFormat::kQ4_1>(xq, M, L.weight, L.scale, y, L.in, L.out, n0, n1);
    case Linear::Kind::kQ8_0Integer:
      return integer_linear_blocks<BlockFormat::kQ8_0>(xq, M, L.weight, L.scale, y, L.in, L.out, n0, n1);
  }
}

// y [M, out] = x [M, in] L^T, output rows split across the team (call inside a parallel
// region); after(n0, n1) runs on each chunk of output columns once it is done. The integer kinds
// first quantise x's rows into buf's codes and code_scales.
template <typename After>
void linear_for(const float* x, int64_t M, const Linear& L, float* y, const DecoderScratch& buf, After after) {
  const QuantizedRows codes{buf.codes, buf.code_scales, M, L.in / kBlock};
  if (L.integer()) {
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) quantize_row(x + m * L.in, m, codes);
  }
  const int64_t chunks = (L.out + kLinearChunk - 1) / kLinearChunk;
#pragma omp for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t n0 = c * kLinearChunk, n1 = std::min(L.out, n0 + kLinearChunk);
    linear_columns(x, codes, M, L, y, n0, n1);
    after(n0, n1);
  }
}

// out [M, d] = RMSNorm(x) * weight, rows split across the team.
inline void rms_norm_for(const float* x, const float* weight, float* out, int64_t M, int64_t d, float eps) {
#pragma omp for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * d;
    float sum = 0.0f;
    for (int64_t i = 0; i < d; ++i) sum += xm[i] * xm[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) out[m * d + i] = weight[i] * (xm[i] * inv);
  }
}

// x [hd] rotated in place: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1).
inline void rotate(float* x, const float* cos, const float* sin, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  vfloat acc{};
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) acc = fma(load(a + i), load(b + i), acc);
  float s = reduce_add(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// scores[j] = dot(q, keys + seen(j) hd) * scale for j < n. With AVX-512, 16 keys at a time:
// each key's products summed as dot sums them, the 16 sums reduced at once (reduce_add16,
// the same additions), so the scores are dot's to the bit, whatever n.
template <typename Seen>
inline void attention_scores(const float* q, const float* keys, int64_t hd, int64_t n, float scale, Seen seen,
                             float* scores) {
  int64_t j = 0;
#if defined(__AVX512F__)
  if (hd % kWidth == 0)
    for (; j + 16 <= n; j += 16) {
      vfloat acc[16];
      for (int l = 0; l < 16; ++l) {
        const float* key = keys + seen(j + l) * hd;
        vfloat a{};
        for (int64_t i = 0; i < hd; i += kWidth) a = fma(load(q + i), load(key + i), a);
        acc[reduce16_slot(l)] = a;
      }
      store(scores + j, reduce_add16(acc) * scale);
    }
#endif
  for (; j < n; ++j) scores[j] = dot(q, keys + seen(j) * hd, hd) * scale;
}

// scores[0, n) = exp(scores - max) in place (vectorised); returns their sum. The buffer has
// room for n rounded up to kWidth.
inline float softmax_numerators(float* scores, int64_t n) {
  vfloat top = splat(-INFINITY);
  int64_t j = 0;
  for (; j + kWidth <= n; j += kWidth) top = vmax(top, load(scores + j));
  float m = reduce_max(top);
  for (; j < n; ++j) m = std::max(m, scores[j]);
  vfloat total{};
  for (j = 0; j < n; j += kWidth) {
    const int64_t lanes = std::min<int64_t>(kWidth, n - j);
    const vfloat z = lanes == kWidth ? load(scores + j) : load_partial(scores + j, lanes, -INFINITY);
    const vfloat e = exp_nonpositive(z - m);  // 0 in the lanes past n
    if (lanes == kWidth)
      store(scores + j, e);
    else
      store_partial(scores + j, e, lanes);
    total += e;
  }
  return reduce_add(total);
}

// out[i] for i in [i0, ...) in groups of C vectors of dimensions (C chains of FMAs in flight),
// as far as whole groups reach; returns where they stop. See attention_values.
template <int C, typename Seen>
inline int64_t value_chains(const float* scores, const float* values, int64_t hd, int64_t n, float total, Seen seen,
                            float* out, int64_t i0) {
  int64_t i = i0;
  for (; i + C * kWidth <= hd; i += C * kWidth) {
    vfloat acc[C] = {};
    for (int64_t j = 0; j < n; ++j) {
      const vfloat p = splat(scores[j]);
      const float* v = values + seen(j) * hd + i;
      for (int c = 0; c < C; ++c) acc[c] = fma(p, load(v + c * kWidth), acc[c]);
    }
    for (int c = 0; c < C; ++c) store(out + i + c * kWidth, acc[c] / total);
  }
  return i;
}

// out[i] = sum_j scores[j] values[seen(j) hd + i] / total for i < hd, each sum taken in order of
// j by FMA: four vectors of dimensions at a time (four chains in flight, not one), then one,
// then the lanes past the last whole vector.
template <typename Seen>
inline void attention_values(const float* scores, const float* values, int64_t hd, int64_t n, float total, Seen seen,
                             float* out) {
  int64_t i = value_chains<4>(scores, values, hd, n, total, seen, out, 0);
  i = value_chains<1>(scores, values, hd, n, total, seen, out, i);
  for (; i < hd; ++i) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += scores[j] * values[seen(j) * hd + i];
    out[i] = acc / total;
  }
}

// silu(g) = g sigmoid(g), sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) below, e = exp(-|g|) <= 1
// (exp_nonpositive's range), per lane.
inline vfloat silu(vfloat g) {
  const vfloat e = exp_nonpositive(g < 0 ? g : -g);
  return g * ((g < 0 ? e : splat(1.0f)) / (1.0f + e));
}

constexpr int64_t kElementChunk = 256;  // elements per work item of elementwise steps

// act [M, I] = silu(gate) * up from gate_up [M, 2 I] (gate then up), chunks of each row split
// across the team (a one-token pass's row alone would keep one thread busy).
inline void swiglu_for(const float* gate_up, float* act, int64_t M, int64_t I) {
  const int64_t chunks = (I + kElementChunk - 1) / kElementChunk;
#pragma omp for schedule(static)
  for (int64_t c = 0; c < M * chunks; ++c) {
    const int64_t m = c / chunks, i0 = c % chunks * kElementChunk, i1 = std::min(I, i0 + kElementChunk);
    const float *gate = gate_up + m * 2 * I, *up = gate + I;
    int64_t i = i0;
    for (; i + kWidth <= i1; i += kWidth) store(act + m * I + i, silu(load(gate + i)) * load(up + i));
    if (i < i1) store_partial(act + m * I + i, silu(load_partial(gate + i, i1 - i, 0.0f)) * load_partial(up + i, i1 - i, 0.0f), i1 - i);
  }
}

// Bias, rotary embedding of q and k, and the keys and values written to the cache.
inline void rope_and_cache_for(float* qkv, const float* bias, const PassTokens& t, const DecoderShape& s,
                               const KVCache& cache, int64_t layer) {
  const int64_t hd = s.head_dim, width = (s.heads + 2 * s.kv_heads) * hd;
#pragma omp for schedule(static)
  for (int64_t m = 0; m < t.M; ++m) {
    float* row = qkv + m * width;
    if (bias)
      for (int64_t i = 0; i < width; ++i) row[i] += bias[i];
    const float *cos = t.cos + m * hd, *sin = t.sin + m * hd;
    for (int64_t h = 0; h < s.heads + s.kv_heads; ++h) rotate(row + h * hd, cos, sin, hd);
    for (int64_t h = 0; h < s.kv_heads; ++h) {
      std::copy_n(row + (s.heads + h) * hd, hd, cache.slot(t.row[m], layer, 0, h, t.slot[m]));
      std::copy_n(row + (s.heads + s.kv_heads + h) * hd, hd, cache.slot(t.row[m], layer, 1, h, t.slot[m]));
    }
  }
}

// attn [M, H hd]: each (token, query head) attends to its row's cached slots 0..pos - 1 and its own.
inline void attention_for(const float* qkv, float* attn, const PassTokens& t, const DecoderShape& s,
                          const KVCache& cache, int64_t layer) {
  const int64_t hd = s.head_dim, width = (s.heads + 2 * s.kv_heads) * hd, group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  thread_local std::vector<float> scores;
#pragma omp for schedule(static)
  for (int64_t item = 0; item < t.M * s.heads; ++item) {
    const int64_t m = item / s.heads, h = item % s.heads, n = t.pos[m] + 1;
    const float* q = qkv + m * width + h * hd;
    const float* keys = cache.slot(t.row[m], layer, 0, h / group, 0);
    const float* values = cache.slot(t.row[m], layer, 1, h / group, 0);
    const auto seen = [&](int64_t j) { return j + 1 < n ? j : t.slot[m]; };  // the j-th slot it attends to
    if (static_cast<int64_t>(scores.size()) < n + kWidth) scores.resize(n + kWidth);
    attention_scores(q, keys, hd, n, scale, seen, scores.data());
    const float total = softmax_numerators(scores.data(), n);
    attention_values(scores.data(), values, hd, n, total, seen, attn + m * s.heads * hd + h * hd);
  }
}

// The pass: x [M, d] (the tokens' embeddings) goes through every layer in place, then the
// final norm writes hidden [M, d]; logits [R, V] = hidden[logit_rows] head^T. Keys and values
// of the M tokens are written to the cache.
inline void decoder_pass(float* x, const std::vector<DecoderLayer>& layers, const float* final_norm, const Linear& head,
                  const DecoderShape& s, const PassTokens& t, const KVCache& cache, const DecoderScratch& buf,
                  float* hidden, const int64_t* logit_rows, int64_t R, float* head_input, float* logits, int threads) {
  const int64_t M = t.M, d = s.d, I = s.inter;
#pragma omp parallel num_threads(threads)
  {
    for (int64_t l = 0; l < static_cast<int64_t>(layers.size()); ++l) {
      const DecoderLayer& L = layers[l];
      rms_norm_for(x, L.attn_norm, buf.h, M, d, s.eps);
      linear_for(buf.h, M, L.qkv, buf.qkv, buf, [](int64_t, int64_t) {});
      rope_and_cache_for(buf.qkv, L.qkv_bias, t, s, cache, l);
      attention_for(buf.qkv, buf.attn, t, s, cache, l);
      const auto add_to_x = [&](int64_t n0, int64_t n1) {
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = n0; n < n1; ++n) x[m * d + n] += buf.tmp[m * d + n];
      };
      linear_for(buf.attn, M, L.o, buf.tmp, buf, add_to_x);
      rms_norm_for(x, L.mlp_norm, buf.h, M, d, s.eps);
      linear_for(buf.h, M, L.gate_up, buf.gate_up, buf, [](int64_t, int64_t) {});
      swiglu_for(buf.gate_up, buf.act, M, I);
      linear_for(buf.act, M, L.down, buf.tmp, buf, add_to_x);
    }
    rms_norm_for(x, final_norm, hidden, M, d, s.eps);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) std::copy_n(hidden + logit_rows[r] * d, d, head_input + r * d);
    linear_for(head_input, R, head, logits, buf, [](int64_t, int64_t) {});
  }
}

}  // namespace specdec
