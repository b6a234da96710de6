// torch-facing side of the CUDA kernels: the CUDA implementations of the ops whose schemas
// specdec_fast/backends.py defines. Inputs are checked in Python (specdec_fast/ops.py);
// here: contiguity and dtypes, the device guard, the current stream, the launch's error.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels.h"

namespace {

namespace k = specdec::cuda;

k::Dtype kernel_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return k::Dtype::kFloat32;
    case at::kBFloat16: return k::Dtype::kBFloat16;
    case at::kHalf: return k::Dtype::kFloat16;
    default: TORCH_CHECK(false, "specdec_fast CUDA kernels take fp32, bf16 or fp16 logits, got ", t.scalar_type());
  }
}

void check_launch(cudaError_t error, const char* op) {
  TORCH_CHECK(error == cudaSuccess, "specdec_fast::", op, " CUDA launch failed: ", cudaGetErrorString(error));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_cuda(
    const at::Tensor& target_logits,  // [B, K+1, V] fp32/bf16/fp16
    const at::Tensor& draft_probs,    // [B, K, V] fp32
    const at::Tensor& draft_tokens,   // [B, K] int64
    const at::Tensor& draft_lens,     // [B] int64
    const at::Tensor& temperature,    // [B] fp32
    const at::Tensor& top_k,          // [B] int64
    const at::Tensor& top_p,          // [B] fp32
    const at::Tensor& uniforms) {     // [B, K+1] fp32
  TORCH_CHECK(target_logits.dim() == 3, "target_logits must be [B, K+1, V]");
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const at::Tensor target = target_logits.contiguous();
  const at::Tensor q = draft_probs.contiguous().to(at::kFloat), x = draft_tokens.contiguous().to(at::kLong);
  const at::Tensor lens = draft_lens.contiguous().to(at::kLong), t = temperature.contiguous().to(at::kFloat);
  const at::Tensor kk = top_k.contiguous().to(at::kLong), p = top_p.contiguous().to(at::kFloat);
  const at::Tensor u = uniforms.contiguous().to(at::kFloat);
  const int64_t B = target.size(0), K = target.size(1) - 1, V = target.size(2);
  at::Tensor accepted = at::empty({B}, x.options()), tokens = at::empty({B, K + 1}, x.options());
  check_launch(k::verify(kernel_dtype(target), target.data_ptr(), q.data_ptr<float>(), x.data_ptr<int64_t>(),
                         lens.data_ptr<int64_t>(), t.data_ptr<float>(), kk.data_ptr<int64_t>(), p.data_ptr<float>(),
                         u.data_ptr<float>(), accepted.data_ptr<int64_t>(), tokens.data_ptr<int64_t>(), B, K, V,
                         c10::cuda::getCurrentCUDAStream()),
               "verify");
  return {accepted, tokens, accepted + 1};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> draft_step_cuda(
    const at::Tensor& logits,       // [B, V]
    const at::Tensor& temperature,  // [B]
    const at::Tensor& top_k,        // [B]
    const at::Tensor& top_p,        // [B]
    const at::Tensor& uniforms) {   // [B]
  TORCH_CHECK(logits.dim() == 2, "logits must be [B, V]");
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor x = logits.contiguous();
  const at::Tensor t = temperature.contiguous().to(at::kFloat), kk = top_k.contiguous().to(at::kLong);
  const at::Tensor p = top_p.contiguous().to(at::kFloat), u = uniforms.contiguous().to(at::kFloat);
  const int64_t B = x.size(0), V = x.size(1);
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor tokens = at::empty({B}, x.options().dtype(at::kLong)), probs = at::empty({B, V}, f32);
  at::Tensor token_prob = at::empty({B}, f32), entropy = at::empty({B}, f32), top1 = at::empty({B}, f32);
  check_launch(k::draft_step(kernel_dtype(x), x.data_ptr(), t.data_ptr<float>(), kk.data_ptr<int64_t>(),
                             p.data_ptr<float>(), u.data_ptr<float>(), tokens.data_ptr<int64_t>(),
                             probs.data_ptr<float>(), token_prob.data_ptr<float>(), entropy.data_ptr<float>(),
                             top1.data_ptr<float>(), B, V, c10::cuda::getCurrentCUDAStream()),
               "draft_step");
  return {tokens, probs, token_prob, entropy, top1};
}

at::Tensor philox_uniforms_cuda(const at::Tensor& seed,    // [B] int64
                                const at::Tensor& offset,  // [B] int64
                                int64_t n) {
  const c10::cuda::CUDAGuard guard(seed.device());
  const at::Tensor s = seed.contiguous().to(at::kLong), o = offset.contiguous().to(at::kLong);
  at::Tensor out = at::empty({s.size(0), n}, s.options().dtype(at::kFloat));
  check_launch(k::philox_uniforms(s.data_ptr<int64_t>(), o.data_ptr<int64_t>(), out.data_ptr<float>(), s.size(0), n,
                                  c10::cuda::getCurrentCUDAStream()),
               "philox_uniforms");
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec_fast, CUDA, m) {
  m.impl("verify", &verify_cuda);
  m.impl("draft_step", &draft_step_cuda);
  m.impl("philox_uniforms", &philox_uniforms_cuda);
}
