"""The benchmark commands: each writes JSON + a markdown table (+ a PNG where a picture helps)
into ``--out`` (default ./results, never the package) and prints the table."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..bench import alternatives, batch, drafts, e2e, linear, microbench, passes, policies, quant, soak, workload
from ..bench import warmup as warmup_bench
from ..data.workload import CATEGORIES
from ..drafts.shipped import DRAFT_KINDS


def _out(args, name: str) -> Path:
    """Where a benchmark writes: ``--out`` / (``--out-name`` or the benchmark's own name)."""
    return Path(args.out) / (args.out_name or name)


def _bench(args) -> int:
    if args.workload:
        name = "workload" if args.batch == 1 else f"workload_batch{args.batch}"
        name += {"fp32-dense": "_dense", "q8": "_q8"}.get(args.lean, "")
        data = workload.run(args.categories, args.prompts or 4, args.temperatures, args.max_new_tokens, args.repeats,
                            _out(args, name), args.batch, args.lean, not args.no_peers)
        print(workload.table(data))
        return 0
    data = e2e.run(args.prompts, args.lengths, args.feature_lengths, args.temperatures, args.max_new_tokens,
                   out=_out(args, "e2e"), alternatives=tuple(args.alternatives))
    print(e2e.table(data["summary"], data["costs"]))
    return 0


def _microbench(args) -> int:
    dtypes = [getattr(torch, name) for name in args.dtypes]
    data = microbench.run(args.batches, args.lengths, args.vocabs, dtypes, args.repeats, args.device, _out(args, "microbench"),
                          args.drafts)
    print(microbench.table(data))
    return 0


def _policies(args) -> int:
    data = policies.run(args.prompts, args.temperatures, args.max_new_tokens, args.lengths, args.draft,
                        out=_out(args, f"policies_{args.draft}"))
    print(policies.table(data))
    return 0


def _linear_bench(args) -> int:
    print(linear.table(linear.run(args.repeats, _out(args, "linear"))))
    return 0


def _pass_bench(args) -> int:
    print(passes.table(passes.run(args.repeats, args.prompts, args.max_new_tokens, args.decode_repeats, _out(args, "passes"))))
    return 0


def _batch_bench(args) -> int:
    print(batch.table(batch.run(args.batches, args.lengths, args.temperatures, args.max_new_tokens, args.repeats,
                                args.draft, _out(args, f"batch_{args.draft}"))))
    return 0


def _quant_bench(args) -> int:
    print(quant.table(quant.run(args.prompts, args.k, args.temperatures, args.max_new_tokens, args.draft, _out(args, "quant"))))
    return 0


def _draft_bench(args) -> int:
    print(drafts.table(drafts.run(args.drafts, args.prompts, args.temperatures, args.k, args.max_new_tokens,
                                  _out(args, "drafts"))))
    return 0


def _alternatives_bench(args) -> int:
    print(alternatives.table(alternatives.run(args.prompts, args.lengths, args.alternatives, args.temperatures,
                                              args.max_new_tokens, _out(args, "alternatives"))))
    return 0


def _soak(args) -> int:
    print(soak.table(soak.run(args.rounds, out=_out(args, "soak"))))
    return 0


def _warmup_bench(args) -> int:
    print(warmup_bench.table(warmup_bench.run(args.repeats, args.threads or torch.get_num_threads(), _out(args, "warmup"))))
    return 0


def add_parsers(commands, common: argparse.ArgumentParser) -> None:
    results = argparse.ArgumentParser(add_help=False, parents=[common])
    results.add_argument("--out", default="results", help="folder for the JSON, markdown and PNG results (made if missing)")
    results.add_argument("--out-name", default=None, help="file name of the results, without suffix (default: the benchmark's)")
    bench = commands.add_parser("bench", parents=[results], help="end-to-end benchmark on the held-out prompts (benchmarks/e2e.py)")
    bench.add_argument("--prompts", type=int, default=None,
                       help="an evenly spaced subset of N held-out prompts (default: all 34; --workload: the first 4 per category)")
    bench.add_argument("--batch", type=int, default=1,
                       help="--workload: run our engines in batch_generate on groups of this many prompts")
    bench.add_argument("--workload", action="store_true",
                       help="the workload benchmark instead: by prompt category, transformers' engines beside ours, with "
                            "prompt lookup and the hybrid (specdec_fast/bench/workload.py)")
    bench.add_argument("--categories", nargs="+", choices=CATEGORIES, default=list(CATEGORIES),
                       help="--workload: prompt categories")
    bench.add_argument("--repeats", type=int, default=1, help="--workload: repeats of every cell (medians reported)")
    bench.add_argument("--no-peers", action="store_true", help="--workload: our engines only (no transformers or llama.cpp)")
    bench.add_argument("--lean", choices=("auto", "fp32-dense", "q8"), default="auto",
                       help="--workload: our target's path: the checkpoint's blocks (auto: compute-bound on a CPU), whole "
                            "fp32 matrices (fp32-dense: memory-bound, as a dense checkpoint is read), or the blocks against "
                            "8-bit activations (q8: integer products)")
    bench.add_argument("--lengths", type=int, nargs="+", default=list(range(1, 9)), help="token-draft lengths")
    bench.add_argument("--feature-lengths", type=int, nargs="+", default=list(range(1, 9)), help="feature-draft lengths")
    bench.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="sampling temperatures (0 = greedy)")
    bench.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per generation")
    bench.add_argument("--alternatives", type=int, nargs="*", default=[],
                       help="also the feature-draft lengths with this many first-token alternatives")
    bench.set_defaults(run=_bench)

    micro = commands.add_parser("microbench", parents=[results], help="verify-kernel microbenchmark per backend (benchmarks/microbench.py)")
    micro.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128], help="batch sizes")
    micro.add_argument("--lengths", type=int, nargs="+", default=[1, 4, 8], help="draft lengths K")
    micro.add_argument("--vocabs", type=int, nargs="+", default=[32_000, 49_152, 151_936, 262_144], help="vocabulary sizes V")
    micro.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="dtypes of the target logits")
    micro.add_argument("--repeats", type=int, default=5, help="timed repeats per cell (medians reported)")
    micro.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="tensors' device")
    micro.add_argument("--drafts", nargs="+", default=list(microbench.DRAFTS), choices=microbench.DRAFTS,
                       help="draft kinds: a model's q, or point masses (draft_probs=None)")
    micro.set_defaults(run=_microbench)

    pol = commands.add_parser("policies", parents=[results], help="draft-length policies x verifiers on the held-out prompts (benchmarks/policies.py)")
    pol.add_argument("--prompts", type=int, default=6, help="an evenly spaced subset of N held-out prompts")
    pol.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="sampling temperatures (0 = greedy)")
    pol.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per generation")
    pol.add_argument("--lengths", type=int, nargs="+", default=[1, 2, 3, 4, 6], help="fixed draft lengths compared")
    pol.add_argument("--draft", choices=DRAFT_KINDS, default=DRAFT_KINDS[0], help="the shipped SmolLM2 draft")
    pol.set_defaults(run=_policies)

    lb = commands.add_parser("linear-bench", parents=[results], help="skinny linear kernel vs F.linear (benchmarks/linear.py)")
    lb.add_argument("--repeats", type=int, default=21, help="timed repeats per cell (medians reported)")
    lb.set_defaults(run=_linear_bench)
    pb = commands.add_parser("pass-bench", parents=[results],
                             help="the target's pass: transformers, skinny, lean, llama.cpp peer (benchmarks/passes.py)")
    pb.add_argument("--repeats", type=int, default=15, help="timed repeats per pass cell (medians reported)")
    pb.add_argument("--prompts", type=int, default=3, help="held-out chat prompts decoded greedily by each engine")
    pb.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per greedy decoding")
    pb.add_argument("--decode-repeats", type=int, default=3, help="repeats of each decoding (medians reported)")
    pb.set_defaults(run=_pass_bench)

    bb = commands.add_parser("batch-bench", parents=[results],
                             help="batched speculative vs batched autoregressive decoding per batch size (benchmarks/batch.py)")
    bb.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="batch sizes")
    bb.add_argument("--lengths", type=int, nargs="+", default=[1, 2, 4], help="fixed draft lengths compared")
    bb.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="sampling temperatures (0 = greedy)")
    bb.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per generation")
    bb.add_argument("--repeats", type=int, default=3, help="timed repeats per cell (medians reported)")
    bb.add_argument("--draft", choices=DRAFT_KINDS, default=DRAFT_KINDS[0], help="the shipped SmolLM2 draft")
    bb.set_defaults(run=_batch_bench)

    qb = commands.add_parser("quant-bench", parents=[results],
                             help="int8 draft (int8 skinny kernel, torchao, torch dynamic) vs fp32: c, acceptance, tokens/s (benchmarks/quant.py)")
    qb.add_argument("--prompts", type=int, default=8, help="an evenly spaced subset of N held-out prompts")
    qb.add_argument("-k", type=int, default=1, help="fixed draft length")
    qb.add_argument("--draft", choices=DRAFT_KINDS, default="feature", help="which shipped draft to quantize")
    qb.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="sampling temperatures (0 = greedy)")
    qb.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per generation")
    qb.set_defaults(run=_quant_bench)

    ab = commands.add_parser("alternatives-bench", parents=[results],
                             help="first-token alternatives against the same loop without them (benchmarks/alternatives.py)")
    ab.set_defaults(run=_alternatives_bench)
    ab.add_argument("--prompts", type=int, default=12, help="an evenly spaced subset of N held-out prompts")
    ab.add_argument("--lengths", type=int, nargs="+", default=[1, 2], help="fixed feature-draft lengths (and the learned policy)")
    ab.add_argument("--alternatives", type=int, nargs="+", default=[3], help="alternative counts compared")
    ab.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="sampling temperatures (0 = greedy)")
    ab.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per generation")

    db = commands.add_parser("draft-bench", parents=[results],
                             help="feature-draft files side by side on the held-out prompts: cost c, teacher-forced "
                                  "top-1 / top-3 agreement, acceptance by position in the loop (benchmarks/drafts.py)")
    db.add_argument("drafts", nargs="+", help="feature-draft files (the shipped one is specdec_fast/data/"
                                              "smollm2_feature_draft.safetensors)")
    db.add_argument("--prompts", type=int, default=None, help="an evenly spaced subset of N held-out prompts (default: all 34)")
    db.add_argument("-k", type=int, default=2, help="fixed draft length in the loop")
    db.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="sampling temperatures (0 = greedy)")
    db.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per generation")
    db.set_defaults(run=_draft_bench)

    so = commands.add_parser("soak", parents=[results], help="rounds of fast_generate and batch_generate with RSS readings (benchmarks/soak.py)")
    so.add_argument("--rounds", type=int, default=1000, help="rounds of each loop")
    so.set_defaults(run=_soak)

    wb = commands.add_parser("warmup-bench", parents=[results], help="cold vs warm first-request times in fresh processes")
    wb.add_argument("--repeats", type=int, default=3, help="timed repeats per cell (medians reported)")
    wb.set_defaults(run=_warmup_bench)
