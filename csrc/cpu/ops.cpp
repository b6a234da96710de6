// torch-facing side of the CPU kernels: the CPU implementations of the ops whose schemas
// specdec_fast/backends.py defines. Inputs are checked in Python (specdec_fast/ops.py);
// here only what the kernels rely on.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>

#include "../op_inputs.h"
#include "../philox.h"
#include "sampling.h"
#include "skinny_linear.h"

namespace {

using specdec::Sampling;

// The kernels' storage type of each logits dtype (same bits, no torch types in the kernels).
template <typename T> struct Storage { using type = T; };
template <> struct Storage<c10::BFloat16> { using type = specdec::BFloat16; };
template <> struct Storage<c10::Half> { using type = specdec::Half; };

template <typename T>
const typename Storage<T>::type* storage(const at::Tensor& t) {
  return reinterpret_cast<const typename Storage<T>::type*>(t.data_ptr<T>());
}

Sampling row_sampling(const at::Tensor& t, const at::Tensor& k, const at::Tensor& p, int64_t b) {
  return Sampling{t.data_ptr<float>()[b], k.data_ptr<int64_t>()[b], p.data_ptr<float>()[b]};
}

// Splits a row's chunks across threads, for batches too small to occupy them with rows.
struct ParallelChunks {
  template <typename F>
  void operator()(int64_t chunks, F body) const {
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) body(k);
    });
  }
};

// f(b, scratch, for_chunks) for every row b: rows in parallel when there are enough of
// them, else one row at a time with its chunks in parallel.
template <typename F>
void for_each_row(int64_t B, int64_t V, F f) {
  const int64_t threads = at::get_num_threads();
  if (B >= threads) {  // rows cost 1 to K+2 passes: threads take the next row as they finish
    std::atomic<int64_t> next{0};
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
      specdec::Scratch& scratch = specdec::thread_scratch(V);
      for (int64_t b = next++; b < B; b = next++) f(b, scratch, specdec::Serial{});
    });
  } else {
    specdec::Scratch& scratch = specdec::thread_scratch(V);
    for (int64_t b = 0; b < B; ++b) f(b, scratch, ParallelChunks{});
  }
}

// Token-wise (block = false) or block verification of every row.
std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_rows(const specdec::VerifyInputs& in, bool block) {
  const int64_t B = in.B, K = in.K, V = in.V;
  at::Tensor accepted = at::empty({B}, in.tokens.options()), tokens = at::empty({B, K + 1}, in.tokens.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.target.scalar_type(), "verify_cpu", [&] {
    const auto* target = storage<scalar_t>(in.target);
    for_each_row(B, V, [&](int64_t b, specdec::Scratch& scratch, auto for_chunks) {
      const auto row = [&](auto verify_row) {
        return verify_row(target + b * (K + 1) * V, in.q.data_ptr<float>() + b * K * V,
                          in.tokens.data_ptr<int64_t>() + b * K, in.lens.data_ptr<int64_t>()[b], K, V,
                          row_sampling(in.temperature, in.top_k, in.top_p, b), in.uniforms.data_ptr<float>() + b * (K + 1),
                          tokens.data_ptr<int64_t>() + b * (K + 1), scratch, for_chunks);
      };
      accepted.data_ptr<int64_t>()[b] = block ? row([](auto&&... a) { return specdec::verify_block_row(a...); })
                                              : row([](auto&&... a) { return specdec::verify_row(a...); });
    });
  });
  return {accepted, tokens, accepted + 1};
}

template <bool kBlock>
std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_cpu(
    const at::Tensor& target_logits, const at::Tensor& draft_probs, const at::Tensor& draft_tokens,
    const at::Tensor& draft_lens, const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
    const at::Tensor& uniforms) {
  return verify_rows(
      specdec::verify_inputs(target_logits, draft_probs, draft_tokens, draft_lens, temperature, top_k, top_p, uniforms),
      kBlock);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> draft_step_cpu(
    const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
    const at::Tensor& uniforms) {
  const specdec::DraftStepInputs in = specdec::draft_step_inputs(logits, temperature, top_k, top_p, uniforms);
  auto out = specdec::draft_step_outputs(in);
  auto& [tokens, probs, token_prob, entropy, top1] = out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.logits.scalar_type(), "draft_step_cpu", [&] {
    const auto* x = storage<scalar_t>(in.logits);
    for_each_row(in.B, in.V, [&](int64_t b, specdec::Scratch& scratch, auto for_chunks) {
      tokens.data_ptr<int64_t>()[b] = specdec::draft_step_row(
          x + b * in.V, in.V, row_sampling(in.temperature, in.top_k, in.top_p, b), in.uniforms.data_ptr<float>()[b],
          probs.data_ptr<float>() + b * in.V, scratch, token_prob.data_ptr<float>() + b,
          entropy.data_ptr<float>() + b, top1.data_ptr<float>() + b, for_chunks);
    });
  });
  return out;
}

at::Tensor philox_uniforms_cpu(const at::Tensor& seed,    // [B] int64
                               const at::Tensor& offset,  // [B] int64
                               int64_t n) {
  const at::Tensor s = seed.contiguous().to(at::kLong), o = offset.contiguous().to(at::kLong);
  const int64_t B = s.size(0);
  at::Tensor u = at::empty({B, n}, s.options().dtype(at::kFloat));
  const auto* s_ptr = s.data_ptr<int64_t>();
  const auto* o_ptr = o.data_ptr<int64_t>();
  float* u_ptr = u.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      u_ptr[b * n + i] = specdec::philox_uniform(static_cast<uint64_t>(s_ptr[b]), static_cast<uint64_t>(o_ptr[b] + i));
  return u;
}

// x [M, K] fp32 (M <= kSkinnyMaxRows), weight [N, K] fp32, or int8 with scale [N] fp32 -> [M, N];
// checked in specdec_fast/linear.py.
template <typename W>
at::Tensor skinny_linear_impl(const at::Tensor& x, const at::Tensor& weight, const float* scale) {
  const at::Tensor xc = x.contiguous(), w = weight.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = w.size(0);
  TORCH_CHECK(M >= 1 && M <= specdec::kSkinnyMaxRows && w.size(1) == K, "skinny_linear: bad shapes");
  at::Tensor y = at::empty({M, N}, xc.options());
  const auto kernel = specdec::skinny_linear_kernel<W>(static_cast<int>(M));
  const float* x_ptr = xc.data_ptr<float>();
  const W* w_ptr = w.data_ptr<W>();
  float* y_ptr = y.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) { kernel(x_ptr, w_ptr, scale, y_ptr, K, N, begin, end); });
  return y;
}

at::Tensor skinny_linear_cpu(const at::Tensor& x, const at::Tensor& weight) {
  return skinny_linear_impl<float>(x, weight, nullptr);
}

at::Tensor skinny_linear_int8_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale) {
  const at::Tensor s = scale.contiguous();
  TORCH_CHECK(s.numel() == weight.size(0), "skinny_linear_int8: one scale per weight row");
  return skinny_linear_impl<int8_t>(x, weight, s.data_ptr<float>());
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) {
  m.impl("verify", &verify_cpu<false>);
  m.impl("verify_block", &verify_cpu<true>);
  m.impl("draft_step", &draft_step_cpu);
  m.impl("philox_uniforms", &philox_uniforms_cpu);
  m.impl("skinny_linear", &skinny_linear_cpu);
  m.impl("skinny_linear_int8", &skinny_linear_int8_cpu);
}
