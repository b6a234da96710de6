// y = x w^T in integers: x quantised to 8 bits per block of 32, w in Q4_1 or Q8_0 blocks
// (skinny_linear.h), integer dot products per block, the block scales applied in fp32: four
// times the multiplies per instruction of fp32 FMA on AVX2, no weight converted to fp32, but
// float work per (token, block) that the fp32 path shares among tokens (docs/integer.md).
//
// The arithmetic (what this kernel computes on every ISA, and the torch reference, bit for bit):
//
//   - a row of x is quantised per block of 32: d = max|x| / 127, q = round-half-even(x / d)
//     clamped to -127..127 (0 where d = 0), s = d * sum(q);
//   - for an output y[m, n] and block b, eight lanes l = 0..7 each hold the exact int32 sum of
//     w_q[e] x_q[e] over the block's elements e = 4l .. 4l + 3 (w_q: the 4-bit codes 0..15 of
//     Q4_1, the int8 codes of Q8_0);
//   - acc[l] = acc[l] + float(lane l) * (d_w * d_x), block after block (a multiply, then an add:
//     no FMA), from acc = 0;
//   - y = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)), plus for Q4_1 the
//     offsets: off = off + m_w * s block after block, added last.
//
// Every step is an integer sum (exact, in any order) or an fp32 operation in that fixed order,
// so y does not depend on the pass size, the threads, the tile, or the instruction set: AVX2
// (maddubs / madd), Arm's dot product (sdot) and plain C++ give the same bits.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "skinny_linear.h"

