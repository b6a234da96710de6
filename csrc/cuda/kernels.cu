// CUDA kernels: one group of thread blocks per batch row; no torch headers (see kernels.h).
//
// A group is a thread block cluster on sm_90 and later (one block before): each block streams
// its slice of the vocabulary (whole sampling tiles) and the blocks combine their partial values
// through distributed shared memory. Small batches get up to kCluster blocks per request (see
// group_size), so a row of a 262,144-token vocabulary is read by 8 SMs at once rather than one.
//
// The math is specdec_fast/sampling.py and specdec_fast/reference/verify.py, the
// algorithms those of csrc/cpu/sampling.h and triton_kernels/sampling.py:
// p(x) = kept(x) ? exp(z_x - max) / sum : 0 with z = logits / temperature, kept(x) iff
// key(z_x) >= min_key, the sum over kept x in double; top-k / top-p thresholds by bisection
// on the 32-bit key; sampling by inverse CDF cumulated in double. Every decision a group
// takes is made on group-reduced values that all its threads hold, so control flow
// around __syncthreads() and cluster barriers is uniform.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "../philox.h"
#include "../verify_status.h"
#include "kernels.h"

namespace specdec::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kCluster = 8;  // blocks per request where clusters exist (8: the portable maximum)
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 32;  // loads in flight per thread in a streaming pass over a row
constexpr int kItems = 16;   // consecutive entries per thread in a sampling tile
constexpr int kTile = kThreads * kItems;
constexpr float kResidualEps = 1e-6f;  // reference/verify.py RESIDUAL_EPS

// 2 for NaN, 1 for +inf, else 0: reduced with Max over a row, NaN wins.
__device__ __forceinline__ int bad_value(float z) { return isnan(z) ? 2 : (z == INFINITY ? 1 : 0); }

// The status of a row whose values reduced to `bad` (bad_value, group-reduced) and max `m`.
__device__ __forceinline__ Status value_status(int bad, float m) {
  return bad == 2 ? kNaN : bad == 1 ? kPosInfinity : m == -INFINITY ? kAllNegInf : kOk;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Sampling tiles: kTile consecutive entries, kItems consecutive ones per thread, so that
// the cumulative sum over a tile is a sum per thread, then a scan over the block.
__host__ __device__ constexpr int64_t num_tiles(int64_t V) { return (V + kTile - 1) / kTile; }

// The tiles each block of a group of `size` blocks covers (the last blocks may cover fewer).
__host__ __device__ constexpr int64_t tiles_per_block(int64_t V, int size) { return (num_tiles(V) + size - 1) / size; }

// The blocks that share one request (see the file comment): this block's rank and their number.
struct Group {
  int rank, size;
};

__device__ Group this_group() {
#if __CUDA_ARCH__ >= 900
  const cg::cluster_group cluster = cg::this_cluster();
  return {static_cast<int>(cluster.block_rank()), static_cast<int>(cluster.num_blocks())};
#else
  return {0, 1};
#endif
}

// This block's part of a row: entries [lo, hi), which are the whole tiles [tile0, tile0 + tiles).
struct Slice {
  int64_t lo, hi, tile0, tiles;
};

__device__ Slice this_slice(int64_t V, Group g) {
  const int64_t per = tiles_per_block(V, g.size);
  const int64_t tile0 = min(num_tiles(V), g.rank * per), end = min(num_tiles(V), tile0 + per);
  return {min(V, tile0 * kTile), min(V, end * kTile), tile0, end - tile0};
}

// Streaming passes read rows in chunks of kChunk entries. For 2-byte logits on sm_90 and later a
// chunk goes through shared memory: thread 0 keeps kStages bulk copies (cp.async.bulk, the
// Tensor Memory Accelerator) in flight, where one 2-byte load per entry and thread left each
// block issue-bound (measured on an H200: 1.2-1.5x faster at B = 128). fp32 rows measured the
// same either way (geometric mean 1.00 over the microbenchmark's grid), so they keep each
// thread's own kUnroll loads and need no stages in shared memory.
constexpr int kChunk = kThreads * kUnroll;
constexpr int kStages = 4;
constexpr int kStageBytes = kChunk * 2 + 32;  // a chunk of 2-byte entries, widened by up to 14 bytes at each end

__host__ __device__ constexpr size_t stream_bytes(bool bulk) { return bulk ? size_t{kStages} * kStageBytes : 0; }
__host__ __device__ constexpr bool bulk_dtype(size_t bytes) { return bytes == 2; }

// Dynamic shared memory: the stream's stages (sm_90 and later), then the sampler's tile sums.
extern __shared__ __align__(16) unsigned char dynamic_smem[];

#if __CUDA_ARCH__ >= 900
constexpr bool kBulk = true;

// The stages' barriers and the number of chunks this block has streamed (chunk k uses stage
// k % kStages, whose barrier then completes its phase k / kStages).
struct StreamState {
  uint64_t full[kStages];
  uint32_t count;
};
__shared__ StreamState stream_state;

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies [begin, end) of row's entries, widened to whole 16-byte words, into `stage`.
template <typename T>
__device__ void bulk_load(int stage, const T* row, int64_t begin, int64_t end) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(row + begin) & ~uintptr_t{15};
  const uintptr_t last = (reinterpret_cast<uintptr_t>(row + end) + 15) & ~uintptr_t{15};
  const uint32_t bar = smem_address(&stream_state.full[stage]), bytes = static_cast<uint32_t>(last - first);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_address(dynamic_smem + stage * kStageBytes)), "l"(first), "r"(bytes), "r"(bar)
               : "memory");
}

