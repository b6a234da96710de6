// Verification kernels for the CPU on raw pointers; no torch headers.
//
// The math is specdec_fast/sampling.py and specdec_fast/reference/verify.py. A row's warped
// distribution is never materialised while it is tested: RowDist keeps the numbers that
// define it (max, normaliser, kept-set threshold) and p(x) is computed from them. A row is
// read from memory once, in L1-sized chunks: each chunk's scaled logits z, its max m_c and
// e = exp(z - m_c) go to per-thread scratch, so the stop row's residual needs no second exp.
// Every function works on one row of V entries; ops.cpp parallelises over rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>

#include "../verify_status.h"
#include "simd.h"

namespace specdec {

constexpr float kResidualEps = 1e-6f;  // reference/verify.py RESIDUAL_EPS
constexpr int64_t kChunk = 2048;       // elements per chunk: 8 KB of fp32, stays in L1
constexpr int64_t kFlush = 16;         // vectors summed in fp32 before adding into double
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

struct Sampling {
  float temperature;  // 0 = greedy
  int64_t top_k;      // <= 0 or >= V: off
  float top_p;        // >= 1: off
};

inline int64_t num_chunks(int64_t V) { return (V + kChunk - 1) / kChunk; }
inline int64_t padded(int64_t n) { return (n + kWidth - 1) / kWidth * kWidth; }

// A key that orders floats as integers: a < b iff key(a) < key(b) (no NaN reaches here).
inline uint32_t order_key(float z) {
  uint32_t bits;
  std::memcpy(&bits, &z, sizeof bits);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// Per-thread scratch for rows of up to V entries (padded to whole vectors), kept between calls.
struct Scratch {
  int64_t capacity = 0;
  std::unique_ptr<float[]> z;           // [V] scaled logits, -inf in the padding
  std::unique_ptr<float[]> e;           // [V] exp(z - m_c) of the kept entries, 0 elsewhere
  std::unique_ptr<float[]> w;           // [V] sampling weights
  std::unique_ptr<double[]> p64;        // [V] top-p only: probabilities in double
  std::unique_ptr<uint32_t[]> keys;     // [V] top-k/top-p only: order keys of z
  std::unique_ptr<float[]> chunk_max;   // [chunks] m_c
  std::unique_ptr<double[]> chunk_sum;  // [chunks] per-chunk sums (of e, then of the weights)
  std::unique_ptr<bool[]> chunk_bad;    // [chunks] the chunk holds NaN or +inf
  void reserve(int64_t V) {
    if (V <= capacity) return;
    const int64_t n = padded(V), chunks = num_chunks(V);
    z.reset(new float[n]), e.reset(new float[n]), w.reset(new float[n]);
    p64.reset(new double[n]), keys.reset(new uint32_t[n]);
    chunk_max.reset(new float[chunks]), chunk_sum.reset(new double[chunks]), chunk_bad.reset(new bool[chunks]);
    capacity = V;
  }
};

inline Scratch& thread_scratch(int64_t V) {
  thread_local Scratch s;
  s.reserve(V);
  return s;
}

// z[i] = logits[i] / t for i < n (as the reference divides), -inf up to the next whole vector.
template <typename T>
void scale_chunk(const T* logits, int64_t n, float t, float* z) {
  if (t == 1.0f) {
    for (int64_t i = 0; i < n; ++i) z[i] = to_float(logits[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) z[i] = to_float(logits[i]) / t;
  }
  for (int64_t i = n; i < padded(n); ++i) z[i] = kNegInf;
}

inline float max_of(const float* z, int64_t n) {  // n: a multiple of kWidth
  vfloat m = splat(kNegInf);
  for (int64_t i = 0; i < n; i += kWidth) m = vmax(m, load(z + i));
  return reduce_max(m);
}

// The max of z[0..n) (n a multiple of kWidth) and, in *bad, whether z holds NaN or +inf (then
// the max is meaningless): one read, one compare per vector besides the max.
inline float checked_max_of(const float* z, int64_t n, bool* bad) {
  vfloat m0 = splat(kNegInf), m1 = m0;  // two chains: vmax's latency, not its throughput, bounds one
  vint flags = {};
  int64_t i = 0;
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
    const vfloat v0 = load(z + i), v1 = load(z + i + kWidth);
    flags |= ~(v0 < kPosInf) | ~(v1 < kPosInf);
    m0 = vmax(m0, v0);
    m1 = vmax(m1, v1);
  }
  if (i < n) {
    const vfloat v = load(z + i);
    flags |= ~(v < kPosInf);
    m0 = vmax(m0, v);
  }
  *bad = false;
  for (int l = 0; l < kWidth; ++l) *bad |= flags[l] != 0;
  return reduce_max(vmax(m0, m1));
}

// The status of a row of n values that holds NaN or +inf: NaN wins.
inline Status nan_or_inf(const float* z, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(z[i])) return kNaN;
  return kPosInfinity;
}

// e[i] = exp(z[i] - m) for i < n (a multiple of kWidth); returns their sum (fp32 partial
// sums of kFlush vectors, added in double: the normaliser scales every probability).
// `ahead`: the input of the chunk read next, `ahead_step` bytes of it fetched into L1 per
// vector computed, so that the next chunk's first read does not wait on memory (a prefetch
// never faults: ahead may run past the tensor's end).
inline double exp_and_sum(const float* z, int64_t n, float m, float* e, const char* ahead = nullptr,
                          int64_t ahead_step = 0) {
  vdouble total = {};
  int64_t i = 0;
  for (; i + 2 * kWidth <= n;) {  // two vectors per step: two independent exp chains
    vfloat part0 = {}, part1 = {};
    for (int64_t end = std::min(n, i + kFlush * kWidth); i + 2 * kWidth <= end; i += 2 * kWidth) {
      if (ahead != nullptr) {
        __builtin_prefetch(ahead + i / kWidth * ahead_step);
        __builtin_prefetch(ahead + (i / kWidth + 1) * ahead_step);
      }
      const vfloat v0 = exp_nonpositive(load(z + i) - m), v1 = exp_nonpositive(load(z + i + kWidth) - m);
      store(e + i, v0);
      store(e + i + kWidth, v1);
      part0 += v0;
      part1 += v1;
    }
    total += widen(part0 + part1);
  }
  if (i < n) {
    const vfloat v = exp_nonpositive(load(z + i) - m);
    store(e + i, v);
    total += widen(v);
  }
  return sum_lanes(total);
}

// The smallest key k among the row's elements with  sum_{key_i > k} weight_i < limit.
// Bisection on the 32-bit key, one pass per bit: with weight 1 and limit top_k it is the
// top-k rule ("fewer than k logits strictly greater"), with weight p and limit top_p the
// top-p rule ("mass strictly greater below top_p"). The Triton and CUDA kernels use the
// same search, so every backend draws the same boundary, ties included.
template <typename Weight>
uint32_t smallest_kept_key(const uint32_t* keys, int64_t V, Weight weight, double limit) {
  int64_t below = -1;  // the largest key known to fail the rule (all keys <= below fail)
  for (int bit = 31; bit >= 0; --bit) {
    const int64_t probe = below + (int64_t{1} << bit);
    double above = 0.0;
    for (int64_t i = 0; i < V; ++i)
      if (keys[i] > probe) above += weight(i);
    if (!(above < limit)) below = probe;
  }
  return static_cast<uint32_t>(below + 1);
}

// The warped distribution of one row (temperature, top-k, softmax, top-p, renormalise),
// kept as  p(x) = kept(x) ? exp(z_x - max) / sum : 0,  z_x = logit_x / temperature,
// kept(x) iff order_key(z_x) >= min_key, the sum over the kept x. Greedy rows are the
// point mass on the first argmax.
struct RowDist {
  Status status = kOk;   // kNaN, kPosInfinity, kAllNegInf: the row cannot be warped
  int64_t argmax = -1;   // >= 0 for greedy rows
  float temperature = 1.0f;
  uint32_t min_key = 0;  // 0: every token kept
  float max = 0.0f;
  double inv_sum = 1.0;

