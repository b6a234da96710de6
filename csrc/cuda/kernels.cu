// CUDA kernels: one thread block per batch row; no torch headers (see kernels.h).
//
// The math is specdec_fast/sampling.py and specdec_fast/reference/verify.py, the
// algorithms those of csrc/cpu/sampling.h and triton_kernels/sampling.py:
// p(x) = kept(x) ? exp(z_x - max) / sum : 0 with z = logits / temperature, kept(x) iff
// key(z_x) >= min_key, the sum over kept x in double; top-k / top-p thresholds by bisection
// on the 32-bit key; sampling by inverse CDF cumulated in double. Every decision a block
// takes is made on block-reduced values that all its threads hold, so control flow around
// __syncthreads() is uniform.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "../philox.h"
#include "kernels.h"

namespace specdec::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 8;  // consecutive entries per thread in a sampling tile
constexpr int kTile = kThreads * kItems;
constexpr float kResidualEps = 1e-6f;  // reference/verify.py RESIDUAL_EPS

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

__device__ __forceinline__ uint32_t order_key(float z) {
  const uint32_t bits = __float_as_uint(z);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

struct Max { template <typename V> __device__ V operator()(V a, V b) const { return a > b ? a : b; } };
struct Min { template <typename V> __device__ V operator()(V a, V b) const { return a < b ? a : b; } };
struct Sum { template <typename V> __device__ V operator()(V a, V b) const { return a + b; } };

// The reduction of v over the block, returned to every thread.
template <typename V, typename Op>
__device__ V block_reduce(V v, Op op) {
  __shared__ V warp_values[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();  // the previous call's readers are done with warp_values
  if ((threadIdx.x & 31) == 0) warp_values[threadIdx.x >> 5] = v;
  __syncthreads();
  V out = warp_values[0];
  for (int w = 1; w < kThreads / 32; ++w) out = op(out, warp_values[w]);
  return out;
}

// Exclusive prefix sum of v over the block's threads (in thread order); *total gets the sum.
__device__ double block_exclusive_scan(double v, double* total) {
  __shared__ double warp_sums[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double x = v;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, x, offset);
    if (lane >= offset) x += y;
  }
  __syncthreads();
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  double before = 0.0, all = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  *total = all;
  return before + x - v;
}

struct Sampling {
  float temperature;  // 0 = greedy
  int64_t top_k;      // <= 0 or >= V: off
  float top_p;        // >= 1: off
};

// A row's warped distribution (see the file comment); argmax >= 0 for greedy rows.
struct RowDist {
  int64_t argmax;
  float temperature;
  uint32_t min_key;
  float max;
  double inv_sum;

  template <typename T>
  __device__ float prob(T logit, int64_t x) const {
    if (argmax >= 0) return x == argmax ? 1.0f : 0.0f;
    const float z = to_float(logit) / temperature;
    return order_key(z) >= min_key ? static_cast<float>(exp(static_cast<double>(z) - max) * inv_sum) : 0.0f;
  }
  // The sampling weight of p at an entry (fp32, as the CPU and Triton kernels compute it).
  __device__ float weight(float z) const {
    return order_key(z) >= min_key && z != -INFINITY ? expf(z - max) * static_cast<float>(inv_sum) : 0.0f;
  }
};

template <typename T>
__device__ int64_t argmax_row(const T* row, int64_t V) {
  float best = -INFINITY;
  int64_t best_idx = INT64_MAX;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float x = to_float(row[i]);
    if (x > best || best_idx == INT64_MAX) best = x, best_idx = i;  // strided: the first of a thread's ties
  }
  const float m = block_reduce(best, Max{});
  return block_reduce(best == m ? best_idx : INT64_MAX, Min{});
}

// Sum over kept entries with key > probe of 1, or (use_p) exp(z - m) / total in double.
template <typename T>
__device__ double weight_above(const T* row, int64_t V, float t, int64_t probe, uint32_t min_key, float m,
                               double total, bool use_p) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float z = to_float(row[i]) / t;
    const uint32_t key = order_key(z);
    if (key > probe && key >= min_key) acc += use_p ? exp(static_cast<double>(z) - m) / total : 1.0;
  }
  return block_reduce(acc, Sum{});
}

// The smallest key k with weight_above(k) < limit, by bisection on the key's 32 bits.
template <typename T>
__device__ uint32_t smallest_kept_key(const T* row, int64_t V, float t, double limit, uint32_t min_key, float m,
                                      double total, bool use_p) {
  int64_t below = -1;  // the largest key known to fail the rule
  for (int bit = 31; bit >= 0; --bit) {
    const int64_t probe = below + (int64_t{1} << bit);
    if (!(weight_above(row, V, t, probe, min_key, m, total, use_p) < limit)) below = probe;
  }
  return static_cast<uint32_t>(below + 1);
}

