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
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 32;  // loads in flight per thread in a streaming pass over a row
constexpr int kItems = 16;   // consecutive entries per thread in a sampling tile
constexpr int kTile = kThreads * kItems;
constexpr float kResidualEps = 1e-6f;  // reference/verify.py RESIDUAL_EPS

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Streams this thread's entries i = threadIdx.x + n kThreads of row[0, V) in chunks:
// chunk(first, x, n) gets x[r] = row[first + r kThreads] for r < n and -inf for r >= n (n <
// kUnroll only at the row's end). A chunk's loads are all issued before any value is used:
// one block per row needs that many bytes in flight to stream at the memory's rate.
template <typename T, typename F>
__device__ __forceinline__ void stream_chunks(const T* row, int64_t V, F chunk) {
  for (int64_t start = 0; start < V; start += int64_t{kThreads} * kUnroll) {
    const int64_t first = start + threadIdx.x;
    const int n = first < V ? static_cast<int>(min(int64_t{kUnroll}, (V - first + kThreads - 1) / kThreads)) : 0;
    float x[kUnroll];
#pragma unroll
    for (int r = 0; r < kUnroll; ++r) x[r] = r < n ? to_float(row[first + r * kThreads]) : -INFINITY;
    chunk(first, x, n);
  }
}

// Calls f(i, row[i] as float) for this thread's entries, in increasing i.
template <typename T, typename F>
__device__ __forceinline__ void stream_row(const T* row, int64_t V, F f) {
  stream_chunks(row, V, [&](int64_t first, const float (&x)[kUnroll], int n) {
#pragma unroll
    for (int r = 0; r < kUnroll; ++r)
      if (r < n) f(first + r * kThreads, x[r]);
  });
}

// x[i] = row[first + i] for i < kItems (0 past V), in 16-byte loads where the entries allow.
template <typename T>
__device__ __forceinline__ void load_items(const T* row, int64_t first, int64_t V, float (&x)[kItems]) {
  static_assert(sizeof(T) * kItems % 16 == 0, "a thread's items are whole 16-byte words");
  const T* src = row + first;
  if (first + kItems <= V && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    alignas(16) T v[kItems];
#pragma unroll
    for (int w = 0; w < static_cast<int>(sizeof(v) / 16); ++w)
      reinterpret_cast<uint4*>(v)[w] = reinterpret_cast<const uint4*>(src)[w];
#pragma unroll
    for (int i = 0; i < kItems; ++i) x[i] = to_float(v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kItems; ++i) x[i] = first + i < V ? to_float(src[i]) : 0.0f;
  }
}

// z = x / t, without the division when t == 1 (the same value: a correctly rounded division
// costs more instructions than the rest of a streaming pass's work on an entry).
__device__ __forceinline__ float scaled(float x, float t) { return t == 1.0f ? x : x / t; }

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

// Inclusive prefix sum of v over the warp's lanes.
__device__ __forceinline__ double warp_inclusive_scan(double v) {
  const int lane = threadIdx.x & 31;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) v += y;
  }
  return v;
}

