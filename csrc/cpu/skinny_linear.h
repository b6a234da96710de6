// y = x w^T for a few rows of x (a verification pass: the last token plus the drafts), in
// one pass over the weights. BLAS libraries treat such skinny products as M separate
// matrix-vector products (each reading all of w), or pack w first; both read w several
// times where once is enough, and the weights are what a small-batch pass is bound by.
//
// Every y[m, n] is summed in the same order whatever M is, so a token's outputs do not
// depend on how many tokens share the pass.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "simd.h"

namespace specdec {

constexpr int kSkinnyMaxRows = 16;  // the public skinny_linear ops' cap (any M works here)

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

// One tile of y [M, N]: rows [m0, m0 + MR) by columns [n0, n0 + NR), from x [M, K] fp32 and w
// [N, K] (fp32, bf16, or int8 with a scale per output row: y[m, n] = scale[n] * sum_k x[m, k]
// w[n, k]), all row-major. Each of the MR x NR outputs has its own vector accumulator: every
// step along k loads NR weight vectors and MR input vectors and does MR x NR FMAs, so a weight
// vector read from memory serves MR rows and an input vector NR columns (one load per FMA made
// a 9-row pass compute-bound at a fifth of the FMA peak).
//
// y[m, n] is the same sum whatever the tile: lane l of its accumulator adds x[m, k] w[n, k] for
// k = l, l + kWidth, ... in order by explicit FMA (simd.h; nothing else is contracted, since
// the compiler would fuse some instantiations and not others), then reduce_add's fixed tree
// over the lanes, then the tail k past the last whole vector. So a token's outputs do not
// depend on M or on the tiling. One FMA per weight vector and row (not a multiply and an add)
// keeps a pass of bf16 or int8 weights, which costs a conversion per vector too, near the
// memory bound.
template <int MR, int NR, typename W>
__attribute__((optimize("fp-contract=off"))) void skinny_tile(const float* x, const W* w, const float* scale, float* y,
                                                               int64_t K, int64_t N, int64_t m0, int64_t n0) {
  vfloat acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = vfloat{};
  const W* rows[NR];
  for (int j = 0; j < NR; ++j) rows[j] = w + (n0 + j) * K;
  const float* xs[MR];
  for (int i = 0; i < MR; ++i) xs[i] = x + (m0 + i) * K;
  int64_t k = 0;
  for (; k + kWidth <= K; k += kWidth) {
    if ((k * sizeof(W)) % 64 == 0)
      for (int j = 0; j < NR; ++j) __builtin_prefetch(reinterpret_cast<const char*>(rows[j] + k) + kPrefetchBytes, 0, 2);
    vfloat wk[NR];
    for (int j = 0; j < NR; ++j) wk[j] = load_weights(rows[j] + k);
    for (int i = 0; i < MR; ++i) {
      const vfloat xk = load(xs[i] + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = fma(wk[j], xk, acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float sum = reduce_add(acc[i][j]);
      for (int64_t t = k; t < K; ++t) sum += to_float(rows[j][t]) * xs[i][t];
      y[(m0 + i) * N + n0 + j] = scale ? sum * scale[n0 + j] : sum;
    }
}

// Tiles of up to kTileRows input rows by kTileCols weight rows: 24 accumulators, the weight and
// input vectors in the other 8 of AVX-512's 32 registers.
constexpr int kTileRows = 6, kTileCols = 4;

template <typename W>
using SkinnyTile = void (*)(const float*, const W*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
template <int NR, typename W, int... Ms>
constexpr std::array<SkinnyTile<W>, sizeof...(Ms)> tile_row(std::integer_sequence<int, Ms...>) {
  return {&skinny_tile<Ms + 1, NR, W>...};
}
template <typename W, int... Ns>
constexpr std::array<std::array<SkinnyTile<W>, kTileRows>, sizeof...(Ns)> tile_table(std::integer_sequence<int, Ns...>) {
  return {tile_row<Ns + 1, W>(std::make_integer_sequence<int, kTileRows>{})...};
}

// Columns [n0, n1) of y [M, N] = x [M, K] w^T (see skinny_tile) for any M >= 1: the M rows split
// into tiles of near-equal height (9 rows: 5 + 4), each group of kTileCols weight rows read from
// memory once and applied to every tile while it is in L1.
template <typename W>
void skinny_linear(const float* x, int64_t M, const W* w, const float* scale, float* y, int64_t K, int64_t N, int64_t n0,
                   int64_t n1) {
  static constexpr auto table = tile_table<W>(std::make_integer_sequence<int, kTileCols>{});
  const int64_t tiles = (M + kTileRows - 1) / kTileRows;
  for (int64_t n = n0; n < n1; n += kTileCols) {
    const int64_t cols = std::min<int64_t>(kTileCols, n1 - n);
    for (int64_t t = 0, m = 0; t < tiles; ++t) {
      const int64_t rows = (M - m) / (tiles - t);
      table[cols - 1][rows - 1](x, w, scale, y, K, N, m, n);
      m += rows;
    }
  }
}

}  // namespace specdec
