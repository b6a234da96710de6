"""A feature-level draft (in the manner of EAGLE): the draft reads the target's own last
hidden states, so one small layer can predict what thirty layers compute.

The draft's input at position j is ``fc([embed(x_j), h_{j-1}])``, where h_{j-1} is the
target's final (normed) hidden state at position j - 1; one decoder layer (or a few) and a
final norm turn it into a predicted feature f_j, and the target's LM head rows over a token
subset (:class:`~specdec_fast.drafts.small.RestrictedHead`) turn f_j into the draft's logits
for x_{j+1}. While drafting, the target has not seen the drafted tokens yet, so the draft
feeds its own f_j in place of h_j. The caches that bind it to its target for decoding are in
:mod:`specdec_fast.drafts.feature_lm`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from ..models.cached_lm import cache_argument
from .small import build_small_draft, load_draft_weights, read_draft_file, save_draft_weights


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
        return self.lm.model(inputs_embeds=self.inputs(ids, prev), attention_mask=attention_mask, **cache_kwargs).last_hidden_state

    def inputs(self, ids: Tensor, prev: Tensor) -> Tensor:
        """The first layer's inputs [B, L, d]: fc of each token's embedding beside the previous
        position's feature (ids [B, L] int64, prev [B, L, d])."""
        return self.fc(torch.cat([self.lm.model.embed_tokens(ids), prev.to(self.lm.model.embed_tokens.weight.dtype)], -1))

    def unrolled_features(self, ids: Tensor, prev: Tensor, steps: int, attention_mask: Tensor | None = None) -> list[Tensor]:
        """The features of ``steps`` consecutive drafting steps at every position, each as the
        decoding loop computes it (for training). ids [B, L] int64 (right-padded), prev [B, L, d]
        the target's features of the previous positions, attention_mask [B, L] (1 = token).
        Returns [f_1, ..., f_steps], each [B, L, d]: f_1 is :meth:`features`; f_j at position t
        reads f_{j-1} at t - 1 and, like step j of a round whose first draft position is
        t - j + 1, attends to step-1 positions <= t - j + 1 (inputs from true features) and to
        step i's position t - j + i for 1 < i <= j (inputs from its own features)."""
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
            out.append(self.lm.model(inputs_embeds=self.inputs(ids, shifted), attention_mask=rows, position_ids=positions,
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