// Exclusive prefix sum of v over the block's threads (in thread order). The total, the sum of
// the warps' sums in warp order, is what tile_sums records for the same values.
__device__ double block_exclusive_scan(double v) {
  __shared__ double warp_sums[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const double x = warp_inclusive_scan(v);
  __syncthreads();
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  double before = 0.0;
  for (int w = 0; w < warp; ++w) before += warp_sums[w];
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
    const float z = scaled(to_float(logit), temperature);
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
  stream_row(row, V, [&](int64_t i, float x) {
    if (x > best || best_idx == INT64_MAX) best = x, best_idx = i;  // strided: the first of a thread's ties
  });
  const float m = block_reduce(best, Max{});
  return block_reduce(best == m ? best_idx : INT64_MAX, Min{});
}

// Sum over kept entries with key > probe of 1, or (use_p) exp(z - m) / total in double.
template <typename T>
__device__ double weight_above(const T* row, int64_t V, float t, int64_t probe, uint32_t min_key, float m,
                               double total, bool use_p) {
  double acc = 0.0;
  stream_row(row, V, [&](int64_t, float x) {
    const float z = scaled(x, t);
    const uint32_t key = order_key(z);
    if (key > probe && key >= min_key) acc += use_p ? exp(static_cast<double>(z) - m) / total : 1.0;
  });
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
  stream_row(row, V, [&](int64_t, float x) {
    const float z = scaled(x, d.temperature);
    if (order_key(z) >= d.min_key && z != -INFINITY) acc += expf(z - d.max);
  });
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
    // The running max moves once per chunk, so a chunk's exps are independent of each other
    // (no chain of dependent instructions from one entry to the next).
    float m = -INFINITY;
    double sum = 0.0;
    stream_chunks(row, V, [&](int64_t, const float (&x)[kUnroll], int) {
      float z[kUnroll], chunk_max = -INFINITY;
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) z[r] = scaled(x[r], s.temperature), chunk_max = fmaxf(chunk_max, z[r]);
      if (chunk_max == -INFINITY) return;  // no finite entry
      if (chunk_max > m) sum = m == -INFINITY ? 0.0 : sum * exp(static_cast<double>(m) - chunk_max), m = chunk_max;
      double part = 0.0;
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) part += expf(z[r] - m);  // -inf entries add 0
      sum += part;
    });
    d.max = block_reduce(m, Max{});
    sum = m == -INFINITY ? 0.0 : sum * exp(static_cast<double>(m) - d.max);
    d.inv_sum = 1.0 / block_reduce(sum, Sum{});
    return d;
  }
  float m = -INFINITY;
  stream_row(row, V, [&](int64_t, float x) { m = fmaxf(m, scaled(x, s.temperature)); });
  d.max = block_reduce(m, Max{});  // the max is always kept
  if (s.top_k > 0 && s.top_k < V)
    d.min_key = smallest_kept_key(row, V, s.temperature, static_cast<double>(s.top_k), 0u, d.max, 1.0, false);
  if (s.top_p < 1.0f) {  // the kept set is decided on p in double, as in the reference
    double total = 0.0;
    stream_row(row, V, [&](int64_t, float x) {
      const float z = scaled(x, s.temperature);
      if (order_key(z) >= d.min_key) total += exp(static_cast<double>(z) - d.max);
    });
    total = block_reduce(total, Sum{});
    d.min_key = smallest_kept_key(row, V, s.temperature, static_cast<double>(s.top_p), d.min_key, d.max, total, true);
  }
  d.inv_sum = 1.0 / kept_sum(row, V, d);
  return d;
}

// Sampling tiles: kTile consecutive entries, kItems consecutive ones per thread, so that
// the cumulative sum over a tile is a sum per thread, then a scan over the block.
__host__ __device__ constexpr int64_t num_tiles(int64_t V) { return (V + kTile - 1) / kTile; }

// The sampler's shared memory: the warps' sums of every tile's weights, p then residual.
__host__ __device__ constexpr size_t sampler_bytes(int64_t V) { return 2 * num_tiles(V) * kWarps * sizeof(double); }

// This thread's items of the tile at `start`: p[i] = p(x), r[i] = max(scale p(x) - q(x), 0)
// if q, x = start + threadIdx.x * kItems + i; 0 past V.
template <typename T>
__device__ __forceinline__ void tile_weights(const T* row, const float* q, int64_t start, int64_t V, const RowDist& d,
                                             float scale, float (&p)[kItems], float (&r)[kItems]) {
  const int64_t first = start + threadIdx.x * kItems;
  float x[kItems], qx[kItems];
  load_items(row, first, V, x);
  if (q != nullptr) load_items(q, first, V, qx);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    p[i] = first + i < V ? d.weight(scaled(x[i], d.temperature)) : 0.0f;
    r[i] = q != nullptr ? fmaxf(scale * p[i] - qx[i], 0.0f) : 0.0f;
  }
}

__device__ __forceinline__ double sum_items(const float (&w)[kItems]) {
  double sum = 0.0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) sum += w[i];
  return sum;
}

