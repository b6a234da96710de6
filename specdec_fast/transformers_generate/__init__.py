"""Speculative decoding from transformers' own ``generate``, through its ``custom_generate`` hook::

    from specdec_fast.transformers_generate import CUSTOM_GENERATE

    out = target.generate(input_ids, assistant_model=draft, custom_generate=CUSTOM_GENERATE,
                          trust_remote_code=True, max_new_tokens=64, do_sample=False)

transformers loads ``custom_generate/generate.py`` from this folder (a local folder needs
``trust_remote_code=True``: it runs the file) and calls it instead of its own decoding loop.
"""

from pathlib import Path

CUSTOM_GENERATE = str(Path(__file__).resolve().parent)

__all__ = ["CUSTOM_GENERATE"]
