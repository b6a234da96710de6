"""Command line: ``specdec-fast generate --prompt "..."``."""

from __future__ import annotations

import argparse
import json
import sys

import torch


def chat_prompt_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    """Token ids of ``prompt``, wrapped in the tokenizer's chat template when ``chat`` and it has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False).input_ids
    return tokenizer(prompt).input_ids


def _load_pair(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .drafts import early_exit_draft
    from .smollm2 import load_smollm2

    if args.target:
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.target)
    else:
        target, tokenizer = load_smollm2()
    if args.draft:
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    else:
        draft = early_exit_draft(target, args.draft_layers)
    return target, draft, tokenizer


def _generate(args) -> int:
    from transformers import TextStreamer

    from .generate import fast_generate, generate_autoregressive

    if args.threads:
        torch.set_num_threads(args.threads)
    target, draft, tokenizer = _load_pair(args)
    ids = chat_prompt_ids(tokenizer, args.prompt, chat=not args.no_chat)
    sampling = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if not args.json else None
    out = fast_generate(target, draft, ids, tokenizer=tokenizer, num_draft_tokens=args.num_draft_tokens, streamer=streamer, **sampling)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec-fast", description="Lossless speculative decoding.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate text with speculative decoding and print statistics")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--target", help="transformers checkpoint folder of the target (default: SmolLM2-135M-Instruct)")
    gen.add_argument("--draft", help="transformers checkpoint folder of the draft (same tokenizer as the target)")
    gen.add_argument("--draft-layers", type=int, default=4, help="without --draft: use the target's first N layers")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--num-draft-tokens", "-k", type=int, default=4)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    gen.add_argument("--baseline", action="store_true", help="also run the target alone and print the speedup")
    gen.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    gen.add_argument("--json", action="store_true", help="print the text and statistics as JSON")
    gen.set_defaults(run=_generate)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