  // p(x) from x's logit.
  template <typename T>
  float prob(T logit, int64_t x) const {
    if (argmax >= 0) return x == argmax ? 1.0f : 0.0f;
    const float z = to_float(logit) / temperature;
    return order_key(z) >= min_key ? static_cast<float>(std::exp(static_cast<double>(z) - max) * inv_sum) : 0.0f;
  }
};

// Index of the first maximum of a row; z: scratch for one chunk. With `status`, also checks
// the row (NaN, +inf, only -inf).
template <typename T>
int64_t argmax(const T* logits, int64_t V, float* z, Status* status = nullptr) {
  int64_t best = 0;
  float best_value = kNegInf;
  for (int64_t c = 0; c < V; c += kChunk) {
    const int64_t n = std::min(kChunk, V - c);
    scale_chunk(logits + c, n, 1.0f, z);
    bool bad = false;
    const float mc = checked_max_of(z, padded(n), &bad);
    if (status != nullptr && *status == kOk && bad) *status = nan_or_inf(z, n);
    if (!(mc > best_value)) continue;  // ties with an earlier chunk keep the earlier index
    best_value = mc;
    best = c + (std::find(z, z + n, mc) - z);
  }
  if (status != nullptr && *status == kOk && best_value == kNegInf) *status = kAllNegInf;
  return best;
}

// Fills s.z, s.e, s.chunk_max, s.chunk_sum for a row with top-k and/or top-p, whose kept
// set is decided on the whole row first.
inline void filtered_row(RowDist& d, int64_t V, Sampling samp, Scratch& s) {
  const float* z = s.z.get();
  uint32_t* keys = s.keys.get();
  for (int64_t i = 0; i < V; ++i) keys[i] = order_key(z[i]);
  if (samp.top_k > 0 && samp.top_k < V)
    d.min_key = smallest_kept_key(keys, V, [](int64_t) { return 1.0; }, static_cast<double>(samp.top_k));
  d.max = max_of(z, padded(V));  // the max is always kept
  if (samp.top_p < 1.0f) {  // the kept set is decided on p in double, as in the reference
    double* p64 = s.p64.get();
    double total = 0.0;
    for (int64_t i = 0; i < V; ++i)
      total += p64[i] = keys[i] >= d.min_key ? std::exp(static_cast<double>(z[i]) - d.max) : 0.0;
    for (int64_t i = 0; i < V; ++i) p64[i] /= total;
    d.min_key = smallest_kept_key(keys, V, [p64](int64_t i) { return p64[i]; }, static_cast<double>(samp.top_p));
  }
  for (int64_t c = 0, k = 0; c < V; c += kChunk, ++k) {
    const int64_t n = padded(std::min(kChunk, V - c));
    s.chunk_max[k] = d.max;
    s.chunk_sum[k] = exp_and_sum(z + c, n, d.max, s.e.get() + c);
    for (int64_t i = c; i < std::min(V, c + n); ++i)
      if (keys[i] < d.min_key) s.e[i] = 0.0f;
    if (d.min_key != 0) {
      double sum = 0.0;
      for (int64_t i = c; i < c + n; ++i) sum += s.e[i];
      s.chunk_sum[k] = sum;
    }
  }
}

// Runs body(k) for the chunks k of a row; ops.cpp passes a parallel version for small batches.
struct Serial {
  template <typename F>
  void operator()(int64_t chunks, F body) const {
    for (int64_t k = 0; k < chunks; ++k) body(k);
  }
};

// The scaled logits of chunk k, padded to whole vectors: the logits themselves when they
// are fp32 at temperature 1 and the chunk is whole, else scaled into s.z.
template <typename T>
const float* chunk_z(const T* logits, int64_t V, float t, int64_t k, Scratch& s) {
  const int64_t c = k * kChunk, n = std::min(kChunk, V - c);
  if constexpr (std::is_same_v<T, float>) {
    if (t == 1.0f && n == kChunk) return logits + c;
  }
  scale_chunk(logits + c, n, t, s.z.get() + c);
  return s.z.get() + c;
}

// Build the RowDist of a row of logits, leaving e and the per-chunk max and sums in s
// (and z in s.z for filtered rows).
template <typename T, typename ForChunks = Serial>
RowDist row_dist(const T* logits, int64_t V, Sampling samp, Scratch& s, ForChunks for_chunks = {}) {
  RowDist d;
  if (samp.temperature == 0.0f) {
    d.argmax = argmax(logits, V, s.z.get(), &d.status);
    return d;
  }
  d.temperature = samp.temperature;
  const int64_t chunks = num_chunks(V);
  if ((samp.top_k > 0 && samp.top_k < V) || samp.top_p < 1.0f) {
    for (int64_t c = 0; c < V; c += kChunk) scale_chunk(logits + c, std::min(kChunk, V - c), samp.temperature, s.z.get() + c);
    bool bad = false;
    const float max = checked_max_of(s.z.get(), padded(V), &bad);
    if (bad) d.status = nan_or_inf(s.z.get(), V);
    else if (max == kNegInf) d.status = kAllNegInf;
    if (d.status != kOk) return d;
    filtered_row(d, V, samp, s);
  } else {  // the hot path: each chunk read once, its max and exps from L1
    for_chunks(chunks, [&](int64_t k) {
      const int64_t n = padded(std::min(kChunk, V - k * kChunk));
      const float* z = chunk_z(logits, V, samp.temperature, k, s);
      float* e = s.e.get() + k * kChunk;
      bool bad = false;
      const float mc = s.chunk_max[k] = checked_max_of(z, n, &bad);
      s.chunk_bad[k] = bad;
      if (mc == kNegInf || bad) std::fill(e, e + n, 0.0f);
      const char* ahead = reinterpret_cast<const char*>(logits + (k + 1) * kChunk);  // the next chunk or row
      s.chunk_sum[k] = mc == kNegInf || bad ? 0.0 : exp_and_sum(z, n, mc, e, ahead, kWidth * sizeof(T));
    });
    for (int64_t k = 0; k < chunks && d.status == kOk; ++k)
      if (s.chunk_bad[k]) d.status = nan_or_inf(chunk_z(logits, V, samp.temperature, k, s), std::min(kChunk, V - k * kChunk));
    d.max = *std::max_element(s.chunk_max.get(), s.chunk_max.get() + chunks);
    if (d.status == kOk && d.max == kNegInf) d.status = kAllNegInf;
    if (d.status != kOk) return d;
  }
  double sum = 0.0;
  for (int64_t k = 0; k < chunks; ++k)
    if (s.chunk_max[k] != kNegInf) sum += s.chunk_sum[k] * std::exp(static_cast<double>(s.chunk_max[k]) - d.max);
  d.inv_sum = 1.0 / sum;
  return d;
}

// w[x] = p_scale p(x), then max(0, w[x] - q[x]) where q != nullptr, and 0 at x = `exclude`
// (the residual of a point mass on it), from a row_dist's scratch, with s.chunk_sum[k] = the
// sum of chunk k's weights (double); returns the total, NaN if q holds NaN, a negative or an
// infinite value. w has room for V rounded up to whole vectors unless `exact_end`, then
// exactly V entries.
template <typename ForChunks = Serial>
double fill_weights(const RowDist& d, const float* q, int64_t V, Scratch& s, float* w, bool exact_end,
                    ForChunks for_chunks = {}, float p_scale = 1.0f, int64_t exclude = -1) {
  for_chunks(num_chunks(V), [&](int64_t k) {
    const int64_t c = k * kChunk, n = std::min(kChunk, V - c);
    const vfloat scale = splat(static_cast<float>(std::exp(static_cast<double>(s.chunk_max[k]) - d.max) * d.inv_sum));
    const vint lanes = lane_indices();
    vdouble sum = {};
    vint bad_q = {};
    for (int64_t i = 0; i < n;) {
      vfloat part = {};
      for (int64_t end = std::min(n, i + kFlush * kWidth); i < end; i += kWidth) {
        vfloat v = load(s.e.get() + c + i) * scale * p_scale;
        if (q != nullptr) {
          __builtin_prefetch(q + c + kChunk + i);  // the next chunk's q (see exp_and_sum)
          const vfloat qv = i + kWidth <= n ? load(q + c + i) : load_partial(q + c + i, n - i, 0.0f);
          bad_q |= ~((qv >= 0.0f) & (qv < kPosInf));
          v = vmax(v - qv, vfloat{});
        }
        const int64_t at = exclude - c - i;  // a lane compare: a lane subscript would spill v
        v = lanes == static_cast<int32_t>(at >= 0 && at < kWidth ? at : -1) ? vfloat{} : v;
        if (exact_end && i + kWidth > n) store_partial(w + c + i, v, n - i);
        else store(w + c + i, v);
        part += v;
      }
      sum += widen(part);
    }
    s.chunk_sum[k] = sum_lanes(sum);
    for (int l = 0; l < kWidth; ++l)
      if (bad_q[l]) s.chunk_sum[k] = std::numeric_limits<double>::quiet_NaN();
  });
  double total = 0.0;
  for (int64_t k = 0; k < num_chunks(V); ++k) total += s.chunk_sum[k];
  return total;
}

// Inverse CDF over weights w[V] >= 0 with per-chunk sums: the smallest x with
// cumsum(w)[x] >= u * sum(w), cumulated in double (reference: sample_inverse_cdf).
inline int64_t sample_inverse_cdf(const float* w, const double* chunk_sum, int64_t V, float u) {
  const int64_t chunks = num_chunks(V);
  double total = 0.0;
  for (int64_t k = 0; k < chunks; ++k) total += chunk_sum[k];
  const double target = static_cast<double>(u) * total;
  double cum = 0.0;
  for (int64_t k = 0; k < chunks; ++k) {
    if (cum + chunk_sum[k] >= target) {
      for (int64_t i = k * kChunk, end = std::min(V, i + kChunk); i < end; ++i) {
        cum += w[i];
        if (cum >= target && w[i] > 0.0f) return i;
      }
    }
    cum += chunk_sum[k];
  }
  for (int64_t i = V - 1; i > 0; --i)  // rounding put the target past the end: the last token of weight > 0
    if (w[i] > 0.0f) return i;
  return 0;
}

// Samples the token emitted at a stop: from max(0, p_scale p - q) (q == nullptr: p_scale p with
// X = `exclude` removed, the residual of a point mass) when `residual`, else or when that has no
// mass from p. Returns the token, or -1 if q holds bad values (kBadDraft).
template <typename ForChunks>
int64_t stop_token(const RowDist& d, const float* q, int64_t exclude, bool residual, float p_scale, int64_t V, float u,
                   Scratch& s, ForChunks for_chunks) {
  if (d.argmax >= 0) return d.argmax;  // greedy: the residual of a point mass is the point mass
  float* w = s.w.get();
  if (residual) {
    const double mass = fill_weights(d, q, V, s, w, false, for_chunks, p_scale, q == nullptr ? exclude : -1);
    if (std::isnan(mass)) return -1;
    residual = static_cast<float>(mass) > kResidualEps;
  }
  if (!residual) fill_weights(d, nullptr, V, s, w, false, for_chunks);
  return sample_inverse_cdf(w, s.chunk_sum.get(), V, u);
}

// One row of token-wise verification. target: [K+1, V] logits, q: [K, V] or nullptr (a point
// mass on each drafted token), tokens: [K], u: [K+1]. Writes out_tokens[K+1] (padded with -1)
// and returns the accepted count; *status: kOk, or what is wrong (then the outputs are undefined).
template <typename T, typename ForChunks = Serial>
int64_t verify_row(const T* target, const float* q, const int64_t* tokens, int64_t len, int64_t K, int64_t V,
                   Sampling samp, const float* u, int64_t* out_tokens, Scratch& s, Status* status,
                   ForChunks for_chunks = {}) {
  if ((*status = check_row(tokens, len, K, V, u)) != kOk) return 0;
  int64_t j = 0;
  RowDist d;
  for (;; ++j) {
    d = row_dist(target + j * V, V, samp, s, for_chunks);
    if (d.status != kOk) return *status = d.status, 0;
    if (j == len) break;
    const int64_t x = tokens[j];
    const float qx = draft_prob(q, j, V, x);
    if (std::isnan(qx)) return *status = kBadDraft, 0;
    if (!(qx > 0.0f && u[j] * qx <= d.prob(target[j * V + x], x))) break;  // q(x) == 0: reject
  }
  for (int64_t i = 0; i <= K; ++i) out_tokens[i] = i < j ? tokens[i] : -1;
  // The residual max(0, p - q) at a rejection; p itself for the bonus or an empty residual.
  const int64_t y = stop_token(d, q == nullptr ? nullptr : q + j * V, j < len ? tokens[j] : -1, j < len, 1.0f, V, u[K],
                               s, for_chunks);
  if (y < 0) return *status = kBadDraft, 0;
  out_tokens[j] = y;
  return j;
}

// One row of block verification (reference/verify_block.py): the same inputs and outputs
// as verify_row. Reads every drafted row: p_i needs P_i(X_i), r_i a pass over P_{i+1}, Q_{i+1}
// (for a point mass r_i = p_i (1 - P_{i+1}(X_{i+1})), without the pass).
template <typename T, typename ForChunks = Serial>
int64_t verify_block_row(const T* target, const float* q, const int64_t* tokens, int64_t len, int64_t K, int64_t V,
                         Sampling samp, const float* u, int64_t* out_tokens, Scratch& s, Status* status,
                         ForChunks for_chunks = {}) {
  if (samp.temperature == 0.0f)  // point masses: block and token-wise accept the same matching prefix
    return verify_row(target, q, tokens, len, K, V, samp, u, out_tokens, s, status, for_chunks);
  if ((*status = check_row(tokens, len, K, V, u)) != kOk) return 0;
  double clipped = 1.0, clipped_at_tau = 1.0;  // p_i, and p_tau
  int64_t tau = 0;
  for (int64_t j = 0; j < len; ++j) {  // row j holds P_{j+1}; X_{j+1} = tokens[j]
    const RowDist d = row_dist(target + j * V, V, samp, s, for_chunks);
    if (d.status != kOk) return *status = d.status, 0;
    const int64_t x = tokens[j];
    const float px = d.prob(target[j * V + x], x), qx = draft_prob(q, j, V, x);
    if (std::isnan(qx)) return *status = kBadDraft, 0;
    if (j > 0) {  // h_j from r_j = sum max(p_j P_{j+1} - Q_{j+1}, 0), a pass over row j
      const double r = q == nullptr ? clipped * (1.0 - static_cast<double>(px))
                                    : fill_weights(d, q + j * V, V, s, s.w.get(), false, for_chunks, static_cast<float>(clipped));
      if (std::isnan(r)) return *status = kBadDraft, 0;
      const double denominator = r + 1.0 - clipped;
      if (static_cast<double>(u[j - 1]) <= (denominator > 0.0 ? r / denominator : 1.0)) tau = j, clipped_at_tau = clipped;
    }
    clipped = qx > 0.0f ? std::min(1.0, clipped * px / qx) : 0.0;
  }
  if (len > 0 && static_cast<double>(u[len - 1]) <= clipped) tau = len, clipped_at_tau = clipped;  // h_L = p_L
  for (int64_t i = 0; i <= K; ++i) out_tokens[i] = i < tau ? tokens[i] : -1;
  // Y ~ P_{L+1} at tau = L; else norm(max(p_tau P_{tau+1} - Q_{tau+1}, 0)), or P_{tau+1} without mass.
  const RowDist d = row_dist(target + tau * V, V, samp, s, for_chunks);
  if (d.status != kOk) return *status = d.status, 0;
  const int64_t y = stop_token(d, q == nullptr ? nullptr : q + tau * V, tau < len ? tokens[tau] : -1, tau < len,
                               static_cast<float>(clipped_at_tau), V, u[K], s, for_chunks);
  if (y < 0) return *status = kBadDraft, 0;
  out_tokens[tau] = y;
  return tau;
}

// H(q) = sum_x q(x) (log(sum) - (z_x - max)) over x with q(x) > 0: no log per element.
template <typename T>
double entropy(const T* logits, const float* probs, int64_t V, const RowDist& d, Scratch& s) {
  const vfloat log_sum = splat(static_cast<float>(-std::log(d.inv_sum))), max = splat(d.max);
  vdouble h = {};
  for (int64_t k = 0; k < num_chunks(V); ++k) {
    const int64_t c = k * kChunk, n = std::min(kChunk, V - c);
    const float* z = chunk_z(logits, V, d.temperature, k, s);
    for (int64_t i = 0; i < n;) {
      vfloat part = {};
      for (int64_t end = std::min(n, i + kFlush * kWidth); i < end; i += kWidth) {
        const vfloat p = i + kWidth <= n ? load(probs + c + i) : load_partial(probs + c + i, n - i, 0.0f);
        part += p > 0.0f ? p * (log_sum - (load(z + i) - max)) : vfloat{};
      }
      h += widen(part);
    }
  }
  return sum_lanes(h);
}

// One draft step: warp, sample with u, report q(token), H(q) and max q. probs: [V] out.
// A greedy row (q the point mass on the argmax) reports these features of the distribution
// at temperature 1 (reference/draft_step.py), whose largest entry is the argmax's.
template <typename T, typename ForChunks = Serial>
int64_t draft_step_row(const T* logits, int64_t V, Sampling samp, float u, float* probs, Scratch& s,
                       float* token_prob, float* entropy_out, float* top1, ForChunks for_chunks = {}) {
  const bool greedy = samp.temperature == 0.0f;
  if (greedy) samp.temperature = 1.0f;
  const RowDist d = row_dist(logits, V, samp, s, for_chunks);
  fill_weights(d, nullptr, V, s, probs, true, for_chunks);
  *entropy_out = static_cast<float>(entropy(logits, probs, V, d, s));
  *top1 = static_cast<float>(d.inv_sum);  // p(argmax) = exp(0) / sum
  const int64_t x = greedy ? argmax(logits, V, s.z.get()) : sample_inverse_cdf(probs, s.chunk_sum.get(), V, u);
  *token_prob = probs[x];
  if (greedy) {
    std::fill(probs, probs + V, 0.0f);
    probs[x] = 1.0f;
  }
  return x;
}

}  // namespace specdec
