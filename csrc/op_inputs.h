// The ops' tensor arguments as every backend's kernels take them: contiguous, in the
// kernels' dtypes (the values were checked in Python, specdec_fast/ops.py). Shared by the
// CPU and CUDA implementations (csrc/cpu/ops.cpp, csrc/cuda/ops.cpp).
#pragma once

#include <ATen/ATen.h>

namespace specdec {

struct VerifyInputs {
  at::Tensor target;       // [B, K+1, V] fp32/bf16/fp16
  at::Tensor q;            // [B, K, V] fp32
  at::Tensor tokens;       // [B, K] int64
  at::Tensor lens;         // [B] int64
  at::Tensor temperature;  // [B] fp32
  at::Tensor top_k;        // [B] int64
  at::Tensor top_p;        // [B] fp32
  at::Tensor uniforms;     // [B, K+1] fp32
  int64_t B, K, V;
};

inline VerifyInputs verify_inputs(const at::Tensor& target_logits, const at::Tensor& draft_probs,
                                  const at::Tensor& draft_tokens, const at::Tensor& draft_lens,
                                  const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                                  const at::Tensor& uniforms) {
  TORCH_CHECK(target_logits.dim() == 3, "target_logits must be [B, K+1, V]");
  const at::Tensor target = target_logits.contiguous();
  return {target, draft_probs.contiguous().to(at::kFloat), draft_tokens.contiguous().to(at::kLong),
          draft_lens.contiguous().to(at::kLong), temperature.contiguous().to(at::kFloat),
          top_k.contiguous().to(at::kLong), top_p.contiguous().to(at::kFloat), uniforms.contiguous().to(at::kFloat),
          target.size(0), target.size(1) - 1, target.size(2)};
}

struct DraftStepInputs {
  at::Tensor logits;       // [B, V] fp32/bf16/fp16
  at::Tensor temperature;  // [B] fp32
  at::Tensor top_k;        // [B] int64
  at::Tensor top_p;        // [B] fp32
  at::Tensor uniforms;     // [B] fp32
  int64_t B, V;
};

inline DraftStepInputs draft_step_inputs(const at::Tensor& logits, const at::Tensor& temperature,
                                         const at::Tensor& top_k, const at::Tensor& top_p,
                                         const at::Tensor& uniforms) {
  TORCH_CHECK(logits.dim() == 2, "logits must be [B, V]");
  const at::Tensor x = logits.contiguous();
  return {x, temperature.contiguous().to(at::kFloat), top_k.contiguous().to(at::kLong),
          top_p.contiguous().to(at::kFloat), uniforms.contiguous().to(at::kFloat), x.size(0), x.size(1)};
}

// Outputs of a draft step: tokens [B] int64; probs [B, V], token_prob, entropy, top1 [B] fp32.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> draft_step_outputs(
    const DraftStepInputs& in) {
  const auto f32 = in.logits.options().dtype(at::kFloat);
  return {at::empty({in.B}, in.logits.options().dtype(at::kLong)), at::empty({in.B, in.V}, f32),
          at::empty({in.B}, f32), at::empty({in.B}, f32), at::empty({in.B}, f32)};
}

}  // namespace specdec