__device__ void wait_stage(int stage, uint32_t parity) {
  const uint32_t bar = smem_address(&stream_state.full[stage]);
  uint32_t done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}
#else
constexpr bool kBulk = false;
#endif

// Every kernel's first step: the stream's barriers.
__device__ void init_stream() {
#if __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
    for (int stage = 0; stage < kStages; ++stage)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_address(&stream_state.full[stage])));
    stream_state.count = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
#endif
}

template <typename T>
__device__ double* sampler_parts() {
  return reinterpret_cast<double*>(dynamic_smem + stream_bytes(kBulk && bulk_dtype(sizeof(T))));
}

// How many of this thread's kUnroll entries of a chunk, first + r kThreads, lie before hi.
__device__ __forceinline__ int entries_from(int64_t first, int64_t hi) {
  return first < hi ? static_cast<int>(min(int64_t{kUnroll}, (hi - first + kThreads - 1) / kThreads)) : 0;
}

// Streams this thread's entries i = lo + threadIdx.x + n kThreads of row[lo, hi) in chunks:
// chunk(first, x, n) gets x[r] = row[first + r kThreads] for r < n and -inf for r >= n (n <
// kUnroll only at the slice's end). Called by every thread of the block.
template <typename T, typename F>
__device__ __forceinline__ void stream_chunks(const T* row, const Slice& s, F chunk) {
  const int64_t chunks = (s.hi - s.lo + kChunk - 1) / kChunk;
#if __CUDA_ARCH__ >= 900
  if constexpr (bulk_dtype(sizeof(T))) {
    const uint32_t base = stream_state.count;
    // Where a chunk starts in its stage: the row's offset in its 16-byte word (slices and chunks
    // start at multiples of 16 bytes from the row's start).
    const int skew = static_cast<int>(reinterpret_cast<uintptr_t>(row) % 16 / sizeof(T));
    if (threadIdx.x == 0)
      for (int64_t c = 0; c < min(chunks, int64_t{kStages}); ++c)
        bulk_load((base + c) % kStages, row, s.lo + c * kChunk, min(s.hi, s.lo + (c + 1) * kChunk));
    for (int64_t c = 0; c < chunks; ++c) {
      const int stage = (base + c) % kStages;
      wait_stage(stage, (base + c) / kStages % 2);
      const T* buffer = reinterpret_cast<const T*>(dynamic_smem + stage * kStageBytes) + skew;
      const int64_t start = s.lo + c * kChunk, first = start + threadIdx.x;
      const int n = entries_from(first, s.hi);
      float x[kUnroll];
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) x[r] = r < n ? to_float(buffer[threadIdx.x + r * kThreads]) : -INFINITY;
      chunk(first, x, n);
      __syncthreads();  // the stage is read; after the first chunk, every thread has read `base`
      if (threadIdx.x == 0) {
        if (c == 0) stream_state.count = base + static_cast<uint32_t>(chunks);
        if (c + kStages < chunks) bulk_load(stage, row, start + kStages * kChunk, min(s.hi, start + (kStages + 1) * kChunk));
      }
    }
    if (chunks > 0) __syncthreads();  // the count is written before any thread reads it again
  } else
