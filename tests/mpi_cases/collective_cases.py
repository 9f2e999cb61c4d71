"""Every collective x dtype x op, run on each rank; inputs are reproducible from (case, rank).

``cases(size)`` lists the cases; ``inputs(case, set_rank, set_size)`` makes one rank's input;
``run(ranks)`` runs every case on the given process set (None = global) and returns
{case id: result} on members, None elsewhere. The pytest side recomputes every rank's inputs and
checks the results against NumPy.
"""
import zlib
from typing import Any, Dict, List, NamedTuple, Optional

import numpy as np

import hvdlike as hvd
from hvdlike.base.dtypes import SUPPORTED

OPS = ["Average", "Sum", "Min", "Max", "Product"]
REDUCING = ("allreduce", "allreduce_async", "reducescatter", "reducescatter_async")


class Case(NamedTuple):
    collective: str
    dtype: str
    op: Optional[str] = None
    root: Optional[int] = None  # index into the set's ranks for broadcast

    @property
    def id(self) -> str:
        return "-".join(str(p) for p in self if p is not None)


def cases() -> List[Case]:
    out: List[Case] = []
    for dtype in SUPPORTED:
        d = str(dtype)
        for collective in REDUCING:
            for op in OPS:
                if d == "bool" and op == "Average":
                    continue
                if collective.endswith("_async") and op not in ("Sum", "Average"):
                    continue
                out.append(Case(collective, d, op))
        for collective in ("allgather", "allgather_async", "alltoall", "alltoall_async"):
            out.append(Case(collective, d))
        out.append(Case("broadcast", d, root=0))
        out.append(Case("broadcast", d, root=-1))
        out.append(Case("broadcast_async", d, root=-1))
    for collective in ("grouped_allreduce", "grouped_allreduce_async", "grouped_reducescatter"):
        out += [Case(collective, "mixed", "Sum"), Case(collective, "mixed", "Average")]
    # 16-bit floats beside float32 in one call, on values where rounding to 16 bits shows
    for collective in ("grouped_allreduce", "grouped_reducescatter"):
        out += [Case(collective, "fine", "Sum"), Case(collective, "fine", "Average")]
    out += [Case("grouped_allgather", "mixed"), Case("grouped_allgather_async", "mixed")]
    out += [Case("allreduce_scaled", "float32", "Sum"), Case("allreduce_scaled", "int32", "Sum"),
            Case("allreduce_scaled", "float16", "Average")]
    # factors that 16-bit floats cannot hold, on values that are not integers: Horovod's
    # scaling rules show (see reference.reduce). Not float32: its sums of such values depend
    # on the order MPI adds the ranks' values in (its scaling is covered above)
    out += [Case("allreduce_scaled_random", d, op) for d in ("float16", "bfloat16", "int32",
                                                            "uint16")
            for op in ("Sum", "Average")]
    # sums past the range of 8- and 16-bit integers wrap around, as in NumPy (Open MPI's AVX
    # reduction component saturates them: uint8 200 + 200 = 255)
    out += [Case(c, d, op) for c in ("allreduce_wrapping", "reducescatter_wrapping")
            for d in ("int8", "uint8", "int16", "uint16") for op in ("Sum", "Average")]
    return out


MIXED = ["float32", "float16", "int32", "bool", "float64", "bfloat16", "float32"]
# dtype, and 1/step of the values: each value is exact in its dtype and sums over a few ranks
# are exact in float32, but the float32 values and the 16-bit sums do not fit 16 bits
FINE = [("float16", 64), ("float32", 1024), ("bfloat16", 4), ("float32", 1024)]


def _values(dtype_name: str, shape: tuple, seed: int) -> np.ndarray:
    """Small integers (exact in every float dtype, so sums do not depend on order)."""
    dtype = np.dtype(next(d for d in SUPPORTED if str(d) == dtype_name))
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    low = 0 if dtype.kind == "u" else -3
    return rng.integers(low, 4, shape).astype(dtype)


def _large(dtype_name: str, shape: tuple, seed: int) -> np.ndarray:
    """Integers in the upper half of the dtype's range: sums over two ranks overflow."""
    info = np.iinfo(np.dtype(dtype_name))
    return np.random.default_rng(seed).integers(info.max // 2, info.max, shape, endpoint=True,
                                                dtype=np.dtype(dtype_name))


