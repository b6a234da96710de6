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
#include <vector>

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

// Tile shapes per instruction set. A tile's accumulators, its weight vectors and an input vector
// must fit the vector registers, or the accumulators spill to the stack on every step along k:
// AVX-512 has 32 registers, AVX2 16, NEON 32 of 128 bits (16 of these 8-lane vectors), SSE 16 of
// 128 bits (8). Passes of up to kTileRows tokens take one tile of all their rows by
// tile_cols(rows) weight rows (fewer rows, more columns: the accumulator chains that hide the FMA
// latency); longer ones tiles of up to kTileRows rows by kTileCols (skinny_tile). Passes of up to
// kFusedRows tokens over block weights take one tile of all their rows by fused_cols(rows) weight
// rows (skinny_tile_blocks). Timed on each ISA (docs/kernels.md); a shape changes which registers
// hold a sum, never the order of its terms.
#if defined(__AVX512F__)
constexpr int kVectorRegisters = 32, kTileRows = 6, kTileCols = 4, kFusedRows = 9;
constexpr int tile_cols(int64_t) { return 4; }
constexpr int fused_cols(int64_t rows) { return rows <= 4 ? 4 : rows <= 6 ? 3 : 2; }
#elif defined(__AVX__) || defined(__aarch64__)
constexpr int kVectorRegisters = 16, kTileRows = 6, kTileCols = 2, kFusedRows = 12;
constexpr int tile_cols(int64_t rows) { return rows <= 2 ? 4 : rows == 3 ? 3 : 2; }
constexpr int fused_cols(int64_t rows) { return rows <= 2 ? 2 : 1; }
#else
constexpr int kVectorRegisters = 8, kTileRows = 2, kTileCols = 2, kFusedRows = 6;
constexpr int tile_cols(int64_t rows) { return rows == 1 ? 3 : 2; }
constexpr int fused_cols(int64_t) { return 1; }
#endif
constexpr bool fits(int rows, int cols) { return rows * cols + cols + 1 <= kVectorRegisters; }
static_assert(fits(kTileRows, kTileCols) && fits(1, tile_cols(1)) && fits(2, tile_cols(2)) && fits(kTileRows, tile_cols(kTileRows)) &&
              fits(kFusedRows, fused_cols(kFusedRows)) && fits(1, fused_cols(1)), "a tile must fit the vector registers");

