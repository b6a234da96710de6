"""The benchmark commands: each writes JSON + a markdown table (+ a PNG where a picture helps)
under benchmarks/results and prints the table."""

from __future__ import annotations

import argparse

import torch

from ..bench import alternatives, batch, drafts, e2e, linear, microbench, policies, quant, soak
from ..bench import warmup as warmup_bench
from ..drafts.shipped import DRAFT_KINDS


def _bench(args) -> int:
    data = e2e.run(args.prompts, args.lengths, args.feature_lengths, args.temperatures, args.max_new_tokens,
                   alternatives=tuple(args.alternatives))
    print(e2e.table(data["summary"], data["costs"]))
    return 0


def _microbench(args) -> int:
    dtypes = [getattr(torch, name) for name in args.dtypes]
    data = microbench.run(args.batches, args.lengths, args.vocabs, dtypes, args.repeats, args.device, args.out_name)
    print(microbench.table(data))
    return 0


def _policies(args) -> int:
    data = policies.run(args.prompts, args.temperatures, args.max_new_tokens, args.lengths, args.draft,
                        out_name=f"policies_{args.draft}")
    print(policies.table(data))
    return 0


def _linear_bench(args) -> int:
    print(linear.table(linear.run(args.repeats)))
    return 0


def _batch_bench(args) -> int:
    print(batch.table(batch.run(args.batches, args.lengths, args.temperatures, args.max_new_tokens, args.repeats,
                                args.draft, args.out_name)))
    return 0


def _quant_bench(args) -> int:
    print(quant.table(quant.run(args.prompts, args.k, args.temperatures, args.max_new_tokens, args.draft)))
    return 0


def _draft_bench(args) -> int:
    print(drafts.table(drafts.run(args.drafts, args.prompts, args.temperatures, args.k, args.max_new_tokens, args.out_name)))
    return 0


def _alternatives_bench(args) -> int:
    print(alternatives.table(alternatives.run(args.prompts, args.lengths, args.alternatives, args.temperatures,
                                              args.max_new_tokens)))
    return 0


def _soak(args) -> int:
    print(soak.table(soak.run(args.rounds)))
    return 0


def _warmup_bench(args) -> int:
    print(warmup_bench.table(warmup_bench.run(args.repeats, args.threads or torch.get_num_threads())))
    return 0


