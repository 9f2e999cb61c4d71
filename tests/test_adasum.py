"""Adasum (Horovod's adaptive summation): the combination itself, and allreduce(op=Adasum)
through the engine on 2 and 4 ranks and on process sets, checked on every rank against a
float64 reference of the pairwise tree."""
import numpy as np
import pytest

import reference
from adasum_cases import CASES, FACTORS, inputs
from hvdlike.engine import adasum
from mpi_harness import run_mpi


def _tolerance(dtype: np.dtype) -> float:
    return {8: 1e-12, 4: 1e-5}.get(np.dtype(dtype).itemsize, 1e-2)


def _assert_matches(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape)
    tol = _tolerance(want.dtype)
    w = want.astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
    np.testing.assert_allclose(got.astype(np.float64), w, rtol=tol, atol=tol * scale,
                               err_msg=what)


# ----------------------------------------------------------------------- the combination

def _pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    low, high = adasum.factors(*adasum.dots(a, b))
    return low * a + high * b


def test_orthogonal_vectors_are_summed_and_parallel_ones_averaged():
    a = np.array([1.0, 0.0, 0.0])
    b = np.array([0.0, 2.0, 0.0])
    assert adasum.factors(*adasum.dots(a, b)) == (1.0, 1.0)
    np.testing.assert_array_equal(_pair(a, b), a + b)
    assert adasum.factors(*adasum.dots(a, 3 * a)) == pytest.approx((-0.5, 5 / 6))
    np.testing.assert_allclose(_pair(a, 3 * a), 2 * a)  # same direction: the average of 1 and 3


