"""``specdec-fast train-draft`` and ``train-policy``: the training commands."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import torch

from ..drafts.feature import load_feature_draft
from ..drafts.feature_lm import feature_pair
from ..drafts.shipped import DRAFT_KINDS, FEATURE_DRAFT_FILE, TOKEN_DRAFT_FILE
from ..drafts.small import load_small_draft
from ..models.smollm2 import load_smollm2
from ..paths import cache_root
from ..policies.shipped import POLICY_FILES
from ..training import card, collect, distill, lookup_policy
from ..training import policy as train_policy

SHIPPED = Path(__file__).resolve().parents[1] / "data"  # the shipped artifacts: written only with --replace-shipped


def _output(args, name: str) -> Path:
    """Where a training command writes: ``--out``, else the user cache folder (never the package);
    a shipped artifact only with ``--replace-shipped``."""
    out = Path(args.out) if args.out else cache_root() / "trained" / name
    if out.resolve().parent == SHIPPED.resolve() and not args.replace_shipped:
        args.parser.error(f"--out {out} is a shipped artifact: pass --replace-shipped to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"writing {out}")
    return out


def _per_set(option: str, values: list, sets: list[str]) -> dict:
    """{prompt set: value} from one value for all sets or one per set."""
    if len(values) not in (1, len(sets)):
        raise SystemExit(f"{option} takes one value, or one per prompt set ({len(sets)}), got {len(values)}")
    return dict(zip(sets, values * len(sets) if len(values) == 1 else values))


def _train_draft(args) -> int:
    if args.init and args.kind != "feature":
        raise SystemExit("--init starts a feature draft from a feature draft file: use it with --kind feature")
    target, tokenizer = load_smollm2()
    collector = target if args.collect_dtype == "float32" else load_smollm2(getattr(torch, args.collect_dtype))[0]
    work = Path(args.work) if args.work else cache_root() / "distill"
    work.mkdir(parents=True, exist_ok=True)
    out = _output(args, TOKEN_DRAFT_FILE if args.kind == "token" else FEATURE_DRAFT_FILE)
    command = "specdec-fast train-draft " + " ".join(shlex.quote(a) for a in args.argv)
    fit = distill.FitConfig(args.epochs, args.batch, args.lr, args.weight_decay, args.validate_every)
    corpus_chunks = args.corpus_chunks if args.corpus_chunks is not None else (384 if args.kind == "token" else 0)
    counts, responses = (_per_set(option, values, args.prompt_set)
                         for option, values in (("--prompts", args.prompts or [None]), ("--responses", args.responses)))
    prompts = {
        name: collect.collect_generations(collector, tokenizer, work, batch=args.gen_batch, max_new_tokens=args.gen_tokens,
                                          responses=responses[name], num_prompts=counts[name], prompt_set=name)
        for name in args.prompt_set
    }
    if args.kind == "token":
        collect.collect_corpus(collector, tokenizer, work, chunks=corpus_chunks)
        torch.manual_seed(0)
        info = distill.train(target, work, out, args.layers or 2, args.vocab, fit)
        pair = target, load_small_draft(target, out)
    else:
        collect.collect_features(collector, work)
        if corpus_chunks:
            collect.collect_corpus(collector, tokenizer, work, collect.CORPORA, corpus_chunks, collect.FEATURE_CHUNK, features=True)
        torch.manual_seed(0)
        init = Path(args.init) if args.init else None
        info = distill.train_feature(target, work, out, args.vocab, fit, init, command, args.layers)
        pair = feature_pair(target, load_feature_draft(target, out))
    acceptance = card.heldout_acceptance(*pair, tokenizer, args.eval_tokens)
    card_path = out.with_suffix(".md")
    info |= dict(responses=responses, prompts=prompts, corpus_chunks=corpus_chunks)
    card.write_card(card_path, args.kind, out.name, info, acceptance, args.eval_tokens, out.stat().st_size / 1e6, command)
    print(json.dumps(dict(info, heldout_acceptance=acceptance), indent=2))
    return 0


def _train_lookup_policy(args) -> int:
    out = _output(args, POLICY_FILES["lookup"].name)
    metadata = lookup_policy.run(out, args.prompts, args.temperatures, args.max_new_tokens, args.max_draft)
    print("calibration of a looked-up token's acceptance (every fifth prompt, not fitted on): predicted, observed")
    for row in metadata["calibration"]:
        print(f"  {row['predicted']:.3f}  {row['observed']:.3f}  (n={row['rows']})")
    print(f"{metadata['rows']} looked-up tokens from {metadata['prompts']} prompts in {metadata['minutes']:.1f} min; "
          f"written to {out}")
    return 0


def _train_policy(args) -> int:
    if args.draft == "lookup":
        return _train_lookup_policy(args)
    out = _output(args, POLICY_FILES[args.draft].name)
    metadata = train_policy.run(out, args.prompts, args.temperatures, args.max_new_tokens, args.max_draft,
                                draft_kind=args.draft)
    for name, what in (("calibration", "the drafted token"), ("next_calibration", "the next drafted token")):
        print(f"calibration of {what}'s acceptance (every fifth policy prompt, not fitted on): decile, predicted, observed")
        for row in metadata[name]:
            print(f"  {row['decile']:2d}  {row['predicted']:.3f}  {row['observed']:.3f}  (n={row['n']})")
    print(f"{metadata['rows']} drafted tokens from {metadata['prompts']} prompts in {metadata['minutes']:.1f} min; "
          f"written to {out}")
    return 0


def add_parsers(commands, common: argparse.ArgumentParser) -> None:
    train = commands.add_parser("train-draft", parents=[common], help="distil the draft for SmolLM2-135M-Instruct (resumable)")
    train.add_argument("--kind", choices=DRAFT_KINDS, default="feature",
                       help="feature: a decoder layer or two on the target's hidden states (EAGLE-like); token: a small LM on tokens")
    train.add_argument("--out", help="the draft file (default: <user cache>/trained/<the shipped file's name>)")
    train.add_argument("--replace-shipped", action="store_true", help="allow --out to overwrite a draft shipped in the package")
    train.add_argument("--work", help="folder for collected data and checkpoints (default: the user cache)")
    train.add_argument("--layers", type=int, default=None,
                       help="decoder layers of the draft (token: default 2; feature: default 1, or --init's count; "
                            "layers beyond --init's start as zero additions to its output)")
    train.add_argument("--vocab", type=int, default=8192, help="tokens the draft may propose")
    train.add_argument("--epochs", type=int, default=3, help="training epochs")
    train.add_argument("--batch", type=int, default=16, help="sequences per training batch")
    train.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
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
    train.add_argument("--gen-tokens", type=int, default=128, help="new tokens per collected target response")
    train.add_argument("--collect-dtype", choices=["float32", "bfloat16"], default="float32",
                       help="the target's dtype while collecting responses, features and top-k labels; bfloat16 is "
                            "1.7-3x faster on CPUs with AMX or AVX512-BF16 (training and evaluation stay float32)")
    train.add_argument("--corpus-chunks", type=int, default=None,
                       help="chunks of offline text the target reads teacher-forced: 128 tokens of Shakespeare and the "
                            "KJV Bible for a token draft (default 384), 256 tokens of those plus Python's standard library "
                            "and the installed packages' READMEs for a feature draft (default 0)")
    train.add_argument("--init", help="feature draft: start from this feature draft file (keeping its token subset)")
    train.add_argument("--eval-tokens", type=int, default=64, help="new tokens per held-out prompt in the card's acceptance")
    train.set_defaults(run=_train_draft)

    tp = commands.add_parser("train-policy", parents=[common],
                             help="traces of a SmolLM2 pair -> its learned draft-length policy (data/policy*.safetensors)")
    tp.add_argument("--draft", choices=[*DRAFT_KINDS, "lookup"], default=DRAFT_KINDS[0],
                    help="the shipped draft traced; lookup: the hybrid's source chooser (prompts: per workload category)")
    tp.add_argument("--out", help="the policy file (default: <user cache>/trained/<the shipped file's name>)")
    tp.add_argument("--replace-shipped", action="store_true", help="allow --out to overwrite a policy shipped in the package")
    tp.add_argument("--prompts", type=int, default=40, help="policy prompts traced (every fifth calibrates)")
    tp.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="sampling temperatures (0 = greedy)")
    tp.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per generation")
    tp.add_argument("--max-draft", type=int, default=8, help="draft length of the traces")
    tp.set_defaults(run=_train_policy)
