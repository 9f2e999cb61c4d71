"""Hypothesis property tests that run on every rank in lockstep.

Every rank runs the same derandomized Hypothesis search, so all ranks draw the same examples
and call the same collectives. Each rank builds every rank's input from the example's seed,
checks its own result against NumPy, and the ranks agree on the verdict with an allreduce(Min)
so that a failure (and Hypothesis's shrinking) happens on all ranks together.
"""
from typing import Dict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

import hvdlike as hvd
import reference
from hvdlike.base.dtypes import SUPPORTED

SETTINGS = settings(max_examples=40, derandomize=True, database=None, deadline=None)
DTYPES = st.sampled_from([str(d) for d in SUPPORTED])
SHAPES = array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
counts: Dict[str, int] = {}


def _make(dtype_name: str, shape: tuple, seed: int, rank: int) -> np.ndarray:
    dtype = next(d for d in SUPPORTED if str(d) == dtype_name)
    rng = np.random.default_rng([seed, rank])
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0 if dtype.kind == "u" else -4, 5, shape).astype(dtype)


def _agree(ok: bool, what: str) -> None:
    counts[what] = counts.get(what, 0) + 1
    everywhere = hvd.allreduce(np.array(ok), op=hvd.Min)
    assert everywhere, f"{what}: a rank's result differs from NumPy"


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    return (got.dtype == want.dtype and got.shape == want.shape
            and np.array_equal(got.astype(np.float64), want.astype(np.float64),
                               equal_nan=True))


@SETTINGS
@given(shape=SHAPES, dtype=DTYPES, op=st.sampled_from(["Sum", "Min", "Max", "Average"]),
       seed=st.integers(0, 2**32 - 1))
def allreduce_matches_numpy(shape, dtype, op, seed):
    if dtype == "bool" and op == "Average":
        op = "Sum"
    n, rank = hvd.size(), hvd.rank()
    xs = [_make(dtype, shape, seed, r) for r in range(n)]
    got = hvd.allreduce(xs[rank], op=getattr(hvd, op))
    _agree(_same(got, reference.reduce(xs, op)), "allreduce")


@SETTINGS
@given(trailing=array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4), dtype=DTYPES,
       seed=st.integers(0, 2**32 - 1))
def allgather_matches_numpy(trailing, dtype, seed):
    n, rank = hvd.size(), hvd.rank()
    rows = np.random.default_rng(seed).integers(0, 4, n)
    xs = [_make(dtype, (int(rows[r]),) + trailing, seed, r) for r in range(n)]
    _agree(_same(hvd.allgather(xs[rank]), np.concatenate(xs)), "allgather")


@SETTINGS
@given(shapes=st.lists(SHAPES, min_size=0, max_size=6),
       dtypes=st.lists(DTYPES, min_size=6, max_size=6), seed=st.integers(0, 2**32 - 1))
def grouped_allreduce_matches_numpy(shapes, dtypes, seed):
    n, rank = hvd.size(), hvd.rank()
    xs = [[_make(d, s, seed + i, r) for i, (s, d) in enumerate(zip(shapes, dtypes))]
          for r in range(n)]
    got = hvd.grouped_allreduce(xs[rank], op=hvd.Sum)
    want = [reference.reduce([x[i] for x in xs], "Sum") for i in range(len(shapes))]
    _agree(len(got) == len(want) and all(map(_same, got, want)), "grouped_allreduce")


FLOATS = st.sampled_from([str(d) for d in SUPPORTED if d.kind == "f" or str(d) == "bfloat16"])


@SETTINGS
@given(shape=SHAPES, dtype=FLOATS, op=st.sampled_from(["Sum", "Min", "Max"]),
       seed=st.integers(0, 2**32 - 1))
def allreduce_with_nan_and_inf_matches_numpy(shape, dtype, op, seed):
    """NaN wherever any rank has one (Min and Max too, as in NumPy), inf - inf = NaN."""
    n, rank = hvd.size(), hvd.rank()
    special = np.array([np.nan, np.inf, -np.inf, 1.0, -2.0])
    xs = [special[np.random.default_rng([seed, r]).integers(0, 5, shape)].astype(
        _make(dtype, (), 0, 0).dtype) for r in range(n)]
    got = hvd.allreduce(xs[rank], op=getattr(hvd, op))
    _agree(_same(got, reference.reduce(xs, op)), "allreduce_nan_inf")
    if len(shape) > 0:
        got = hvd.reducescatter(xs[rank], op=getattr(hvd, op))
        want = reference.scatter_block(reference.reduce(xs, op), rank, n)
        _agree(_same(got, want), "reducescatter_nan_inf")


def run() -> Dict[str, int]:
    allreduce_with_nan_and_inf_matches_numpy()
    allreduce_matches_numpy()
    allgather_matches_numpy()
    grouped_allreduce_matches_numpy()
    return counts