def test_a_zero_vector_counts_as_nothing():
    a = np.array([1.5, -2.0], np.float32)
    zero = np.zeros(2, np.float32)
    np.testing.assert_array_equal(_pair(zero, a), a)
    np.testing.assert_array_equal(_pair(a, zero), a)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dot_products_over_many_chunks_are_float64_sums_and_swap_bit_for_bit(dtype):
    rng = np.random.default_rng(0)
    size = 3 * adasum._CHUNK + 5
    a = rng.standard_normal(size).astype(dtype)
    b = rng.standard_normal(size).astype(dtype)
    ab, aa, bb = adasum.dots(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    tol = 1e-12 if dtype == np.float64 else 1e-6
    assert ab == pytest.approx(float(a64 @ b64), rel=tol, abs=tol * size)
    assert aa == pytest.approx(float(a64 @ a64), rel=tol)
    assert bb == pytest.approx(float(b64 @ b64), rel=tol)
    assert adasum.dots(b, a) == (ab, bb, aa)  # the same bits, swapped


@pytest.mark.parametrize("n, ok", [(1, True), (2, True), (3, False), (4, True), (6, False),
                                   (8, True)])
def test_only_a_power_of_two_of_ranks_can_reduce_with_adasum(n, ok):
    why = adasum.power_of_two_error(n)
    assert (why == "") == ok
    if not ok:
        assert f"got {n} ranks" in why and "hvdlike.Average" in why


# ----------------------------------------------------------------------- through the engine

@pytest.mark.parametrize("np_, members", [(2, None), (4, None), (4, [1, 3]), (4, [2])],
                         ids=["np2", "np4", "np4-set-1-3", "np4-set-of-one"])
def test_allreduce_with_adasum_matches_the_pairwise_tree_on_every_rank(np_, members):
    results = run_mpi(np_, "adasum_cases:run", timeout=120, members=members)
    ranks = list(range(np_)) if members is None else members
    for case in CASES:
        pre, post = FACTORS.get(case, (1.0, 1.0))
        given = [inputs(case, r) for r in ranks]
        want = [reference.adasum([g[t] for g in given], pre, post) for t in range(len(given[0]))]
        first = results[ranks[0]][case][0]
        for rank in ranks:
            for attempt, got in enumerate(results[rank][case]):
                grouped = case.startswith("grouped")
                got = got if grouped else [got]
                for t, (g, w) in enumerate(zip(got, want)):
                    _assert_matches(g, w, f"{case} rank {rank} call {attempt} tensor {t}")
                    f = first[t] if grouped else first
                    assert g.tobytes() == f.tobytes(), f"{case}: rank {rank} differs in bits"
    for rank in set(range(np_)) - set(ranks):
        assert results[rank] is None
    # what Adasum promises: orthogonal contributions summed, parallel ones averaged, zeros
    # left out
    got = results[ranks[0]]
    orthogonal = sum(inputs("orthogonal", q)[0] for q in ranks)
    np.testing.assert_allclose(got["orthogonal"][0], orthogonal, rtol=1e-12)
    parallel = np.mean([inputs("parallel", q)[0] for q in ranks], axis=0)
    np.testing.assert_allclose(got["parallel"][0], parallel, rtol=1e-5, atol=1e-6)
    nonzero = [inputs("zeros_on_odd", q)[0] for q in ranks if q % 2 == 0]
    if nonzero:  # one or two arrays here: a tree of their own
        np.testing.assert_allclose(got["zeros_on_odd"][0], reference.adasum(nonzero), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("np_", [2, 4])
def test_a_joined_rank_counts_as_zeros_in_adasum(np_):
    results = run_mpi(np_, "adasum_cases:joined", timeout=120)
    want = reference.adasum([np.zeros(257, np.float32)]
                            + [inputs("float32", r)[0] for r in range(1, np_)])
    for rank, r in enumerate(results):
        assert 0 < r["last"] < np_, r  # rank 0 joined first
        if rank:
            _assert_matches(r["result"], want, f"rank {rank}")
    assert len({r["last"] for r in results}) == 1


@pytest.mark.parametrize("np_, members", [(2, None), (3, None), (4, [0, 1, 2])],
                         ids=["np2", "np3", "np4-set-of-three"])
def test_adasum_where_it_cannot_run_raises_on_every_rank(np_, members):
    results = run_mpi(np_, "adasum_cases:refused", timeout=120, members=members)
    ranks = list(range(np_)) if members is None else members
    three = len(ranks) == 3
    for rank in ranks:
        r = results[rank]
        if three:
            assert r["allreduce"].startswith("ValueError"), r
            assert "power of two" in r["allreduce"] and "got 3 ranks" in r["allreduce"], r
        else:
            assert r["allreduce"] == "no error", r
        assert r["int_grouped"].startswith("TypeError"), r
        assert "Adasum combines floating-point gradients; got int32" in r["int_grouped"], r
        assert r["reducescatter"].startswith("ValueError"), r
        assert "reducescatter does not support it" in r["reducescatter"], r
        assert r["sum_after"] == [float(len(ranks))] * 2
    for rank in set(range(np_)) - set(ranks):
        assert results[rank] == {}


@pytest.mark.parametrize("np_", [2, 4])
def test_small_buffers_swap_whole_vectors_in_one_message_a_level(np_):
    """Up to WHOLE_BYTES a rank sends its whole buffer once per level (log2 n messages);
    past it, halves that shrink, then the pieces back, plus the dot products: more messages,
    fewer bytes. Both give the tree's result, with the same bits on every rank."""
    results = run_mpi(np_, "adasum_cases:messages", timeout=120)
    levels = np_.bit_length() - 1
    for case in ("at_whole", "past_whole"):
        want = reference.adasum([inputs(case, r)[0] for r in range(np_)])
        for rank, r in enumerate(results):
            sent, got = r[case]
            _assert_matches(got, want, f"{case} rank {rank}")
            assert got.tobytes() == results[0][case][1].tobytes(), (case, rank)
            if case == "at_whole":
                assert sent == [adasum.WHOLE_BYTES] * levels, sent
            else:
                assert len(sent) > levels and max(sent) <= adasum.WHOLE_BYTES // 2 + 8, sent