#endif
  {
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t first = s.lo + c * kChunk + threadIdx.x;
      const int n = entries_from(first, s.hi);
      float x[kUnroll];
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) x[r] = r < n ? to_float(row[first + r * kThreads]) : -INFINITY;
      chunk(first, x, n);
    }
  }
}

// Calls f(i, row[i] as float) for this thread's entries of the slice, in increasing i.
template <typename T, typename F>
__device__ __forceinline__ void stream_row(const T* row, const Slice& s, F f) {
  stream_chunks(row, s, [&](int64_t first, const float (&x)[kUnroll], int n) {
#pragma unroll
    for (int r = 0; r < kUnroll; ++r)
      if (r < n) f(first + r * kThreads, x[r]);
  });
}

// x[i] = row[first + i] for i < kItems (0 past end), in 16-byte loads where the entries allow.
template <typename T>
__device__ __forceinline__ void load_items(const T* row, int64_t first, int64_t end, float (&x)[kItems]) {
  static_assert(sizeof(T) * kItems % 16 == 0, "a thread's items are whole 16-byte words");
  const T* src = row + first;
  if (first + kItems <= end && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    alignas(16) T v[kItems];
#pragma unroll
    for (int w = 0; w < static_cast<int>(sizeof(v) / 16); ++w)
      reinterpret_cast<uint4*>(v)[w] = reinterpret_cast<const uint4*>(src)[w];
#pragma unroll
    for (int i = 0; i < kItems; ++i) x[i] = to_float(v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kItems; ++i) x[i] = first + i < end ? to_float(src[i]) : 0.0f;
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

// Calls f(rank, v of that block) for each block of the group in rank order (every thread of a
// block passes the same v). The second barrier keeps each block's slot (and the block) alive
// until the other blocks have read it.
template <typename V, typename F>
__device__ void for_each_block(V v, F f) {
#if __CUDA_ARCH__ >= 900
  const cg::cluster_group cluster = cg::this_cluster();
  const int size = static_cast<int>(cluster.num_blocks());
  if (size > 1) {
    __shared__ V slot;
    if (threadIdx.x == 0) slot = v;
    cluster.sync();
    V x[kCluster];
#pragma unroll
    for (int r = 0; r < kCluster; ++r)
      if (r < size) x[r] = *cluster.map_shared_rank(&slot, r);  // all reads in flight at once
    cluster.sync();
#pragma unroll
    for (int r = 0; r < kCluster; ++r)
      if (r < size) f(r, x[r]);
    return;
  }
#endif
  f(0, v);
}

// The reduction of v over the group, returned to every thread of every block: the blocks'
// values combined in rank order, so each block gets the same bits.
template <typename V, typename Op>
__device__ V group_reduce(V v, Op op) {
  V out{};
  for_each_block(block_reduce(v, op), [&](int r, V x) { out = r == 0 ? x : op(out, x); });
  return out;
}

// A sum over the group of one value per block, added in rank order: the sum over the blocks
// before this one, this block's value, the total. before + local is bitwise the next block's before.
struct Prefix {
  double before, local, total;
};

__device__ Prefix group_prefix(double local, Group g) {
  Prefix p{0.0, local, 0.0};
  for_each_block(local, [&](int r, double x) {
    if (r == g.rank) p.before = p.total;
    p.total += x;
  });
  return p;
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
  Status status;  // kNaN, kPosInfinity, kAllNegInf: the row cannot be warped (the rest is undefined)

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
__device__ int64_t argmax_row(const T* row, const Slice& s, Status* status = nullptr) {
  float best = -INFINITY;
  int64_t best_idx = INT64_MAX;
  int bad = 0;
  stream_row(row, s, [&](int64_t i, float x) {
    if (x > best || best_idx == INT64_MAX) best = x, best_idx = i;  // strided: the first of a thread's ties
    bad = max(bad, bad_value(x));
  });
  const float m = group_reduce(best, Max{});
  if (status != nullptr) *status = value_status(group_reduce(bad, Max{}), m);
  return group_reduce(best == m ? best_idx : INT64_MAX, Min{});
}

// Sum over kept entries with key > probe of 1, or (use_p) exp(z - m) / total in double.
template <typename T>
__device__ double weight_above(const T* row, const Slice& s, float t, int64_t probe, uint32_t min_key, float m,
                               double total, bool use_p) {
  double acc = 0.0;
  stream_row(row, s, [&](int64_t, float x) {
    const float z = scaled(x, t);
    const uint32_t key = order_key(z);
    if (key > probe && key >= min_key) acc += use_p ? exp(static_cast<double>(z) - m) / total : 1.0;
  });
  return group_reduce(acc, Sum{});
}

// The smallest key k with weight_above(k) < limit, by bisection on the key's 32 bits.
template <typename T>
__device__ uint32_t smallest_kept_key(const T* row, const Slice& s, float t, double limit, uint32_t min_key, float m,
                                      double total, bool use_p) {
  int64_t below = -1;  // the largest key known to fail the rule
  for (int bit = 31; bit >= 0; --bit) {
    const int64_t probe = below + (int64_t{1} << bit);
    if (!(weight_above(row, s, t, probe, min_key, m, total, use_p) < limit)) below = probe;
  }
  return static_cast<uint32_t>(below + 1);
}

template <typename T>
__device__ double kept_sum(const T* row, const Slice& s, const RowDist& d) {
  double acc = 0.0;
  stream_row(row, s, [&](int64_t, float x) {
    const float z = scaled(x, d.temperature);
    if (order_key(z) >= d.min_key && z != -INFINITY) acc += expf(z - d.max);
  });
  return group_reduce(acc, Sum{});
}

template <typename T>
__device__ RowDist row_dist(const T* row, int64_t V, const Slice& sl, Sampling s) {
  RowDist d{-1, s.temperature, 0u, 0.0f, 1.0, kOk};
  if (s.temperature == 0.0f) {
    d.argmax = argmax_row(row, sl, &d.status);
    return d;
  }
  if ((s.top_k <= 0 || s.top_k >= V) && s.top_p >= 1.0f) {  // the hot path: one read, online max and sum
    // The running max moves once per chunk, so a chunk's exps are independent of each other
    // (no chain of dependent instructions from one entry to the next).
    float m = -INFINITY;
    double sum = 0.0;
    int bad = 0;
    stream_chunks(row, sl, [&](int64_t, const float (&x)[kUnroll], int) {
      float z[kUnroll], chunk_max = -INFINITY;
#pragma unroll
      for (int r = 0; r < kUnroll; ++r)
        z[r] = scaled(x[r], s.temperature), chunk_max = fmaxf(chunk_max, z[r]), bad = max(bad, bad_value(z[r]));
      if (chunk_max == -INFINITY) return;  // no finite entry
      if (chunk_max > m) sum = m == -INFINITY ? 0.0 : sum * exp(static_cast<double>(m) - chunk_max), m = chunk_max;
      double part = 0.0;
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) part += expf(z[r] - m);  // -inf entries add 0
      sum += part;
    });
    d.max = group_reduce(m, Max{});
    d.status = value_status(group_reduce(bad, Max{}), d.max);
    sum = m == -INFINITY ? 0.0 : sum * exp(static_cast<double>(m) - d.max);
    d.inv_sum = 1.0 / group_reduce(sum, Sum{});
    return d;
  }
  float m = -INFINITY;
  int bad = 0;
  stream_row(row, sl, [&](int64_t, float x) {
    const float z = scaled(x, s.temperature);
    m = fmaxf(m, z), bad = max(bad, bad_value(z));
  });
  d.max = group_reduce(m, Max{});  // the max is always kept
  d.status = value_status(group_reduce(bad, Max{}), d.max);
  if (d.status != kOk) return d;
  if (s.top_k > 0 && s.top_k < V)
    d.min_key = smallest_kept_key(row, sl, s.temperature, static_cast<double>(s.top_k), 0u, d.max, 1.0, false);
  if (s.top_p < 1.0f) {  // the kept set is decided on p in double, as in the reference
    double total = 0.0;
    stream_row(row, sl, [&](int64_t, float x) {
      const float z = scaled(x, s.temperature);
      if (order_key(z) >= d.min_key) total += exp(static_cast<double>(z) - d.max);
    });
    total = group_reduce(total, Sum{});
    d.min_key = smallest_kept_key(row, sl, s.temperature, static_cast<double>(s.top_p), d.min_key, d.max, total, true);
  }
  d.inv_sum = 1.0 / kept_sum(row, sl, d);
  return d;
}

// The sampler's shared memory: the warps' sums of each of a block's tiles' weights, p then residual.
__host__ __device__ constexpr size_t sampler_bytes(int64_t V, int size) {
  return 2 * tiles_per_block(V, size) * kWarps * sizeof(double);
}

// The draft row a residual is taken against: q [V], or (q == nullptr, point >= 0) the point
// mass on token `point`; neither (q == nullptr, point < 0): no residual.
struct Draft {
  const float* q;
  int64_t point;
  __device__ bool any() const { return q != nullptr || point >= 0; }
};

// This thread's items of the tile at `start`: p[i] = p(x), r[i] = max(scale p(x) - q(x), 0)
// if the draft has a row, x = start + threadIdx.x * kItems + i; 0 from `end` on. Returns the
// count of the items whose q is NaN, negative or infinite.
template <typename T>
__device__ __forceinline__ int tile_weights(const T* row, Draft draft, int64_t start, int64_t end, const RowDist& d,
                                            float scale, float (&p)[kItems], float (&r)[kItems]) {
  const int64_t first = start + threadIdx.x * kItems;
  float x[kItems], qx[kItems];
  load_items(row, first, end, x);
  if (draft.q != nullptr) load_items(draft.q, first, end, qx);
  int bad = 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (draft.q == nullptr) qx[i] = first + i == draft.point ? 1.0f : 0.0f;
    bad += !(qx[i] >= 0.0f && qx[i] < INFINITY);
    p[i] = first + i < end ? d.weight(scaled(x[i], d.temperature)) : 0.0f;
    r[i] = draft.any() ? fmaxf(scale * p[i] - qx[i], 0.0f) : 0.0f;
  }
  return bad;
}

__device__ __forceinline__ double sum_items(const float (&w)[kItems]) {
  double sum = 0.0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) sum += w[i];
  return sum;
}

