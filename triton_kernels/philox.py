"""Counter-based uniforms in Triton (reference: specdec_fast.sampling.philox_uniforms).

triton.language.randint is Philox4x32-10 on counter (offset low, offset high, 0, 0) and
key (seed low, seed high), its first output word: the same generator as csrc/philox.h.
"""

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n"])
def philox_kernel(seed_ptr, offset_ptr, out_ptr, n, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    seed = tl.load(seed_ptr + b)
    offset = tl.load(offset_ptr + b)
    for start in range(0, n, BLOCK):
        i = start + tl.arange(0, BLOCK).to(tl.int64)
        r = tl.randint(seed, offset + i)
        u = ((r >> 8) + 1).to(tl.float32) * 5.9604644775390625e-8  # 2^-24: in (0, 1]
        tl.store(out_ptr + b * n + i, u, mask=i < n)


def philox_uniforms(seed: torch.Tensor, offset: torch.Tensor, n: int) -> torch.Tensor:
    """seed, offset: [B] int64 -> [B, n] fp32 in (0, 1]."""
    out = torch.empty(seed.shape[0], n, dtype=torch.float32, device=seed.device)
    if out.numel():
        philox_kernel[(seed.shape[0],)](seed.contiguous().long(), offset.contiguous().long(), out, n,
                                        BLOCK=64)
    return out
