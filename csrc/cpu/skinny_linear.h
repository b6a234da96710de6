// y = x w^T for a few rows of x (a verification pass: the last token plus the drafts), in
// one pass over the weights. BLAS libraries treat such skinny products as M separate
// matrix-vector products (each reading all of w), or pack w first; both read w several
// times where once is enough, and the weights are what a small-batch pass is bound by.
//
// Every y[m, n] is summed in the same order whatever M is, so a token's outputs do not
// depend on how many tokens share the pass.
#pragma once

#include <cstdint>
#include <utility>

#include "simd.h"

namespace specdec {

constexpr int kSkinnyMaxRows = 16;

// Weight lanes as fp32: fp32 as they are, bf16 shifted into the high half (exact), int8
// sign-extended and converted (exact). GCC 12 scalarises vector-extension conversions from
// int8, hence the intrinsics.
inline vfloat load_weights(const float* p) { return load(p); }
inline vfloat load_weights(const BFloat16* p) {
#if defined(__AVX512F__)
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return (vfloat)_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
#elif defined(__AVX2__)
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return (vfloat)_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
#else
  vfloat v;
  for (int l = 0; l < kWidth; ++l) v[l] = to_float(p[l]);
  return v;
#endif
}
inline vfloat load_weights(const int8_t* p) {
#if defined(__AVX512F__)
  return (vfloat)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return (vfloat)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  vfloat v;
  for (int l = 0; l < kWidth; ++l) v[l] = p[l];
  return v;
#endif
}

// How far ahead of the row being read to prefetch weights (into L2), one cache line per
// line read. With the hardware prefetcher alone, the 211 weights of a SmolLM2-135M pass
// streamed at 20 GB/s for one input row and 15 GB/s for two on a 2-core Xeon VM (more
// arithmetic per line, fewer lines in flight); with this, 22-25 GB/s for 1-4 rows.
constexpr int64_t kPrefetchBytes = 16384;

// Rows [n0, n1) of y [M, N] from x [M, K] fp32 and w [N, K] (fp32, bf16, or int8 with a scale
// per output row: y[m, n] = scale[n] * sum_k x[m, k] w[n, k]), all row-major. The products
// are accumulated by explicit FMA (simd.h) and nothing else is contracted: the compiler would
// fuse some instantiations and not others, and the sums must not depend on M. One FMA per
// weight vector and row (not a multiply and an add) keeps a 5-row pass of bf16 or int8
// weights, which costs a conversion per vector too, near the memory bound.
template <int M, typename W>
__attribute__((optimize("fp-contract=off"))) void skinny_linear_rows(const float* x, const W* w, const float* scale, float* y,
                                                                      int64_t K, int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const W* row = w + n * K;
    vfloat acc[M];
    for (int m = 0; m < M; ++m) acc[m] = vfloat{};
    int64_t k = 0;
    for (; k + kWidth <= K; k += kWidth) {
      if ((k * sizeof(W)) % 64 == 0) __builtin_prefetch(reinterpret_cast<const char*>(row + k) + kPrefetchBytes, 0, 2);
      const vfloat wk = load_weights(row + k);
      for (int m = 0; m < M; ++m) acc[m] = fma(wk, load(x + m * K + k), acc[m]);
    }
    for (int m = 0; m < M; ++m) {
      float sum = reduce_add(acc[m]);
      for (int64_t j = k; j < K; ++j) sum += to_float(row[j]) * x[m * K + j];
      y[m * N + n] = scale ? sum * scale[n] : sum;
    }
  }
}

// The instantiation for M rows (1 <= M <= kSkinnyMaxRows) and weights of type W.
template <typename W>
using SkinnyRows = void (*)(const float*, const W*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
template <typename W, int... Ms>
constexpr SkinnyRows<W> skinny_table(int M, std::integer_sequence<int, Ms...>) {
  constexpr SkinnyRows<W> table[] = {&skinny_linear_rows<Ms + 1, W>...};
  return table[M - 1];
}
template <typename W>
SkinnyRows<W> skinny_linear_kernel(int M) {
  return skinny_table<W>(M, std::make_integer_sequence<int, kSkinnyMaxRows>{});
}

}  // namespace specdec
