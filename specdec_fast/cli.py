"""Command line: ``specdec-fast generate --prompt "..."``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from .prompts import chat_prompt_ids

DATA = Path(__file__).parent / "data"
DRAFT_KINDS = ("feature", "token")


def _shipped_draft(args) -> str | None:
    """The kind of shipped SmolLM2 draft the flags ask for, or None (another target or draft)."""
    if args.target or args.draft_layers or args.draft not in (None, *DRAFT_KINDS):
        return None
    return args.draft or DRAFT_KINDS[0]


def _load_pair(args):
    """The target, draft and tokenizer the flags ask for (default: the SmolLM2 pair), with skinny
    linear layers and packed GQA attention (``use_fast_passes``). A feature draft comes as its bound pair of
    CachedLMs (specdec_fast/feature_draft.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .drafts import early_exit_draft, load_small_draft, read_draft_file
    from .feature_draft import feature_pair, load_feature_draft
    from .smollm2 import load_pair, load_smollm2, use_fast_passes

    if kind := _shipped_draft(args):
        return load_pair(kind)
    if args.draft in DRAFT_KINDS:
        raise SystemExit(f"--draft {args.draft} (a draft shipped for SmolLM2) cannot be combined with --target or "
                         "--draft-layers; pass a draft checkpoint instead")
    if args.target:
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.target)
    else:
        target, tokenizer = load_smollm2()
    if args.draft and args.draft.endswith(".safetensors"):
        if read_draft_file(args.draft)[0].get("kind") == "feature":
            draft = use_fast_passes(load_feature_draft(target, args.draft))
            return (*feature_pair(use_fast_passes(target), draft), tokenizer)
        draft = load_small_draft(target, args.draft)
    elif args.draft:
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    else:
        draft = early_exit_draft(target, args.draft_layers)
    return use_fast_passes(target), use_fast_passes(draft), tokenizer


def _policy(args):
    """The draft-length policy: the shipped learned one for a shipped SmolLM2 draft, else a fixed length."""
    from .learned_policy import POLICY_FILES, default_policy
    from .policy import FixedDraftLength

    kind = _shipped_draft(args)
    if args.num_draft_tokens is not None or kind is None:
        return FixedDraftLength(args.num_draft_tokens if args.num_draft_tokens is not None else 4)
    return default_policy(args.verifier, POLICY_FILES[kind])


def _generate(args) -> int:
    from transformers import TextStreamer

    from .generate import fast_generate, generate_autoregressive, warmup

    target, draft, tokenizer = _load_pair(args)
    warmup(target, draft, num_alternatives=args.alternatives)  # the kernels and first-call costs, out of the measured times
    ids = chat_prompt_ids(tokenizer, args.prompt, chat=not args.no_chat)
    sampling = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if not args.json else None
    out = fast_generate(target, draft, ids, tokenizer=tokenizer, policy=_policy(args), verifier=args.verifier,
                        num_alternatives=args.alternatives, streamer=streamer, **sampling)
    report = {"speculative": out.stats.as_dict(), "text": out.text}
    if not args.json:
        print(f"\n[speculative]   {out.stats.summary()}")
    if args.baseline:
        base = generate_autoregressive(target, ids, tokenizer=tokenizer, **sampling)
        report["autoregressive"] = base.stats.as_dict()
        report["speedup"] = out.stats.tokens_per_second / base.stats.tokens_per_second
        if not args.json:
            print(f"[autoregressive] {base.stats.summary()}")
            print(f"speedup {report['speedup']:.2f}x")
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    return 0


def _bench(args) -> int:
    from .bench import e2e

    data = e2e.run(args.prompts, args.lengths, args.feature_lengths, args.temperatures, args.max_new_tokens,
                   alternatives=tuple(args.alternatives))
    print(e2e.table(data["summary"], data["costs"]))
    return 0


def _microbench(args) -> int:
    from .bench import microbench

    dtypes = [getattr(torch, name) for name in args.dtypes]
    data = microbench.run(args.batches, args.lengths, args.vocabs, dtypes, args.repeats, args.device, args.out_name)
    print(microbench.table(data))
    return 0


def _per_set(option: str, values: list, sets: list[str]) -> dict:
    """{prompt set: value} from one value for all sets or one per set."""
    if len(values) not in (1, len(sets)):
        raise SystemExit(f"{option} takes one value, or one per prompt set ({len(sets)}), got {len(values)}")
    return dict(zip(sets, values * len(sets) if len(values) == 1 else values))