template <typename T>
__device__ double kept_sum(const T* row, int64_t V, const RowDist& d) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float z = to_float(row[i]) / d.temperature;
    if (order_key(z) >= d.min_key && z != -INFINITY) acc += expf(z - d.max);
  }
  return block_reduce(acc, Sum{});
}

template <typename T>
__device__ RowDist row_dist(const T* row, int64_t V, Sampling s) {
  RowDist d{-1, s.temperature, 0u, 0.0f, 1.0};
  if (s.temperature == 0.0f) {
    d.argmax = argmax_row(row, V);
    return d;
  }
  if ((s.top_k <= 0 || s.top_k >= V) && s.top_p >= 1.0f) {  // the hot path: one read, online max and sum
    float m = -INFINITY;
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float z = to_float(row[i]) / s.temperature;
      if (z == -INFINITY) continue;
      if (z > m) sum = sum * exp(static_cast<double>(m) - z) + 1.0, m = z;
      else sum += expf(z - m);
    }
    d.max = block_reduce(m, Max{});
    sum = m == -INFINITY ? 0.0 : sum * exp(static_cast<double>(m) - d.max);
    d.inv_sum = 1.0 / block_reduce(sum, Sum{});
    return d;
  }
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) m = fmaxf(m, to_float(row[i]) / s.temperature);
  d.max = block_reduce(m, Max{});  // the max is always kept
  if (s.top_k > 0 && s.top_k < V)
    d.min_key = smallest_kept_key(row, V, s.temperature, static_cast<double>(s.top_k), 0u, d.max, 1.0, false);
  if (s.top_p < 1.0f) {  // the kept set is decided on p in double, as in the reference
    double total = 0.0;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float z = to_float(row[i]) / s.temperature;
      if (order_key(z) >= d.min_key) total += exp(static_cast<double>(z) - d.max);
    }
    total = block_reduce(total, Sum{});
    d.min_key = smallest_kept_key(row, V, s.temperature, static_cast<double>(s.top_p), d.min_key, d.max, total, true);
  }
  d.inv_sum = 1.0 / kept_sum(row, V, d);
  return d;
}

// Sampling weight of entry i: p(i), or max(scale p(i) - q[i], 0) if `residual`.
template <typename T>
__device__ __forceinline__ float weight_at(const T* row, const float* q, int64_t i, const RowDist& d, bool residual,
                                           float scale) {
  const float p = d.weight(to_float(row[i]) / d.temperature);
  return residual ? fmaxf(scale * p - q[i], 0.0f) : p;
}

// The sums of max(scale p - q, 0) (if `rejected`) and of p over the row, in double, in one read.
template <typename T>
__device__ void weight_totals(const T* row, const float* q, int64_t V, const RowDist& d, bool rejected, float scale,
                              double* residual, double* total) {
  double r = 0.0, t = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float p = weight_at(row, q, i, d, false, 1.0f);
    t += p;
    if (rejected) r += fmaxf(scale * p - q[i], 0.0f);
  }
  *residual = block_reduce(r, Sum{});
  *total = block_reduce(t, Sum{});
}

// Inverse CDF: the smallest x with cumsum(w)[x] >= u * total and w[x] > 0, in double. Tiles
// of kTile entries, kItems consecutive ones per thread; only the tile that holds the
// target is scanned.
template <typename T>
__device__ int64_t sample_row(const T* row, const float* q, int64_t V, const RowDist& d, bool residual, float scale,
                              double total, float u) {
  const double target = static_cast<double>(u) * total;
  double cum = 0.0;
  int64_t last = -1;  // the last entry of positive weight: rounding past the end lands there
  for (int64_t start = 0; start < V; start += kTile) {
    const int64_t first = start + threadIdx.x * kItems;
    float w[kItems];
    double mine = 0.0;
    for (int i = 0; i < kItems; ++i) {
      w[i] = first + i < V ? weight_at(row, q, first + i, d, residual, scale) : 0.0f;
      mine += w[i];
      if (w[i] > 0.0f) last = first + i;
    }
    double tile_total;
    double before = cum + block_exclusive_scan(mine, &tile_total);
    if (cum + tile_total >= target) {
      int64_t found = INT64_MAX;
      for (int i = 0; i < kItems; ++i) {
        before += w[i];
        if (found == INT64_MAX && w[i] > 0.0f && before >= target) found = first + i;
      }
      found = block_reduce(found, Min{});
      if (found != INT64_MAX) return found;
    }
    cum += tile_total;
  }
  last = block_reduce(last, Max{});
  return last < 0 ? 0 : last;
}