// One read of the slice: records in `parts` each warp's sum of each tile's weights, p and (if
// the draft has a row) max(scale p - q, 0), in the order the sampler's scan adds them. Returns
// (to every thread of the group) whether q holds a NaN, negative or infinite value.
template <typename T>
__device__ bool tile_sums(const T* row, Draft draft, const Slice& s, const RowDist& d, float scale, double* parts) {
  const int warp = threadIdx.x >> 5;
  int bad = 0;
  __syncthreads();  // the readers of the previous sums are done
  for (int64_t t = 0; t < s.tiles; ++t) {
    float p[kItems], r[kItems];
    bad += tile_weights(row, draft, (s.tile0 + t) * kTile, s.hi, d, scale, p, r);
    const double sp = warp_inclusive_scan(sum_items(p)), sr = warp_inclusive_scan(sum_items(r));
    if ((threadIdx.x & 31) == 31) parts[t * kWarps + warp] = sp, parts[(s.tiles + t) * kWarps + warp] = sr;
  }
  __syncthreads();
  return group_reduce(bad, Max{}) > 0;
}

// A tile's total from the warps' sums (`parts` of one weight kind), added as block_exclusive_scan does.
__device__ __forceinline__ double tile_total(const double* parts, int64_t tile) {
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += parts[tile * kWarps + w];
  return total;
}

