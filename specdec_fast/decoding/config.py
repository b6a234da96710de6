"""transformers' generation vocabulary, turned into what the loops run with.

Every loop takes transformers' keywords (``do_sample``, ``temperature``, ``top_k``, ``top_p``,
``max_new_tokens``, ``max_length``, ``eos_token_id``, ``pad_token_id``, ``generation_config``)
with transformers' rule: a value passed to the call wins, else the ``generation_config`` passed,
else the model's own ``generation_config``, else defaults: greedy, as transformers; when sampling,
temperature 1, top-p 1 and no top-k (transformers' default is top-k 50, which would make "T = 1"
mean something else here); 128 new tokens (transformers': a total length of 20). One rule is
ours: a ``temperature`` passed without ``do_sample`` samples (temperature 0 is greedy), as this
library's calls always did.

What the verifier cannot honour (repetition penalties, other logits processors, beam search,
stop strings, ...) is an error naming it, never a silent difference: speculative decoding
follows the target's distribution after temperature, top-k and top-p, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..kernels import SamplingParams

SUPPORTED = ("do_sample", "temperature", "top_k", "top_p", "max_new_tokens", "max_length", "eos_token_id", "pad_token_id")
DEFAULTS = dict(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=128)
# GenerationConfig fields that change which token is drawn, or when a sequence stops, in ways the
# verifier cannot follow, with the value that turns each off.
NEUTRAL = dict(repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0, min_length=0,
               min_new_tokens=None, min_p=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, num_beams=1,
               num_return_sequences=1, bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None,
               forced_bos_token_id=None, forced_eos_token_id=None, exponential_decay_length_penalty=None,
               sequence_bias=None, stop_strings=None, guidance_scale=None, watermarking_config=None,
               renormalize_logits=False, top_h=None, max_time=None)


@dataclass(frozen=True)
class GenerationSettings:
    """What a generation runs with: the sampling settings (one or one per request), the new-token
    budget of each request, and the end-of-sequence ids (empty: never stop early)."""

    sampling: SamplingParams
    max_new_tokens: list[int]
    eos: set[int]


def _configured(name: str, generation_config, model):
    """``name`` from the ``generation_config`` passed, else the model's, else None."""
    for config in (generation_config, getattr(model, "generation_config", None)):
        value = getattr(config, name, None) if config is not None else None
        if value is not None:
            return value
    return None


def _check_honoured(given: dict, generation_config, model) -> None:
    for name in given:
        if name not in NEUTRAL:
            raise ValueError(f"unsupported generation argument {name!r}: speculative decoding here takes "
                             f"{', '.join(SUPPORTED)}, attention_mask and generation_config")
    for name, neutral in NEUTRAL.items():
        value = given[name] if name in given else _configured(name, generation_config, model)
        if value is not None and value != neutral:
            origin = "passed" if name in given else "from the generation config"
            raise ValueError(f"{name}={value!r} ({origin}) changes the target's distribution in a way the verifier "
                             f"cannot follow; set {name}={neutral!r} to turn it off (supported: {', '.join(SUPPORTED)})")


def _per_request(value, batch: int, name: str) -> list:
    value = value.tolist() if isinstance(value, torch.Tensor) else value
    values = list(value) if isinstance(value, (list, tuple)) else [value] * batch
    if len(values) != batch:
        raise ValueError(f"{name} must be one value or one per request ({batch}), got {len(values)}")
    return values


def generation_settings(model, tokenizer, prompt_lengths: Sequence[int], generation_config=None, *,
                        do_sample: bool | None = None, temperature=None, top_k=None, top_p=None,
                        max_new_tokens: int | None = None, max_length: int | None = None, eos_token_id=None,
                        pad_token_id: int | None = None, **unsupported) -> GenerationSettings:
    """The settings of a generation of ``len(prompt_lengths)`` requests by ``model`` (see the module
    docstring for the rule). ``temperature``, ``top_k`` and ``top_p`` may be one value per request."""
    _check_honoured(unsupported, generation_config, model)
    batch = len(prompt_lengths)
    pick = lambda name, value: value if value is not None else _configured(name, generation_config, model)  # noqa: E731
    asked_to_sample = do_sample is True
    if do_sample is None:  # ours: a temperature passed without do_sample samples (0: greedy)
        do_sample = True if temperature is not None else pick("do_sample", None)
    do_sample = DEFAULTS["do_sample"] if do_sample is None else bool(do_sample)
    rows = {name: _per_request(value if value is not None else DEFAULTS[name], batch, name)
            for name, value in (("temperature", pick("temperature", temperature)), ("top_k", pick("top_k", top_k)),
                                ("top_p", pick("top_p", top_p)))}
    if asked_to_sample and any(t == 0 for t in rows["temperature"]):
        raise ValueError("do_sample=True needs a temperature > 0 (temperature 0 is greedy decoding)")
    if not do_sample:
        rows["temperature"] = [0.0] * batch
    sampling = SamplingParams(*(values if batch > 1 else values[0] for values in rows.values()))
    budget = max_new_tokens if max_new_tokens is not None else pick("max_new_tokens", None)
    if budget is None and max_length is None:
        max_length = pick("max_length", None)
    if budget is None:
        budget = [max_length - n for n in prompt_lengths] if max_length is not None else DEFAULTS["max_new_tokens"]
    budgets = _per_request(budget, batch, "max_new_tokens")
    for b in budgets:
        if int(b) != b or b <= 0:
            raise ValueError(f"max_new_tokens must be a positive integer, got {b}"
                             + (" (max_length leaves no room after the prompt)" if max_length is not None else ""))
    if pad_token_id is not None and int(pad_token_id) != pad_token_id:
        raise ValueError(f"pad_token_id must be an integer, got {pad_token_id!r}")
    return GenerationSettings(sampling, [int(b) for b in budgets], eos_ids(eos_token_id, generation_config, model, tokenizer))


def eos_ids(eos_token_id, generation_config, model, tokenizer) -> set[int]:
    """End-of-sequence ids: ``eos_token_id`` if given (``()`` disables stopping), else the generation
    config's, else the model's, else the tokenizer's."""
    if eos_token_id is None:
        eos_token_id = _configured("eos_token_id", generation_config, model)
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}
