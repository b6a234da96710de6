// Verification kernels for the CPU on raw pointers (no tensors); the only torch header is
// ATen's SIMD vector type, for a vectorised exp.
//
// The math is specdec_fast/sampling.py and specdec_fast/reference/verify.py; this file
// follows it step by step. Every function works on one row of V entries; the callers in
// ops.cpp parallelise over rows. Cumulative sums that decide a sampled token are
// accumulated in double and rounded to float per element, as torch.cumsum does on the CPU,
// so that the same uniforms give the same tokens as the reference.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace specdec {

constexpr float kResidualEps = 1e-6f;  // reference/verify.py RESIDUAL_EPS

struct Sampling {
  float temperature;  // 0 = greedy
  int64_t top_k;      // <= 0 or >= V: off
  float top_p;        // >= 1: off
  bool plain(int64_t V) const { return temperature > 0 && (top_k <= 0 || top_k >= V) && top_p >= 1.0f; }
};

template <typename T>
int64_t argmax(const T* x, int64_t V) {
  int64_t best = 0;
  float best_value = static_cast<float>(x[0]);
  for (int64_t i = 1; i < V; ++i) {
    const float v = static_cast<float>(x[i]);
    if (v > best_value) best_value = v, best = i;
  }
  return best;
}

using Vec = at::vec::Vectorized<float>;

// x[i] = logits[i] / t, in float (the reference divides the same way).
template <typename T>
void scale_row(const T* logits, int64_t V, float t, float* x) {
  for (int64_t i = 0; i < V; ++i) x[i] = static_cast<float>(logits[i]) / t;
}

inline float row_max(const float* x, int64_t V) {
  return at::vec::reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, x, V);
}

inline float sum_exp(const float* x, int64_t V, float m) {
  return at::vec::map_reduce_all<float>([m](Vec v) { return (v - Vec(m)).exp(); },
                                        [](Vec a, Vec b) { return a + b; }, x, V);
}

// The warped distribution of one row into probs[V]; scratch[V] is work space.
template <typename T>
void warp_row(const T* logits, int64_t V, Sampling s, float* probs, float* scratch) {
  if (s.temperature == 0.0f) {  // greedy: point mass on the first argmax
    std::fill(probs, probs + V, 0.0f);
    probs[argmax(logits, V)] = 1.0f;
    return;
  }
  scale_row(logits, V, s.temperature, probs);
  if (s.top_k > 0 && s.top_k < V) {  // keep x iff fewer than k logits are strictly greater
    std::copy(probs, probs + V, scratch);
    std::nth_element(scratch, scratch + (s.top_k - 1), scratch + V, std::greater<float>());
    const float kth = scratch[s.top_k - 1];
    for (int64_t i = 0; i < V; ++i)
      if (probs[i] < kth) probs[i] = -std::numeric_limits<float>::infinity();
  }
  const float m = row_max(probs, V);
  std::vector<double> p64;
  if (s.top_p < 1.0f) {  // the kept set is decided in double, as in the reference
    p64.resize(V);
    double total = 0.0;
    for (int64_t i = 0; i < V; ++i) total += p64[i] = std::exp(static_cast<double>(probs[i]) - m);
    for (int64_t i = 0; i < V; ++i) p64[i] /= total;
  }
  const float sum = sum_exp(probs, V, m);
  at::vec::map([m, sum](Vec v) { return (v - Vec(m)).exp() / Vec(sum); }, probs, probs, V);
  if (s.top_p < 1.0f) {  // keep x iff the mass strictly above p(x) is below top_p
    std::vector<double> sorted(p64);
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    double cum = 0.0;
    int64_t keep = 0;
    for (; keep < V; ++keep) {
      cum += sorted[keep];
      if (!(cum - sorted[keep] < static_cast<double>(s.top_p))) break;
    }
    const double threshold = sorted[std::max<int64_t>(keep, 1) - 1];
    double total = 0.0;
    for (int64_t i = 0; i < V; ++i) {
      if (p64[i] < threshold) probs[i] = 0.0f;
      total += probs[i];
    }
    const float inv_total = static_cast<float>(1.0 / total);
    for (int64_t i = 0; i < V; ++i) probs[i] *= inv_total;
  }
}

// p(x) of one row from its max and normaliser alone (plain sampling or greedy only).
template <typename T>
float prob_of(const T* logits, int64_t V, Sampling s, int64_t x, float* scratch) {
  if (s.temperature == 0.0f) return argmax(logits, V) == x ? 1.0f : 0.0f;
  scale_row(logits, V, s.temperature, scratch);
  const float m = row_max(scratch, V);
  return std::exp(scratch[x] - m) / sum_exp(scratch, V, m);
}

// Inverse CDF: the smallest x with cumsum(w)[x] >= u * sum(w), w >= 0, u in (0, 1].
inline int64_t sample_inverse_cdf(const float* w, int64_t V, float u) {
  double total = 0.0;
  for (int64_t i = 0; i < V; ++i) total += w[i];
  const float target = u * static_cast<float>(total);
  double cum = 0.0;
  for (int64_t i = 0; i < V; ++i) {
    cum += w[i];
    if (static_cast<float>(cum) >= target) return i;
  }
  return V - 1;
}

// One row of token-wise verification. target: [K+1, V] logits, q: [K, V], tokens: [K],
// u: [K+1]. Writes out_tokens[K+1] (padded with -1) and returns the accepted count.
template <typename T>
int64_t verify_row(const T* target, const float* q, const int64_t* tokens, int64_t len, int64_t K, int64_t V,
                   Sampling s, const float* u, int64_t* out_tokens, float* p, float* scratch) {
  const bool plain = s.plain(V) || s.temperature == 0.0f;
  int64_t j = 0;
  for (; j < len; ++j) {
    const int64_t x = tokens[j];
    const float qx = q[j * V + x];
    float px;
    if (plain) {
      px = prob_of(target + j * V, V, s, x, scratch);
    } else {
      warp_row(target + j * V, V, s, p, scratch);
      px = p[x];
    }
    if (!(qx > 0.0f && u[j] * qx <= px)) break;  // q(x) == 0 cannot come from sampling q: reject
  }
  warp_row(target + j * V, V, s, p, scratch);
  if (j < len) {  // residual max(0, p - q); sample from p if it has no mass
    const float* qj = q + j * V;
    double mass = 0.0;
    for (int64_t i = 0; i < V; ++i) {
      scratch[i] = std::max(p[i] - qj[i], 0.0f);
      mass += scratch[i];
    }
    if (static_cast<float>(mass) > kResidualEps) std::copy(scratch, scratch + V, p);
  }
  for (int64_t i = 0; i <= K; ++i) out_tokens[i] = i < j ? tokens[i] : -1;
  out_tokens[j] = sample_inverse_cdf(p, V, u[K]);
  return j;
}

// One draft step: warp, sample with u, report q(token), H(q) and max q. probs: [V] out.
template <typename T>
int64_t draft_step_row(const T* logits, int64_t V, Sampling s, float u, float* probs, float* scratch,
                       float* token_prob, float* entropy, float* top1) {
  warp_row(logits, V, s, probs, scratch);
  const int64_t x = sample_inverse_cdf(probs, V, u);
  double h = 0.0;
  float best = 0.0f;
  for (int64_t i = 0; i < V; ++i) {
    const float q = probs[i];
    if (q > 0.0f) h -= static_cast<double>(q) * std::log(static_cast<double>(q));
    best = std::max(best, q);
  }
  *token_prob = probs[x];
  *entropy = static_cast<float>(h);
  *top1 = best;
  return x;
}

}  // namespace specdec