// The tiles of rows-high tiles ([rows - 1]): by tile_cols(rows) weight rows (a pass's one tile), by
// kTileCols (one of several tiles), and by one weight row (the columns left over at the end).
template <typename W>
using SkinnyTile = void (*)(const float*, const W*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
template <typename W, int... Ms>
constexpr std::array<std::array<SkinnyTile<W>, 3>, sizeof...(Ms)> tile_table(std::integer_sequence<int, Ms...>) {
  return {std::array<SkinnyTile<W>, 3>{&skinny_tile<Ms + 1, tile_cols(Ms + 1), W>, &skinny_tile<Ms + 1, kTileCols, W>,
                                       &skinny_tile<Ms + 1, 1, W>}...};
}

// Columns [n0, n1) of y [M, N] = x [M, K] w^T (see skinny_tile) for any M >= 1: the M rows split
// into tiles of near-equal height (9 rows: 5 + 4), each group of weight rows read from memory once
// and applied to every tile while it is in L1.
template <typename W>
void skinny_linear(const float* x, int64_t M, const W* w, const float* scale, float* y, int64_t K, int64_t N, int64_t n0,
                   int64_t n1) {
  static constexpr auto table = tile_table<W>(std::make_integer_sequence<int, kTileRows>{});
  const int64_t tiles = (M + kTileRows - 1) / kTileRows, shape = tiles == 1 ? 0 : 1;
  const int64_t group = tiles == 1 ? tile_cols(M) : kTileCols;
  for (int64_t n = n0; n < n1;) {
    const int64_t cols = n + group <= n1 ? group : 1, which = cols == group ? shape : 2;
    for (int64_t t = 0, m = 0; t < tiles; ++t) {
      const int64_t rows = (M - m) / (tiles - t);
      table[rows - 1][which](x, w, scale, y, K, N, m, n);
      m += rows;
    }
    n += cols;
  }
}

// Weights stored in blocks of 32 along k, as ggml's Q4_1 and Q8_0 formats store them: a block
// of Q4_1 is 16 bytes of 4-bit codes q (byte j: element j in the low nibble, element j + 16 in
// the high one) with a scale d and an offset m, w = fl(fl(d q) + m); a block of Q8_0 is 32 int8
// codes with a scale d, w = fl(d q). d and m are fp16 numbers, held in fp32 here ([N, K / 32, 2]
// (d, m) for Q4_1, [N, K / 32] for Q8_0). d q is exact in fp32 (11 significant bits times 4 or
// 8), so w has one rounding however it is computed: the fp32 value a GGUF loader makes of the
// file. A model dequantised from such a file is read back from its blocks, bit for bit, at 6 or
// 9 bits per weight instead of 32 (specdec_fast/kernels/blocks.py finds them).
enum class BlockFormat { kQ4_1, kQ8_0 };
constexpr int64_t kBlock = 32;

// Prefetch (into L2) the codes of a row of blocks starting at block `first`, kPrefetchBytes / 4 (Q4_1)
// or / 2 (Q8_0) ahead of its block b, once per cache line (once per block saturated the misses in
// flight: a Q8_0 head read at 8 GB/s instead of 22).
template <BlockFormat F>
inline void prefetch_codes(const void* codes, int64_t first, int64_t b) {
  constexpr int64_t bytes = F == BlockFormat::kQ4_1 ? kBlock / 2 : kBlock;
  constexpr int64_t ahead = F == BlockFormat::kQ4_1 ? kPrefetchBytes / 4 : kPrefetchBytes / 2;
  const char* at = static_cast<const char*>(codes) + (first + b) * bytes;
  if (reinterpret_cast<uintptr_t>(at) % 64 < bytes) __builtin_prefetch(at + ahead, 0, 2);
}

// One weight row's block as kBlock / kWidth vectors in k order (block[s] holds elements
// s kWidth .. s kWidth + kWidth - 1), each the fp32 values fl(d q + m) (Q4_1) or d q (Q8_0) exactly.
template <BlockFormat F>
struct BlockRow;

#if defined(__AVX512F__)
// A Q4_1 block's 16 values d q + m, q = 0..15, in one register: each code then picks its value
// (a permute), in place of a conversion, a multiply and an add per 16 weights.
template <>
struct BlockRow<BlockFormat::kQ4_1> {
  __m512 table;
  __m512i bytes;  // the block's 16 code bytes, one per lane
  BlockRow(const void* codes, const float* scales, int64_t block) {
    const uint8_t* q = static_cast<const uint8_t*>(codes) + block * kBlock / 2;
    const vfloat values = (vfloat)_mm512_cvtepi32_ps(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
    table = (__m512)(splat(scales[2 * block]) * values + splat(scales[2 * block + 1]));
    bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  }
  // The low nibbles (elements 0..15) or the high ones (16..31), each looked up in the table.
  vfloat operator[](int s) const {
    return (vfloat)_mm512_permutexvar_ps(s ? _mm512_srli_epi32(bytes, 4) : _mm512_and_si512(bytes, _mm512_set1_epi32(15)), table);
  }
};
#else
// kWidth = 8 lanes: vector s holds the low nibbles (s = 0, 1) or the high ones (s = 2, 3) of code
// bytes 8 (s % 2) .. 8 (s % 2) + 7, each converted and scaled by one FMA (d q is exact, so fma(d, q, m)
// is fl(d q + m)): 4 instructions per 8 weights, no table to build per block.
template <>
struct BlockRow<BlockFormat::kQ4_1> {
  const uint8_t* q;
  vfloat d, m;
  BlockRow(const void* codes, const float* scales, int64_t block)
      : q(static_cast<const uint8_t*>(codes) + block * kBlock / 2), d(splat(scales[2 * block])), m(splat(scales[2 * block + 1])) {}
  vfloat operator[](int s) const {
    const uint8_t* p = q + 8 * (s % 2);
#if defined(__AVX2__)
    const __m256i wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i codes = s < 2 ? _mm256_and_si256(wide, _mm256_set1_epi32(15)) : _mm256_srli_epi32(wide, 4);
    const vfloat values = (vfloat)_mm256_cvtepi32_ps(codes);
#else
    vfloat values;
    for (int l = 0; l < kWidth; ++l) values[l] = static_cast<float>(s < 2 ? p[l] & 15 : p[l] >> 4);
#endif
    return fma(d, values, m);
  }
};
#endif

template <>
struct BlockRow<BlockFormat::kQ8_0> {
  const int8_t* q;
  vfloat d;
  BlockRow(const void* codes, const float* scales, int64_t block)
      : q(static_cast<const int8_t*>(codes) + block * kBlock), d(splat(scales[block])) {}
  vfloat operator[](int s) const { return d * load_weights(q + s * kWidth); }
};

// Rows [n, n + rows) of block weights, dequantised into out [rows, K] (K a multiple of kBlock).
template <BlockFormat F>
void dequantize_rows(const void* codes, const float* scales, int64_t K, int64_t n, int64_t rows, float* out) {
  const int64_t blocks = K / kBlock;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      prefetch_codes<F>(codes, (n + r) * blocks, b);
      const BlockRow<F> block(codes, scales, (n + r) * blocks + b);
      for (int s = 0; s < kBlock / kWidth; ++s) store(out + r * K + b * kBlock + s * kWidth, block[s]);
    }
}

// One tile of y (as skinny_tile, MR <= kFusedRows rows by NR weight rows) over block weights
// dequantised in registers, not through a buffer: per block, each weight row's vectors in k order,
// each applied to the MR input rows, which is skinny_tile's order along k: the same sums, the same
// bits as the dequantised matrix in fp32. One weight row's block at a time, so that only its state
// (codes, scales) is live beside the accumulators: the NR x MR accumulator chains are what hides
// the FMA latency (a one-token pass needs NR of them), and they, not the rows' state, take the
// registers.
template <int MR, int NR, BlockFormat F>
__attribute__((optimize("fp-contract=off"))) void skinny_tile_blocks(const float* x, const void* codes, const float* scales,
                                                                     float* y, int64_t K, int64_t N, int64_t n0) {
  const int64_t blocks = K / kBlock;
  vfloat acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = vfloat{};
  for (int64_t b = 0; b < blocks; ++b)
    for (int j = 0; j < NR; ++j) {
      prefetch_codes<F>(codes, (n0 + j) * blocks, b);
      const BlockRow<F> row(codes, scales, (n0 + j) * blocks + b);
      for (int s = 0; s < kBlock / kWidth; ++s) {
        const vfloat w = row[s];
        for (int i = 0; i < MR; ++i) acc[i][j] = fma(w, load(x + i * K + b * kBlock + s * kWidth), acc[i][j]);
      }
    }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * N + n0 + j] = reduce_add(acc[i][j]);
}

