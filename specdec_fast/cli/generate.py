"""``specdec-fast generate``: speculative decoding of one prompt, its text streamed and its statistics printed."""

from __future__ import annotations

import argparse
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextStreamer

from ..decoding import fast_generate, generate_autoregressive, warmup
from ..decoding.requests import chat_prompt_ids
from ..drafts.feature import load_feature_draft
from ..drafts.feature_lm import feature_pair
from ..drafts.shipped import DRAFT_KINDS, load_pair
from ..drafts.small import early_exit_draft, load_small_draft, read_draft_file
from ..models.fast_passes import use_fast_passes
from ..models.smollm2 import load_smollm2
from ..policies.baselines import FixedDraftLength
from ..policies.shipped import POLICY_FILES, default_policy


def _shipped_draft(args) -> str | None:
    """The kind of shipped SmolLM2 draft the flags ask for, or None (another target or draft)."""
    if args.target or args.draft_layers or args.draft not in (None, *DRAFT_KINDS):
        return None
    return args.draft or DRAFT_KINDS[0]


def _load_pair(args):
    """The target, draft and tokenizer the flags ask for (default: the SmolLM2 pair), with skinny
    linear layers and packed GQA attention (``use_fast_passes``). A feature draft comes as its bound pair of
    CachedLMs (specdec_fast/feature_draft.py)."""
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
    kind = _shipped_draft(args)
    if args.num_draft_tokens is not None or kind is None:
        return FixedDraftLength(args.num_draft_tokens if args.num_draft_tokens is not None else 4)
    return default_policy(args.verifier, POLICY_FILES[kind])


def run(args) -> int:
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


def add_parser(commands, common: argparse.ArgumentParser) -> None:
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
    gen.set_defaults(run=run)
