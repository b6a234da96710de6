// A standalone check of the CPU kernels (csrc/cpu, which include no torch header), for a build
// that the Python tests cannot load: a cross-compiled NEON build run under qemu, or another
// -march of x86. It checks what the torch tests check on the native build:
//
//   - y = x w^T (fp32, bf16, int8 rows, Q4_1 and Q8_0 blocks) against a double-precision reference;
//   - a token's outputs do not depend on the pass size (bit for bit, 1..16 rows, 1 and 2 threads);
//   - block weights give the bits of the fp32 matrix they hold;
//   - the decoder pass: a token's logits are the same bits in passes of 1, 2, 5 and 9 tokens, over
//     blocks and over the fp32 matrices alike, and with 8-bit activations;
//   - the integer block product (integer_linear.h) equals a plain scalar statement of its
//     arithmetic, bit for bit, in passes of 1..16 rows at 1 and 2 threads, and prints a digest of
//     its outputs: the same digest from every build (AVX2, generic x86, NEON with and without the
//     dot product) shows that its bits do not depend on the instruction set;
//   - exp_nonpositive within 4 ulp of the exact exponential.
//
// Build and run (tests/kernels/test_ops_driver.py does it):
//   g++ -O2 -std=c++17 -fopenmp -march=native -Icsrc/cpu csrc/tests/ops_driver.cpp -o ops_driver && ./ops_driver
//   aarch64-linux-gnu-g++ -O2 -std=c++17 -fopenmp -Icsrc/cpu csrc/tests/ops_driver.cpp -o ops_driver_arm
//   qemu-aarch64 -L /usr/aarch64-linux-gnu ./ops_driver_arm
// Prints one line per failure and a summary; exit status 1 on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <omp.h>

#include "decoder.h"

using namespace specdec;

namespace {

int checks = 0, failures = 0;

void expect(bool ok, const char* what, int a = -1, int b = -1) {
  ++checks;
  if (!ok && failures++ < 20) std::printf("FAIL: %s (%d, %d)\n", what, a, b);
}

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

std::mt19937 rng(0);
float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }

// x rounded to 11 significant bits, as an fp16 scale of a GGUF block holds it (d q is then exact).
float fp16_value(float x) {
  int e;
  const float mantissa = std::frexp(x, &e);
  return std::ldexp(std::nearbyint(std::ldexp(mantissa, 11)), e - 11);
}

// A Q4_1 (or Q8_0) matrix [N, K] and the fp32 matrix it holds, as a GGUF loader makes it.
struct Blocks {
  std::vector<uint8_t> q4;
  std::vector<int8_t> q8;
  std::vector<float> scales, dense;
};

Blocks make_blocks(BlockFormat format, int64_t N, int64_t K) {
  Blocks b;
  const int64_t blocks = N * K / kBlock;
  b.dense.resize(N * K);
  if (format == BlockFormat::kQ4_1) {
    b.q4.resize(N * K / 2);
    b.scales.resize(2 * blocks);
    for (int64_t i = 0; i < blocks; ++i) {
      const float d = fp16_value(uniform(0.001f, 0.01f)), m = fp16_value(uniform(-0.05f, 0.0f));
      b.scales[2 * i] = d, b.scales[2 * i + 1] = m;
      for (int j = 0; j < 16; ++j) {
        const int lo = rng() % 16, hi = rng() % 16;
        b.q4[i * 16 + j] = static_cast<uint8_t>(lo | hi << 4);
        b.dense[i * 32 + j] = std::fma(d, static_cast<float>(lo), m);
        b.dense[i * 32 + j + 16] = std::fma(d, static_cast<float>(hi), m);
      }
    }
  } else {
    b.q8.resize(N * K);
    b.scales.resize(blocks);
    for (int64_t i = 0; i < blocks; ++i) {
      b.scales[i] = fp16_value(uniform(0.0005f, 0.002f));
      for (int j = 0; j < 32; ++j) {
        b.q8[i * 32 + j] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
        b.dense[i * 32 + j] = b.scales[i] * b.q8[i * 32 + j];
      }
    }
  }
  return b;
}