def _train_draft(args) -> int:
    import shlex

    from . import distill
    from .drafts import TOKEN_DRAFT_FILE, load_small_draft
    from .feature_draft import FEATURE_DRAFT_FILE, feature_pair, load_feature_draft
    from .smollm2 import cache_root, load_smollm2

    if args.init and args.kind != "feature":
        raise SystemExit("--init starts a feature draft from a feature draft file: use it with --kind feature")
    target, tokenizer = load_smollm2()
    collector = target if args.collect_dtype == "float32" else load_smollm2(getattr(torch, args.collect_dtype))[0]
    work = Path(args.work) if args.work else cache_root() / "distill"
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else DATA / (TOKEN_DRAFT_FILE if args.kind == "token" else FEATURE_DRAFT_FILE)
    command = "specdec-fast train-draft " + " ".join(shlex.quote(a) for a in args.argv)
    fit = distill.FitConfig(args.epochs, args.batch, args.lr, args.weight_decay, args.validate_every)
    corpus_chunks = args.corpus_chunks if args.corpus_chunks is not None else (384 if args.kind == "token" else 0)
    counts, responses = (_per_set(option, values, args.prompt_set)
                         for option, values in (("--prompts", args.prompts or [None]), ("--responses", args.responses)))
    prompts = {
        name: distill.collect_generations(collector, tokenizer, work, batch=args.gen_batch, max_new_tokens=args.gen_tokens,
                                          responses=responses[name], num_prompts=counts[name], prompt_set=name)
        for name in args.prompt_set
    }
    if args.kind == "token":
        distill.collect_corpus(collector, tokenizer, work, chunks=corpus_chunks)
        torch.manual_seed(0)
        info = distill.train(target, work, out, args.layers or 2, args.vocab, fit)
        pair = target, load_small_draft(target, out)
    else:
        distill.collect_features(collector, work)
        if corpus_chunks:
            distill.collect_corpus(collector, tokenizer, work, distill.CORPORA, corpus_chunks, distill.FEATURE_CHUNK, features=True)
        torch.manual_seed(0)
        init = Path(args.init) if args.init else None
        info = distill.train_feature(target, work, out, args.vocab, fit, init, command, args.layers)
        pair = feature_pair(target, load_feature_draft(target, out))
    acceptance = distill.heldout_acceptance(*pair, tokenizer, args.eval_tokens)
    card = out.with_suffix(".md")
    info |= dict(responses=responses, prompts=prompts, corpus_chunks=corpus_chunks)
    distill.write_card(card, args.kind, out.name, info, acceptance, args.eval_tokens, out.stat().st_size / 1e6, command)
    print(json.dumps(dict(info, heldout_acceptance=acceptance), indent=2))
    return 0


def _train_policy(args) -> int:
    from . import train_policy
    from .learned_policy import POLICY_FILES

    out = Path(args.out) if args.out else POLICY_FILES[args.draft]
    metadata = train_policy.run(out, args.prompts, args.temperatures, args.max_new_tokens, args.max_draft,
                                draft_kind=args.draft)
    for name, what in (("calibration", "the drafted token"), ("next_calibration", "the next drafted token")):
        print(f"calibration of {what}'s acceptance (every fifth policy prompt, not fitted on): decile, predicted, observed")
        for row in metadata[name]:
            print(f"  {row['decile']:2d}  {row['predicted']:.3f}  {row['observed']:.3f}  (n={row['n']})")
    print(f"{metadata['rows']} drafted tokens from {metadata['prompts']} prompts in {metadata['minutes']:.1f} min; "
          f"written to {out}")
    return 0


def _policies(args) -> int:
    from .bench import policies

    data = policies.run(args.prompts, args.temperatures, args.max_new_tokens, args.lengths, args.draft,
                        out_name=f"policies_{args.draft}")
    print(policies.table(data))
    return 0


def _linear_bench(args) -> int:
    from .bench import linear

    print(linear.table(linear.run(args.repeats)))
    return 0


def _batch_bench(args) -> int:
    from .bench import batch

    print(batch.table(batch.run(args.batches, args.lengths, args.temperatures, args.max_new_tokens, args.repeats,
                                args.draft, args.out_name)))
    return 0


def _quant_bench(args) -> int:
    from .bench import quant

    print(quant.table(quant.run(args.prompts, args.k, args.temperatures, args.max_new_tokens, args.draft)))
    return 0


def _draft_bench(args) -> int:
    from .bench import drafts

    print(drafts.table(drafts.run(args.drafts, args.prompts, args.temperatures, args.k, args.max_new_tokens, args.out_name)))
    return 0


def _alternatives_bench(args) -> int:
    from .bench import alternatives

    print(alternatives.table(alternatives.run(args.prompts, args.lengths, args.alternatives, args.temperatures,
                                              args.max_new_tokens)))
    return 0


def _soak(args) -> int:
    from .bench import soak

    print(soak.table(soak.run(args.rounds)))
    return 0


