"""``specdec-fast calibrate``: measure a loop's costs on this machine, store them, and print them with
the tokens per second each draft length should reach."""

from __future__ import annotations

import argparse

from ..decoding.calibrate import calibrate, calibration_for, key_for
from ..policies.calibration import Calibration, calibration_path, save_calibration
from .generate import add_pair_arguments, check_pair_flags, load_pair_from_args

ALPHAS = (0.3, 0.5, 0.7, 0.9)  # per-token acceptances of the expected-rate table


def pass_efficiency(c: Calibration, k: int) -> dict[str, float]:
    """The target pass against the machine's limits (lean path only): the (k + 1)-token pass's FLOP rate
    as a share of the matrix product's, and the one-token pass against the larger of its read and
    compute bounds."""
    if "pass_weights" not in c.extra:
        return {}
    weights, nbytes = c.extra["pass_weights"], c.extra["pass_bytes"]
    bound = max(nbytes / (c.read_gbps * 1e9), 2 * weights / (c.matmul_gflops * 1e9))
    wide = 2 * weights * (k + 1) / c.target(k + 1) / 1e9
    return {f"{k + 1}-token pass GFLOP/s": wide, f"{k + 1}-token pass / matrix product": wide / c.matmul_gflops,
            "one-token pass / its bound": bound / c.target(1), "weight MB read per pass": nbytes / 1e6}


def report(c: Calibration) -> str:
    """The calibration as text: the key, the costs, the pass's efficiency and the expected tokens/s."""
    k, key = c.extra["max_draft_tokens"], c.key
    lines = [f"machine: {key['cpu']}, {key['threads']} threads, CPU kernels {key['build']['isa']} (-march={key['build']['arch']})",
             f"path: target {key['target']} at {key['precision']}, draft {key['draft']}, specdec_fast {key['version']}",
             f"measured in {c.seconds:.2f} s; matrix product {c.matmul_gflops:.0f} GFLOP/s, memory read {c.read_gbps:.1f} GB/s", ""]
    for context, sizes in sorted(c.target_pass_s.items()):
        lines.append(f"target pass after {context} tokens: " + ", ".join(f"T({n}) {t * 1e3:.2f} ms" for n, t in sorted(sizes.items())))
    lines.append(f"plain round (an autoregressive step) {c.plain_round_s * 1e3:.2f} ms, draft step {c.draft_step_s * 1e3:.2f} ms, "
                 f"a drafting round's fixed part {c.round_fixed_s * 1e3:.2f} ms")
    lines += [f"{name}: {value:.3g}" for name, value in pass_efficiency(c, k).items()]
    lines += ["", "expected tokens/s by draft length k and per-token acceptance alpha (k = 0: the target alone):",
              "| k | " + " | ".join(f"alpha {a}" for a in ALPHAS) + " |", "|---|" + "---|" * len(ALPHAS)]
    lines += [f"| {n} | " + " | ".join(f"{c.rate(a, n):.1f}" for a in ALPHAS) + " |" for n in range(k + 1)]
    return "\n".join(lines)


def run(args) -> int:
    target, draft, _ = load_pair_from_args(args)
    if args.cached:
        measured = calibration_for(target, draft, args.lean, args.max_draft_tokens)
    else:
        measured = calibrate(target, draft, args.lean, args.max_draft_tokens)
        save_calibration(measured)
    print(measured.to_json() if args.json else report(measured))
    if not args.json:
        print(f"\nstored in {calibration_path(key_for(target, draft, args.lean))}")
    return 0


def check(parser: argparse.ArgumentParser, args) -> None:
    check_pair_flags(parser, args)
    if not 1 <= args.max_draft_tokens <= 16:
        parser.error(f"--max-draft-tokens must be in 1..16, got {args.max_draft_tokens}")


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    cal = commands.add_parser("calibrate", parents=[common], help="measure this machine's costs of a loop and print them",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_pair_arguments(cal)
    cal.add_argument("--max-draft-tokens", type=int, default=8, help="the longest draft whose round is timed")
    cal.add_argument("--cached", action="store_true", help="print the stored calibration (measure only if there is none)")
    cal.add_argument("--json", action="store_true", help="print the calibration as JSON")
    cal.set_defaults(run=run, check=check)

