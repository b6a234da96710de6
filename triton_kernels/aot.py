"""Compile the Triton kernels for a GPU target without a GPU (a build check; the math is
tested under TRITON_INTERPRET=1, which cannot compile).

    python -m specdec_fast._triton.aot [--arch 90]    # prints each kernel's cubin size
"""

import argparse
import os

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .draft_step import draft_step_kernel
from .philox import philox_kernel
from .verify import verify_block_kernel, verify_kernel

I64, F32 = "*i64", "*fp32"
SIGNATURES = {  # kernel: (function, argument types, constexprs); logits in bf16 here
    "verify": (verify_kernel, ["*bf16", F32, "*i8", I64, I64, F32, I64, F32, F32, I64, I64, I64, "i64", "i64"],
               dict(BLOCK=4096)),
    "verify_block": (verify_block_kernel, ["*bf16", F32, "*i8", I64, I64, F32, I64, F32, F32, I64, I64, I64, "i64", "i64"],
                     dict(BLOCK=4096)),
    "draft_step": (draft_step_kernel, ["*bf16", F32, I64, F32, F32, I64, F32, F32, F32, F32, "i64"],
                   dict(BLOCK=4096)),
    "philox": (philox_kernel, [I64, I64, F32, "i64"], dict(BLOCK=64)),
}


def compile_for_gpu(name: str, arch: int = 90) -> dict:
    """Compile one kernel for CUDA compute capability ``arch``; returns its assembly by stage (ttir ... cubin)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    fn, types, constexprs = SIGNATURES[name]
    params = [p for p in fn.arg_names if p not in constexprs]
    signature = dict(zip(params, types)) | {c: "constexpr" for c in constexprs}
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", arch, 32)).asm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args()
    for name in SIGNATURES:
        print(f"{name}: {len(compile_for_gpu(name, args.arch)['cubin'])} bytes of sm_{args.arch} cubin")


if __name__ == "__main__":
    main()
