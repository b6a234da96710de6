// torch-facing side of the CPU kernels: the CPU implementations of the ops whose schemas
// specdec_fast/kernels/registry.py defines. Shapes are checked in Python (specdec_fast/kernels/ops.py),
// the values a verifier reads by the kernels (a row's status).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>

#include "../op_inputs.h"
#include "../philox.h"
#include "decoder.h"
#include "lookup.h"
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
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_rows(const specdec::VerifyInputs& in, bool block) {
  const int64_t B = in.B, K = in.K, V = in.V;
  at::Tensor accepted = at::empty({B}, in.tokens.options()), tokens = at::empty({B, K + 1}, in.tokens.options()),
             status = at::empty({B}, in.tokens.options());
  const bool* point_mass = in.point_mass.data_ptr<bool>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, in.target.scalar_type(), "verify_cpu", [&] {
    const auto* target = storage<scalar_t>(in.target);
    for_each_row(B, V, [&](int64_t b, specdec::Scratch& scratch, auto for_chunks) {
      specdec::Status row_status = specdec::kOk;
      const auto row = [&](auto verify_row) {
        return verify_row(target + b * (K + 1) * V, in.q_row(b, point_mass), in.tokens.data_ptr<int64_t>() + b * K,
                          in.lens.data_ptr<int64_t>()[b], K, V, row_sampling(in.temperature, in.top_k, in.top_p, b),
                          in.uniforms.data_ptr<float>() + b * (K + 1), tokens.data_ptr<int64_t>() + b * (K + 1), scratch,
                          &row_status, for_chunks);
      };
      accepted.data_ptr<int64_t>()[b] = block ? row([](auto&&... a) { return specdec::verify_block_row(a...); })
                                              : row([](auto&&... a) { return specdec::verify_row(a...); });
      status.data_ptr<int64_t>()[b] = row_status;
    });
  });
  return {accepted, tokens, accepted + 1, status};
}

template <bool kBlock>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_cpu(
    const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_probs, const at::Tensor& point_mass,
    const at::Tensor& draft_tokens, const at::Tensor& draft_lens, const at::Tensor& temperature, const at::Tensor& top_k,
    const at::Tensor& top_p, const at::Tensor& uniforms) {
  return verify_rows(specdec::verify_inputs(target_logits, draft_probs, point_mass, draft_tokens, draft_lens, temperature,
                                            top_k, top_p, uniforms),
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
  const float* x_ptr = xc.data_ptr<float>();
  const W* w_ptr = w.data_ptr<W>();
  float* y_ptr = y.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    specdec::skinny_linear<W>(x_ptr, M, w_ptr, scale, y_ptr, K, N, begin, end);
  });
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


// A weight matrix of the decoder pass as decoder.h reads it: fp32 or bf16 [N, K] (scale empty),
// int8 [N, K] with scale [N] (one per row), or blocks (skinny_linear.h): uint8 Q4_1 codes [N, K / 2]
// with scale [N, K / 32, 2], int8 Q8_0 codes [N, K] with scale [N, K / 32]; all contiguous. integer:
// blocks taken against 8-bit activations (integer_linear.h), which only blocks can be.
specdec::Linear decoder_linear(const at::Tensor& w, const at::Tensor& scale, bool integer) {  // scale: undefined or empty for none
  using Kind = specdec::Linear::Kind;
  const bool scaled = scale.defined() && scale.numel() > 0;
  TORCH_CHECK(w.is_contiguous() && w.dim() == 2 && (!scaled || (scale.is_contiguous() && scale.scalar_type() == at::kFloat)),
              "decoder_pass: weights must be contiguous 2D, scales contiguous fp32");
  const int64_t N = w.size(0), K = w.size(1) * (w.scalar_type() == at::kByte ? 2 : 1);
  const auto blocks_of = [&](std::vector<int64_t> shape) {
    TORCH_CHECK(K % specdec::kBlock == 0 && scaled && scale.sizes() == at::IntArrayRef(shape), "decoder_pass: block weights [", N,
                ", ", K, "] need K a multiple of 32 and scales ", at::IntArrayRef(shape));
  };
  Kind kind;
  switch (w.scalar_type()) {
    case at::kFloat: kind = Kind::kFloat; break;
    case at::kBFloat16: kind = Kind::kBFloat16; break;
    case at::kByte: kind = Kind::kQ4_1, blocks_of({N, K / specdec::kBlock, 2}); break;
    case at::kChar:
      if (scaled && scale.dim() == 2) {
        kind = Kind::kQ8_0, blocks_of({N, K / specdec::kBlock});
      } else {
        TORCH_CHECK(scaled && scale.dim() == 1 && scale.size(0) == N, "decoder_pass: int8 weights need one scale per row or per block");
        kind = Kind::kInt8Rows;
      }
      break;
    default: TORCH_CHECK(false, "decoder_pass: weights must be fp32, bf16, int8 or uint8 blocks, got ", w.scalar_type());
  }
  TORCH_CHECK((kind == Kind::kFloat || kind == Kind::kBFloat16) != scaled, "decoder_pass: a scale for exactly the int8 and block weights");
  if (integer) {
    TORCH_CHECK(kind == Kind::kQ4_1 || kind == Kind::kQ8_0, "decoder_pass: 8-bit activations need Q4_1 or Q8_0 block weights, got ",
                w.scalar_type(), " weights with scale ", scale.sizes());
    kind = kind == Kind::kQ4_1 ? Kind::kQ4_1Integer : Kind::kQ8_0Integer;
  }
  return {kind, w.data_ptr(), scaled ? scale.data_ptr<float>() : nullptr, N, K};
}

