// Launchers of the CUDA kernels (csrc/cuda/kernels.cu): raw pointers, no torch types.
// Each returns the launch's cudaError_t; ops.cpp checks inputs and picks the stream.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace specdec::cuda {

enum class Dtype { kFloat32, kBFloat16, kFloat16 };

// target [B, K+1, V] (dtype), q [B, K, V] fp32 or nullptr (every row a point mass), point_mass
// [B] bool, tokens [B, K], lens [B], temperature/top_p [B] fp32, top_k [B] int64, u [B, K+1] fp32
// -> accepted [B], out [B, K+1], status [B] int64 (reference/verify.py STATUS).
// Token-wise verification, or block verification if `block`.
cudaError_t verify(Dtype dtype, const void* target, const float* q, const bool* point_mass, const int64_t* tokens,
                   const int64_t* lens, const float* temperature, const int64_t* top_k, const float* top_p,
                   const float* u, int64_t* accepted, int64_t* out, int64_t* status, int64_t B, int64_t K, int64_t V,
                   bool block, cudaStream_t stream);

// logits [B, V] (dtype), sampling [B], u [B] -> tokens [B], probs [B, V], token_prob /
// entropy / top1 [B] fp32.
cudaError_t draft_step(Dtype dtype, const void* logits, const float* temperature, const int64_t* top_k,
                       const float* top_p, const float* u, int64_t* tokens, float* probs, float* token_prob,
                       float* entropy, float* top1, int64_t B, int64_t V, cudaStream_t stream);

// seed, offset [B] int64 -> out [B, n] fp32 in (0, 1].
cudaError_t philox_uniforms(const int64_t* seed, const int64_t* offset, float* out, int64_t B, int64_t n,
                            cudaStream_t stream);

}  // namespace specdec::cuda