// The group's sums of one weight kind whose tile sums (of this block's slice) are `parts`.
__device__ Prefix weight_total(const double* parts, const Slice& s, Group g) {
  double local = 0.0;
  for (int64_t t = 0; t < s.tiles; ++t) local += tile_total(parts, t);
  return group_prefix(local, g);
}

// Inverse CDF: the smallest x with cumsum(w)[x] >= u * total and w[x] > 0, in double, where w
// is p or (residual) max(scale p - q, 0), `parts` holds its tile sums (tile_sums) and `w_sums`
// its sums over the group. Only the block whose slice holds the target reads it, skipping the
// tiles before the target's by their sums; the last entry of positive weight in that slice
// catches rounding past its end.
template <typename T>
__device__ int64_t sample_row(const T* row, Draft draft, const Slice& s, const RowDist& d, bool residual,
                              float scale, const double* parts, Prefix w_sums, float u) {
  const double target = static_cast<double>(u) * w_sums.total;
  int64_t found = INT64_MAX, last = -1;
  if (w_sums.before < target && target <= w_sums.before + w_sums.local) {
    int64_t last_tile = -1;  // the slice's last tile of positive weight: read even if rounding leaves cum short
    for (int64_t t = 0; t < s.tiles; ++t)
      if (tile_total(parts, t) > 0.0) last_tile = t;
    double cum = w_sums.before;
    for (int64_t t = 0; t <= last_tile; ++t) {
      const double sum = tile_total(parts, t);
      if (cum + sum >= target || t == last_tile) {
        float p[kItems], r[kItems];
        tile_weights(row, residual ? draft : Draft{nullptr, -1}, (s.tile0 + t) * kTile, s.hi, d, scale, p, r);
#pragma unroll
        for (int i = 0; i < kItems; ++i) p[i] = residual ? r[i] : p[i];
        const int64_t first = (s.tile0 + t) * kTile + threadIdx.x * kItems;
        double before = cum + block_exclusive_scan(sum_items(p));
#pragma unroll
        for (int i = 0; i < kItems; ++i) {
          before += p[i];
          if (p[i] > 0.0f) last = first + i;
          if (found == INT64_MAX && p[i] > 0.0f && before >= target) found = first + i;
        }
        if (block_reduce(found, Min{}) != INT64_MAX) break;
      }
      cum += sum;
    }
  }
  found = group_reduce(found, Min{});
  if (found != INT64_MAX) return found;
  last = group_reduce(last, Max{});
  return last < 0 ? 0 : last;
}