// Room for M rows of a linear's input quantised per block (the integer kinds), inputs up to K wide.
struct CodeBuffers {
  at::Tensor q, f;
  CodeBuffers(int64_t M, int64_t K, const at::TensorOptions& f32)
      : q(at::empty({M * K}, f32.dtype(at::kChar))), f(at::empty({specdec::QuantizedRows::floats(M, K)}, f32)) {}
  specdec::QuantizedRows rows(int64_t M, int64_t K) { return {q.data_ptr<int8_t>(), f.data_ptr<float>(), M, K / specdec::kBlock}; }
};

// x [M, K] fp32 quantised to 8 bits per block of 32, times block weights (codes, scale as
// decoder_linear reads them) -> [M, N] fp32 (integer_linear.h); checked in specdec_fast/kernels/integer.py.
at::Tensor integer_linear_cpu(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale) {
  const specdec::Linear L = decoder_linear(codes.contiguous(), scale.contiguous(), true);
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0);
  TORCH_CHECK(xc.dim() == 2 && xc.size(1) == L.in && xc.scalar_type() == at::kFloat, "integer_linear: x [M, ", L.in, "] fp32");
  CodeBuffers buffers(M, L.in, xc.options());
  const specdec::QuantizedRows rows = buffers.rows(M, L.in);
  for (int64_t m = 0; m < M; ++m) specdec::quantize_row(xc.data_ptr<float>() + m * L.in, m, rows);
  at::Tensor y = at::empty({M, L.out}, xc.options());
  at::parallel_for(0, L.out, 64, [&](int64_t begin, int64_t end) {
    specdec::linear_columns(xc.data_ptr<float>(), rows, M, L, y.data_ptr<float>(), begin, end);
  });
  return y;
}

