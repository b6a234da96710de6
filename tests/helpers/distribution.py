"""Statistical helpers for the losslessness tests."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def chi_square(observed: Tensor, expected_probs: Tensor, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Pearson chi-square of integer counts ``observed`` [C] against ``expected_probs`` [C].

    Cells expected below ``min_expected`` are pooled into one cell. A sample on a cell of
    probability exactly 0 (an impossible token) makes the statistic infinite.
    Returns (statistic, threshold, df) with threshold = df + 10 * sqrt(2 * df).
    """
    observed = observed.double().flatten()
    probs = expected_probs.double().flatten()
    impossible = probs == 0
    n = observed.sum()
    expected = probs * n
    small = (expected < min_expected) & ~impossible
    big = ~small & ~impossible
    obs_cells = torch.cat([observed[big], observed[small].sum().reshape(1)])
    exp_cells = torch.cat([expected[big], expected[small].sum().reshape(1)])
    keep = exp_cells > 0
    obs_cells, exp_cells = obs_cells[keep], exp_cells[keep]
    stat = float(((obs_cells - exp_cells) ** 2 / exp_cells).sum())
    if observed[impossible].sum() > 0:
        stat = math.inf
    df = max(int(keep.sum()) - 1, 1)
    return stat, df + 10 * math.sqrt(2 * df), df


def counts(values: Tensor, num_cells: int) -> Tensor:
    """Histogram of int64 ``values`` in [0, num_cells)."""
    return torch.bincount(values.flatten(), minlength=num_cells)


def sequence_counts(seqs: Tensor, vocab: int) -> Tensor:
    """Histogram of the rows of int64 ``seqs`` [N, n] over the V ** n sequences, a row z at cell
    ((z_0 V + z_1) V + z_2) ... (the order of the exact joints the tests compare with)."""
    cells = torch.zeros(len(seqs), dtype=torch.int64)
    for column in seqs.T:
        cells = cells * vocab + column
    return counts(cells, vocab ** seqs.shape[1])
