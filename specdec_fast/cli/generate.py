"""``specdec-fast generate``: speculative decoding of one prompt, its text streamed and its statistics printed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextStreamer

from ..decoding import fast_generate, generate_autoregressive, warmup
from ..decoding.requests import chat_prompt_ids
from ..drafts.feature import load_feature_draft
from ..drafts.hybrid import Hybrid
from ..drafts.lookup import LookupCorpus, PromptLookup
from ..drafts.shipped import DRAFT_KINDS, load_pair
from ..drafts.small import early_exit_draft, load_small_draft, read_draft_file
from ..models.fast_passes import use_fast_passes
from ..models.lean import LEAN_CHOICES
from ..models.smollm2 import load_smollm2
from ..policies.baselines import FixedDraftLength
from ..policies.shipped import default_policy

LOOKUP_TOKENS = 8


def check(parser: argparse.ArgumentParser, args) -> None:
    """The user errors that can be told before any model loads (each one line, exit status 2)."""
    check_pair_flags(parser, args)
    if args.max_new_tokens is not None and args.max_new_tokens <= 0:
        parser.error(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    for flag, value, ok in (("--temperature", args.temperature, lambda v: v >= 0), ("--top-k", args.top_k, lambda v: v >= 0),
                            ("--top-p", args.top_p, lambda v: 0 < v <= 1), ("--alternatives", args.alternatives, lambda v: v >= 0),
                            ("--num-draft-tokens", args.num_draft_tokens, lambda v: v >= 0)):
        if value is not None and not ok(value):
            parser.error(f"{flag} {value} is out of range")
    if args.alternatives and args.verifier != "token":
        parser.error("--alternatives needs --verifier token (alternatives are verified token by token)")


def check_pair_flags(parser: argparse.ArgumentParser, args) -> None:
    """The user errors of the pair flags (add_pair_arguments), told before any model loads."""
    for flag, path in (("--target", args.target), ("--draft-model", args.draft_model)):
        if path is not None and not Path(path).exists():
            parser.error(f"{flag} {path}: no such file or folder")
    if args.target is not None and not (Path(args.target) / "config.json").is_file():
        parser.error(f"--target {args.target} is not a transformers checkpoint folder (no config.json)")
    if args.draft in (*DRAFT_KINDS, "hybrid") and args.target is not None:
        parser.error(f"--draft {args.draft} is a draft shipped for SmolLM2; for your --target use --draft-model "
                     "(a transformers checkpoint with the same vocabulary) or --draft early-exit --draft-layers N")
    if args.draft == "early-exit" and not args.draft_layers:
        parser.error("--draft early-exit needs --draft-layers N (the target's first N layers)")
    if args.draft_model is not None and args.draft is not None:
        parser.error("pass one draft: --draft or --draft-model")
    for path in args.corpus or ():
        if not Path(path).is_file():
            parser.error(f"--corpus {path}: no such file")
    if args.corpus and args.draft not in ("lookup", "hybrid"):
        parser.error("--corpus is text for a prompt lookup to copy from: use it with --draft lookup or --draft hybrid")
    if args.target is not None and args.draft is None and args.draft_model is None:
        parser.error("a target of your own needs a draft: --draft-model DIR (a transformers checkpoint with the same "
                     "vocabulary) or --draft early-exit --draft-layers N")


def load_pair_from_args(args):
    """The target, draft and tokenizer the flags ask for (default: SmolLM2 with its shipped feature
    draft), with fast passes on both models."""
    if args.draft == "hybrid":
        target, feature, tokenizer = load_pair("feature", models=True)
        return target, Hybrid(feature, _lookup(args, tokenizer, max_tokens=LOOKUP_TOKENS)), tokenizer
    if args.target is None and args.draft_model is None and args.draft not in ("early-exit", "lookup"):
        return load_pair(args.draft or DRAFT_KINDS[0], models=True)
    if args.target is not None:
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.target)
    else:
        target, tokenizer = load_smollm2()
    if args.draft == "lookup":
        return use_fast_passes(target), _lookup(args, tokenizer), tokenizer
    if args.draft == "early-exit":
        draft = early_exit_draft(target, args.draft_layers)
    elif args.draft_model.endswith(".safetensors"):
        loader = load_feature_draft if read_draft_file(args.draft_model)[0].get("kind") == "feature" else load_small_draft
        draft = loader(target, args.draft_model)
    else:
        draft = AutoModelForCausalLM.from_pretrained(args.draft_model, dtype=torch.float32).eval()
    return use_fast_passes(target), use_fast_passes(draft), tokenizer


def _lookup(args, tokenizer, **settings) -> PromptLookup:
    """The prompt lookup of --draft lookup / hybrid, copying from the --corpus files too."""
    if not args.corpus:
        return PromptLookup(**settings)
    corpus = LookupCorpus()
    corpus.add_texts(tokenizer, (Path(path).read_text(errors="replace") for path in args.corpus))
    return PromptLookup(corpus=corpus, **settings)


def _policy(args, draft):
    """The draft-length policy: a fixed length if asked for, else the shipped learned one for a shipped
    SmolLM2 draft (the hybrid: its feature draft's), LOOKUP_TOKENS for a lookup draft (what the context
    offers caps it), else 4 tokens."""
    if args.num_draft_tokens is not None:
        return FixedDraftLength(args.num_draft_tokens)
    if args.draft == "lookup":
        return FixedDraftLength(LOOKUP_TOKENS)
    if args.target is None and args.draft_model is None and args.draft != "early-exit":
        return default_policy(args.verifier, draft=draft)
    return FixedDraftLength(4)


def run(args) -> int:
    target, draft, tokenizer = load_pair_from_args(args)
    warmup(target, draft, num_alternatives=args.alternatives, lean=args.lean)  # kernels, first-call costs: out of the clocks
    ids = chat_prompt_ids(tokenizer, args.prompt, chat=not args.no_chat)
    sampling = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    seed=args.seed, lean=args.lean)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if not args.json else None
    out = fast_generate(target, draft, ids, tokenizer=tokenizer, policy=_policy(args, draft), verifier=args.verifier,
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


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that choose the target, the draft and the target's path (generate, calibrate)."""
    parser.add_argument("--target", help="a transformers checkpoint folder of your own (default: SmolLM2-135M-Instruct); "
                        "it needs --draft-model or --draft early-exit")
    parser.add_argument("--draft", choices=[*DRAFT_KINDS, "hybrid", "early-exit", "lookup"],
                        help="feature / token: the drafts shipped for SmolLM2 (default: feature); hybrid: prompt lookup "
                             "where it pays by the measured costs, else the shipped feature draft; early-exit: "
                             "the target's first --draft-layers layers; lookup: copy from the context (prompt lookup, "
                             f"up to {LOOKUP_TOKENS} tokens a round unless -k); the last two for any target")
    parser.add_argument("--draft-model", help="a draft of your own: a transformers checkpoint folder with the target's "
                        "vocabulary, or a .safetensors file written by train-draft (SmolLM2)")
    parser.add_argument("--draft-layers", type=int, default=0, help="layers of the early-exit draft")
    parser.add_argument("--corpus", nargs="+", metavar="FILE",
                        help="text files a lookup draft (--draft lookup / hybrid) may copy from, beside the context")
    parser.add_argument("--lean", choices=LEAN_CHOICES, default="auto",
                        help="the target's pass: the lean path where the model allows (auto), transformers' (off), or the "
                             "lean path with fp32 / bf16 / int8 weights or q8 (the blocks against 8-bit activations, in integers); "
                             "bf16, int8, q8: the output follows that model")


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    gen = commands.add_parser("generate", parents=[common], help="generate text with speculative decoding and print statistics",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    gen.add_argument("--prompt", required=True, help="the user's message (wrapped in the chat template unless --no-chat)")
    add_pair_arguments(gen)
    gen.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per generation")
    gen.add_argument("--temperature", type=float, default=None,
                     help="0 = greedy; unset: the target's generation config (greedy for SmolLM2)")
    gen.add_argument("--top-k", type=int, default=None, help="0 = off; unset: the generation config's, else off")
    gen.add_argument("--top-p", type=float, default=None, help="1 = off; unset: the generation config's, else 1")
    gen.add_argument("--num-draft-tokens", "-k", type=int, default=None,
                     help="a fixed draft length (unset: the learned cost-aware policy of a shipped draft, 4 otherwise)")
    gen.add_argument("--verifier", choices=["token", "block"], default="token", help="token-wise or block verification (same output law)")
    gen.add_argument("--alternatives", type=int, default=0,
                     help="more candidates for each round's first drafted token, verified in the same target pass")
    gen.add_argument("--seed", type=int, default=0, help="seed of all randomness")
    gen.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    gen.add_argument("--baseline", action="store_true", help="also run the target alone and print the speedup")
    gen.add_argument("--json", action="store_true", help="print the text and statistics as JSON")
    gen.set_defaults(run=run, check=check)