__device__ Sampling row_sampling(const float* temperature, const int64_t* top_k, const float* top_p, int64_t b) {
  return Sampling{temperature[b], top_k[b], top_p[b]};
}

// The token emitted after `accepted` drafts of row b: argmax for greedy rows; else a sample
// of max(scale p - q, 0) at a stop before the draft's end (p if that has no mass), of p at the end.
template <typename T>
__device__ int64_t stop_token(const T* rows, const float* q, const float* u, int64_t b, int64_t accepted, int64_t len,
                              float scale, Sampling s, int64_t K, int64_t V) {
  const RowDist d = row_dist(rows + accepted * V, V, s);
  if (d.argmax >= 0) return d.argmax;  // the residual of a point mass is the point mass
  const bool rejected = accepted < len;
  const float* q_row = rejected ? q + (b * K + accepted) * V : nullptr;
  double mass, total;
  weight_totals(rows + accepted * V, q_row, V, d, rejected, scale, &mass, &total);
  const bool residual = rejected && static_cast<float>(mass) > kResidualEps;
  return sample_row(rows + accepted * V, q_row, V, d, residual, scale, residual ? mass : total, u[b * (K + 1) + K]);
}

__device__ void emit(const int64_t* tokens, int64_t* accepted_out, int64_t* out, int64_t b, int64_t accepted, int64_t y,
                     int64_t K) {
  for (int64_t i = threadIdx.x; i <= K; i += kThreads) out[b * (K + 1) + i] = i < accepted ? tokens[b * K + i] : (i == accepted ? y : -1);
  if (threadIdx.x == 0) accepted_out[b] = accepted;
}