def _fine(dtype_name: str, step: int, shape: tuple, seed: int) -> np.ndarray:
    dtype = np.dtype(next(d for d in SUPPORTED if str(d) == dtype_name))
    high = 250 if dtype_name == "bfloat16" else 2000
    values = np.random.default_rng(seed).integers(-high, high, shape) / step
    return values.astype(dtype)


def _seed(case: Case, rank: int, extra: str = "") -> int:
    return zlib.crc32(f"{case.id}/{rank}/{extra}".encode())


def rows_for(case: Case, rank: int) -> int:
    """Per-rank first dimension for allgather (rank 0 sends zero rows)."""
    return rank


def splits_for(rank: int, size: int) -> List[int]:
    """Rows rank sends to each destination in alltoall (some zero)."""
    return [(rank + d) % 3 for d in range(size)]


def inputs(case: Case, rank: int, size: int) -> Any:
    base = case.collective.replace("_async", "")
    if base == "allreduce_wrapping":  # enough elements for the vectorised reduction loops
        return _large(case.dtype, (8, 16), _seed(case, rank))
    if base == "reducescatter_wrapping":
        return _large(case.dtype, (2 * size + 1, 16), _seed(case, rank))
    if base in ("allreduce", "allreduce_scaled"):
        return _values(case.dtype, (3, 4), _seed(case, rank))
    if base == "allreduce_scaled_random":
        dtype = np.dtype(next(d for d in SUPPORTED if str(d) == case.dtype))
        low = 0 if dtype.kind == "u" else -100
        return np.random.default_rng(_seed(case, rank)).uniform(low, 100, (5, 7)).astype(dtype)
    if base == "reducescatter":
        return _values(case.dtype, (2 * size + 1, 3), _seed(case, rank))
    if base == "allgather":
        return _values(case.dtype, (rows_for(case, rank), 2), _seed(case, rank))
    if base == "alltoall":
        return _values(case.dtype, (sum(splits_for(rank, size)), 2), _seed(case, rank))
    if base == "broadcast":
        return _values(case.dtype, (2, 3), _seed(case, rank))
    if base in ("grouped_allreduce", "grouped_reducescatter"):
        lead = size + 1 if base == "grouped_reducescatter" else 2
        if case.dtype == "fine":
            return [_fine(d, step, (lead, i + 2), _seed(case, rank, str(i)))
                    for i, (d, step) in enumerate(FINE)]
        mixed = [d for d in MIXED if d != "bool"] if case.op == "Average" else MIXED
        return [_values(d, (lead, i + 1), _seed(case, rank, str(i))) for i, d in enumerate(mixed)]
    if base == "grouped_allgather":
        return [_values(d, (rank + i % 2, 2), _seed(case, rank, str(i)))
                for i, d in enumerate(MIXED)]
    raise ValueError(case)


def run_case(case: Case, process_set: Any) -> Any:
    rank, size = process_set.rank(), process_set.size()
    x = inputs(case, rank, size)
    kw = dict(process_set=process_set, name=case.id)
    op = getattr(hvd, case.op) if case.op else None
    asynchronous = case.collective.endswith("_async")
    base = case.collective.replace("_async", "")
    if base == "allreduce_scaled":
        return hvd.allreduce(x, op=op, prescale_factor=0.5, postscale_factor=3.0, **kw)
    if base == "allreduce_scaled_random":
        return hvd.allreduce(x, op=op, prescale_factor=0.3, postscale_factor=1.7, **kw)
    if base == "broadcast":
        kw["root_rank"] = process_set.ranks[case.root]
        call_args = (x,)
    elif base == "alltoall":
        kw["splits"] = splits_for(rank, size)
        call_args = (x,)
    else:
        call_args = (x,)
        if op is not None:
            kw["op"] = op
    fn = getattr(hvd, case.collective.replace("_wrapping", ""))
    result = fn(*call_args, **kw)
    return result.synchronize() if asynchronous else result


def run(ranks: Optional[List[int]] = None) -> Optional[Dict[str, Any]]:
    process_set = hvd.global_process_set if ranks is None else hvd.add_process_set(ranks)
    if not process_set.included():
        return None
    return {case.id: run_case(case, process_set) for case in cases()}


def run_in_pieces(ranks: Optional[List[int]] = None) -> Optional[Dict[str, Any]]:
    """``run`` with the MPI transport's per-call limit lowered to 5 elements, so that every
    collective takes the path that messages past 2 GiB take (pieces, per-rank broadcasts,
    point-to-point, per-block reductions)."""
    from hvdlike.transport import mpi as transport

    transport.MAX_COUNT = 5
    return run(ranks)
