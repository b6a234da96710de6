"""The lean decoder path for Llama-family models (Llama 2/3, SmolLM2, Mistral, Qwen2).

transformers runs a decoder layer as ~25 torch ops driven from Python, each one a hand-off
to the thread pool; on a small model on a CPU that costs as much as reading the weights.
Here a whole pass is one op (:func:`~specdec_fast.kernels.decoder.decoder_pass`) over the
model's own weights: the q/k/v and gate/up matrices are stacked once and the transformers
modules' weights become views of the stacks (no second copy), and the KV cache is a static
buffer in which a rollback only moves a length.

:class:`LeanLM` (one sequence) and :class:`BatchedLeanLM` (a batch) are the
:class:`~specdec_fast.models.cached_lm.CachedLM` and
:class:`~specdec_fast.models.batched_lm.BatchedCachedLM` of the path; both keep the final
hidden state of every cached position (``features``) for a feature draft. :func:`lean_unsupported`
says why a model cannot take the path (the loops then use transformers').

fp32 weights that are exactly 4- or 8-bit blocks (a model dequantised from a Q4_1 / Q8_0 GGUF
file, as the default target is) are read from their blocks (kernels/blocks.py): the same fp32
numbers, the same output bits, a fifth of the bytes. Weights may instead be read as bf16 or int8
(``precision``), or taken in integers against activations quantised to 8 bits ("q8": the blocks,
other matrices quantised to Q8_0 on load; kernels/integer.py): the output then follows the
distribution of that model, exactly, not the fp32 model's.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from ..kernels.blocks import is_blocks, pack_blocks
from ..kernels.decoder import CONVERTED_PREFILL_TOKENS, PREFILL_TOKENS, decoder_pass, prefill_pass
from ..kernels.integer import quantize_q8_0
from ..kernels.linear import quantize_int8
from ..kernels.reference.decoder import weight_linear
from .cached_lm import CachedLM, TransformersLM, as_cached_lm, is_transformers_lm

MODEL_TYPES = ("llama", "mistral", "qwen2")
PRECISIONS = ("fp32", "fp32-dense", "bf16", "int8", "q8")  # fp32: from the checkpoint's blocks where it has them
LEAN_CHOICES = ("auto", "off") + PRECISIONS  # what ``lean=`` takes wherever a loop builds its caches
STATIC_ROPE = (None, "default", "linear", "llama3", "yarn")  # rotary tables that depend on the position only


def lean_unsupported(model) -> str | None:
    """Why ``model`` cannot take the lean path, or None if it can: a transformers Llama-family
    causal LM (model_type llama, mistral or qwen2) with fp32 ``nn.Linear`` weights (the output
    head: any module with an fp32 [V, d] ``weight`` and no bias, such as a draft's restricted
    head), a SiLU MLP without biases, no sliding window and a rotary table that depends on the
    position only."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in MODEL_TYPES or not hasattr(getattr(model, "model", None), "layers"):
        return f"model_type {kind!r} is not one of {', '.join(MODEL_TYPES)}"
    layer = model.model.layers[0]
    linears = [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
               layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj]
    head = model.get_output_embeddings()
    rope = (getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}).get("rope_type")
    reasons = {
        "weights are not fp32 nn.Linear weights": any(
            not isinstance(m, nn.Linear) or m.weight.dtype != torch.float32 for m in linears),
        "the output head has no fp32 weight": not isinstance(getattr(head, "weight", None), Tensor)
        or head.weight.dtype != torch.float32,
        f"hidden_act {config.hidden_act!r} is not silu": config.hidden_act != "silu",
        "the MLP or the output projection has a bias": any(
            getattr(m, "bias", None) is not None for m in [*linears[3:], head]),
        "a sliding attention window": getattr(config, "use_sliding_window", True) and getattr(config, "sliding_window", None),
        f"rope_type {rope!r} depends on the sequence length": rope not in STATIC_ROPE,
    }
    return next((reason for reason, bad in reasons.items() if bad), None)


