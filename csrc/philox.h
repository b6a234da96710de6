// Counter-based uniforms (Philox4x32-10, Salmon et al. 2011), shared by the CPU and CUDA
// kernels; specdec_fast/sampling.py philox_uniforms is the reference, and the Triton kernel
// uses triton.language.randint, the same generator with the same counter layout.
//
// Uniform i of a request with (seed, offset): counter (offset + i) as two 32-bit words
// (low, high) followed by two zero words, key (seed low, seed high); the first output word
// r gives u = ((r >> 8) + 1) * 2^-24, exactly representable, in (0, 1].
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPECDEC_HD __host__ __device__ __forceinline__
#else
#define SPECDEC_HD inline
#endif

namespace specdec {

SPECDEC_HD uint32_t philox_first_word(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t a = static_cast<uint64_t>(0xD2511F53u) * c0, b = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(b >> 32) ^ c1 ^ k0, n2 = static_cast<uint32_t>(a >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(b), c3 = static_cast<uint32_t>(a), c0 = n0, c2 = n2;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  return c0;
}

SPECDEC_HD float philox_uniform(uint64_t seed, uint64_t counter) {
  return static_cast<float>((philox_first_word(seed, counter) >> 8) + 1) * 5.9604644775390625e-8f;  // 2^-24
}

}  // namespace specdec