__device__ Sampling row_sampling(const float* temperature, const int64_t* top_k, const float* top_p, int64_t b) {
  return Sampling{temperature[b], top_k[b], top_p[b]};
}

// What a group's blocks share about the request they verify.
struct Request {
  int64_t b, K, V;
  Group g;
  Slice s;
};

__device__ Request this_request(int64_t K, int64_t V) {
  const Group g = this_group();
  return {blockIdx.x / g.size, K, V, g, this_slice(V, g)};
}

// check_row and draft_prob (../verify_status.h) read the same values in every thread of a group,
// so their results are uniform over it.

// The token emitted after `accepted` drafts of the request: argmax for greedy rows; else a
// sample of max(scale p - q, 0) at a stop before the draft's end (p if that has no mass), of p
// at the end. q: the request's [K, V] or nullptr (a point mass at each drafted token).
// `known`: the stop row's distribution if the caller has it, else nullptr. -1 with *status set
// if the stop row or its q holds bad values.
template <typename T>
__device__ int64_t stop_token(const T* rows, const float* q, const int64_t* tokens, const float* u, const Request& req,
                              int64_t accepted, int64_t len, float scale, Sampling s, const RowDist* known,
                              double* parts, Status* status) {
  const int64_t V = req.V;
  const T* row = rows + accepted * V;
  const RowDist d = known != nullptr ? *known : row_dist(row, V, req.s, s);
  if (d.status != kOk) return *status = d.status, -1;
  if (d.argmax >= 0) return d.argmax;  // the residual of a point mass is the point mass
  const bool rejected = accepted < len;
  const Draft draft = !rejected ? Draft{nullptr, -1}
                      : q == nullptr ? Draft{nullptr, tokens[accepted]} : Draft{q + accepted * V, -1};
  double* residual_parts = parts + req.s.tiles * kWarps;
  if (tile_sums(row, draft, req.s, d, scale, parts)) return *status = kBadDraft, -1;
  const Prefix mass = rejected ? weight_total(residual_parts, req.s, req.g) : Prefix{};
  const bool residual = rejected && static_cast<float>(mass.total) > kResidualEps;
  const Prefix sums = residual ? mass : weight_total(parts, req.s, req.g);
  return sample_row(row, draft, req.s, d, residual, scale, residual ? residual_parts : parts, sums, u[req.K]);
}

__device__ void emit(const int64_t* tokens, int64_t* accepted_out, int64_t* out, int64_t* status_out,
                     const Request& req, int64_t accepted, int64_t y, Status status) {
  if (req.g.rank != 0) return;
  const int64_t b = req.b, K = req.K;
  for (int64_t i = threadIdx.x; i <= K; i += kThreads) out[b * (K + 1) + i] = i < accepted ? tokens[i] : (i == accepted ? y : -1);
  if (threadIdx.x == 0) accepted_out[b] = accepted, status_out[b] = status;
}

// The request's rows: target [K+1, V], q [K, V] (nullptr for a point-mass request), tokens [K], u [K+1].
template <typename T>
struct Rows {
  const T* target;
  const float* q;
  const int64_t* tokens;
  const float* u;
};

template <typename T>
__device__ Rows<T> request_rows(const T* target, const float* q, const bool* point_mass, const int64_t* tokens,
                                const float* u, const Request& req) {
  const int64_t b = req.b, K = req.K, V = req.V;
  return {target + b * (K + 1) * V, q == nullptr || point_mass[b] ? nullptr : q + b * K * V, tokens + b * K,
          u + b * (K + 1)};
}