namespace specdec {

typedef float float8 __attribute__((vector_size(32)));
typedef int32_t dot_lanes __attribute__((vector_size(32)));  // the 8 int32 lanes of a block's dot product

// Rows of x [M, K] quantised per block, block-major so that a tile's rows of one block sit side by
// side: codes q [K / 32, M, 32] int8, then in `f` each block's d in 8 lanes ([K / 32, M, 8], ready
// for a vector multiply) and its s ([K / 32, M]): floats(M, K) floats in all.
struct QuantizedRows {
  int8_t* q;
  float* f;
  int64_t M, blocks;
  static int64_t floats(int64_t M, int64_t K) { return M * K / kBlock * 9; }
  int8_t* codes(int64_t b, int64_t m) const { return q + (b * M + m) * kBlock; }
  float* d8(int64_t b, int64_t m) const { return f + (b * M + m) * 8; }
  float& s(int64_t b, int64_t m) const { return f[blocks * M * 8 + b * M + m]; }
};

// Row m of x (x_m: K values, K a multiple of 32) into `out` (see the top of the file). Rounding
// half to even by adding and taking away 1.5 2^23 (exact for |v| <= 127; it vectorises where a
// call to nearbyint would not).
inline void quantize_row(const float* x_m, int64_t m, const QuantizedRows& out) {
  constexpr float kRound = 12582912.0f;
  for (int64_t b = 0; b < out.blocks; ++b) {
    const float* xb = x_m + b * kBlock;
    int8_t* qb = out.codes(b, m);
    float top = 0.0f;
    for (int e = 0; e < kBlock; ++e) top = std::max(top, std::fabs(xb[e]));
    const float d = top / 127.0f;
    int32_t sum = 0;
    if (d > 0.0f)
      for (int e = 0; e < kBlock; ++e) {
        const float v = std::min(127.0f, std::max(-127.0f, xb[e] / d));
        qb[e] = static_cast<int8_t>(static_cast<int32_t>((v + kRound) - kRound));
        sum += qb[e];
      }
    else
      std::memset(qb, 0, kBlock);
    std::fill_n(out.d8(b, m), 8, d);
    out.s(b, m) = d * static_cast<float>(sum);
  }
}

// One weight block's codes (load(codes, block)), ready for dot products with activation blocks:
// Q4_1's 4-bit codes unpacked to bytes 0..15 in element order, Q8_0's int8 codes as they are.
#if defined(__AVX2__)
template <BlockFormat F>
struct CodeBlock;
template <>
struct CodeBlock<BlockFormat::kQ4_1> {
  __m256i w;  // unsigned bytes 0..15: elements 0..15 (low nibbles), then 16..31 (high nibbles)
  void load(const void* codes, int64_t block) {
    const uint8_t* q = static_cast<const uint8_t*>(codes) + block * kBlock / 2;
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i low = _mm_set1_epi8(15);
    w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(c, 4), low), _mm_and_si128(c, low));
  }
  // maddubs multiplies unsigned by signed bytes and adds pairs (|sum| <= 2 15 127: no saturation);
  // madd with ones adds pairs of those: lane l covers elements 4l .. 4l + 3.
  dot_lanes dot(const int8_t* x) const {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    return (dot_lanes)_mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
  }
};
template <>
struct CodeBlock<BlockFormat::kQ8_0> {
  __m256i w, magnitude;  // the signed codes, and |codes| as unsigned bytes (|-128| = 128)
  void load(const void* codes, int64_t block) {
    const int8_t* q = static_cast<const int8_t*>(codes) + block * kBlock;
    w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    magnitude = _mm256_abs_epi8(w);
  }
  // w x = |w| (x with w's sign): x is in -127..127, so the sign flip cannot overflow, and a pair
  // sums to at most 2 128 127 < 2^15.
  dot_lanes dot(const int8_t* x) const {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    return (dot_lanes)_mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(a, w)), _mm256_set1_epi16(1));
  }
};
#else
// Elsewhere the codes as 32 signed bytes; dot products by Arm's sdot where the CPU has it (each
// int32 lane of vdotq_s32 sums 4 consecutive byte products: the lanes above), else in C++.
template <BlockFormat F>
struct CodeBlock {
  int8_t w[kBlock];
  void load(const void* codes, int64_t block) {
    if constexpr (F == BlockFormat::kQ4_1) {
      const uint8_t* c = static_cast<const uint8_t*>(codes) + block * kBlock / 2;
      for (int j = 0; j < kBlock / 2; ++j) w[j] = static_cast<int8_t>(c[j] & 15), w[j + kBlock / 2] = static_cast<int8_t>(c[j] >> 4);
    } else {
      std::memcpy(w, static_cast<const int8_t*>(codes) + block * kBlock, kBlock);
    }
  }
  dot_lanes dot(const int8_t* x) const {
    dot_lanes lanes;
#if defined(__ARM_FEATURE_DOTPROD)
    const int32x4_t low = vdotq_s32(vdupq_n_s32(0), vld1q_s8(w), vld1q_s8(x));
    const int32x4_t high = vdotq_s32(vdupq_n_s32(0), vld1q_s8(w + 16), vld1q_s8(x + 16));
    std::memcpy(&lanes, &low, 16), std::memcpy(reinterpret_cast<char*>(&lanes) + 16, &high, 16);
#else
    for (int l = 0; l < 8; ++l) {
      int32_t s = 0;
      for (int e = 4 * l; e < 4 * l + 4; ++e) s += static_cast<int32_t>(w[e]) * x[e];
      lanes[l] = s;
    }
#endif
    return lanes;
  }
};
#endif

inline float8 splat8(float v) { return float8{v, v, v, v, v, v, v, v}; }

inline float block_scale(BlockFormat F, const float* scales, int64_t block) {
  return F == BlockFormat::kQ4_1 ? scales[2 * block] : scales[block];
}