// Work buffers of a pass of M tokens of TinyDecoder's shape (or of one linear up to 128 wide), with
// room for the integer kinds' quantised inputs.
struct Scratch {
  std::vector<float> f;
  std::vector<int8_t> codes;
  std::vector<float> code_scales;
  DecoderScratch buf;
  Scratch(int64_t M, int64_t d, int64_t qkv, int64_t attn, int64_t I)
      : f(M * (d + qkv + attn + 3 * I + d)), codes(M * std::max({d, attn, I})),
        code_scales(QuantizedRows::floats(M, std::max({d, attn, I}))) {
    float* p = f.data();
    buf = {p, p + M * d, p + M * (d + qkv), p + M * (d + qkv + attn), p + M * (d + qkv + attn + 2 * I),
           p + M * (d + qkv + attn + 3 * I), codes.data(), code_scales.data()};
  }
};

// y [M, N] = x [M, K] L^T over the team, as the decoder pass runs it.
std::vector<float> linear(const std::vector<float>& x, int64_t M, const Linear& L, int threads) {
  std::vector<float> y(M * L.out);
  const Scratch scratch(M, L.in, 0, 0, 0);
#pragma omp parallel num_threads(threads)
  linear_for(x.data(), M, L, y.data(), scratch.buf, [](int64_t, int64_t) {});
  return y;
}

void check_linear(const char* name, const Linear& L, const std::vector<float>& reference_w, const std::vector<float>& reference_scale) {
  const int64_t N = L.out, K = L.in, most = 16;
  std::vector<float> x(most * K);
  for (auto& v : x) v = uniform(-1.0f, 1.0f);
  const std::vector<float> alone = linear(x, 1, L, 1);  // row 0 on its own, one thread
  for (int M : {1, 2, 3, 5, 7, 9, 12, 16})
    for (int threads : {1, 2}) {
      const std::vector<float> y = linear(x, M, L, threads);
      expect(same_bits(y.data(), alone.data(), N), name, M, threads);  // row 0's outputs, whatever beside them
      for (int m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double exact = 0, size = 0;
          for (int64_t k = 0; k < K; ++k) {
            exact += static_cast<double>(x[m * K + k]) * reference_w[n * K + k];
            size += std::fabs(static_cast<double>(x[m * K + k]) * reference_w[n * K + k]);
          }
          const double scale = reference_scale.empty() ? 1.0 : reference_scale[n];
          if (std::fabs(y[m * N + n] - exact * scale) > 1e-5 * size * scale + 1e-30) {
            expect(false, name, M, static_cast<int>(n));
            return;
          }
        }
    }
}

void check_linears() {
  const int64_t N = 37, K = 96;  // odd rows: every tile width and the leftover columns
  std::vector<float> w(N * K);
  for (auto& v : w) v = uniform(-0.1f, 0.1f);
  check_linear("fp32 linear", {Linear::Kind::kFloat, w.data(), nullptr, N, K}, w, {});
  std::vector<BFloat16> wb(N * K);
  std::vector<float> wb_values(N * K);
  for (int64_t i = 0; i < N * K; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &w[i], 4);
    wb[i].bits = static_cast<uint16_t>(bits >> 16);
    wb_values[i] = to_float(wb[i]);
  }
  check_linear("bf16 linear", {Linear::Kind::kBFloat16, wb.data(), nullptr, N, K}, wb_values, {});
  std::vector<int8_t> wi(N * K);
  std::vector<float> wi_values(N * K), scale(N);
  for (int64_t i = 0; i < N * K; ++i) wi[i] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127), wi_values[i] = wi[i];
  for (auto& s : scale) s = uniform(0.001f, 0.01f);
  check_linear("int8 linear", {Linear::Kind::kInt8Rows, wi.data(), scale.data(), N, K}, wi_values, scale);
  for (BlockFormat format : {BlockFormat::kQ4_1, BlockFormat::kQ8_0}) {
    const bool q4 = format == BlockFormat::kQ4_1;
    const Blocks b = make_blocks(format, N, K);
    const Linear blocks{q4 ? Linear::Kind::kQ4_1 : Linear::Kind::kQ8_0, q4 ? static_cast<const void*>(b.q4.data()) : b.q8.data(),
                        b.scales.data(), N, K};
    check_linear(q4 ? "Q4_1 linear" : "Q8_0 linear", blocks, b.dense, {});
    std::vector<float> x(16 * K);
    for (auto& v : x) v = uniform(-1.0f, 1.0f);
    for (int M : {1, 2, 5, 9, 12, 16}) {
      const std::vector<float> from_blocks = linear(x, M, blocks, 2);
      const std::vector<float> from_dense = linear(x, M, {Linear::Kind::kFloat, b.dense.data(), nullptr, N, K}, 2);
      expect(same_bits(from_blocks.data(), from_dense.data(), M * N), q4 ? "Q4_1 = its fp32 matrix" : "Q8_0 = its fp32 matrix", M);
    }
  }
}