// Token-wise: accept X_j while u_j q_j(X_j) <= p_j(X_j); then the stop token.
template <typename T>
__device__ void token_wise_row(const Rows<T>& r, int64_t len, Sampling s, int64_t* accepted, int64_t* out,
                               int64_t* status_out, const Request& req, double* parts) {
  const int64_t V = req.V;
  Status status = check_row(r.tokens, len, req.K, V, r.u);
  RowDist d{};
  int64_t j = 0, y = -1;
  for (; j < len && status == kOk; ++j) {
    d = row_dist(r.target + j * V, V, req.s, s);
    const int64_t x = r.tokens[j];
    const float q_x = draft_prob(r.q, j, V, x);
    status = d.status != kOk ? d.status : isnan(q_x) ? kBadDraft : kOk;
    if (status != kOk || !(q_x > 0.0f && r.u[j] * q_x <= d.prob(r.target[j * V + x], x))) break;  // q(x) == 0: reject
  }
  if (status == kOk) y = stop_token(r.target, r.q, r.tokens, r.u, req, j, len, 1.0f, s, j < len ? &d : nullptr, parts, &status);
  emit(r.tokens, accepted, out, status_out, req, j, y, status);
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
verify_kernel(const T* target, const float* q, const bool* point_mass, const int64_t* tokens, const int64_t* lens,
              const float* temperature, const int64_t* top_k, const float* top_p, const float* u, int64_t* accepted,
              int64_t* out, int64_t* status, int64_t K, int64_t V) {
  init_stream();
  double* parts = sampler_parts<T>();
  const Request req = this_request(K, V);
  token_wise_row(request_rows(target, q, point_mass, tokens, u, req), lens[req.b],
                 row_sampling(temperature, top_k, top_p, req.b), accepted, out, status, req, parts);
}

// Block verification (reference/verify_block.py): p_i = min(1, p_{i-1} P_i(X_i) / Q_i(X_i)),
// h_i = r_i / (r_i + 1 - p_i) with r_i = sum max(p_i P_{i+1} - Q_{i+1}, 0) (for a point mass
// p_i (1 - P_{i+1}(X_{i+1})), without a pass over the row), h_L = p_L, tau = max{i : u_i <= h_i}.
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
verify_block_kernel(const T* target, const float* q, const bool* point_mass, const int64_t* tokens,
                    const int64_t* lens, const float* temperature, const int64_t* top_k, const float* top_p,
                    const float* u, int64_t* accepted, int64_t* out, int64_t* status_out, int64_t K, int64_t V) {
  init_stream();
  double* parts = sampler_parts<T>();
  const Request req = this_request(K, V);
  const int64_t len = lens[req.b];
  const Sampling s = row_sampling(temperature, top_k, top_p, req.b);
  const Rows<T> r = request_rows(target, q, point_mass, tokens, u, req);
  if (s.temperature == 0.0f) {  // point masses: block and token-wise accept the same matching prefix
    token_wise_row(r, len, s, accepted, out, status_out, req, parts);
    return;
  }
  Status status = check_row(r.tokens, len, K, V, r.u);
  double clipped = 1.0, clipped_tau = 1.0;  // p_j, and p_tau
  int64_t tau = 0, y = -1;
  RowDist d_tau{};  // row tau's distribution, once computed
  for (int64_t j = 0; j < len && status == kOk; ++j) {  // row j holds P_{j+1}; X_{j+1} = tokens[j]
    const RowDist d = row_dist(r.target + j * V, V, req.s, s);
    const int64_t x = r.tokens[j];
    const float q_x = draft_prob(r.q, j, V, x), p_x = d.prob(r.target[j * V + x], x);
    status = d.status != kOk ? d.status : isnan(q_x) ? kBadDraft : kOk;
    if (status != kOk) break;
    if (j == 0) d_tau = d;
    if (j > 0) {
      double residual = clipped * (1.0 - static_cast<double>(p_x));  // r_j of a point mass
      if (r.q != nullptr) {
        if (tile_sums(r.target + j * V, Draft{r.q + j * V, -1}, req.s, d, static_cast<float>(clipped), parts)) {
          status = kBadDraft;
          break;
        }
        residual = weight_total(parts + req.s.tiles * kWarps, req.s, req.g).total;
      }
      const double denominator = residual + 1.0 - clipped;
      if (static_cast<double>(r.u[j - 1]) <= (denominator > 0.0 ? residual / denominator : 1.0))
        tau = j, clipped_tau = clipped, d_tau = d;
    }
    clipped = q_x > 0.0f ? fmin(1.0, clipped * p_x / q_x) : 0.0;
  }
  if (status == kOk) {
    if (len > 0 && static_cast<double>(r.u[len - 1]) <= clipped) tau = len, clipped_tau = clipped;
    y = stop_token(r.target, r.q, r.tokens, r.u, req, tau, len, static_cast<float>(clipped_tau), s,
                   tau < len ? &d_tau : nullptr, parts, &status);
  }
  emit(r.tokens, accepted, out, status_out, req, tau, y, status);
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
draft_step_kernel(const T* logits, const float* temperature, const int64_t* top_k, const float* top_p,
                  const float* u, int64_t* tokens, float* probs, float* token_prob, float* entropy, float* top1,
                  int64_t V) {
  init_stream();
  double* parts = sampler_parts<T>();
  const Request req = this_request(0, V);
  const int64_t b = req.b;
  const T* row = logits + b * V;
  float* q = probs + b * V;
  // A greedy row's q is the point mass on the argmax; its features are those of the
  // distribution at temperature 1 (reference/draft_step.py).
  Sampling samp = row_sampling(temperature, top_k, top_p, b);
  const bool greedy = samp.temperature == 0.0f;
  if (greedy) samp.temperature = 1.0f;
  const RowDist d = row_dist(row, V, req.s, samp);
  // p, and H(p) = sum p (log(sum) - (z - max)) over p > 0.
  const float log_sum = static_cast<float>(-log(d.inv_sum));
  double h = 0.0;
  stream_row(row, req.s, [&](int64_t i, float x) {
    const float z = scaled(x, d.temperature), p = d.weight(z);
    q[i] = p;
    if (p > 0.0f) h += p * (log_sum - (z - d.max));
  });
  h = group_reduce(h, Sum{});
  int64_t x;
  if (greedy) {
    x = argmax_row(row, req.s);
    for (int64_t i = req.s.lo + threadIdx.x; i < req.s.hi; i += kThreads) q[i] = i == x ? 1.0f : 0.0f;
  } else {
    tile_sums(row, Draft{nullptr, -1}, req.s, d, 1.0f, parts);
    x = sample_row(row, Draft{nullptr, -1}, req.s, d, false, 1.0f, parts,
                   weight_total(parts, req.s, req.g), u[b]);
  }
  if (req.g.rank == 0 && threadIdx.x == 0) {
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

// The blocks per request: a cluster of up to kCluster where the kernel was compiled for sm_90 or
// later, as many as keep the batch's blocks within one per SM (a batch of SM-count requests
// already keeps every SM busy, and a cluster's barriers cost more than its blocks save), and
// no more than the vocabulary's tiles.
int group_size(const cudaFuncAttributes& kernel, int64_t B, int64_t V) {
  int device = 0, sms = 1;
  if (kernel.ptxVersion < 90 || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 1;
  int size = 1;
  while (size < kCluster && B * size * 2 <= sms && num_tiles(V) >= size * 2) size *= 2;
  return size;
}

// Launches kernel (its first parameter the rows of T) with a group of blocks per request and
// the stream's and sampler's shared memory, opted into above 48 KiB (the launch fails, saying so, for vocabularies whose tile
// sums exceed the device's maximum).
template <typename T, typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(const T*, Params...), int64_t B, int64_t V, cudaStream_t stream, const T* first,
                   Args... args) {
  cudaFuncAttributes attributes;
  cudaError_t error = cudaFuncGetAttributes(&attributes, kernel);
  if (error != cudaSuccess) return error;
  const int size = group_size(attributes, B, V);
  const size_t bytes = stream_bytes(attributes.ptxVersion >= 90 && bulk_dtype(sizeof(T))) + sampler_bytes(V, size);
  if (bytes > 48 * 1024) {
    error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (error != cudaSuccess) return error;
  }
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = size, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(B * size));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = bytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = size > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<const T*>(first), static_cast<Params>(args)...);
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

cudaError_t verify(Dtype dtype, const void* target, const float* q, const bool* point_mass, const int64_t* tokens,
                   const int64_t* lens, const float* temperature, const int64_t* top_k, const float* top_p,
                   const float* u, int64_t* accepted, int64_t* out, int64_t* status, int64_t B, int64_t K, int64_t V,
                   bool block, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return launch(block ? verify_block_kernel<T> : verify_kernel<T>, B, V, stream, static_cast<const T*>(target), q,
                  point_mass, tokens, lens, temperature, top_k, top_p, u, accepted, out, status, K, V);
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
