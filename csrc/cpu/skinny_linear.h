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

// Rows [n0, n1) of y [M, N] from x [M, K] and w [N, K], all fp32 row-major. No FMA
// contraction: the compiler would fuse some instantiations and not others, and the sums
// must not depend on M.
template <int M>
__attribute__((optimize("fp-contract=off"))) void skinny_linear_rows(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const float* row = w + n * K;
    vfloat acc[M];
    for (int m = 0; m < M; ++m) acc[m] = vfloat{};
    int64_t k = 0;
    for (; k + kWidth <= K; k += kWidth) {
      const vfloat wk = load(row + k);
      for (int m = 0; m < M; ++m) acc[m] += wk * load(x + m * K + k);
    }
    for (int m = 0; m < M; ++m) {
      float sum = 0.0f;
      for (int l = 0; l < kWidth; ++l) sum += acc[m][l];
      for (int64_t j = k; j < K; ++j) sum += row[j] * x[m * K + j];
      y[m * N + n] = sum;
    }
  }
}

// The instantiation for M rows (1 <= M <= kSkinnyMaxRows).
using SkinnyRows = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
template <int... Ms>
constexpr SkinnyRows skinny_table(int M, std::integer_sequence<int, Ms...>) {
  constexpr SkinnyRows table[] = {&skinny_linear_rows<Ms + 1>...};
  return table[M - 1];
}
inline SkinnyRows skinny_linear_kernel(int M) {
  return skinny_table(M, std::make_integer_sequence<int, kSkinnyMaxRows>{});
}

}  // namespace specdec