// The integer product's arithmetic (the top of integer_linear.h) in plain scalar C++, in double
// int for the exact sums and float for each rounding step (no FMA: fp-contract off).
__attribute__((optimize("fp-contract=off"))) std::vector<float> integer_reference(const std::vector<float>& x, int64_t M, const Blocks& b, bool q4, int64_t N, int64_t K) {
  const int64_t blocks = K / kBlock;
  std::vector<float> y(M * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc[8] = {}, off = 0.0f;
      for (int64_t k = 0; k < blocks; ++k) {
        const float* xb = x.data() + m * K + k * kBlock;
        float top = 0.0f;
        for (int e = 0; e < kBlock; ++e) top = std::max(top, std::fabs(xb[e]));
        const float d = top / 127.0f;
        int q[kBlock], sum = 0;
        for (int e = 0; e < kBlock; ++e) q[e] = d > 0.0f ? static_cast<int>(std::nearbyint(std::min(127.0f, std::max(-127.0f, xb[e] / d)))) : 0, sum += q[e];
        const int64_t at = n * blocks + k;
        const float dw = q4 ? b.scales[2 * at] : b.scales[at];
        for (int l = 0; l < 8; ++l) {
          int lane = 0;
          for (int e = 4 * l; e < 4 * l + 4; ++e) {
            const int w = q4 ? (e < 16 ? b.q4[at * 16 + e] & 15 : b.q4[at * 16 + e - 16] >> 4) : b.q8[at * kBlock + e];
            lane += w * q[e];
          }
          const float dd = dw * d, step = static_cast<float>(lane) * dd;
          acc[l] = acc[l] + step;
        }
        if (q4) {
          const float s = d * static_cast<float>(sum), u = b.scales[2 * at + 1] * s;
          off = off + u;
        }
      }
      const float left = (acc[0] + acc[4]) + (acc[2] + acc[6]), right = (acc[1] + acc[5]) + (acc[3] + acc[7]), total = left + right;
      y[m * N + n] = total + off;
    }
  return y;
}

// FNV-1a over the bits of v: one line that two builds' outputs can be compared by.
uint64_t digest(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  for (const float f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    for (int i = 0; i < 4; ++i) h = (h ^ ((bits >> (8 * i)) & 255)) * 1099511628211ull;
  }
  return h;
}