// One decoder pass (csrc/cpu/decoder.h) over M tokens; the layout of the arguments is
// specdec_fast/models/lean.py's: norms [2 L + 1] (attention and MLP norm of each layer, then
// the final norm), weights [4 L + 1] (qkv, o, gate_up, down of each layer, then the head), each
// as decoder_linear reads it with scales [4 L + 1] (empty tensors for fp32 and bf16), or scales
// empty for all fp32 / bf16 weights; qkv_bias [L] or empty.
std::tuple<at::Tensor, at::Tensor> decoder_pass_cpu(const at::Tensor& x, at::TensorList norms, at::TensorList weights,
                                                    at::TensorList scales, at::TensorList qkv_bias, const at::Tensor& cos,
                                                    const at::Tensor& sin, const at::Tensor& rows, const at::Tensor& positions,
                                                    const at::Tensor& slots, at::Tensor cache, const at::Tensor& logit_rows, int64_t heads,
                                                    int64_t kv_heads, double eps, bool integer) {
  const int64_t M = x.size(0), d = x.size(1), L = static_cast<int64_t>(norms.size() - 1) / 2;
  TORCH_CHECK(weights.size() == static_cast<size_t>(4 * L + 1), "decoder_pass: 4 weights per layer and a head");
  TORCH_CHECK(scales.empty() || scales.size() == weights.size(), "decoder_pass: no scales, or one (maybe empty) per weight");
  const auto linear = [&](int64_t i) { return decoder_linear(weights[i], scales.empty() ? at::Tensor() : scales[i], integer); };
  const specdec::Linear head = linear(4 * L);
  const int64_t hd = cache.size(5), I = weights[2].size(0) / 2, R = logit_rows.size(0), V = head.out;
  TORCH_CHECK(cache.is_contiguous() && cache.scalar_type() == at::kFloat && cache.size(1) == L, "decoder_pass: bad cache");
  std::vector<specdec::DecoderLayer> layers;
  for (int64_t l = 0; l < L; ++l)
    layers.push_back({norms[2 * l].data_ptr<float>(), linear(4 * l), qkv_bias.empty() ? nullptr : qkv_bias[l].data_ptr<float>(),
                      linear(4 * l + 1), norms[2 * l + 1].data_ptr<float>(), linear(4 * l + 2), linear(4 * l + 3)});
  const at::Tensor pos = positions.contiguous(), slot = slots.contiguous(), row = rows.contiguous(), c = cos.contiguous(), s = sin.contiguous();
  TORCH_CHECK(pos.numel() == M && slot.numel() == M && row.numel() == M && c.size(0) == M && c.size(1) == hd, "decoder_pass: one row, position and rotary row per token");
  TORCH_CHECK(M == 0 || (slot.max().item<int64_t>() < cache.size(4) && (pos <= slot).all().item<bool>() && row.max().item<int64_t>() < cache.size(0)),
              "decoder_pass: a slot past the cache's capacity or below its position, or a row past the batch");
  const auto f32 = x.options();
  at::Tensor h = x.contiguous().clone(), hidden = at::empty({M, d}, f32), logits = at::empty({R, V}, f32);
  at::Tensor scratch = at::empty({M * (d + (heads + 2 * kv_heads) * hd + heads * hd + 3 * I + d) + R * d}, f32);
  float* p = scratch.data_ptr<float>();
  CodeBuffers codes(integer ? M : 0, std::max({d, heads * hd, I}), f32);
  const specdec::DecoderScratch buf{p, p + M * d, p + M * (d + (heads + 2 * kv_heads) * hd),
                                    p + M * (d + (2 * heads + 2 * kv_heads) * hd),
                                    p + M * (d + (2 * heads + 2 * kv_heads) * hd + 2 * I),
                                    p + M * (d + (2 * heads + 2 * kv_heads) * hd + 3 * I), codes.q.data_ptr<int8_t>(),
                                    codes.f.data_ptr<float>()};
  const specdec::DecoderShape shape{d, heads, kv_heads, hd, I, static_cast<float>(eps)};
  const specdec::PassTokens tokens{M, row.data_ptr<int64_t>(), pos.data_ptr<int64_t>(), slot.data_ptr<int64_t>(), c.data_ptr<float>(), s.data_ptr<float>()};
  const specdec::KVCache kv{cache.data_ptr<float>(), L, kv_heads, cache.size(4), hd};
  const at::Tensor lr = logit_rows.contiguous();
  const int64_t* lr_begin = lr.data_ptr<int64_t>();
  TORCH_CHECK(std::all_of(lr_begin, lr_begin + R, [M](int64_t r) { return 0 <= r && r < M; }),
              "decoder_pass: logit_rows must index the pass's ", M, " tokens");
  specdec::decoder_pass(h.data_ptr<float>(), layers, norms[2 * L].data_ptr<float>(), head, shape, tokens, kv, buf,
                        hidden.data_ptr<float>(), lr.data_ptr<int64_t>(), R, p + M * (2 * d + (2 * heads + 2 * kv_heads) * hd + 3 * I),
                        logits.data_ptr<float>(), at::get_num_threads());
  return {hidden, logits};
}

// Prompt lookup (csrc/cpu/lookup.h) for B sequences: tokens [B, H] int64 (row b's first
// lengths[b] are its committed tokens), tables keys, next [B, C] int64 (C a power of two).
specdec::LookupTable lookup_table(at::Tensor& keys, at::Tensor& next, int64_t b) {
  const int64_t C = keys.size(1);
  return {reinterpret_cast<uint64_t*>(keys.data_ptr<int64_t>()) + b * C, next.data_ptr<int64_t>() + b * C, C};
}

void check_lookup(const at::Tensor& tokens, const at::Tensor& keys, const at::Tensor& next, int64_t max_n) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong && tokens.is_contiguous(), "lookup: tokens [B, H] int64");
  TORCH_CHECK(keys.sizes() == next.sizes() && keys.size(0) == tokens.size(0) && keys.is_contiguous() && next.is_contiguous() &&
                  keys.scalar_type() == at::kLong && next.scalar_type() == at::kLong,
              "lookup: keys and next [B, C] int64, one row per sequence");
  TORCH_CHECK(keys.size(1) > 0 && (keys.size(1) & (keys.size(1) - 1)) == 0, "lookup: the table size must be a power of two");
  TORCH_CHECK(max_n >= 1 && max_n <= specdec::kLookupMaxN, "lookup: n-grams of 1..", specdec::kLookupMaxN, " tokens");
}