def _stacked(modules: list[nn.Linear]) -> Tensor:
    """The weights of ``modules`` stacked into one [sum out, in] tensor; each module's weight
    becomes a view of its rows (the modules keep working; no second copy)."""
    weights = [m.weight for m in modules]
    start, storage = weights[0].data_ptr(), weights[0].untyped_storage().data_ptr()
    if all(w.untyped_storage().data_ptr() == storage and w.data_ptr() == start + sum(v.numel() for v in weights[:i]) * w.element_size()
           for i, w in enumerate(weights)):
        return torch.as_strided(weights[0].detach(), (sum(w.shape[0] for w in weights), weights[0].shape[1]),
                                (weights[0].shape[1], 1))  # stacked already (by an earlier call)
    stack = torch.cat([w.detach() for w in weights])
    row = 0
    for m in modules:
        m.weight.data = stack[row: row + m.weight.shape[0]]
        row += m.weight.shape[0]
    return stack


@dataclass
class LeanWeights:
    """A model's tensors in :func:`decoder_pass`'s layout (see there), at one precision; ``dense``:
    the fp32 matrices themselves (for :func:`prefill_pass`) when the precision is fp32, else None;
    ``integer``: the blocks take 8-bit activations (precision "q8")."""

    embed: Tensor
    norms: list[Tensor]
    weights: list[Tensor]
    scales: list[Tensor]
    dense: list[Tensor] | None
    qkv_bias: list[Tensor]
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    integer: bool = False

    @classmethod
    def of(cls, model: nn.Module, precision: str = "fp32") -> "LeanWeights":
        """``model``'s weights for the lean path, made once per model and precision: "fp32": the
        model's own tensors, read from their codes where they are exactly blocks
        (:func:`~specdec_fast.kernels.blocks.pack_blocks`); "fp32-dense": the tensors themselves
        always; "bf16" or "int8": converted copies; "q8": the blocks where the tensors are blocks, else
        Q8_0 blocks made on load, all taken against 8-bit activations."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        reason = lean_unsupported(model)
        if reason:
            raise ValueError(f"{type(model).__name__} cannot take the lean path: {reason}")
        made = _MADE.setdefault(model, {})
        if precision not in made:
            made[precision] = cls._build(model, precision)
        return made[precision]

    def sizes(self) -> tuple[int, int]:
        """(weights, bytes) of the matrices a pass reads (the layers' and the head; a Q4_1 byte holds
        two weights): a pass over n tokens does 2 n weights FLOPs and reads the bytes once."""
        weights = sum(w.numel() * (2 if w.dtype == torch.uint8 else 1) for w in self.weights)
        return weights, sum(t.numel() * t.element_size() for t in [*self.weights, *self.scales])

    @classmethod
    def _build(cls, model: nn.Module, precision: str) -> "LeanWeights":
        if precision == "q8":  # the fp32 path's blocks themselves (packed once, held once), other matrices as Q8_0
            base = cls.of(model, "fp32")
            scales = base.scales or [None] * len(base.weights)
            weights, scales = map(list, zip(*((w, s) if is_blocks(w, s) else quantize_q8_0(w) for w, s in zip(base.weights, scales))))
            return replace(base, weights=[w.contiguous() for w in weights], scales=scales, dense=None, integer=True)
        config, layers = model.config, model.model.layers
        matrices, norms, biases = [], [], []
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            projections = [attn.q_proj, attn.k_proj, attn.v_proj]
            matrices += [_stacked(projections), attn.o_proj.weight.detach(), _stacked([mlp.gate_proj, mlp.up_proj]),
                         mlp.down_proj.weight.detach()]
            norms += [layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()]
            if attn.q_proj.bias is not None:
                biases.append(torch.cat([p.bias.detach() for p in projections]))
        norms.append(model.model.norm.weight.detach())
        matrices.append(model.get_output_embeddings().weight.detach())
        scales, dense = [], [w.contiguous() for w in matrices] if precision.startswith("fp32") else None
        if precision == "bf16":
            matrices = [w.to(torch.bfloat16) for w in matrices]
        elif precision == "int8":
            matrices, scales = map(list, zip(*(quantize_int8(w) for w in matrices)))
        elif precision == "fp32":
            blocks = [pack_blocks(w) for w in matrices]
            if any(blocks):
                matrices = [b[0] if b else w for b, w in zip(blocks, matrices)]
                scales = [b[1] if b else torch.empty(0) for b in blocks]
        heads = config.num_attention_heads
        return cls(model.get_input_embeddings().weight.detach(), norms, [w.contiguous() for w in matrices], scales, dense,
                   biases, heads, config.num_key_value_heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads, float(config.rms_norm_eps))


_MADE: "weakref.WeakKeyDictionary[nn.Module, dict[str, LeanWeights]]" = weakref.WeakKeyDictionary()


class LeanPass:
    """One model on the lean path: its weights, its rotary module and a static KV cache of B
    rows (grown by doubling; ``capacity`` slots per row)."""

    def __init__(self, model: nn.Module, batch: int, precision: str = "fp32", capacity: int = 256):
        self.w = LeanWeights.of(model, precision)
        self.rotary = model.model.rotary_emb
        self.device = self.w.embed.device
        shape = (batch, len(model.model.layers), 2, self.w.kv_heads, capacity, self.w.head_dim)
        self.cache = torch.empty(shape, device=self.device)
        self.features = torch.empty(batch, capacity, model.config.hidden_size, device=self.device)

    def reserve(self, length: int) -> None:
        """Make room for ``length`` slots per row (doubling; the filled slots are copied once)."""
        capacity = self.cache.shape[4]
        if length <= capacity:
            return
        while capacity < length:
            capacity *= 2
        cache = torch.empty(*self.cache.shape[:4], capacity, self.cache.shape[5], device=self.device)
        cache[:, :, :, :, : self.cache.shape[4]] = self.cache
        features = torch.empty(self.features.shape[0], capacity, self.features.shape[2], device=self.device)
        features[:, : self.features.shape[1]] = self.features
        self.cache, self.features = cache, features

    def __call__(self, tokens: Tensor, rows: Tensor, positions: Tensor, logit_rows: Tensor,
                 slots: Tensor | None = None) -> Tensor:
        """Run ``tokens`` [M] int64 at ``positions`` [M] of sequences ``rows`` [M], in cache slots
        ``slots`` [M] (default: their positions; see :func:`decoder_pass`); records their final
        hidden states in ``features`` (at the slots) and returns the logits [R, V] of ``logit_rows`` [R].

        A row whose tokens here are a prompt (positions 0..L - 1 in slots 0..L - 1, L >=
        :attr:`prefill_tokens`) takes :func:`prefill_pass` (over the fp32 matrices, or the bf16 /
        int8 weights read as the numbers they hold), the others :func:`decoder_pass`."""
        return self.run(self.w.embed[tokens], rows, positions, logit_rows, slots)

    @torch.inference_mode()
    def run(self, x: Tensor, rows: Tensor, positions: Tensor, logit_rows: Tensor, slots: Tensor | None = None) -> Tensor:
        """:meth:`__call__` from the tokens' input vectors ``x`` [M, d] fp32 instead of their ids
        (a feature draft's inputs are not embeddings of tokens)."""
        slots = positions if slots is None else slots
        self.reserve(int(slots.max()) + 1)
        w = self.w
        cos, sin = self.rotary(x, positions[None])
        cos, sin = cos[0].float(), sin[0].float()
        prompts = self._prompts(rows, positions, slots)
        if not prompts:
            hidden, logits = decoder_pass(x, w.norms, w.weights, w.scales, w.qkv_bias, cos, sin, rows, positions, slots,
                                          self.cache, logit_rows, w.heads, w.kv_heads, w.eps, w.integer)
        else:
            hidden, logits = self._with_prompts(prompts, x, cos, sin, rows, positions, slots, logit_rows)
        self.features[rows, slots] = hidden
        return logits

    @property
    def prefill_tokens(self) -> int | float:
        """The shortest prompt that takes :func:`prefill_pass`: longer where the weights are
        converted to fp32 for it (bf16, int8); none does with 8-bit activations (its products are
        not fp32 ones: every pass takes :func:`decoder_pass`)."""
        if self.w.integer:
            return float("inf")
        return PREFILL_TOKENS if self.w.dense is not None else CONVERTED_PREFILL_TOKENS

    def _prompts(self, rows: Tensor, positions: Tensor, slots: Tensor) -> list[tuple[int, Tensor]]:
        """(row, its token indices) of each row whose tokens in this pass are a prompt (see __call__)."""
        if len(rows) < self.prefill_tokens or int(positions.min()) != 0:
            return []
        prompts = []
        for row in rows[positions == 0].tolist():
            index = (rows == row).nonzero()[:, 0]
            span = torch.arange(len(index), device=rows.device)
            if len(index) >= self.prefill_tokens and torch.equal(positions[index], span) and torch.equal(slots[index], span):
                prompts.append((row, index))
        return prompts

    def _with_prompts(self, prompts: list[tuple[int, Tensor]], x: Tensor, cos: Tensor, sin: Tensor, rows: Tensor,
                      positions: Tensor, slots: Tensor, logit_rows: Tensor) -> tuple[Tensor, Tensor]:
        """(hidden [M, d], logits [R, V]) of a pass holding prompts: each by prefill_pass, the other
        tokens by decoder_pass (their logits too, so theirs stay the pass-size-free bits)."""
        w = self.w
        weights, scales = (w.dense, []) if w.dense is not None else (w.weights, w.scales)
        hidden, rest = torch.empty_like(x), torch.ones(len(x), dtype=torch.bool, device=x.device)
        for row, index in prompts:
            hidden[index] = prefill_pass(x[index], w.norms, weights, scales, w.qkv_bias, cos[index], sin[index], row,
                                         self.cache, w.heads, w.kv_heads, w.eps)
            rest[index] = False
        logits = torch.empty(len(logit_rows), weights[-1].shape[0], device=x.device)
        kernel_rows = rest[logit_rows]
        if rest.any():
            at = rest.cumsum(0) - 1  # a token's index among the rest
            hidden[rest], logits[kernel_rows] = decoder_pass(
                x[rest], w.norms, w.weights, w.scales, w.qkv_bias, cos[rest], sin[rest], rows[rest], positions[rest],
                slots[rest], self.cache, at[logit_rows[kernel_rows]], w.heads, w.kv_heads, w.eps)
        logits[~kernel_rows] = weight_linear(hidden[logit_rows[~kernel_rows]], weights[-1], scales[-1] if scales else None)
        return hidden, logits


class LeanLM(TransformersLM):
    """:class:`~specdec_fast.models.cached_lm.CachedLM` of one sequence on the lean path;
    ``features`` [cache_length, d]: the final hidden state of every cached position."""

    def __init__(self, model: nn.Module, precision: str = "fp32"):
        super().__init__(model)
        self.lean = LeanPass(model, 1, precision)
        self.length = 0

    @property
    def cache_length(self) -> int:
        return self.length

    @property
    def features(self) -> Tensor:
        return self.lean.features[0, : self.length]

    def reset(self) -> None:
        self.length = 0

    def extend(self, tokens: Tensor, num_logits: int) -> Tensor:
        return self.extend_siblings(tokens, tokens[:0], 0, num_logits)

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        self.length = length

    def extend_siblings(self, tokens: Tensor, siblings: Tensor, at: int, num_logits: int) -> Tensor:
        """Append ``tokens`` [n] as :meth:`extend` does, then ``siblings`` [a]: alternatives to
        tokens[at], each at tokens[at]'s position, seeing the cache and tokens[:at] only (they sit in
        the slots after the chain). Returns logits [num_logits + a, V]: the last ``num_logits`` of
        ``tokens``, then one row per sibling. :meth:`keep_sibling` or :meth:`crop` follows."""
        start, n, a = self.length, len(tokens), len(siblings)
        positions = torch.cat([torch.arange(start, start + n), torch.full((a,), start + at)]).to(self.device)
        slots = torch.arange(start, start + n + a, device=self.device)
        logit_rows = torch.cat([torch.arange(n - num_logits, n), torch.arange(n, n + a)]).to(self.device)
        logits = self.lean(torch.cat([tokens, siblings]).to(self.device), torch.zeros(n + a, dtype=torch.int64, device=self.device),
                           positions, logit_rows, slots)
        self.length += n + a
        return logits

    @torch.inference_mode()
    def keep_sibling(self, length: int, slot: int) -> None:
        """Keep the first ``length - 1`` cached tokens and, as the last, the one in ``slot`` (a
        sibling that :meth:`extend_siblings` placed at position ``length - 1``)."""
        cache, features = self.lean.cache[0], self.lean.features[0]
        cache[:, :, :, length - 1] = cache[:, :, :, slot]
        features[length - 1] = features[slot]
        self.crop(length)


class BatchedLeanLM(TransformersLM):
    """:class:`~specdec_fast.models.batched_lm.BatchedCachedLM` of B sequences on the lean path.

    Row b's tokens sit in slots 0..lengths[b] - 1 of its cache row: holes of ``extend`` are never
    fed (their logits are zeros), and ``keep`` only moves lengths. ``valid`` [B, max length] and
    ``features`` [B, max length, d] have the layout a batched feature draft reads."""

    def __init__(self, model: nn.Module, batch: int, precision: str = "fp32"):
        super().__init__(model)
        self.lean = LeanPass(model, batch, precision)
        self._lengths = torch.zeros(batch, dtype=torch.int64, device=self.device)

    @property
    def lengths(self) -> Tensor:
        """[B] int64: tokens of each row in the cache."""
        return self._lengths.clone()

    @property
    def valid(self) -> Tensor:
        """[B, max length] bool: slot j of row b holds a token (j < lengths[b])."""
        width = int(self._lengths.max()) if len(self._lengths) else 0
        return torch.arange(width, device=self.device)[None] < self._lengths[:, None]

    @property
    def features(self) -> Tensor:
        """[B, max length, d]: the final hidden state of every slot (a view)."""
        return self.lean.features[: len(self._lengths), : self.valid.shape[1]]

    def extend(self, tokens: Tensor, fed: Tensor, num_logits: int) -> Tensor:
        """Append the fed tokens of ``tokens`` [B, n] (``fed`` [B, n] bool) to each row; returns the
        logits [B, num_logits, V] of the last ``num_logits`` columns (zeros where a column is a hole)."""
        fed = fed.to(self.device, torch.bool)
        rows, cols = fed.nonzero(as_tuple=True)
        index = torch.full(fed.shape, -1, dtype=torch.int64, device=self.device)
        index[rows, cols] = torch.arange(len(rows), device=self.device)
        wanted = index[:, fed.shape[1] - num_logits:]
        out = torch.zeros(*wanted.shape, self.vocab_size, device=self.device)
        if len(rows):
            positions = self._lengths[rows] + fed.cumsum(1)[rows, cols] - 1
            out[wanted >= 0] = self.lean(tokens.to(self.device)[rows, cols], rows, positions, wanted[wanted >= 0])
        self._lengths += fed.sum(1)
        return out

    def keep(self, lengths: Tensor) -> None:
        """Keep the first ``lengths[b]`` tokens of row b ([B] int64)."""
        self._lengths = torch.minimum(self._lengths, lengths.to(self.device))

    def select(self, rows: Tensor) -> None:
        """Keep only ``rows`` ([B'] int64 indices) of the batch (their cache rows are copied to the front)."""
        rows = rows.to(self.device)
        self.lean.cache, self.lean.features = self.lean.cache[rows], self.lean.features[rows]
        self._lengths = self._lengths[rows]


def lean_precision(model, lean: str = "auto") -> str | None:
    """The weight precision at which ``model`` takes the lean path, or None for transformers' path.

    ``lean``: "auto" (fp32 where :func:`lean_unsupported` allows and the model is on a CPU, else
    None), "off" (None), or a precision (:data:`PRECISIONS`: a ValueError where the model cannot
    take the path). Objects that are already caches are left alone (None)."""
    if lean not in LEAN_CHOICES:
        raise ValueError(f"lean must be one of {', '.join(LEAN_CHOICES)}, got {lean!r}")
    if lean == "off" or isinstance(model, CachedLM) or not is_transformers_lm(model):
        return None
    reason = lean_unsupported(model)
    if lean == "auto":
        return "fp32" if reason is None and next(model.parameters()).device.type == "cpu" else None
    if reason:
        raise ValueError(f"lean={lean!r}: {type(model).__name__} cannot take the lean path: {reason}")
    return lean


def cached_lm(model, lean: str = "auto") -> CachedLM:
    """The cache of one sequence for ``model``: :class:`LeanLM` where :func:`lean_precision` says
    so, else :func:`~specdec_fast.models.cached_lm.as_cached_lm`."""
    precision = lean_precision(model, lean)
    return LeanLM(model, precision) if precision else as_cached_lm(model)