uint64_t check_integer() {
  const int64_t N = 37, K = 96, most = 16;
  uint64_t h = 0;
  for (BlockFormat format : {BlockFormat::kQ4_1, BlockFormat::kQ8_0}) {
    const bool q4 = format == BlockFormat::kQ4_1;
    const Blocks b = make_blocks(format, N, K);
    const Linear L{q4 ? Linear::Kind::kQ4_1Integer : Linear::Kind::kQ8_0Integer,
                   q4 ? static_cast<const void*>(b.q4.data()) : b.q8.data(), b.scales.data(), N, K};
    std::vector<float> x(most * K);
    for (auto& v : x) v = uniform(-1.0f, 1.0f);
    std::fill_n(x.begin() + 2 * K, kBlock, 0.0f);  // a block of zeros (d = 0)
    const std::vector<float> expected = integer_reference(x, most, b, q4, N, K);
    h ^= digest(expected) + (q4 ? 0 : 0x9e3779b97f4a7c15ull);
    for (int M : {1, 2, 3, 4, 5, 7, 9, 10, 12, 16})
      for (int threads : {1, 2}) {
        const std::vector<float> y = linear(x, M, L, threads);
        expect(same_bits(y.data(), expected.data(), M * N), q4 ? "Q4_1 x int8 = its scalar statement" : "Q8_0 x int8 = its scalar statement",
               M, threads);
      }
  }
  return h;
}

// A two-layer decoder (d 64, 4 heads over 2 KV heads of 16, MLP 128, vocabulary 96), weights as
// Q4_1 blocks with a Q8_0 head, or the fp32 matrices they hold.
struct TinyDecoder {
  static constexpr int64_t L = 2, d = 64, H = 4, Hkv = 2, hd = 16, I = 128, V = 96, capacity = 32;
  std::vector<Blocks> mats;
  std::vector<float> norm = std::vector<float>(d), embed = std::vector<float>(V * d);
  TinyDecoder() {
    for (auto& v : norm) v = uniform(0.5f, 1.5f);
    for (auto& v : embed) v = uniform(-1.0f, 1.0f);
    for (int64_t l = 0; l < L; ++l)
      for (auto [N, K] : {std::pair<int64_t, int64_t>{(H + 2 * Hkv) * hd, d}, {d, H * hd}, {2 * I, d}, {d, I}})
        mats.push_back(make_blocks(BlockFormat::kQ4_1, N, K));
    mats.push_back(make_blocks(BlockFormat::kQ8_0, V, d));
  }
  enum class Weights { kDense, kBlocks, kInteger };
  Linear at(size_t i, Weights kind) const {
    const Blocks& b = mats[i];
    const int64_t N = i + 1 == mats.size() ? V : (i % 4 == 0 ? (H + 2 * Hkv) * hd : i % 4 == 2 ? 2 * I : d);
    const int64_t K = static_cast<int64_t>(b.dense.size()) / N;
    const bool integer = kind == Weights::kInteger;
    if (kind == Weights::kDense) return {Linear::Kind::kFloat, b.dense.data(), nullptr, N, K};
    return i + 1 == mats.size() ? Linear{integer ? Linear::Kind::kQ8_0Integer : Linear::Kind::kQ8_0, b.q8.data(), b.scales.data(), N, K}
                                : Linear{integer ? Linear::Kind::kQ4_1Integer : Linear::Kind::kQ4_1, b.q4.data(), b.scales.data(), N, K};
  }
  // The logits [n, V] of tokens ids[0..n) run in passes of `step` tokens, on a fresh cache.
  std::vector<float> logits(const std::vector<int64_t>& ids, int64_t step, Weights dense, int threads) const {
    std::vector<DecoderLayer> layers;
    for (int64_t l = 0; l < L; ++l)
      layers.push_back({norm.data(), at(4 * l, dense), nullptr, at(4 * l + 1, dense), norm.data(), at(4 * l + 2, dense),
                        at(4 * l + 3, dense)});
    std::vector<float> cache(L * 2 * Hkv * capacity * hd), out;
    const KVCache kv{cache.data(), L, Hkv, capacity, hd};
    for (size_t start = 0; start < ids.size(); start += step) {
      const int64_t M = std::min<int64_t>(step, ids.size() - start);
      std::vector<int64_t> row(M, 0), pos(M), rows(M);
      std::vector<float> x(M * d), cs(M * hd), sn(M * hd);
      for (int64_t m = 0; m < M; ++m) {
        pos[m] = start + m, rows[m] = m;
        std::copy_n(embed.data() + ids[start + m] * d, d, x.data() + m * d);
        for (int64_t i = 0; i < hd; ++i) {
          const float angle = static_cast<float>(pos[m]) / std::pow(100.0f, static_cast<float>(i % (hd / 2)) / (hd / 2));
          cs[m * hd + i] = std::cos(angle), sn[m * hd + i] = std::sin(angle);
        }
      }
      const PassTokens t{M, row.data(), pos.data(), pos.data(), cs.data(), sn.data()};
      const Scratch scratch(M, d, (H + 2 * Hkv) * hd, H * hd, I);
      std::vector<float> hidden(M * d), head_in(M * d), logits(M * V);
      decoder_pass(x.data(), layers, norm.data(), at(mats.size() - 1, dense), {d, H, Hkv, hd, I, 1e-5f}, t, kv, scratch.buf,
                   hidden.data(), rows.data(), M, head_in.data(), logits.data(), threads);
      out.insert(out.end(), logits.begin(), logits.end());
    }
    return out;
  }
};

