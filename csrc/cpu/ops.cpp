// torch-facing side of the CPU kernels: the CPU implementations of the ops whose schemas
// specdec_fast/backends.py defines. Inputs are checked in Python (specdec_fast/ops.py);
// here only what the kernels rely on.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>

#include "../philox.h"
#include "sampling.h"

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

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_cpu(
    const at::Tensor& target_logits,  // [B, K+1, V] fp32/bf16/fp16
    const at::Tensor& draft_probs,    // [B, K, V] fp32
    const at::Tensor& draft_tokens,   // [B, K] int64
    const at::Tensor& draft_lens,     // [B] int64
    const at::Tensor& temperature,    // [B] fp32
    const at::Tensor& top_k,          // [B] int64
    const at::Tensor& top_p,          // [B] fp32
    const at::Tensor& uniforms) {     // [B, K+1] fp32
  TORCH_CHECK(target_logits.dim() == 3, "target_logits must be [B, K+1, V]");
  const at::Tensor target = target_logits.contiguous();
  const at::Tensor q = draft_probs.contiguous().to(at::kFloat);
  const at::Tensor x = draft_tokens.contiguous().to(at::kLong);
  const at::Tensor lens = draft_lens.contiguous().to(at::kLong);
  const at::Tensor t = temperature.contiguous().to(at::kFloat), k = top_k.contiguous().to(at::kLong);
  const at::Tensor p = top_p.contiguous().to(at::kFloat), u = uniforms.contiguous().to(at::kFloat);
  const int64_t B = target.size(0), K = target.size(1) - 1, V = target.size(2);
  at::Tensor accepted = at::empty({B}, x.options());
  at::Tensor tokens = at::empty({B, K + 1}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, target.scalar_type(), "verify_cpu", [&] {
    const auto* target_ptr = storage<scalar_t>(target);
    for_each_row(B, V, [&](int64_t b, specdec::Scratch& scratch, auto for_chunks) {
      accepted.data_ptr<int64_t>()[b] = specdec::verify_row(
          target_ptr + b * (K + 1) * V, q.data_ptr<float>() + b * K * V, x.data_ptr<int64_t>() + b * K,
          lens.data_ptr<int64_t>()[b], K, V, row_sampling(t, k, p, b), u.data_ptr<float>() + b * (K + 1),
          tokens.data_ptr<int64_t>() + b * (K + 1), scratch, for_chunks);
    });
  });
  return {accepted, tokens, accepted + 1};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> draft_step_cpu(
    const at::Tensor& logits,       // [B, V]
    const at::Tensor& temperature,  // [B]
    const at::Tensor& top_k,        // [B]
    const at::Tensor& top_p,        // [B]
    const at::Tensor& uniforms) {   // [B]
  TORCH_CHECK(logits.dim() == 2, "logits must be [B, V]");
  const at::Tensor x = logits.contiguous();
  const at::Tensor t = temperature.contiguous().to(at::kFloat), k = top_k.contiguous().to(at::kLong);
  const at::Tensor p = top_p.contiguous().to(at::kFloat), u = uniforms.contiguous().to(at::kFloat);
  const int64_t B = x.size(0), V = x.size(1);
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor tokens = at::empty({B}, x.options().dtype(at::kLong));
  at::Tensor probs = at::empty({B, V}, f32), token_prob = at::empty({B}, f32);
  at::Tensor entropy = at::empty({B}, f32), top1 = at::empty({B}, f32);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "draft_step_cpu", [&] {
    const auto* x_ptr = storage<scalar_t>(x);
    for_each_row(B, V, [&](int64_t b, specdec::Scratch& scratch, auto for_chunks) {
      tokens.data_ptr<int64_t>()[b] = specdec::draft_step_row(
          x_ptr + b * V, V, row_sampling(t, k, p, b), u.data_ptr<float>()[b], probs.data_ptr<float>() + b * V,
          scratch, token_prob.data_ptr<float>() + b, entropy.data_ptr<float>() + b, top1.data_ptr<float>() + b,
          for_chunks);
    });
  });
  return {tokens, probs, token_prob, entropy, top1};
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

}  // namespace

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) {
  m.impl("verify", &verify_cpu);
  m.impl("draft_step", &draft_step_cpu);
  m.impl("philox_uniforms", &philox_uniforms_cpu);
}
