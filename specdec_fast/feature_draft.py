"""A feature-level draft (in the manner of EAGLE): the draft reads the target's own last
hidden states, so one small layer can predict what thirty layers compute.

The draft's input at position j is ``fc([embed(x_j), h_{j-1}])``, where h_{j-1} is the
target's final (normed) hidden state at position j - 1; one decoder layer (or a few) and a final norm
turn it into a predicted feature f_j, and the target's LM head rows over a token subset
(:class:`~specdec_fast.drafts.RestrictedHead`) turn f_j into the draft's logits for x_{j+1}.
While drafting, the target has not seen the drafted tokens yet, so the draft feeds its
own f_j in place of h_j.

Both models join the unchanged decoding loop as :class:`~specdec_fast.cached_lm.CachedLM`
objects bound to each other by :func:`feature_pair`: :class:`FeatureTargetLM` records the
target's hidden state at every cached position, and :class:`FeatureDraftLM` takes the
target's features where the target has computed them and its own elsewhere. A draft
position computed from its own features is dropped at the next rollback and recomputed
from the target's (the loop re-feeds it), so the draft's cache only ever holds positions
computed from true features. Losslessness does not depend on any of this: the verifier
only needs the draft probabilities it was given.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .batch import BatchedLM
from .cached_lm import HFCachedLM, TransformersLM, cache_argument
from .drafts import build_small_draft, load_draft_weights, read_draft_file, save_draft_weights, shipped_file

FEATURE_DRAFT_FILE = "smollm2_feature_draft.safetensors"


class FeatureDraft(nn.Module):
    """fc [2d -> d] + ``num_layers`` decoder layers in the target's architecture (each initialised
    from target layer ``source_layer``) + the target's final norm + a frozen :class:`RestrictedHead`
    over ``vocab_ids``; the token embeddings are the target's (shared).

    ``lm`` is a regular transformers causal LM whose ``model`` runs on ``inputs_embeds`` (so its
    cache, masks and rotary positions are transformers' own).
    """

    def __init__(self, target: nn.Module, vocab_ids: Tensor, source_layer: int, num_layers: int = 1):
        super().__init__()
        self.lm = build_small_draft(target, [source_layer] * num_layers, vocab_ids)
        self.lm.lm_head.weight.requires_grad_(False)
        d = target.config.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=False, dtype=target.dtype)
        with torch.no_grad():  # start from "the previous feature plus a little of the token"
            self.fc.weight.normal_(0, 0.02).diagonal(d).add_(1.0)
        self.source_layer = source_layer

    def features(self, ids: Tensor, prev: Tensor, attention_mask: Tensor | None = None, **cache_kwargs) -> Tensor:
        """ids [B, L] int64, prev [B, L, d] (the target's feature of each previous position)
        -> predicted features [B, L, d]. ``cache_kwargs`` go to the transformers model (its cache)."""
        return self.lm.model(inputs_embeds=self._inputs(ids, prev), attention_mask=attention_mask, **cache_kwargs).last_hidden_state

    def _inputs(self, ids: Tensor, prev: Tensor) -> Tensor:
        return self.fc(torch.cat([self.lm.model.embed_tokens(ids), prev.to(self.lm.model.embed_tokens.weight.dtype)], -1))

    def unrolled_features(self, ids: Tensor, prev: Tensor, steps: int, attention_mask: Tensor | None = None) -> list[Tensor]:
        """The features of ``steps`` consecutive drafting steps at every position, each as the
        decoding loop computes it (for training). ids [B, L] int64 (right-padded), prev [B, L, d]
        the target's features of the previous positions, attention_mask [B, L] (1 = token).
        Returns [f_1, ..., f_steps], each [B, L, d]: f_1 is :meth:`features`; f_j at position t
        reads f_{j-1} at t - 1 and, like step j of a round whose first draft position is
        t - j + 1, attends to step-1 positions <= t - j + 1 (inputs from true features) and to
        step i's position t - j + i for 1 < i <= j (inputs from its own features)."""
        from transformers import DynamicCache

        B, L = ids.shape
        keys = torch.ones(B, L, dtype=torch.bool, device=ids.device) if attention_mask is None else attention_mask.bool()
        mask = unrolled_mask(L, steps, ids.device) & keys.repeat(1, steps)[:, None, :]
        mask |= torch.eye(steps * L, dtype=torch.bool, device=ids.device)  # no empty rows at padding
        positions = torch.arange(L, device=ids.device)[None]
        cache = DynamicCache(config=self.lm.config)  # step j's queries read the keys of steps 1..j
        out = []
        for j in range(steps):
            shifted = prev if j == 0 else torch.cat([torch.zeros_like(prev[:, :1]), out[-1][:, :-1]], 1)
            rows = mask[:, None, j * L : (j + 1) * L, : (j + 1) * L]
            out.append(self.lm.model(inputs_embeds=self._inputs(ids, shifted), attention_mask=rows, position_ids=positions,
                                     use_cache=True, **{cache_argument(self.lm.model): cache}).last_hidden_state)
        return out


def unrolled_mask(length: int, steps: int, device=None) -> Tensor:
    """[steps L, steps L] bool: query (step i, position t) may attend to key (step i', position s)
    iff i' = 1 and s <= t - i + 1, or 1 < i' <= i and s = t - (i - i') (see unrolled_features)."""
    t = torch.arange(length, device=device)
    rows = []
    for i in range(1, steps + 1):
        row = [t[None, :] <= t[:, None] - i + 1]
        row += [t[None, :] == t[:, None] - (i - k) if k <= i else torch.zeros(length, length, dtype=torch.bool, device=device)
                for k in range(2, steps + 1)]
        rows.append(torch.cat(row, 1))
    return torch.cat(rows, 0)


class FeatureTargetLM(HFCachedLM):
    """:class:`HFCachedLM` that also keeps the target's final hidden state of every cached
    position (``features`` [cache_length, d])."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.generation_config = getattr(model, "generation_config", None)
        self.features = torch.zeros(0, model.config.hidden_size, device=self.device)

    def reset(self) -> None:
        super().reset()
        self.features = self.features[:0]

    @torch.inference_mode()
    def _forward(self, tokens: Tensor, num_logits: int, **mask) -> Tensor:
        hidden = self.model.model(input_ids=tokens.to(self.device)[None], use_cache=True, **mask,
                                  **{self._cache_arg: self.cache}).last_hidden_state[0]
        self.features = torch.cat([self.features, hidden.float()])  # crop keeps it at cache_length rows
        return self.model.lm_head(hidden[-num_logits:])

    @torch.inference_mode()
    def keep_sibling(self, length: int, slot: int) -> None:
        self.features[length - 1] = self.features[slot]
        super().keep_sibling(length, slot)

    def crop(self, length: int) -> None:
        super().crop(length)
        self.features = self.features[:length]


class FeatureDraftLM(TransformersLM):
    """:class:`CachedLM` over a :class:`FeatureDraft` reading ``target``'s features."""

    def __init__(self, draft: FeatureDraft, target: FeatureTargetLM):
        from transformers import DynamicCache

        super().__init__(draft.lm)
        self.draft = draft.eval()
        self.target = target
        self.vocab_size = target.vocab_size
        self._new_cache = lambda: DynamicCache(config=draft.lm.config)
        self.reset()

    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = self._new_cache()
        self.true_length = 0  # leading positions computed from the target's own features
        self.last_feature = None  # the draft's predicted feature of its last cached position

    def _previous_features(self, start: int, n: int) -> tuple[Tensor, bool]:
        """Features of positions start-1 .. start+n-2 and whether they are all the target's."""
        known = self.target.features
        if start + n - 1 <= len(known):
            head = torch.zeros(1, known.shape[1], device=known.device) if start == 0 else known[start - 1 : start]
            return torch.cat([head, known[start : start + n - 1]]), True
        if n == 1 and self.last_feature is not None:
            return self.last_feature[None], False
        raise ValueError(f"the target's features of positions {len(known)}..{start + n - 2} are not known: "
                         "feed the draft one token at a time beyond the target's cache")

    @torch.inference_mode()
    def extend(self, tokens: Tensor, num_logits: int) -> Tensor:
        start, n = self.cache_length, len(tokens)
        prev, true = self._previous_features(start, n)
        feats = self.draft.features(tokens.to(self.device)[None], prev[None], use_cache=True,
                                    **{self._cache_arg: self.cache})[0]
        if true and self.true_length == start:
            self.true_length = start + n
        self.last_feature = feats[-1]
        return self.draft.lm.lm_head(feats[-num_logits:])

    def crop(self, length: int) -> None:
        if length > self.cache_length:
            raise ValueError(f"cannot crop a cache of {self.cache_length} tokens to {length}")
        keep = min(length, self.true_length)  # positions drafted from own features are recomputed
        if keep < self.cache_length:
            self.cache.crop(keep - self.cache_length)
            self.last_feature = None
        self.true_length = keep


class BatchedFeatureTarget(BatchedLM):
    """:class:`~specdec_fast.batch.BatchedLM` over the target that also keeps its final hidden
    state of every slot (``features`` [B, slots, d], aligned with ``valid``)."""

    def __init__(self, model: nn.Module, batch: int):
        super().__init__(model, batch)
        self.features = torch.zeros(batch, 0, model.config.hidden_size, device=self.device)

    @torch.inference_mode()
    def extend(self, tokens: Tensor, fed: Tensor, num_logits: int) -> Tensor:
        hidden = self.model.model(input_ids=tokens.to(self.device), **self._append(fed)).last_hidden_state
        self.features = torch.cat([self.features, hidden.float()], 1)
        return self.model.lm_head(hidden[:, -num_logits:])

    def keep(self, lengths: Tensor) -> None:
        super().keep(lengths)
        self.features = self.features[:, : self.valid.shape[1]]

    def select(self, rows: Tensor) -> None:
        super().select(rows)
        self.features = self.features[rows.to(self.device)]


class BatchedFeatureDraft(BatchedLM):
    """:class:`~specdec_fast.batch.BatchedLM` over a :class:`FeatureDraft` reading ``target``'s
    features, as :class:`FeatureDraftLM` does for one sequence: a row's own predicted feature
    stands in beyond the target's cache (one token at a time), and ``keep`` drops the positions
    computed from it (the next round re-feeds them)."""

    def __init__(self, draft: FeatureDraft, target: BatchedFeatureTarget, batch: int):
        super().__init__(draft.lm, batch)
        self.draft = draft.eval()
        self.target = target
        self.vocab_size = target.vocab_size
        self.true_lengths = torch.zeros(batch, dtype=torch.int64, device=self.device)  # tokens from true features
        self.last_feature = None  # [B, d]: the draft's predicted feature of each row's last slot

    def _previous_features(self, positions: Tensor, fed: Tensor) -> tuple[Tensor, Tensor]:
        """For each fed slot at sequence position t, the feature of position t - 1 ([B, n, d]; zeros
        before a row's first token), and [B] bool: the row used its own last feature."""
        target = self.target
        wanted = positions - 1
        beyond = fed & (wanted >= target.lengths[:, None])  # positions the target has not computed
        own = beyond.any(1)
        allowed = (fed.sum(1) == 1) & (self.last_feature is not None)
        if bool((own & ~allowed).any()):
            row = int((own & ~allowed).nonzero()[0])
            raise ValueError(f"row {row}: the target's features of positions {int(target.lengths[row])}.."
                             f"{int(wanted[row][fed[row]][-1])} are not known: feed the draft one token at a time "
                             "beyond the target's cache")
        slot = torch.zeros_like(target.valid, dtype=torch.int64)  # slot[b, p]: the slot of row b's position p
        rows, slots = target.valid.nonzero(as_tuple=True)
        slot[rows, target.valid.cumsum(1)[rows, slots] - 1] = slots
        prev = torch.zeros(*fed.shape, target.features.shape[-1], device=self.device)
        b, j = (fed & ~beyond & (wanted >= 0)).nonzero(as_tuple=True)
        prev[b, j] = target.features[b, slot[b, wanted[b, j]]]
        b, j = beyond.nonzero(as_tuple=True)
        if len(b):
            prev[b, j] = self.last_feature[b]
        return prev, own

    @torch.inference_mode()
    def extend(self, tokens: Tensor, fed: Tensor, num_logits: int) -> Tensor:
        fed, before = fed.to(self.device), self.lengths
        prev, own = self._previous_features(self._positions(fed), fed)  # checks before the cache changes
        inputs = self._append(fed)
        feats = self.draft.features(tokens.to(self.device), prev, **inputs)
        self.true_lengths = torch.where(~own & (self.true_lengths == before), self.lengths, self.true_lengths)
        self.last_feature = feats[:, -1]
        return self.draft.lm.lm_head(feats[:, -num_logits:])

    def keep(self, lengths: Tensor) -> None:
        self.true_lengths = torch.minimum(self.true_lengths, lengths.to(self.device))
        super().keep(self.true_lengths)
        self.last_feature = None

    def select(self, rows: Tensor) -> None:
        super().select(rows)
        self.true_lengths = self.true_lengths[rows.to(self.device)]
        self.last_feature = None if self.last_feature is None else self.last_feature[rows.to(self.device)]


def feature_pair(target: nn.Module, draft: FeatureDraft) -> tuple[FeatureTargetLM, FeatureDraftLM]:
    """The (target, draft) pair to pass to :func:`~specdec_fast.generate.fast_generate`.

    The two objects share state (the target's features): use them together, for one
    generation at a time."""
    target_lm = FeatureTargetLM(target)
    return target_lm, FeatureDraftLM(draft, target_lm)


def deepened(draft: FeatureDraft, target: nn.Module, num_layers: int) -> FeatureDraft:
    """A copy of ``draft`` with ``num_layers`` decoder layers: its own, then new ones initialised
    from the target's layer ``draft.source_layer`` with their output projections (attention
    and MLP) zeroed, so each new layer adds nothing to the residual stream and the copy computes
    exactly what ``draft`` computes until training moves them."""
    own = len(draft.lm.model.layers)
    if num_layers < own:
        raise ValueError(f"cannot deepen a {own}-layer draft to {num_layers} layers")
    deeper = FeatureDraft(target, draft.lm.lm_head.vocab_ids, draft.source_layer, num_layers)
    deeper.load_state_dict(draft.state_dict(), strict=False)  # the new layers keep their initialisation
    with torch.no_grad():
        for layer in deeper.lm.model.layers[own:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return deeper.train(draft.training)


def save_feature_draft(draft: FeatureDraft, path, metadata: dict[str, str]) -> None:
    """Write the draft's own weights (fp16; not the shared embeddings) and ``metadata``."""
    save_draft_weights(draft, path, {"kind": "feature", "source_layer": str(draft.source_layer),
                                     "num_layers": str(len(draft.lm.model.layers)), **metadata})


def load_feature_draft(target: nn.Module, path) -> FeatureDraft:
    """Rebuild a draft saved by :func:`save_feature_draft` around ``target``."""
    metadata, state = read_draft_file(path)
    draft = FeatureDraft(target, state["lm.lm_head.vocab_ids"], int(metadata["source_layer"]),
                         int(metadata.get("num_layers", 1)))  # files before 2026-12-06 hold one layer
    return load_draft_weights(draft, state, path)


def default_feature_draft(target: nn.Module) -> FeatureDraft:
    """The feature draft shipped for SmolLM2-135M-Instruct (card: specdec_fast/data/smollm2_feature_draft.md)."""
    return load_feature_draft(target, shipped_file(FEATURE_DRAFT_FILE))