void check_decoder() {
  const TinyDecoder model;
  std::vector<int64_t> ids(18);
  for (auto& id : ids) id = rng() % TinyDecoder::V;
  using W = TinyDecoder::Weights;
  const std::vector<float> one_by_one = model.logits(ids, 1, W::kBlocks, 1), integer = model.logits(ids, 1, W::kInteger, 1);
  bool finite = true;
  double differ = 0, size = 0;  // 8-bit activations move the logits a little, not a lot
  for (size_t i = 0; i < one_by_one.size(); ++i)
    finite = finite && std::isfinite(one_by_one[i]) && std::isfinite(integer[i]), differ += std::fabs(integer[i] - one_by_one[i]),
    size += std::fabs(one_by_one[i]);
  expect(finite, "decoder logits are finite");
  expect(differ < 0.05 * size, "decoder: 8-bit activations near the fp32 logits");
  expect(differ > 0, "decoder: 8-bit activations take the integer path");
  for (int64_t step : {1, 2, 5, 9, 16})
    for (int threads : {1, 2}) {
      expect(same_bits(model.logits(ids, step, W::kBlocks, threads).data(), one_by_one.data(), one_by_one.size()),
             "decoder: a token's logits in passes of n tokens", static_cast<int>(step), threads);
      expect(same_bits(model.logits(ids, step, W::kDense, threads).data(), one_by_one.data(), one_by_one.size()),
             "decoder: blocks = their fp32 matrices", static_cast<int>(step), threads);
      expect(same_bits(model.logits(ids, step, W::kInteger, threads).data(), integer.data(), integer.size()),
             "decoder: 8-bit activations, a token's logits in passes of n tokens", static_cast<int>(step), threads);
    }
}

void check_exp() {
  int64_t worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = -87.0f * static_cast<float>(i) / 200000.0f;
    const vfloat e = exp_nonpositive(splat(x));
    const float exact = static_cast<float>(std::exp(static_cast<double>(x)));
    int32_t a, b;
    std::memcpy(&a, &e[0], 4);
    std::memcpy(&b, &exact, 4);
    worst = std::max<int64_t>(worst, std::llabs(static_cast<int64_t>(a) - b));
  }
  expect(worst <= 4, "exp_nonpositive within 4 ulp", static_cast<int>(worst));
}

}  // namespace

int main() {
  check_linears();
  const uint64_t integer = check_integer();
  check_decoder();
  check_exp();
  std::printf("integer digest %016llx\n", static_cast<unsigned long long>(integer));
  std::printf("%d checks, %d failed (kWidth %d, %d vector registers, tiles %dx%d, fused up to %d rows)\n", checks, failures,
              kWidth, kVectorRegisters, kTileRows, kTileCols, kFusedRows);
  return failures ? 1 : 0;
}
