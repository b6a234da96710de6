"""Cold and warm first-request times (``specdec-fast warmup-bench``).

Each measurement is a fresh Python process that loads the default pair and times its first
and second requests (the main job's prompt, greedy, 32 new tokens, the shipped policy):
cold = no warm-up; warm = :func:`specdec_fast.warmup` first. The kernels are already built
(the JIT cache is filled on first use after install), so what a cold first request pays is
loading them plus the first-call costs of torch and transformers.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from .common import machine, markdown_table, write_results

CHILD = """
import json, sys, time, torch
torch.set_num_threads({threads})
from specdec_fast import fast_generate, warmup
from specdec_fast.learned_policy import default_policy
from specdec_fast.prompts import chat_prompt_ids
start = time.perf_counter()
from specdec_fast.smollm2 import load_token_pair
target, draft, tokenizer = load_token_pair()
loaded = time.perf_counter()
warm_s = warmup(target, draft) if {warm} else 0.0
ids = chat_prompt_ids(tokenizer, "Explain why the sky is blue.", chat=True)
requests = []
for _ in range(2):
    t = time.perf_counter()
    fast_generate(target, draft, ids, max_new_tokens=32, temperature=0.0, policy=default_policy("token"))
    requests.append(time.perf_counter() - t)
print(json.dumps(dict(load_s=loaded - start, warmup_s=warm_s, first_s=requests[0], second_s=requests[1])))
"""


def measure(warm: bool, threads: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(threads=threads, warm=warm)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(repeats: int, threads: int, out: Path = Path("results/warmup")) -> dict:
    runs = [dict(mode=mode, **measure(mode == "warm", threads)) for _ in range(repeats) for mode in ("cold", "warm")]
    summary = [dict(mode=mode, **{key: statistics.median(r[key] for r in runs if r["mode"] == mode)
                                  for key in ("load_s", "warmup_s", "first_s", "second_s")}) for mode in ("cold", "warm")]
    data = dict(machine=machine(), settings=dict(repeats=repeats, threads=threads), summary=summary, runs=runs)
    write_results(out, data, table(data))
    return data


def table(data: dict) -> str:
    rows = [[s["mode"], s["load_s"], s["warmup_s"], s["first_s"], s["second_s"], s["first_s"] / s["second_s"]]
            for s in data["summary"]]
    return markdown_table(["process", "load models (s)", "warmup() (s)", "first request (s)", "second request (s)",
                           "first / second"], rows)