void lookup_add_cpu(const at::Tensor& tokens, const at::Tensor& from, const at::Tensor& to, at::Tensor keys, at::Tensor next,
                    int64_t max_n) {
  check_lookup(tokens, keys, next, max_n);
  const at::Tensor f = from.to(at::kLong).contiguous(), t = to.to(at::kLong).contiguous();
  const int64_t H = tokens.size(1);
  for (int64_t b = 0; b < tokens.size(0); ++b) {
    const int64_t lo = f.data_ptr<int64_t>()[b], hi = t.data_ptr<int64_t>()[b];
    TORCH_CHECK(0 <= lo && lo <= hi && hi <= H, "lookup_add: row ", b, " indexes tokens ", lo, "..", hi, " of ", H);
    specdec::lookup_add(lookup_table(keys, next, b), tokens.data_ptr<int64_t>() + b * H, lo, hi, static_cast<int>(max_n));
  }
}

// Proposals for B query sequences (tokens [B, H], lengths [B]) from the tables keys, next
// [T, C] over source [T, S] (source_lengths [T]): row b reads table and source b, or the one
// shared table and source when T = 1 and B > 1 (a corpus).
std::tuple<at::Tensor, at::Tensor, at::Tensor> propose_from(const at::Tensor& tokens, const at::Tensor& lengths,
                                                            const at::Tensor& source, const at::Tensor& source_lengths,
                                                            at::Tensor keys, at::Tensor next, int64_t min_n, int64_t max_n,
                                                            int64_t k) {
  check_lookup(source, keys, next, max_n);
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong && tokens.is_contiguous(), "lookup: tokens [B, H] int64");
  const at::Tensor len = lengths.to(at::kLong).contiguous(), source_len = source_lengths.to(at::kLong).contiguous();
  const int64_t B = tokens.size(0), H = tokens.size(1), T = source.size(0), S = source.size(1);
  TORCH_CHECK(T == B || T == 1, "lookup: one table per sequence, or one shared table");
  at::Tensor out = at::full({B, k}, -1, tokens.options()), count = at::zeros({B}, tokens.options()),
             matched = at::zeros({B}, tokens.options());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = len.data_ptr<int64_t>()[b], t = T == 1 ? 0 : b, m = source_len.data_ptr<int64_t>()[t];
    TORCH_CHECK(0 <= n && n <= H, "lookup_propose: row ", b, " has length ", n, " of ", H);
    TORCH_CHECK(0 <= m && m <= S, "lookup_propose: source ", t, " has length ", m, " of ", S);
    count.data_ptr<int64_t>()[b] = specdec::lookup_propose(
        lookup_table(keys, next, t), tokens.data_ptr<int64_t>() + b * H, n, source.data_ptr<int64_t>() + t * S, m,
        static_cast<int>(min_n), static_cast<int>(max_n), k, out.data_ptr<int64_t>() + b * k, matched.data_ptr<int64_t>() + b);
  }
  return {out, count, matched};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lookup_propose_cpu(const at::Tensor& tokens, const at::Tensor& lengths,
                                                                  at::Tensor keys, at::Tensor next, int64_t min_n,
                                                                  int64_t max_n, int64_t k) {
  return propose_from(tokens, lengths, tokens, lengths, keys, next, min_n, max_n, k);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lookup_propose_in_cpu(const at::Tensor& tokens, const at::Tensor& lengths,
                                                                     const at::Tensor& source, const at::Tensor& source_length,
                                                                     at::Tensor keys, at::Tensor next, int64_t min_n,
                                                                     int64_t max_n, int64_t k) {
  TORCH_CHECK(source.size(0) == 1, "lookup_propose_in: one shared source [1, S]");
  return propose_from(tokens, lengths, source, source_length, keys, next, min_n, max_n, k);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec_fast, CPU, m) {
  m.impl("verify", &verify_cpu<false>);
  m.impl("verify_block", &verify_cpu<true>);
  m.impl("draft_step", &draft_step_cpu);
  m.impl("philox_uniforms", &philox_uniforms_cpu);
  m.impl("skinny_linear", &skinny_linear_cpu);
  m.impl("skinny_linear_int8", &skinny_linear_int8_cpu);
  m.impl("integer_linear", &integer_linear_cpu);
  m.impl("decoder_pass", &decoder_pass_cpu);
  m.impl("lookup_add", &lookup_add_cpu);
  m.impl("lookup_propose", &lookup_propose_cpu);
  m.impl("lookup_propose_in", &lookup_propose_in_cpu);
}