// The fused tiles: [rows - 1] is the tile of fused_cols(rows) weight rows, and the tile of one
// weight row for the columns left over at the end of a range.
using FusedTile = void (*)(const float*, const void*, const float*, float*, int64_t, int64_t, int64_t);
template <BlockFormat F, int... Ms>
constexpr std::array<std::array<FusedTile, 2>, sizeof...(Ms)> fused_table(std::integer_sequence<int, Ms...>) {
  return {std::array<FusedTile, 2>{&skinny_tile_blocks<Ms + 1, fused_cols(Ms + 1), F>, &skinny_tile_blocks<Ms + 1, 1, F>}...};
}

// skinny_linear over block weights, columns [n0, n1): up to kFusedRows input rows, dequantised in
// registers (skinny_tile_blocks); more, each group of kTileCols weight rows dequantised into a
// per-thread buffer (L1-sized) and multiplied by the fp32 tiles. Either way every output is the
// fp32 kernel's sum over the same values: the same bits as the dequantised matrix in fp32.
template <BlockFormat F>
void skinny_linear_blocks(const float* x, int64_t M, const void* codes, const float* scales, float* y, int64_t K, int64_t N,
                          int64_t n0, int64_t n1) {
  if (M <= kFusedRows) {
    static constexpr auto fused = fused_table<F>(std::make_integer_sequence<int, kFusedRows>{});
    const int64_t cols = fused_cols(M);
    int64_t n = n0;
    for (; n + cols <= n1; n += cols) fused[M - 1][0](x, codes, scales, y, K, N, n);
    for (; n < n1; ++n) fused[M - 1][1](x, codes, scales, y, K, N, n);
    return;
  }
  thread_local std::vector<float> buffer;
  buffer.resize(kTileCols * K);
  for (int64_t n = n0; n < n1; n += kTileCols) {
    const int64_t cols = std::min<int64_t>(kTileCols, n1 - n);
    dequantize_rows<F>(codes, scales, K, n, cols, buffer.data());
    skinny_linear(x, M, buffer.data(), static_cast<const float*>(nullptr), y + n, K, N, 0, cols);  // columns n.. of y
  }
}

}  // namespace specdec
