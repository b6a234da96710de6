// What a verifier checks in the inputs it reads, shared by the CPU and CUDA kernels: the status
// codes (specdec_fast/kernels/reference/verify.py STATUS; Python raises the matching error), the
// check of a row's draft length, tokens and uniforms, and the draft probability of a tested token.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SPECDEC_HD_STATUS __host__ __device__ __forceinline__
#else
#define SPECDEC_HD_STATUS inline
#endif

namespace specdec {

// A verified row's status: the first problem found, in this order.
enum Status : int64_t {
  kOk = 0,
  kBadLength = 1,    // draft length outside [0, K]
  kBadToken = 2,     // a drafted token outside [0, V)
  kBadUniform = 3,   // a uniform outside (0, 1]
  kNaN = 4,          // a target row read holds NaN
  kPosInfinity = 5,  // ... or +inf
  kAllNegInf = 6,    // ... or only -inf
  kBadDraft = 7,     // a draft probability read is NaN, negative or infinite
};

// The status of a row's draft length, tokens [K] and uniforms u [K+1]; kOk if all are valid.
SPECDEC_HD_STATUS Status check_row(const int64_t* tokens, int64_t len, int64_t K, int64_t V, const float* u) {
  if (len < 0 || len > K) return kBadLength;
  for (int64_t i = 0; i < len; ++i)
    if (tokens[i] < 0 || tokens[i] >= V) return kBadToken;
  for (int64_t i = 0; i <= K; ++i)
    if (!(u[i] > 0.0f && u[i] <= 1.0f)) return kBadUniform;
  return kOk;
}

// q_j(X_j) of a row's q [K, V]: 1 for a point-mass row (q == nullptr), else the draft's
// probability, NaN if it is not a probability (negative or infinite).
SPECDEC_HD_STATUS float draft_prob(const float* q, int64_t j, int64_t V, int64_t x) {
  if (q == nullptr) return 1.0f;
  const float q_x = q[j * V + x];
  return q_x >= 0.0f && q_x < INFINITY ? q_x : NAN;
}

}  // namespace specdec