// Token-wise: accept X_j while u_j q_j(X_j) <= p_j(X_j); then the stop token.
template <typename T>
__device__ void token_wise_row(const T* target, const float* q, const int64_t* tokens, int64_t len, Sampling s,
                               const float* u, int64_t* accepted, int64_t* out, int64_t b, int64_t K, int64_t V) {
  const T* rows = target + b * (K + 1) * V;
  int64_t j = 0;
  for (; j < len; ++j) {
    const RowDist d = row_dist(rows + j * V, V, s);
    const int64_t x = tokens[b * K + j];
    const float q_x = q[(b * K + j) * V + x];
    if (!(q_x > 0.0f && u[b * (K + 1) + j] * q_x <= d.prob(rows[j * V + x], x))) break;  // q(x) == 0: reject
  }
  emit(tokens, accepted, out, b, j, stop_token(rows, q, u, b, j, len, 1.0f, s, K, V), K);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
verify_kernel(const T* target, const float* q, const int64_t* tokens, const int64_t* lens, const float* temperature,
              const int64_t* top_k, const float* top_p, const float* u, int64_t* accepted, int64_t* out, int64_t K,
              int64_t V) {
  const int64_t b = blockIdx.x;
  token_wise_row(target, q, tokens, lens[b], row_sampling(temperature, top_k, top_p, b), u, accepted, out, b, K, V);
}

// Block verification (reference/verify_block.py): p_i = min(1, p_{i-1} P_i(X_i) / Q_i(X_i)),
// h_i = r_i / (r_i + 1 - p_i) with r_i = sum max(p_i P_{i+1} - Q_{i+1}, 0), h_L = p_L,
// tau = max{i : u_i <= h_i}.
template <typename T>
__global__ void __launch_bounds__(kThreads)
verify_block_kernel(const T* target, const float* q, const int64_t* tokens, const int64_t* lens,
                    const float* temperature, const int64_t* top_k, const float* top_p, const float* u,
                    int64_t* accepted, int64_t* out, int64_t K, int64_t V) {
  const int64_t b = blockIdx.x, len = lens[b];
  const Sampling s = row_sampling(temperature, top_k, top_p, b);
  if (s.temperature == 0.0f) {  // point masses: block and token-wise accept the same matching prefix
    token_wise_row(target, q, tokens, len, s, u, accepted, out, b, K, V);
    return;
  }
  const T* rows = target + b * (K + 1) * V;
  double clipped = 1.0, clipped_tau = 1.0;  // p_j, and p_tau
  int64_t tau = 0;
  for (int64_t j = 0; j < len; ++j) {  // row j holds P_{j+1}; X_{j+1} = tokens[j]
    const RowDist d = row_dist(rows + j * V, V, s);
    if (j > 0) {
      double r, unused;
      weight_totals(rows + j * V, q + (b * K + j) * V, V, d, true, static_cast<float>(clipped), &r, &unused);
      const double denominator = r + 1.0 - clipped;
      if (static_cast<double>(u[b * (K + 1) + j - 1]) <= (denominator > 0.0 ? r / denominator : 1.0))
        tau = j, clipped_tau = clipped;
    }
    const int64_t x = tokens[b * K + j];
    const float q_x = q[(b * K + j) * V + x];
    clipped = q_x > 0.0f ? fmin(1.0, clipped * d.prob(rows[j * V + x], x) / q_x) : 0.0;
  }
  if (len > 0 && static_cast<double>(u[b * (K + 1) + len - 1]) <= clipped) tau = len, clipped_tau = clipped;
  emit(tokens, accepted, out, b, tau, stop_token(rows, q, u, b, tau, len, static_cast<float>(clipped_tau), s, K, V), K);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
draft_step_kernel(const T* logits, const float* temperature, const int64_t* top_k, const float* top_p,
                  const float* u, int64_t* tokens, float* probs, float* token_prob, float* entropy, float* top1,
                  int64_t V) {
  const int64_t b = blockIdx.x;
  const T* row = logits + b * V;
  float* q = probs + b * V;
  // A greedy row's q is the point mass on the argmax; its features are those of the
  // distribution at temperature 1 (reference/draft_step.py).
  Sampling samp = row_sampling(temperature, top_k, top_p, b);
  const bool greedy = samp.temperature == 0.0f;
  if (greedy) samp.temperature = 1.0f;
  const RowDist d = row_dist(row, V, samp);
  // p, its total for the sampler, and H(p) = sum p (log(sum) - (z - max)) over p > 0.
  const float log_sum = static_cast<float>(-log(d.inv_sum));
  double total = 0.0, h = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float z = to_float(row[i]) / d.temperature, p = d.weight(z);
    q[i] = p;
    total += p;
    if (p > 0.0f) h += p * (log_sum - (z - d.max));
  }
  total = block_reduce(total, Sum{});
  h = block_reduce(h, Sum{});
  const int64_t x = greedy ? argmax_row(row, V) : sample_row(row, q, V, d, false, 1.0f, total, u[b]);
  if (greedy)
    for (int64_t i = threadIdx.x; i < V; i += kThreads) q[i] = i == x ? 1.0f : 0.0f;
  if (threadIdx.x == 0) {
    tokens[b] = x;
    token_prob[b] = d.weight(to_float(row[x]) / d.temperature);  // the formula p was written with
    entropy[b] = static_cast<float>(h);
    top1[b] = static_cast<float>(d.inv_sum);
  }
}

__global__ void philox_kernel(const int64_t* seed, const int64_t* offset, float* out, int64_t n) {
  const int64_t b = blockIdx.x;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    out[b * n + i] = philox_uniform(static_cast<uint64_t>(seed[b]), static_cast<uint64_t>(offset[b]) + i);
}

template <typename F>
cudaError_t by_dtype(Dtype dtype, F launch) {
  switch (dtype) {
    case Dtype::kFloat32: return launch(static_cast<float*>(nullptr));
    case Dtype::kBFloat16: return launch(static_cast<__nv_bfloat16*>(nullptr));
    case Dtype::kFloat16: return launch(static_cast<__half*>(nullptr));
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t verify(Dtype dtype, const void* target, const float* q, const int64_t* tokens, const int64_t* lens,
                   const float* temperature, const int64_t* top_k, const float* top_p, const float* u,
                   int64_t* accepted, int64_t* out, int64_t B, int64_t K, int64_t V, bool block, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto kernel = block ? verify_block_kernel<T> : verify_kernel<T>;
    kernel<<<B, kThreads, 0, stream>>>(static_cast<const T*>(target), q, tokens, lens, temperature, top_k, top_p, u,
                                       accepted, out, K, V);
    return cudaGetLastError();
  });
}

cudaError_t draft_step(Dtype dtype, const void* logits, const float* temperature, const int64_t* top_k,
                       const float* top_p, const float* u, int64_t* tokens, float* probs, float* token_prob,
                       float* entropy, float* top1, int64_t B, int64_t V, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    draft_step_kernel<T><<<B, kThreads, 0, stream>>>(static_cast<const T*>(logits), temperature, top_k, top_p, u,
                                                      tokens, probs, token_prob, entropy, top1, V);
    return cudaGetLastError();
  });
}

cudaError_t philox_uniforms(const int64_t* seed, const int64_t* offset, float* out, int64_t B, int64_t n,
                            cudaStream_t stream) {
  if (B == 0 || n == 0) return cudaSuccess;
  philox_kernel<<<B, 128, 0, stream>>>(seed, offset, out, n);
  return cudaGetLastError();
}

}  // namespace specdec::cuda
