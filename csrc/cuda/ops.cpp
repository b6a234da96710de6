// torch-facing side of the CUDA kernels: the CUDA implementations of the ops whose schemas
// specdec_fast/kernels/registry.py defines. Shapes are checked in Python (specdec_fast/kernels/ops.py),
// values by the kernels (a row's status); here: contiguity and dtypes, the device guard, the
// current stream, the launch's error.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../op_inputs.h"
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

// Token-wise (block = false) or block verification of every row.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_rows(const specdec::VerifyInputs& in, bool block) {
  at::Tensor accepted = at::empty({in.B}, in.tokens.options()), tokens = at::empty({in.B, in.K + 1}, in.tokens.options()),
             status = at::empty({in.B}, in.tokens.options());
  check_launch(k::verify(kernel_dtype(in.target), in.target.data_ptr(), in.q.defined() ? in.q.data_ptr<float>() : nullptr,
                         in.point_mass.data_ptr<bool>(), in.tokens.data_ptr<int64_t>(), in.lens.data_ptr<int64_t>(),
                         in.temperature.data_ptr<float>(), in.top_k.data_ptr<int64_t>(), in.top_p.data_ptr<float>(),
                         in.uniforms.data_ptr<float>(), accepted.data_ptr<int64_t>(), tokens.data_ptr<int64_t>(),
                         status.data_ptr<int64_t>(), in.B, in.K, in.V, block, c10::cuda::getCurrentCUDAStream()),
               block ? "verify_block" : "verify");
  return {accepted, tokens, accepted + 1, status};
}

template <bool kBlock>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_cuda(
    const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_probs, const at::Tensor& point_mass,
    const at::Tensor& draft_tokens, const at::Tensor& draft_lens, const at::Tensor& temperature, const at::Tensor& top_k,
    const at::Tensor& top_p, const at::Tensor& uniforms) {
  const c10::cuda::CUDAGuard guard(target_logits.device());
  return verify_rows(specdec::verify_inputs(target_logits, draft_probs, point_mass, draft_tokens, draft_lens, temperature,
                                            top_k, top_p, uniforms),
                     kBlock);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> draft_step_cuda(
    const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
    const at::Tensor& uniforms) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const specdec::DraftStepInputs in = specdec::draft_step_inputs(logits, temperature, top_k, top_p, uniforms);
  auto out = specdec::draft_step_outputs(in);
  auto& [tokens, probs, token_prob, entropy, top1] = out;
  check_launch(k::draft_step(kernel_dtype(in.logits), in.logits.data_ptr(), in.temperature.data_ptr<float>(),
                             in.top_k.data_ptr<int64_t>(), in.top_p.data_ptr<float>(), in.uniforms.data_ptr<float>(),
                             tokens.data_ptr<int64_t>(), probs.data_ptr<float>(), token_prob.data_ptr<float>(),
                             entropy.data_ptr<float>(), top1.data_ptr<float>(), in.B, in.V,
                             c10::cuda::getCurrentCUDAStream()),
               "draft_step");
  return out;
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
  m.impl("verify", &verify_cuda<false>);
  m.impl("verify_block", &verify_cuda<true>);
  m.impl("draft_step", &draft_step_cuda);
  m.impl("philox_uniforms", &philox_uniforms_cuda);
}
