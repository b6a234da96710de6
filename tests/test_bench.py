"""The benchmark arithmetic: expected tokens per round and the verify bytes model."""

import pytest
import torch

from specdec_fast.bench.e2e import expected_tokens
from specdec_fast.bench.microbench import bytes_read, make_inputs


def test_expected_tokens_per_round():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert expected_tokens(1.0, 4) == 5.0 and expected_tokens(0.0, 3) == 1.0


def test_bytes_model_counts_visited_rows():
    args = make_inputs(2, 3, 100, torch.bfloat16)
    accepted = torch.tensor([3, 1])  # row 0: all accepted (4 target rows); row 1: stop at 1 (2 rows + q row)
    assert bytes_read(args, accepted) == 6 * 100 * 2 + 1 * 100 * 4 + (3 + 2) * 4