// The fixed tree that sums an accumulator's lanes (see the top of the file).
inline float sum_lanes(float8 acc) {
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// One tile of y [M, N]: rows [m0, m0 + MR) of the quantised x by weight rows [n0, n0 + NR), each
// output with its own 8-lane accumulator; per block, each weight row's codes are read once and
// applied to the MR activation rows. fp-contract off: the multiply and the add of each step
// stay two roundings on every ISA (an FMA-capable compiler would fuse them on some builds only).
template <int MR, int NR, BlockFormat F>
__attribute__((optimize("fp-contract=off"))) void integer_tile(const QuantizedRows& x, const void* codes, const float* scales,
                                                               float* y, int64_t K, int64_t N, int64_t m0, int64_t n0) {
  const int64_t blocks = K / kBlock;
  float8 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = float8{};
  for (int64_t b = 0; b < blocks; ++b) {
    for (int j = 0; j < NR; ++j) prefetch_codes<F>(codes, (n0 + j) * blocks, b);
    CodeBlock<F> w[NR];
    float8 dw[NR];
    for (int j = 0; j < NR; ++j) w[j].load(codes, (n0 + j) * blocks + b), dw[j] = splat8(block_scale(F, scales, (n0 + j) * blocks + b));
    const int8_t* xq = x.codes(b, m0);
    const float* dx = x.d8(b, m0);
    for (int i = 0; i < MR; ++i) {
      float8 dxi;
      std::memcpy(&dxi, dx + 8 * i, sizeof dxi);
      for (int j = 0; j < NR; ++j) acc[i][j] = acc[i][j] + __builtin_convertvector(w[j].dot(xq + kBlock * i), float8) * (dw[j] * dxi);
    }
  }
  float y_tile[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y_tile[i][j] = sum_lanes(acc[i][j]);
  if constexpr (F == BlockFormat::kQ4_1) {  // the offsets, each a chain along b (the MR x NR chains interleaved)
    float off[MR][NR] = {};
    for (int64_t b = 0; b < blocks; ++b)
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) off[i][j] = off[i][j] + scales[2 * ((n0 + j) * blocks + b) + 1] * x.s(b, m0 + i);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) y_tile[i][j] = y_tile[i][j] + off[i][j];
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[(m0 + i) * N + n0 + j] = y_tile[i][j];
}

// Tile shapes: rows of a tile up to kIntegerRows, by integer_cols(rows) weight rows, so that the
// accumulators, the codes, an activation block and the temporaries fit AVX2's 16 registers.
constexpr int kIntegerRows = 9;
constexpr int integer_cols(int64_t rows) { return rows <= 1 ? 4 : rows <= 2 ? 3 : rows <= 4 ? 2 : 1; }

using IntegerTile = void (*)(const QuantizedRows&, const void*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
template <BlockFormat F, int... Ms>
constexpr std::array<std::array<IntegerTile, 2>, sizeof...(Ms)> integer_table(std::integer_sequence<int, Ms...>) {
  return {std::array<IntegerTile, 2>{&integer_tile<Ms + 1, integer_cols(Ms + 1), F>, &integer_tile<Ms + 1, 1, F>}...};
}

// Columns [n0, n1) of y [M, N] = x w^T for the quantised rows x [M, K] (any M >= 1): the rows
// split into tiles of near-equal height (at most kIntegerRows), every tile applied to a group of
// weight rows before the next group is read.
template <BlockFormat F>
void integer_linear_blocks(const QuantizedRows& x, int64_t M, const void* codes, const float* scales, float* y, int64_t K,
                           int64_t N, int64_t n0, int64_t n1) {
  static constexpr auto table = integer_table<F>(std::make_integer_sequence<int, kIntegerRows>{});
  const int64_t tiles = (M + kIntegerRows - 1) / kIntegerRows, group = tiles == 1 ? integer_cols(M) : 1;
  for (int64_t n = n0; n < n1;) {
    const int64_t cols = n + group <= n1 ? group : 1;
    for (int64_t t = 0, m = 0; t < tiles; ++t) {
      const int64_t rows = (M - m) / (tiles - t);
      table[rows - 1][tiles == 1 && cols == group ? 0 : 1](x, codes, scales, y, K, N, m, n);
      m += rows;
    }
    n += cols;
  }
}

}  // namespace specdec
