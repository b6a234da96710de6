"""Row primitives of the Triton kernels: warping, probabilities and inverse-CDF sampling.

The math is specdec_fast/sampling.py (the reference); the algorithms are those of
csrc/cpu/sampling.h, so every backend draws the same kept sets and tokens:

- a row's warped distribution is kept as p(x) = kept(x) ? exp(z_x - max) / sum : 0 with
  z = logits / temperature, kept(x) iff key(z_x) >= min_key (key: the order-preserving
  integer of a float), the sum over kept x in float64; greedy rows are a point mass on the
  first argmax;
- top-k and top-p thresholds come from one bisection over the 32-bit key: the smallest
  key whose strictly-greater weight (count, or float64 probability) is below the limit;
- sampling is an inverse CDF cumulated in float64 over tiles of the vocabulary.

Every loop walks the vocabulary in tiles of BLOCK entries; row pointers are int64.
"""

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

RESIDUAL_EPS = tl.constexpr(1e-6)  # specdec_fast/reference/verify.py
TILE = 4096  # vocabulary entries per loop step (one kernel specialisation for every V)
# tl.exp compiles to the GPU's approximate exp2 of x log2(e), whose relative error grows with |x|
# (3e-5 at x = -450); libdevice's expf is within 2 ulp, as the C++ kernels' exp. The interpreter
# has no libdevice, and its tl.exp is numpy's.
PRECISE_EXP = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


@triton.jit
def scaled(x, t):
    """x / t (fp32), correctly rounded as torch divides (a GPU's `/` in Triton is approximate,
    2 ulp); greedy rows (t = 0) divide by 1, as the reference does."""
    return tl.math.div_rn(x, tl.where(t == 0, 1.0, t))


@triton.jit
def scaled_tile(row_ptr, offs, V, t):
    """z = logits / t over one tile (fp32), -inf past the row's end."""
    return scaled(tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32), t)


@triton.jit
def order_key(z):
    """int64 in [0, 2^32): a < b iff order_key(a) < order_key(b) (NaN never reaches here)."""
    bits = z.to(tl.uint32, bitcast=True)
    key = tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)
    return key.to(tl.int64)


@triton.jit
def exp_shifted(z, m):
    """exp(z - m), 0 where z is -inf (also when m is -inf)."""
    if PRECISE_EXP:
        e = libdevice.exp(z - m)
    else:
        e = tl.exp(z - m)
    return tl.where(z == float("-inf"), 0.0, e)


@triton.jit
def bad_flags(z, offs, V):
    """(NaN count, +inf count) of one tile of values (past the row's end: -inf, never counted)."""
    inside = offs < V
    return tl.sum(tl.where(inside & (z != z), 1, 0), 0), tl.sum(tl.where(inside & (z == float("inf")), 1, 0), 0)


@triton.jit
def row_status(nans, infs, m):
    """The row's status (specdec_fast/kernels/reference/verify.py STATUS): NaN 4, +inf 5, only -inf 6, else 0."""
    return tl.where(nans > 0, 4, tl.where(infs > 0, 5, tl.where(m == float("-inf"), 6, 0)))


