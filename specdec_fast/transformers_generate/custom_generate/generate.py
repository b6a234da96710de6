"""specdec_fast's speculative decoding as transformers' ``custom_generate``: ``model.generate(...,
custom_generate=specdec_fast.transformers_generate.CUSTOM_GENERATE, trust_remote_code=True,
assistant_model=draft)``. transformers imports this file by path, so it imports specdec_fast by name."""

import torch

from specdec_fast.decoding import batch_generate, fast_generate


def generate(model, inputs=None, generation_config=None, logits_processor=None, stopping_criteria=None,
             prefix_allowed_tokens_fn=None, synced_gpus=None, assistant_model=None, streamer=None,
             negative_prompt_ids=None, negative_prompt_attention_mask=None, **kwargs):
    """Speculative decoding of ``inputs`` ([B, S] token ids; ``attention_mask`` for padded rows) with
    ``model`` as the target and ``assistant_model`` as the draft (a transformers causal LM with the
    same vocabulary, or a specdec_fast FeatureDraft of this target), exact in distribution.

    Takes transformers' generation keywords (see specdec_fast.decoding.config) and specdec_fast's
    own (``num_draft_tokens``, ``policy``, ``verifier``, ``seed``; ``num_alternatives`` for one
    sequence). Returns [B, S + new] int64 like ``generate``: each row's input, then its new tokens,
    rows that stopped early padded with ``pad_token_id``.
    """
    for name, value in (("logits_processor", logits_processor), ("stopping_criteria", stopping_criteria),
                        ("prefix_allowed_tokens_fn", prefix_allowed_tokens_fn), ("negative_prompt_ids", negative_prompt_ids)):
        if value:
            raise ValueError(f"specdec_fast's custom_generate does not take {name}: the verifier follows the target's "
                             "distribution after temperature, top-k and top-p only")
    if assistant_model is None:
        raise ValueError("speculative decoding needs a draft: pass assistant_model=... to generate")
    input_ids = inputs if inputs is not None else kwargs.pop("input_ids")
    attention_mask = kwargs.pop("attention_mask", None)
    pad = kwargs.get("pad_token_id")
    for config in (generation_config, model.generation_config):
        pad = pad if pad is not None else getattr(config, "pad_token_id", None)
    if input_ids.shape[0] == 1 and (attention_mask is None or bool(attention_mask.all())):
        out = fast_generate(model, assistant_model, input_ids, generation_config=generation_config, streamer=streamer, **kwargs)
        new = [out.tokens]
    else:
        if streamer is not None:
            raise ValueError("streaming takes one sequence")
        batch = batch_generate(model, assistant_model, input_ids=input_ids, attention_mask=attention_mask,
                               generation_config=generation_config, **kwargs)
        new = [o.tokens for o in batch.outputs]
    width = max(len(tokens) for tokens in new)
    rows = [tokens + [pad if pad is not None else 0] * (width - len(tokens)) for tokens in new]
    return torch.cat([input_ids, torch.tensor(rows, dtype=input_ids.dtype, device=input_ids.device)], 1)
