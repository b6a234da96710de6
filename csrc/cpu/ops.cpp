// torch-facing side of the CPU kernels: schemas (TORCH_LIBRARY) and the CPU implementations.
// Inputs are checked in Python (specdec_fast/ops.py); here only what the kernel relies on.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "sampling.h"

namespace {

using specdec::Sampling;

Sampling row_sampling(const at::Tensor& t, const at::Tensor& k, const at::Tensor& p, int64_t b) {
  return Sampling{t.data_ptr<float>()[b], k.data_ptr<int64_t>()[b], p.data_ptr<float>()[b]};
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
    const scalar_t* target_ptr = target.data_ptr<scalar_t>();
    at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> row(V), scratch(V);
      for (int64_t b = begin; b < end; ++b) {
        accepted.data_ptr<int64_t>()[b] = specdec::verify_row(
            target_ptr + b * (K + 1) * V, q.data_ptr<float>() + b * K * V, x.data_ptr<int64_t>() + b * K,
            lens.data_ptr<int64_t>()[b], K, V, row_sampling(t, k, p, b), u.data_ptr<float>() + b * (K + 1),
            tokens.data_ptr<int64_t>() + b * (K + 1), row.data(), scratch.data());
      }
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
    const scalar_t* x_ptr = x.data_ptr<scalar_t>();
    at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scratch(V);
      for (int64_t b = begin; b < end; ++b) {
        tokens.data_ptr<int64_t>()[b] = specdec::draft_step_row(
            x_ptr + b * V, V, row_sampling(t, k, p, b), u.data_ptr<float>()[b], probs.data_ptr<float>() + b * V,
            scratch.data(), token_prob.data_ptr<float>() + b, entropy.data_ptr<float>() + b, top1.data_ptr<float>() + b);
      }
    });
  });
  return {tokens, probs, token_prob, entropy, top1};
}

}  // namespace

TORCH_LIBRARY(specdec_fast, m) {
  m.def("verify(Tensor target_logits, Tensor draft_probs, Tensor draft_tokens, Tensor draft_lens, Tensor temperature, "
        "Tensor top_k, Tensor top_p, Tensor uniforms) -> (Tensor, Tensor, Tensor)");
  m.def("draft_step(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor uniforms) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) {
  m.impl("verify", &verify_cpu);
  m.impl("draft_step", &draft_step_cpu);
}