// One read of the row: records in `parts` each warp's sum of each tile's weights, p and (if
// q) max(scale p - q, 0), in the order the sampler's scan adds them.
template <typename T>
__device__ void tile_sums(const T* row, const float* q, int64_t V, const RowDist& d, float scale, double* parts) {
  const int64_t tiles = num_tiles(V);
  const int warp = threadIdx.x >> 5;
  __syncthreads();  // the readers of the previous sums are done
  for (int64_t tile = 0; tile < tiles; ++tile) {
    float p[kItems], r[kItems];
    tile_weights(row, q, tile * kTile, V, d, scale, p, r);
    const double sp = warp_inclusive_scan(sum_items(p)), sr = warp_inclusive_scan(sum_items(r));
    if ((threadIdx.x & 31) == 31) parts[tile * kWarps + warp] = sp, parts[(tiles + tile) * kWarps + warp] = sr;
  }
  __syncthreads();
}

// A tile's total from the warps' sums (`parts` of one weight kind), added as block_exclusive_scan does.
__device__ __forceinline__ double tile_total(const double* parts, int64_t tile) {
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += parts[tile * kWarps + w];
  return total;
}

__device__ double row_total(const double* parts, int64_t tiles) {
  double total = 0.0;
  for (int64_t tile = 0; tile < tiles; ++tile) total += tile_total(parts, tile);
  return total;
}

// Inverse CDF: the smallest x with cumsum(w)[x] >= u * total and w[x] > 0, in double, where w
// is p or (residual) max(scale p - q, 0) and `parts` holds its tile sums (tile_sums). Tiles
// before the one that holds the target are skipped by their sums; the last entry of positive
// weight catches rounding past the end.
template <typename T>
__device__ int64_t sample_row(const T* row, const float* q, int64_t V, const RowDist& d, bool residual, float scale,
                              const double* parts, double total, float u) {
  const double target = static_cast<double>(u) * total;
  double cum = 0.0;
  int64_t last = -1;
  for (int64_t tile = 0; tile < num_tiles(V); ++tile) {
    const double sum = tile_total(parts, tile);
    if (cum + sum >= target) {
      float w[kItems], r[kItems];
      tile_weights(row, residual ? q : nullptr, tile * kTile, V, d, scale, w, r);
#pragma unroll
      for (int i = 0; i < kItems; ++i) w[i] = residual ? r[i] : w[i];
      const int64_t first = tile * kTile + threadIdx.x * kItems;
      double before = cum + block_exclusive_scan(sum_items(w));
      int64_t found = INT64_MAX;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        before += w[i];
        if (w[i] > 0.0f) last = first + i;
        if (found == INT64_MAX && w[i] > 0.0f && before >= target) found = first + i;
      }
      found = block_reduce(found, Min{});
      if (found != INT64_MAX) return found;
    }
    cum += sum;
  }
  last = block_reduce(last, Max{});
  return last < 0 ? 0 : last;
}

__device__ Sampling row_sampling(const float* temperature, const int64_t* top_k, const float* top_p, int64_t b) {
  return Sampling{temperature[b], top_k[b], top_p[b]};
}

// The token emitted after `accepted` drafts of row b: argmax for greedy rows; else a sample
// of max(scale p - q, 0) at a stop before the draft's end (p if that has no mass), of p at
// the end. `known`: the stop row's distribution if the caller has it, else nullptr.
template <typename T>
__device__ int64_t stop_token(const T* rows, const float* q, const float* u, int64_t b, int64_t accepted, int64_t len,
                              float scale, Sampling s, int64_t K, int64_t V, const RowDist* known, double* parts) {
  const T* row = rows + accepted * V;
  const RowDist d = known != nullptr ? *known : row_dist(row, V, s);
  if (d.argmax >= 0) return d.argmax;  // the residual of a point mass is the point mass
  const bool rejected = accepted < len;
  const float* q_row = rejected ? q + (b * K + accepted) * V : nullptr;
  const int64_t tiles = num_tiles(V);
  tile_sums(row, q_row, V, d, scale, parts);
  const double mass = rejected ? row_total(parts + tiles * kWarps, tiles) : 0.0;
  const bool residual = rejected && static_cast<float>(mass) > kResidualEps;
  const double* sums = residual ? parts + tiles * kWarps : parts;
  return sample_row(row, q_row, V, d, residual, scale, sums, residual ? mass : row_total(parts, tiles),
                    u[b * (K + 1) + K]);
}

