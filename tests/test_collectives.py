"""Every collective x dtype x op equals its NumPy reference on every rank: np=1, np=2, np=4
(oversubscribed), a process set of 2 out of 4 ranks and one of 1 out of 4, each over MPI and
over the on-node shared-memory window (threshold 0 so every blocking all-reduce takes it; a
64-byte buffer so that most take several rounds), single-copy through cross-memory attach and hierarchically over two pretend nodes;
with the MPI transport's per-call limit lowered to 5 elements (the path of messages past 2
GiB); and the same under MPICH (HVDLIKE_TEST_MPICH_PREFIX)."""
import numpy as np
import pytest

import reference
from collective_cases import Case, cases, inputs, splits_for
from mpi_harness import mpich_prefix, run_mpi

MPI_ONLY = {"HVDLIKE_SHM_BUFFER": "0"}
SHM = {"HVDLIKE_SHM_THRESHOLD": "0", "HVDLIKE_CMA": "0"}
SHM_ROUNDS = {**SHM, "HVDLIKE_SHM_BUFFER": "64"}
CMA = {"HVDLIKE_SHM_THRESHOLD": "0", "HVDLIKE_CMA_THRESHOLD": "0"}
CONFIGS = {
    "np2": (2, None, MPI_ONLY), "np4": (4, None, MPI_ONLY), "np4-set12": (4, [1, 2], MPI_ONLY),
    "np2-shm": (2, None, SHM), "np4-shm-rounds": (4, None, SHM_ROUNDS),
    "np4-set12-shm-rounds": (4, [1, 2], SHM_ROUNDS),
    "np2-cma": (2, None, CMA), "np4-cma": (4, None, CMA), "np4-set12-cma": (4, [1, 2], CMA),
    # two pretend nodes of 2 ranks: hierarchical (shared memory inside, MPI across)
    "np4-hier-rounds": (4, None, {**SHM_ROUNDS, "HVDLIKE_NODE_NAMES": "a,a,b,b"}),
    "np4-hier-cma": (4, None, {**CMA, "HVDLIKE_NODE_NAMES": "a,a,b,b",
                               "HVDLIKE_HIERARCHICAL_ALLREDUCE": "1"}),
    "mpich-np2": (2, None, MPI_ONLY), "mpich-np4-shm-rounds": (4, None, SHM_ROUNDS),
    "mpich-np4-cma": (4, None, CMA),
    # one rank, and a set of one rank among four: the reduction is a copy per tensor
    "np1": (1, None, {}), "np4-set2": (4, [2], {}),
    # the MPI transport's per-call limit lowered: the path of messages past 2 GiB
    "np2-pieces": (2, None, MPI_ONLY), "np4-set12-pieces": (4, [1, 2], MPI_ONLY),
}
CASES = cases()


@pytest.fixture(scope="module", params=list(CONFIGS))
def job(request):
    np_, ranks, env = CONFIGS[request.param]
    prefix = mpich_prefix() if request.param.startswith("mpich") else None
    target = "collective_cases:run_in_pieces" if request.param.endswith("pieces") \
        else "collective_cases:run"
    results = run_mpi(np_, target, timeout=240, env=env, mpi_prefix=prefix, ranks=ranks)
    members = ranks or list(range(np_))
    for r in range(np_):
        assert (results[r] is None) == (r not in members), f"rank {r} membership"
    return [results[r] for r in members]


def expected(case: Case, rank: int, n: int):
    xs = [inputs(case, r, n) for r in range(n)]
    base = case.collective.replace("_async", "").replace("_wrapping", "")
    if base == "allreduce":
        return reference.reduce(xs, case.op)
    if base == "allreduce_scaled":
        return reference.reduce(xs, case.op, prescale=0.5, postscale=3.0)
    if base == "allreduce_scaled_random":
        return reference.reduce(xs, case.op, prescale=0.3, postscale=1.7)
    if base == "reducescatter":
        return reference.scatter_block(reference.reduce(xs, case.op), rank, n)
    if base == "allgather":
        return np.concatenate(xs)
    if base == "broadcast":
        return xs[case.root]
    if base == "alltoall":
        splits = [splits_for(r, n) for r in range(n)]
        return (reference.alltoall(xs, splits, rank),
                np.array([splits[s][rank] for s in range(n)], np.int64))
    if base == "grouped_allreduce":
        return [reference.reduce([x[i] for x in xs], case.op) for i in range(len(xs[0]))]
    if base == "grouped_reducescatter":
        return [reference.scatter_block(reference.reduce([x[i] for x in xs], case.op), rank, n)
                for i in range(len(xs[0]))]
    if base == "grouped_allgather":
        return [np.concatenate([x[i] for x in xs]) for i in range(len(xs[0]))]
    raise ValueError(case)


def assert_same(got, want, where: str) -> None:
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
        return
    assert isinstance(got, np.ndarray), f"{where}: got {type(got)}"
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
    np.testing.assert_array_equal(got.astype(np.float64) if got.dtype.kind == "V" else got,
                                  want.astype(np.float64) if want.dtype.kind == "V" else want,
                                  err_msg=where)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_collective_matches_numpy_on_every_rank(job, case):
    n = len(job)
    for rank, results in enumerate(job):
        assert_same(results[case.id], expected(case, rank, n), f"{case.id} rank {rank}")
