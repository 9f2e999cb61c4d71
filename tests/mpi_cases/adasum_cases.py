"""Adasum through every path of the engine. Inputs are reproducible from (case, rank) with
``inputs``; the pytest side recomputes every member's inputs and checks the results against
``reference.adasum``, and that every member got the same bits."""
from typing import Any, Dict, List, Optional

import numpy as np

import hvdlike as hvd
from hvdlike.engine import adasum
from hvdlike.base.dtypes import BFLOAT16

CASES = ["float32", "float64", "float16", "bfloat16", "parallel", "orthogonal", "zeros_on_odd",
         "scaled", "async", "grouped", "one_element", "long", "at_whole", "past_whole",
         "grouped_long"]


def inputs(case: str, rank: int) -> List[np.ndarray]:
    """One rank's arrays for ``case`` (a list: several for the grouped case)."""
    rng = np.random.default_rng([CASES.index(case), rank])
    if case in ("float32", "float64", "float16"):
        return [rng.standard_normal(257).astype(case)]
    if case == "bfloat16":
        return [rng.standard_normal(64).astype(BFLOAT16)]
    if case == "parallel":  # the same direction, different lengths: Adasum averages
        return [np.linspace(-1, 1, 100).astype(np.float32) * (rank + 1)]
    if case == "orthogonal":  # disjoint supports: Adasum sums
        x = np.zeros(32, np.float64)
        x[rank * 4:(rank + 1) * 4] = rng.standard_normal(4) + 3
        return [x]
    if case == "zeros_on_odd":
        return [np.zeros(50, np.float32) if rank % 2 else rng.standard_normal(50).astype(
            np.float32)]
    if case in ("scaled", "async"):
        return [rng.standard_normal((5, 7)).astype(np.float32)]
    if case == "one_element":  # most ranks keep empty pieces at np=4
        return [rng.standard_normal(1).astype(np.float32)]
    if case == "long":  # each kept piece spans several of the dot products' chunks
        return [rng.standard_normal(300_001)]
    if case in ("at_whole", "past_whole"):  # the last size that swaps whole vectors, the first
        # that halves them
        return [rng.standard_normal(adasum.WHOLE_BYTES // 8 + (case == "past_whole"))]
    if case == "grouped_long":  # halved, with tensor boundaries inside the pieces
        return [rng.standard_normal(n).astype(np.float32) for n in (20_000, 7, 30_001, 1)]
    # grouped: each tensor on its own (own dot products), 2 dtypes, zero- and one-element
    return [rng.standard_normal(300).astype(np.float32), rng.standard_normal((3, 4)),
            np.zeros(0, np.float32), rng.standard_normal(1).astype(np.float32),
            rng.standard_normal(40).astype(np.float16)]


FACTORS = {"scaled": (0.5, 3.0)}


def _one(case: str, x: List[np.ndarray], ps: Any) -> Any:
    pre, post = FACTORS.get(case, (1.0, 1.0))
    kw = dict(op=hvd.Adasum, name=f"adasum.{case}", process_set=ps)
    if case.startswith("grouped"):
        return hvd.grouped_allreduce(x, **kw)
    if case == "async":
        return hvd.allreduce_async(x[0], **kw).synchronize()
    return hvd.allreduce(x[0], prescale_factor=pre, postscale_factor=post, **kw)


def run(members: Optional[List[int]] = None) -> Optional[Dict[str, Any]]:
    """Every case on the set of ``members`` (None: the world), twice (the second time the
    response cache knows it); returns {case: [result, result again]} on members."""
    ps = hvd.global_process_set if members is None else hvd.add_process_set(members)
    rank = hvd.rank()
    out = None
    if members is None or rank in members:
        out = {case: [_one(case, inputs(case, rank), ps) for _ in range(2)] for case in CASES}
    if members is not None:
        hvd.remove_process_set(ps)
    return out


def joined() -> Dict[str, Any]:
    """Rank 0 joins at once; the others reduce with Adasum (rank 0 counts as zeros) and then
    join."""
    rank = hvd.rank()
    if rank == 0:
        return dict(last=hvd.join())
    result = hvd.allreduce(inputs("float32", rank)[0], op=hvd.Adasum, name="after-join")
    return dict(result=result, last=hvd.join())


def refused(members: Optional[List[int]] = None) -> Dict[str, str]:
    """Adasum where it cannot run: the error each call raised (type: message), then a Sum
    that must still work."""
    ps = hvd.global_process_set if members is None else hvd.add_process_set(members)
    if members is not None and hvd.rank() not in members:
        hvd.remove_process_set(ps)
        return {}
    calls = {
        "allreduce": lambda: hvd.allreduce(np.ones(3), op=hvd.Adasum, process_set=ps),
        "int_grouped": lambda: hvd.grouped_allreduce([np.ones(3), np.ones(2, np.int32)],
                                                     op=hvd.Adasum, process_set=ps),
        "reducescatter": lambda: hvd.reducescatter(np.ones(8), op=hvd.Adasum, process_set=ps),
    }
    out = {}
    for what, call in calls.items():
        try:
            call()
            out[what] = "no error"
        except Exception as e:  # every error is reported to the test
            out[what] = f"{type(e).__name__}: {e}"
    out["sum_after"] = hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=ps).tolist()
    if members is not None:
        hvd.remove_process_set(ps)
    return out


def messages() -> Dict[str, Any]:
    """``hvdlike.engine.adasum.allreduce`` on the world with a sendrecv that counts its messages:
    for a buffer of ``WHOLE_BYTES`` (whole vectors) and one element more (halving); returns
    {size: (messages, result)}."""
    from mpi4py import MPI

    from hvdlike.transport import mpi  # here: importing it sets MPI's environment defaults,
    # which would leak into the pytest process that imports this module for ``inputs``
    out = {}
    for case in ("at_whole", "past_whole"):
        buf = inputs(case, MPI.COMM_WORLD.Get_rank())[0]
        sent = []

        def counted(comm: Any, send: np.ndarray, recv: np.ndarray, peer: int) -> None:
            sent.append(send.nbytes)
            mpi.sendrecv(comm, send, recv, peer)

        adasum.allreduce(MPI.COMM_WORLD, counted, buf, np.empty_like(buf), [(0, buf.size)])
        out[case] = (sent, buf)
    return out