def add_parsers(commands, common: argparse.ArgumentParser) -> None:
    bench = commands.add_parser("bench", parents=[common], help="end-to-end benchmark on the held-out prompts (benchmarks/e2e.py)")
    bench.add_argument("--prompts", type=int, default=None, help="an evenly spaced subset of N held-out prompts (default: all 34)")
    bench.add_argument("--lengths", type=int, nargs="+", default=list(range(1, 9)), help="token-draft lengths")
    bench.add_argument("--feature-lengths", type=int, nargs="+", default=list(range(1, 9)), help="feature-draft lengths")
    bench.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--alternatives", type=int, nargs="*", default=[],
                       help="also the feature-draft lengths with this many first-token alternatives")
    bench.set_defaults(run=_bench)

    micro = commands.add_parser("microbench", parents=[common], help="verify-kernel microbenchmark per backend (benchmarks/microbench.py)")
    micro.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    micro.add_argument("--lengths", type=int, nargs="+", default=[1, 4, 8])
    micro.add_argument("--vocabs", type=int, nargs="+", default=[32_000, 49_152, 151_936, 262_144])
    micro.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    micro.add_argument("--repeats", type=int, default=5)
    micro.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    micro.add_argument("--out-name", default="microbench", help="results file name under benchmarks/results")
    micro.set_defaults(run=_microbench)

    pol = commands.add_parser("policies", parents=[common], help="draft-length policies x verifiers on the held-out prompts (benchmarks/policies.py)")
    pol.add_argument("--prompts", type=int, default=6, help="an evenly spaced subset of N held-out prompts")
    pol.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    pol.add_argument("--max-new-tokens", type=int, default=64)
    pol.add_argument("--lengths", type=int, nargs="+", default=[1, 2, 3, 4, 6], help="fixed draft lengths compared")
    pol.add_argument("--draft", choices=DRAFT_KINDS, default=DRAFT_KINDS[0], help="the shipped SmolLM2 draft")
    pol.set_defaults(run=_policies)

    lb = commands.add_parser("linear-bench", parents=[common], help="skinny linear kernel vs F.linear (benchmarks/linear.py)")
    lb.add_argument("--repeats", type=int, default=21)
    lb.set_defaults(run=_linear_bench)

    bb = commands.add_parser("batch-bench", parents=[common],
                             help="batched speculative vs batched autoregressive decoding per batch size (benchmarks/batch.py)")
    bb.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    bb.add_argument("--lengths", type=int, nargs="+", default=[1, 2, 4], help="fixed draft lengths compared")
    bb.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    bb.add_argument("--max-new-tokens", type=int, default=64)
    bb.add_argument("--repeats", type=int, default=3)
    bb.add_argument("--draft", choices=DRAFT_KINDS, default=DRAFT_KINDS[0], help="the shipped SmolLM2 draft")
    bb.add_argument("--out-name", default=None, help="results file name under benchmarks/results (default batch_<draft>)")
    bb.set_defaults(run=_batch_bench)

    qb = commands.add_parser("quant-bench", parents=[common],
                             help="int8 draft (int8 skinny kernel, torchao, torch dynamic) vs fp32: c, acceptance, tokens/s (benchmarks/quant.py)")
    qb.add_argument("--prompts", type=int, default=8, help="an evenly spaced subset of N held-out prompts")
    qb.add_argument("-k", type=int, default=1, help="fixed draft length")
    qb.add_argument("--draft", choices=DRAFT_KINDS, default="feature", help="which shipped draft to quantize")
    qb.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    qb.add_argument("--max-new-tokens", type=int, default=64)
    qb.set_defaults(run=_quant_bench)

    ab = commands.add_parser("alternatives-bench", parents=[common],
                             help="first-token alternatives against the same loop without them (benchmarks/alternatives.py)")
    ab.set_defaults(run=_alternatives_bench)
    ab.add_argument("--prompts", type=int, default=12, help="an evenly spaced subset of N held-out prompts")
    ab.add_argument("--lengths", type=int, nargs="+", default=[1, 2], help="fixed feature-draft lengths (and the learned policy)")
    ab.add_argument("--alternatives", type=int, nargs="+", default=[3], help="alternative counts compared")
    ab.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ab.add_argument("--max-new-tokens", type=int, default=128)

    db = commands.add_parser("draft-bench", parents=[common],
                             help="feature-draft files side by side on the held-out prompts: cost c, teacher-forced "
                                  "top-1 / top-3 agreement, acceptance by position in the loop (benchmarks/drafts.py)")
    db.add_argument("drafts", nargs="+", help="feature-draft files (the shipped one is specdec_fast/data/"
                                              "smollm2_feature_draft.safetensors)")
    db.add_argument("--prompts", type=int, default=None, help="an evenly spaced subset of N held-out prompts (default: all 34)")
    db.add_argument("-k", type=int, default=2, help="fixed draft length in the loop")
    db.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    db.add_argument("--max-new-tokens", type=int, default=128)
    db.add_argument("--out-name", default="drafts", help="results file name under benchmarks/results")
    db.set_defaults(run=_draft_bench)

    so = commands.add_parser("soak", parents=[common], help="rounds of fast_generate and batch_generate with RSS readings (benchmarks/soak.py)")
    so.add_argument("--rounds", type=int, default=1000)
    so.set_defaults(run=_soak)

    wb = commands.add_parser("warmup-bench", parents=[common], help="cold vs warm first-request times in fresh processes")
    wb.add_argument("--repeats", type=int, default=3)
    wb.set_defaults(run=_warmup_bench)