def _warmup_bench(args) -> int:
    from .bench import warmup

    print(warmup.table(warmup.run(args.repeats, args.threads or torch.get_num_threads())))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec-fast", description="Lossless speculative decoding.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", parents=[common], help="generate text with speculative decoding and print statistics")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--target", help="transformers checkpoint folder of the target (default: SmolLM2-135M-Instruct)")
    gen.add_argument("--draft", help="draft: 'feature' (default) or 'token', the drafts shipped for SmolLM2, or a "
                     "transformers checkpoint folder, or a .safetensors file from train-draft")
    gen.add_argument("--draft-layers", type=int, default=0, help="instead: the target's first N layers as the draft")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--num-draft-tokens", "-k", type=int, default=None,
                     help="a fixed draft length (default: the learned cost-aware policy of a shipped draft, 4 otherwise)")
    gen.add_argument("--verifier", choices=["token", "block"], default="token")
    gen.add_argument("--alternatives", type=int, default=0,
                     help="more candidates for each round's first drafted token, verified in the same target pass")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    gen.add_argument("--baseline", action="store_true", help="also run the target alone and print the speedup")
    gen.add_argument("--json", action="store_true", help="print the text and statistics as JSON")
    gen.set_defaults(run=_generate)

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

    train = commands.add_parser("train-draft", parents=[common], help="distil the draft for SmolLM2-135M-Instruct (resumable)")
    train.add_argument("--kind", choices=DRAFT_KINDS, default="feature",
                       help="feature: a decoder layer or two on the target's hidden states (EAGLE-like); token: a small LM on tokens")
    train.add_argument("--out", help="the draft file (default: the shipped one of its kind, in specdec_fast/data)")
    train.add_argument("--work", help="folder for collected data and checkpoints (default: the user cache)")
    train.add_argument("--layers", type=int, default=None,
                       help="decoder layers of the draft (token: default 2; feature: default 1, or --init's count; "
                            "layers beyond --init's start as zero additions to its output)")
    train.add_argument("--vocab", type=int, default=8192, help="tokens the draft may propose")
    train.add_argument("--epochs", type=int, default=3)
    train.add_argument("--batch", type=int, default=16)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    train.add_argument("--validate-every", type=int, default=0,
                       help="hold back every N-th collected sequence and keep the epoch with the lowest loss on them "
                            "(0: train on all, keep the last epoch)")
    train.add_argument("--gen-batch", type=int, default=16, help="prompts per target generate call")
    train.add_argument("--responses", type=int, nargs="+", default=[1],
                       help="target responses collected per training prompt, or one count per prompt set")
    train.add_argument("--prompts", type=int, nargs="+", default=None,
                       help="only the first N prompts of each prompt set, or one N per set (default: all)")
    train.add_argument("--prompt-set", nargs="+", choices=["templates", "corpus", "self"], default=["templates"],
                       help="training prompts: the templated ones (1,616), ones built from excerpts of the offline corpora "
                            "(1,600) and/or user requests written by the target itself (2,000 by default)")
    train.add_argument("--gen-tokens", type=int, default=128)
    train.add_argument("--collect-dtype", choices=["float32", "bfloat16"], default="float32",
                       help="the target's dtype while collecting responses, features and top-k labels; bfloat16 is "
                            "1.7-3x faster on CPUs with AMX or AVX512-BF16 (training and evaluation stay float32)")
    train.add_argument("--corpus-chunks", type=int, default=None,
                       help="chunks of offline text the target reads teacher-forced: 128 tokens of Shakespeare and the "
                            "KJV Bible for a token draft (default 384), 256 tokens of those plus Python's standard library "
                            "and the installed packages' READMEs for a feature draft (default 0)")
    train.add_argument("--init", help="feature draft: start from this feature draft file (keeping its token subset)")
    train.add_argument("--eval-tokens", type=int, default=64)
    train.set_defaults(run=_train_draft)

    tp = commands.add_parser("train-policy", parents=[common],
                             help="traces of a SmolLM2 pair -> its learned draft-length policy (data/policy*.safetensors)")
    tp.add_argument("--draft", choices=DRAFT_KINDS, default=DRAFT_KINDS[0], help="the shipped draft traced")
    tp.add_argument("--out", help="default: the shipped policy file of that draft")
    tp.add_argument("--prompts", type=int, default=40, help="policy prompts traced (every fifth calibrates)")
    tp.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    tp.add_argument("--max-new-tokens", type=int, default=64)
    tp.add_argument("--max-draft", type=int, default=8)
    tp.set_defaults(run=_train_policy)

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

    args = parser.parse_args(argv)
    argv = argv if argv is not None else sys.argv[1:]
    args.argv = argv[argv.index(args.command) + 1 :]  # what followed the subcommand
    if args.threads:
        torch.set_num_threads(args.threads)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
