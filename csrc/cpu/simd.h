// Portable SIMD for the CPU kernels: GCC/Clang vector extensions, so the same source is
// AVX2 or AVX-512 code (whatever the JIT build's -march=native allows) and NEON on Arm.
// No torch headers: the kernels see raw pointers only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace specdec {

#if defined(__AVX512F__)
constexpr int kWidth = 16;
#else
constexpr int kWidth = 8;
#endif

typedef float vfloat __attribute__((vector_size(4 * kWidth)));
typedef int32_t vint __attribute__((vector_size(4 * kWidth)));

// Storage types of 16-bit logits (bit patterns; the ops pass c10::BFloat16 / c10::Half data).
struct BFloat16 { uint16_t bits; };
struct Half { uint16_t bits; };

inline float to_float(float x) { return x; }
inline float to_float(double x) { return static_cast<float>(x); }
inline float to_float(int8_t x) { return static_cast<float>(x); }
inline float to_float(BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float to_float(Half x) {
#if defined(__aarch64__)
  __fp16 h;  // GCC 12 knows _Float16 in C++ on x86 only
#else
  _Float16 h;
#endif
  std::memcpy(&h, &x.bits, sizeof h);
  return static_cast<float>(h);
}

// x in every lane: one broadcast (vfloat{} + x would add a zero first, since -0 + 0 is +0).
inline vfloat splat(float x) {
#if defined(__AVX512F__)
  return (vfloat)_mm512_set1_ps(x);
#elif defined(__AVX__)
  return (vfloat)_mm256_set1_ps(x);
#elif defined(__aarch64__)
  const float32x4_t half = vdupq_n_f32(x), both[2] = {half, half};
  vfloat v;
  std::memcpy(&v, both, sizeof v);
  return v;
#else
  return vfloat{} + x;
#endif
}
inline vfloat load(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vfloat v) { std::memcpy(p, &v, sizeof v); }
// a * b + c, fused (one rounding) where the CPU has FMA, whatever the compiler would contract.
inline vfloat fma(vfloat a, vfloat b, vfloat c) {
#if defined(__AVX512F__)
  return (vfloat)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  return (vfloat)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#elif defined(__aarch64__)
  float32x4_t x[2], y[2], z[2];  // the 8 lanes as two NEON registers
  std::memcpy(x, &a, sizeof x), std::memcpy(y, &b, sizeof y), std::memcpy(z, &c, sizeof z);
  z[0] = vfmaq_f32(z[0], x[0], y[0]), z[1] = vfmaq_f32(z[1], x[1], y[1]);
  vfloat r;
  std::memcpy(&r, z, sizeof r);
  return r;
#else
  return a * b + c;
#endif
}

// The first n (< kWidth) lanes from p, the rest `fill`: reads nothing past p[n - 1].
inline vfloat load_partial(const float* p, int64_t n, float fill) {
  float lanes[kWidth];
  for (int l = 0; l < kWidth; ++l) lanes[l] = l < n ? p[l] : fill;
  return load(lanes);
}
inline void store_partial(float* p, vfloat v, int64_t n) {
  for (int l = 0; l < n; ++l) p[l] = v[l];
}

inline vint lane_indices() {  // 0, 1, ..., kWidth - 1
  vint v;
  for (int l = 0; l < kWidth; ++l) v[l] = l;
  return v;
}

inline vfloat vmax(vfloat a, vfloat b) { return a > b ? a : b; }
inline float reduce_max(vfloat v) {
  float m = v[0];
  for (int l = 1; l < kWidth; ++l) m = m > v[l] ? m : v[l];
  return m;
}
// The lanes of v added in fp32, in a fixed tree order (the AVX-512 reduction instruction
// sequence where there is one).
inline float reduce_add(vfloat v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#else
  float s = 0.0f;
  for (int l = 0; l < kWidth; ++l) s += v[l];
  return s;
#endif
}
#if defined(__AVX512F__)
// The slot of v that reduce_add16 sums into lane l, and the lane that sums slot l (a 4 x 4
// transpose: its own inverse).
constexpr int reduce16_slot(int l) { return 4 * (l % 4) + l / 4; }
// Lane l: reduce_add(v[reduce16_slot(l)]), the same tree of additions (so the same bits), for
// 16 vectors at once in 45 shuffles and adds instead of 16 x 8.
inline vfloat reduce_add16(const vfloat v[16]) {
  __m512 u[8], w[4], x[2];
  for (int i = 0; i < 8; ++i) {  // lanes l and l + 8 of v[2i] (low half), of v[2i + 1] (high half)
    const __m512 a = (__m512)v[2 * i], b = (__m512)v[2 * i + 1];
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  for (int i = 0; i < 4; ++i)  // then l and l + 4 within each half
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88), _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // l and l + 2 within each quarter
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], 0x44), _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], 0xEE));
  return (vfloat)_mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88), _mm512_shuffle_ps(x[0], x[1], 0xDD));
}
#endif
// Sums in double: a block's fp32 partial sums are widened and added lane-wise (no chain of
// dependent scalar adds in the loop), the lanes summed once at the end.
typedef double vdouble __attribute__((vector_size(8 * kWidth)));
inline vdouble widen(vfloat v) { return __builtin_convertvector(v, vdouble); }
inline double sum_lanes(const vdouble& v) {
  double s = 0.0;
  for (int l = 0; l < kWidth; ++l) s += v[l];
  return s;
}

// exp(x) for x <= 0, within 2 ulp of the exact value; 0 below ln(FLT_MIN) (and for -inf).
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2; exp(r) = 1 + r + r^2 P(r) with P a
// degree-4 minimax fit (relative error 3e-9, below fp32 rounding); 2^n built in the
// exponent bits. Branch-free, so it vectorises.
inline vfloat exp_nonpositive(vfloat x) {
  const vfloat n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln2)
  vfloat r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vfloat p = splat(1.38146e-3f);
  p = p * r + 8.36871e-3f;
  p = p * r + 4.166839e-2f;
  p = p * r + 1.6666521e-1f;
  p = p * r + 4.9999994e-1f;
  p = p * (r * r) + (r + 1.0f);
#if defined(__AVX512F__)
  const vfloat scaled = (vfloat)_mm512_scalef_ps((__m512)p, (__m512)n);  // p 2^n in one instruction
#else
  const vint bits = (__builtin_convertvector(n, vint) + 127) << 23;
  vfloat two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const vfloat scaled = p * two_n;
#endif
  return x < -87.33654f ? vfloat{} : scaled;
}

}  // namespace specdec
