// The ops' tensor arguments as every backend's kernels take them: contiguous, in the
// kernels' dtypes (shapes checked in Python, specdec_fast/kernels/ops.py). Shared by the
// CPU and CUDA implementations (csrc/cpu/ops.cpp, csrc/cuda/ops.cpp).
#pragma once

#include <ATen/ATen.h>

namespace specdec {

struct VerifyInputs {
  at::Tensor target;       // [B, K+1, V] fp32/bf16/fp16
  at::Tensor q;            // [B, K, V] fp32, or undefined when every row is a point mass
  at::Tensor point_mass;   // [B] bool: the row's q is one-hot at its draft tokens (q not read)
  at::Tensor tokens;       // [B, K] int64
  at::Tensor lens;         // [B] int64
  at::Tensor temperature;  // [B] fp32
  at::Tensor top_k;        // [B] int64
  at::Tensor top_p;        // [B] fp32
  at::Tensor uniforms;     // [B, K+1] fp32
  int64_t B, K, V;

  // Row b's q [K, V], or nullptr for a point-mass row (the CPU kernels'; point_mass read on the host).
  const float* q_row(int64_t b, const bool* point_mass_host) const {
    return !q.defined() || point_mass_host[b] ? nullptr : q.data_ptr<float>() + b * K * V;
  }
};

inline VerifyInputs verify_inputs(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_probs,
                                  const at::Tensor& point_mass, const at::Tensor& draft_tokens,
                                  const at::Tensor& draft_lens, const at::Tensor& temperature, const at::Tensor& top_k,
                                  const at::Tensor& top_p, const at::Tensor& uniforms) {
  TORCH_CHECK(target_logits.dim() == 3, "target_logits must be [B, K+1, V]");
  const at::Tensor target = target_logits.contiguous();
  const int64_t B = target.size(0), K = target.size(1) - 1, V = target.size(2);
  at::Tensor q = draft_probs.has_value() ? draft_probs->contiguous().to(at::kFloat) : at::Tensor();
  TORCH_CHECK(!q.defined() || (q.dim() == 3 && q.size(0) == B && q.size(1) == K && q.size(2) == V),
              "draft_probs must be [B, K, V]");
  TORCH_CHECK(point_mass.dim() == 1 && point_mass.size(0) == B, "point_mass must be [B]");
  return {target, q, point_mass.contiguous().to(at::kBool), draft_tokens.contiguous().to(at::kLong),
          draft_lens.contiguous().to(at::kLong), temperature.contiguous().to(at::kFloat),
          top_k.contiguous().to(at::kLong), top_p.contiguous().to(at::kFloat), uniforms.contiguous().to(at::kFloat),
          B, K, V};
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
