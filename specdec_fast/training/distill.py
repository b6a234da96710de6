"""Stage 2 of distilling a draft (``specdec-fast train-draft``): fit the draft to the target's
collected distributions (cross-entropy to the target's soft labels = KL up to a constant),
resumably. The draft's head covers the tokens that carry most of the target's probability
(see :class:`~specdec_fast.drafts.small.RestrictedHead`)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..drafts.feature import FeatureDraft, deepened, load_feature_draft, save_feature_draft
from ..drafts.small import build_small_draft, own_state, read_draft_file, save_small_draft
from .collect import pad_right


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
    ids, mask = pad_right([r["ids"] for r in rows])
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
    (:meth:`~specdec_fast.drafts.feature.FeatureDraft.unrolled_features`): step 1 reads the
    target's features (plus noise), step j the draft's own step j - 1 features. Soft
    cross-entropy at the labelled positions of every step plus a smooth-L1 pull of step 1's
    features to the target's."""
    ids, mask = pad_right([r["ids"] for r in rows])
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
    """Fit a :class:`~specdec_fast.drafts.feature.FeatureDraft` of ``num_layers`` decoder layers
    (default: one, or as many as ``init``'s) to the collected features (target responses and
    corpus chunks); resumable. ``init``: start from that feature draft file (and keep its token
    subset; more layers than it has are added by :func:`~specdec_fast.drafts.feature.deepened`)
    instead of from the target's last layer. The file's metadata records ``command`` and, with
    ``init``, that file's own metadata."""
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