@triton.jit
def argmax_row(row_ptr, V, BLOCK: tl.constexpr):
    """(index of the first maximum, status) of a row of logits."""
    best = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.zeros((), tl.int64)
    nans = tl.zeros((), tl.int32)
    infs = tl.zeros((), tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        n, i = bad_flags(x, offs, V)
        nans += n
        infs += i
        tile_max = tl.max(x, 0)
        tile_idx = tl.min(tl.where((x == tile_max) & (offs < V), offs, V), 0)
        better = tile_max > best  # ties keep the earlier tile
        best_idx = tl.where(better, tile_idx, best_idx)
        best = tl.where(better, tile_max, best)
    return best_idx, row_status(nans, infs, best)


@triton.jit
def weight_above(row_ptr, V, t, probe, min_key, m, total, USE_P: tl.constexpr, BLOCK: tl.constexpr):
    """Sum over kept entries with key > probe of 1 (USE_P False) or exp(z - m) / total in float64."""
    acc = tl.zeros((), tl.float64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        z = scaled_tile(row_ptr, offs, V, t)
        key = order_key(z)
        selected = (offs < V) & (key > probe) & (key >= min_key)
        if USE_P:
            w = tl.exp(z.to(tl.float64) - m.to(tl.float64)) / total
        else:
            w = tl.full((BLOCK,), 1.0, tl.float64)
        acc += tl.sum(tl.where(selected, w, 0.0), 0)
    return acc


@triton.jit
def smallest_kept_key(row_ptr, V, t, limit, min_key, m, total, USE_P: tl.constexpr, BLOCK: tl.constexpr):
    """The smallest key k with weight_above(k) < limit, by bisection on the key's 32 bits."""
    below = tl.full((), -1, tl.int64)  # the largest key known to fail the rule
    for bit in range(31, -1, -1):
        probe = below + (tl.full((), 1, tl.int64) << bit)
        above = weight_above(row_ptr, V, t, probe, min_key, m, total, USE_P, BLOCK)
        below = tl.where(above < limit, below, probe)
    return below + 1


@triton.jit
def kept_sum(row_ptr, V, t, min_key, m, BLOCK: tl.constexpr):
    """Sum of exp(z - m) over the kept entries (fp32 exps added in float64)."""
    acc = tl.zeros((), tl.float64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        z = scaled_tile(row_ptr, offs, V, t)
        acc += tl.sum(tl.where(order_key(z) >= min_key, exp_shifted(z, m), 0.0).to(tl.float64), 0)
    return acc


@triton.jit
def row_max(row_ptr, V, t, BLOCK: tl.constexpr):
    """(max z, status) of a row."""
    m = tl.full((), float("-inf"), tl.float32)
    nans = tl.zeros((), tl.int32)
    infs = tl.zeros((), tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        z = scaled_tile(row_ptr, offs, V, t)
        n, i = bad_flags(z, offs, V)
        nans += n
        infs += i
        m = tl.maximum(m, tl.max(z, 0))
    return m, row_status(nans, infs, m)


@triton.jit
def online_max_sum(row_ptr, V, t, BLOCK: tl.constexpr):
    """(max z, sum exp(z - max), status) in one read of the row: the sum is rescaled when the max grows."""
    m = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float64)
    nans = tl.zeros((), tl.int32)
    infs = tl.zeros((), tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        z = scaled_tile(row_ptr, offs, V, t)
        n, i = bad_flags(z, offs, V)
        nans += n
        infs += i
        new_m = tl.maximum(m, tl.max(z, 0))
        rescale = tl.where(m == float("-inf"), 0.0, tl.exp(m.to(tl.float64) - new_m.to(tl.float64)))
        total = total * rescale + tl.sum(exp_shifted(z, new_m).to(tl.float64), 0)
        m = new_m
    return m, total, row_status(nans, infs, m)


@triton.jit
def row_dist(row_ptr, V, t, top_k, top_p, BLOCK: tl.constexpr):
    """(argmax, min_key, max, inv_sum, status) of a row's warped distribution; argmax >= 0 for
    greedy rows; status 0, or 4 / 5 / 6 for a row with NaN / +inf / only -inf (then the rest is undefined)."""
    argmax = tl.full((), -1, tl.int64)
    min_key = tl.zeros((), tl.int64)
    m = tl.zeros((), tl.float32)
    inv_sum = tl.full((), 1.0, tl.float64)
    status = tl.zeros((), tl.int32)
    if t == 0:
        argmax, status = argmax_row(row_ptr, V, BLOCK)
    elif ((top_k > 0) & (top_k < V)) | (top_p < 1):
        m, status = row_max(row_ptr, V, t, BLOCK)  # the max is always kept
        if status != 0:
            m = tl.zeros((), tl.float32)  # the bisection below then runs on finite numbers
        if (top_k > 0) & (top_k < V):
            min_key = smallest_kept_key(row_ptr, V, t, top_k.to(tl.float64), min_key, m, 1.0, False, BLOCK)
        if top_p < 1:  # the kept set is decided on p in float64, as in the reference
            total = kept_sum(row_ptr, V, t, min_key, m, BLOCK)
            min_key = smallest_kept_key(row_ptr, V, t, top_p.to(tl.float64), min_key, m, total, True, BLOCK)
        inv_sum = 1.0 / kept_sum(row_ptr, V, t, min_key, m, BLOCK)
    else:  # the hot path: one read of the row
        m, total, status = online_max_sum(row_ptr, V, t, BLOCK)
        inv_sum = 1.0 / total
    return argmax, min_key, m, inv_sum, status


@triton.jit
def prob_of(logit, x, t, argmax, min_key, m, inv_sum):
    """p(x) from x's logit, in float64 then rounded to fp32."""
    z = scaled(logit.to(tl.float32), t)
    p = tl.exp(z.to(tl.float64) - m.to(tl.float64)) * inv_sum
    p = tl.where(order_key(z) >= min_key, p, 0.0).to(tl.float32)
    return tl.where(argmax >= 0, tl.where(x == argmax, 1.0, 0.0), p)


@triton.jit
def q_tile(q_ptr, offs, V, read, point, x):
    """One tile of a draft row's q: loaded if `read`; for a point-mass row (`point`) one-hot at x."""
    q = tl.load(q_ptr + offs, mask=(offs < V) & read & (point == 0), other=0.0)
    return tl.where(point != 0, tl.where(offs == x, 1.0, 0.0), q)


@triton.jit
def weights_tile(row_ptr, q_ptr, offs, V, t, min_key, m, inv_sum, residual, p_scale, point, x):
    """Sampling weights of one tile: p, or max(p_scale p - q, 0) if `residual`; 0 past the row's end."""
    z = scaled_tile(row_ptr, offs, V, t)
    p = tl.where(order_key(z) >= min_key, exp_shifted(z, m) * inv_sum.to(tl.float32), 0.0)
    q = q_tile(q_ptr, offs, V, residual, point, x)
    return tl.where(residual, tl.maximum(p * p_scale - q, 0.0), p)


@triton.jit
def weight_totals(row_ptr, q_ptr, V, t, min_key, m, inv_sum, rejected, p_scale, point, x, BLOCK: tl.constexpr):
    """(sum of max(p_scale p - q, 0) if `rejected` else 0, sum of p, count of bad q entries: NaN,
    negative or infinite) over the row, in float64, in one read."""
    residual = tl.zeros((), tl.float64)
    total = tl.zeros((), tl.float64)
    bad = tl.zeros((), tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        p = weights_tile(row_ptr, q_ptr, offs, V, t, min_key, m, inv_sum, False, 1.0, point, x)
        q = q_tile(q_ptr, offs, V, rejected, point, x)
        bad += tl.sum(tl.where((q >= 0) & (q < float("inf")), 0, 1), 0)
        residual += tl.sum(tl.maximum(p * p_scale - q, 0.0).to(tl.float64), 0)
        total += tl.sum(p.to(tl.float64), 0)
    return tl.where(rejected, residual, 0.0), total, bad


@triton.jit
def sample_row(row_ptr, q_ptr, V, t, min_key, m, inv_sum, residual, p_scale, total, u, point, x,
               BLOCK: tl.constexpr):
    """Inverse CDF: the smallest x with cumsum(w)[x] >= u * total, w of positive weight, in float64."""
    target = u.to(tl.float64) * total
    cum = tl.zeros((), tl.float64)
    token = tl.full((), -1, tl.int64)
    last = tl.full((), -1, tl.int64)  # the last token of positive weight: rounding past the end lands there
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        w = weights_tile(row_ptr, q_ptr, offs, V, t, min_key, m, inv_sum, residual, p_scale, point, x)
        w64 = w.to(tl.float64)
        positive = (offs < V) & (w > 0)
        first = tl.min(tl.where(positive & (tl.cumsum(w64, 0) + cum >= target), offs, V), 0)
        token = tl.where((token < 0) & (first < V), first, token)
        last = tl.maximum(last, tl.max(tl.where(positive, offs, -1), 0))
        cum += tl.sum(w64, 0)
    return tl.where(token < 0, tl.maximum(last, 0), token)