__device__ void emit(const int64_t* tokens, int64_t* accepted_out, int64_t* out, int64_t b, int64_t accepted, int64_t y,
                     int64_t K) {
  for (int64_t i = threadIdx.x; i <= K; i += kThreads) out[b * (K + 1) + i] = i < accepted ? tokens[b * K + i] : (i == accepted ? y : -1);
  if (threadIdx.x == 0) accepted_out[b] = accepted;
}

// Token-wise: accept X_j while u_j q_j(X_j) <= p_j(X_j); then the stop token.
template <typename T>
__device__ void token_wise_row(const T* target, const float* q, const int64_t* tokens, int64_t len, Sampling s,
                               const float* u, int64_t* accepted, int64_t* out, int64_t b, int64_t K, int64_t V,
                               double* parts) {
  const T* rows = target + b * (K + 1) * V;
  RowDist d{};
  int64_t j = 0;
  for (; j < len; ++j) {
    d = row_dist(rows + j * V, V, s);
    const int64_t x = tokens[b * K + j];
    const float q_x = q[(b * K + j) * V + x];
    if (!(q_x > 0.0f && u[b * (K + 1) + j] * q_x <= d.prob(rows[j * V + x], x))) break;  // q(x) == 0: reject
  }
  const int64_t y = stop_token(rows, q, u, b, j, len, 1.0f, s, K, V, j < len ? &d : nullptr, parts);
  emit(tokens, accepted, out, b, j, y, K);
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
verify_kernel(const T* target, const float* q, const int64_t* tokens, const int64_t* lens, const float* temperature,
              const int64_t* top_k, const float* top_p, const float* u, int64_t* accepted, int64_t* out, int64_t K,
              int64_t V) {
  extern __shared__ double parts[];
  const int64_t b = blockIdx.x;
  token_wise_row(target, q, tokens, lens[b], row_sampling(temperature, top_k, top_p, b), u, accepted, out, b, K, V,
                 parts);
}

// Block verification (reference/verify_block.py): p_i = min(1, p_{i-1} P_i(X_i) / Q_i(X_i)),
// h_i = r_i / (r_i + 1 - p_i) with r_i = sum max(p_i P_{i+1} - Q_{i+1}, 0), h_L = p_L,
// tau = max{i : u_i <= h_i}.
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
verify_block_kernel(const T* target, const float* q, const int64_t* tokens, const int64_t* lens,
                    const float* temperature, const int64_t* top_k, const float* top_p, const float* u,
                    int64_t* accepted, int64_t* out, int64_t K, int64_t V) {
  extern __shared__ double parts[];
  const int64_t b = blockIdx.x, len = lens[b];
  const Sampling s = row_sampling(temperature, top_k, top_p, b);
  if (s.temperature == 0.0f) {  // point masses: block and token-wise accept the same matching prefix
    token_wise_row(target, q, tokens, len, s, u, accepted, out, b, K, V, parts);
    return;
  }
  const T* rows = target + b * (K + 1) * V;
  const int64_t tiles = num_tiles(V);
  double clipped = 1.0, clipped_tau = 1.0;  // p_j, and p_tau
  int64_t tau = 0;
  RowDist d_tau{};  // row tau's distribution, once computed
  for (int64_t j = 0; j < len; ++j) {  // row j holds P_{j+1}; X_{j+1} = tokens[j]
    const RowDist d = row_dist(rows + j * V, V, s);
    if (j == 0) d_tau = d;
    if (j > 0) {
      tile_sums(rows + j * V, q + (b * K + j) * V, V, d, static_cast<float>(clipped), parts);
      const double r = row_total(parts + tiles * kWarps, tiles), denominator = r + 1.0 - clipped;
      if (static_cast<double>(u[b * (K + 1) + j - 1]) <= (denominator > 0.0 ? r / denominator : 1.0))
        tau = j, clipped_tau = clipped, d_tau = d;
    }
    const int64_t x = tokens[b * K + j];
    const float q_x = q[(b * K + j) * V + x];
    clipped = q_x > 0.0f ? fmin(1.0, clipped * d.prob(rows[j * V + x], x) / q_x) : 0.0;
  }
  if (len > 0 && static_cast<double>(u[b * (K + 1) + len - 1]) <= clipped) tau = len, clipped_tau = clipped;
  const int64_t y = stop_token(rows, q, u, b, tau, len, static_cast<float>(clipped_tau), s, K, V,
                               tau < len ? &d_tau : nullptr, parts);
  emit(tokens, accepted, out, b, tau, y, K);
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
draft_step_kernel(const T* logits, const float* temperature, const int64_t* top_k, const float* top_p,
                  const float* u, int64_t* tokens, float* probs, float* token_prob, float* entropy, float* top1,
                  int64_t V) {
  extern __shared__ double parts[];
  const int64_t b = blockIdx.x;
  const T* row = logits + b * V;
  float* q = probs + b * V;
  // A greedy row's q is the point mass on the argmax; its features are those of the
  // distribution at temperature 1 (reference/draft_step.py).
  Sampling samp = row_sampling(temperature, top_k, top_p, b);
  const bool greedy = samp.temperature == 0.0f;
  if (greedy) samp.temperature = 1.0f;
  const RowDist d = row_dist(row, V, samp);
  // p, and H(p) = sum p (log(sum) - (z - max)) over p > 0.
  const float log_sum = static_cast<float>(-log(d.inv_sum));
  double h = 0.0;
  stream_row(row, V, [&](int64_t i, float x) {
    const float z = scaled(x, d.temperature), p = d.weight(z);
    q[i] = p;
    if (p > 0.0f) h += p * (log_sum - (z - d.max));
  });
  h = block_reduce(h, Sum{});
  int64_t x;
  if (greedy) {
    x = argmax_row(row, V);
    for (int64_t i = threadIdx.x; i < V; i += kThreads) q[i] = i == x ? 1.0f : 0.0f;
  } else {
    tile_sums(row, static_cast<const float*>(nullptr), V, d, 1.0f, parts);
    x = sample_row(row, static_cast<const float*>(nullptr), V, d, false, 1.0f, parts, row_total(parts, num_tiles(V)), u[b]);
  }
  if (threadIdx.x == 0) {
    tokens[b] = x;
    token_prob[b] = d.weight(scaled(to_float(row[x]), d.temperature));  // the formula p was written with
    entropy[b] = static_cast<float>(h);
    top1[b] = static_cast<float>(d.inv_sum);
  }
}

__global__ void philox_kernel(const int64_t* seed, const int64_t* offset, float* out, int64_t n) {
  const int64_t b = blockIdx.x;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    out[b * n + i] = philox_uniform(static_cast<uint64_t>(seed[b]), static_cast<uint64_t>(offset[b]) + i);
}

// Launches kernel<<<B, kThreads>>> with the sampler's shared memory, opted into above 48 KiB
// (the launch fails, saying so, for vocabularies whose tile sums exceed the device's maximum).
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), int64_t B, int64_t V, cudaStream_t stream, Args... args) {
  const size_t bytes = sampler_bytes(V);
  if (bytes > 48 * 1024) {
    const cudaError_t error =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (error != cudaSuccess) return error;
  }
  kernel<<<B, kThreads, bytes, stream>>>(args...);
  return cudaGetLastError();
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
    return launch(block ? verify_block_kernel<T> : verify_kernel<T>, B, V, stream, static_cast<const T*>(target), q,
                  tokens, lens, temperature, top_k, top_p, u, accepted, out, K, V);
  });
}

cudaError_t draft_step(Dtype dtype, const void* logits, const float* temperature, const int64_t* top_k,
                       const float* top_p, const float* u, int64_t* tokens, float* probs, float* token_prob,
                       float* entropy, float* top1, int64_t B, int64_t V, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return launch(draft_step_kernel<T>, B, V, stream, static_cast<const T*>(logits), temperature, top_k, top_p, u,
                  tokens, probs, token_prob, entropy, top1, V);
  });
}

cudaError_t philox_uniforms(const int64_t* seed, const int64_t* offset, float* out, int64_t B, int64_t n,
                            cudaStream_t stream) {
  if (B == 0 || n == 0) return cudaSuccess;
  philox_kernel<<<B, 128, 0, stream>>>(seed, offset, out, n);
  return cudaGetLastError();
}

}  // namespace specdec::cuda
