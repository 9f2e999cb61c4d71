"""Collectives on NumPy arrays (any buffer-protocol array in, new NumPy arrays out).

Every rank of the process set must call the same collectives in the same order with the same
dtype, shape (all but the first dimension for allgather/alltoall), op and root. A mismatch or bad
input raises the same error on every rank (see ``checks``) instead of hanging or returning
garbage. Each collective is written once as a ``_submit_*`` function that returns the MPI
requests in flight and a ``finish`` callback; the blocking form waits at once, the ``*_async``
form returns a Handle.
"""
import functools
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from . import checks, dtypes, fusion, runtime
from .buffers import ResultCache
from .checks import Request
from .handles import Handle
from .process_sets import ProcessSet, global_process_set
from .reduce_ops import ReduceOp, as_reduce_op
from .tf_dispatch import accepts_tf_values

Submitted = Tuple[List[Any], Callable[[], Any]]
InPlacePass = Callable[[np.ndarray], None]
_pool = fusion.BufferPool()
_results = ResultCache()


# ----------------------------------------------------------------------------- helpers

def _array(x: Any) -> np.ndarray:
    a = x if type(x) is np.ndarray else np.asarray(x)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _setup(process_set: ProcessSet, what: str) -> Tuple[runtime._State, Any]:
    st = runtime.state(what)
    comm = process_set._comm
    if comm is None:
        if process_set.process_set_id is None:
            raise ValueError(f"{what}: {process_set} is not registered; call "
                             "hvdlike.add_process_set(...) on every rank first")
        raise ValueError(f"{what}: rank {st.rank} is not a member of {process_set}; only its "
                         "member ranks may call collectives on it")
    return st, comm


def _negotiate(st: runtime._State, process_set: ProcessSet, comm: Any, request: Request,
               error: Optional[checks.LocalError]) -> None:
    if st.settings.consistency_check:
        checks.negotiate(st.transport, comm, process_set._control, request, error)
    elif error is not None:
        checks.resolve([(request, error)])  # raises the local error


def _dtype_error(a: np.ndarray) -> Optional[checks.LocalError]:
    msg = dtypes.dtype_error(a.dtype)
    return ("TypeError", msg) if msg else None


def _reduce_error(a: np.ndarray, op: ReduceOp) -> Optional[checks.LocalError]:
    return _reduce_error_for(a.dtype, op)


@functools.lru_cache(maxsize=256)
def _reduce_error_for(dtype: np.dtype, op: ReduceOp) -> Optional[checks.LocalError]:
    msg = dtypes.dtype_error(dtype) or dtypes.reduce_op_error(dtype, op)
    return ("TypeError", msg) if msg else None


def _kind(name: str, blocking: bool) -> str:
    return name if blocking else name + "_async"


def _work_input(a: np.ndarray, prescale: float) -> Tuple[Optional[np.ndarray], np.ndarray]:
    """(send buffer or None for in place, receive buffer) for reducing ``a``."""
    work = dtypes.reduce_dtype(a.dtype)
    if a.dtype.kind == "b":
        return a.view(np.uint8), _results.empty(a.shape, work)
    if work == a.dtype and prescale == 1.0:
        return a, _results.empty(a.shape, work)
    buf = _results.empty(a.shape, work)
    fusion.pack([a], buf.reshape(-1), prescale)
    return None, buf


def _mpi_op(dtype: np.dtype, op: ReduceOp) -> ReduceOp:
    return dtypes.bool_op(op) if dtype.kind == "b" else op


def _scale_in_place(buf: np.ndarray, op: ReduceOp, postscale: float, n: int) -> None:
    """Apply Average's 1/n and the postscale factor to a reduced buffer, in its dtype."""
    if buf.dtype.kind == "f":
        scale = postscale / n if op == ReduceOp.AVERAGE else postscale
        if scale != 1.0:
            buf *= scale
    elif buf.dtype.kind in "iu":
        if op == ReduceOp.AVERAGE and postscale == 1.0 and n > 1:
            negative_inexact = (buf % n != 0) & (buf < 0)
            buf //= n
            buf += negative_inexact  # floor -> truncation toward zero
        elif op == ReduceOp.AVERAGE or postscale != 1.0:
            scale = postscale / n if op == ReduceOp.AVERAGE else postscale
            buf[...] = buf * scale  # float64 product, truncated toward zero on assignment


def _scaler(op: ReduceOp, postscale: float, n: int) -> Optional[InPlacePass]:
    """The in-place pass that Average and ``postscale`` need after the reduction, or None."""
    if op != ReduceOp.AVERAGE and postscale == 1.0:
        return None
    return functools.partial(_scale_in_place, op=op, postscale=postscale, n=n)


def _finish_reduced(buf: np.ndarray, dtype: np.dtype, scale: Optional[InPlacePass]) -> np.ndarray:
    if scale is not None:
        scale(buf)
    if dtype.kind == "b":
        return buf.view(np.bool_)
    if buf.dtype == dtype:
        return buf
    out = _results.empty(buf.shape, dtype)
    np.copyto(out, buf, casting="unsafe")
    return out


def _handle(st: runtime._State, submitted: Submitted) -> Handle:
    requests, finish = submitted
    return Handle(st.mpi, requests, finish)


def _run(submitted: Submitted) -> Any:
    requests, finish = submitted
    if requests:
        runtime.state().mpi.Request.Waitall(requests)
    return finish()


def _pending(request: Any) -> List[Any]:
    return [] if request is None else [request]


# ----------------------------------------------------------------------------- allreduce

def _submit_allreduce(x: Any, op: Any, prescale_factor: float, postscale_factor: float,
                      name: Optional[str], process_set: ProcessSet, blocking: bool) -> Submitted:
    st, comm = _setup(process_set, "hvdlike.allreduce()")
    a = _array(x)
    op = as_reduce_op(op)
    request = Request(_kind("allreduce", blocking), name, a.dtype, a.shape, int(op), None,
                      (float(prescale_factor), float(postscale_factor)))
    _negotiate(st, process_set, comm, request, _reduce_error(a, op))
    return _allreduce_data(st, process_set, a, op, request.scale, blocking)


def _reduce(st: runtime._State, process_set: ProcessSet, send: Optional[np.ndarray],
            recv: np.ndarray, op: ReduceOp, blocking: bool,
            scale: Optional[InPlacePass]) -> Tuple[List[Any], Optional[InPlacePass]]:
    """All-reduce on the fastest transport: shared memory for a blocking reduction of at least
    HVDLIKE_SHM_THRESHOLD bytes among ranks of one node, MPI otherwise. Every rank takes the
    same branch: they reduce the same bytes. Returns (the MPI requests in flight, the in-place
    pass still to run on the result): shared memory applies ``scale`` to each piece of the
    result while it is still in cache, so nothing is left to run."""
    shm = process_set._shm
    if (blocking and shm is not None and recv.nbytes >= st.settings.shm_threshold
            and shm.reserve(recv.nbytes)):
        shm.allreduce(send, recv, op, scale)
        return [], None
    return _pending(st.transport.allreduce(process_set._comm, send, recv, op, blocking)), scale


def _allreduce_data(st: runtime._State, process_set: ProcessSet, a: np.ndarray, op: ReduceOp,
                    scale: Tuple[float, float], blocking: bool) -> Submitted:
    send, recv = _work_input(a, scale[0])
    requests, rest = _reduce(st, process_set, send, recv, _mpi_op(a.dtype, op), blocking,
                             _scaler(op, scale[1], process_set.size()))
    return requests, lambda: _finish_reduced(recv, a.dtype, rest)


@accepts_tf_values
def allreduce(x: Any, op: Any = ReduceOp.AVERAGE, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Reduce ``x`` over the ranks of ``process_set``.

    Every rank passes an array of the same shape and dtype and the same op and factors; every
    rank gets back a new array: op over all ranks of (x * prescale_factor), times
    postscale_factor. Average divides the sum by the set size (integers: truncated toward zero,
    dtype kept). float16/bfloat16 are reduced in float32. bool: Sum/Max = or, Min/Product = and.
    """
    return _run(_submit_allreduce(x, op, prescale_factor, postscale_factor, name, process_set, True))


def allreduce_async(x: Any, op: Any = ReduceOp.AVERAGE, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``allreduce``; ``handle.synchronize()`` returns its result."""
    submitted = _submit_allreduce(x, op, prescale_factor, postscale_factor, name, process_set,
                                  False)
    return _handle(runtime.state(), submitted)


def _submit_grouped_allreduce(xs: Sequence[Any], op: Any, prescale_factor: float,
                              postscale_factor: float, name: Optional[str],
                              process_set: ProcessSet, blocking: bool) -> Submitted:
    st, comm = _setup(process_set, "hvdlike.grouped_allreduce()")
    arrays = [_array(x) for x in xs]
    op = as_reduce_op(op)
    request = Request(_kind("grouped_allreduce", blocking), name,
                      tuple(a.dtype for a in arrays), tuple(a.shape for a in arrays),
                      int(op), None, (float(prescale_factor), float(postscale_factor)))
    error = next((e for e in (_reduce_error(a, op) for a in arrays) if e), None)
    _negotiate(st, process_set, comm, request, error)
    return _grouped_allreduce_data(st, process_set, arrays, op, request.scale, blocking)


def _grouped_allreduce_data(st: runtime._State, process_set: ProcessSet, arrays: List[np.ndarray],
                            op: ReduceOp, scale: Tuple[float, float], blocking: bool) -> Submitted:
    work = [dtypes.reduce_dtype(a.dtype) for a in arrays]
    keys = [a.dtype if a.dtype.kind == "b" else w for a, w in zip(arrays, work)]  # bool: own op
    buckets = fusion.plan_buckets(keys, [a.size * w.itemsize for a, w in zip(arrays, work)],
                                  st.settings.fusion_threshold)
    requests: List[Any] = []
    finishers: List[Callable[[], None]] = []
    results: List[Any] = [None] * len(arrays)
    n = process_set.size()
    for bucket in buckets:
        if len(bucket) == 1:
            i = bucket[0]
            reqs, finish = _allreduce_data(st, process_set, arrays[i], op, scale, blocking)
            requests += reqs
            finishers.append(lambda i=i, finish=finish: results.__setitem__(i, finish()))
            continue
        members = [arrays[i] for i in bucket]
        size = sum(a.size for a in members)
        base = _pool.acquire(work[bucket[0]], size)
        buf = base[:size]
        fusion.pack(members, buf, scale[0])
        dtype = members[0].dtype
        reqs, rest = _reduce(st, process_set, None, buf, _mpi_op(dtype, op), blocking,
                             _scaler(op, scale[1], n))
        requests += reqs

        def finish_bucket(bucket=bucket, members=members, base=base, buf=buf, rest=rest) -> None:
            if rest is not None:
                rest(buf)
            out_dtypes = [np.dtype(np.uint8) if a.dtype.kind == "b" else a.dtype for a in members]
            unpacked = fusion.unpack(buf, [a.shape for a in members], out_dtypes, _results.empty)
            for i, a, r in zip(bucket, members, unpacked):
                results[i] = r.view(np.bool_) if a.dtype.kind == "b" else r
            _pool.release(base)

        finishers.append(finish_bucket)

    def finish() -> List[np.ndarray]:
        for f in finishers:
            f()
        return results

    return requests, finish


@accepts_tf_values
def grouped_allreduce(xs: Sequence[Any], op: Any = ReduceOp.AVERAGE, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[np.ndarray]:
    """``allreduce`` of a list of arrays, fused: arrays of one dtype share a fusion buffer of up
    to HVDLIKE_FUSION_THRESHOLD bytes, reduced with one MPI call. Returns a list of new arrays."""
    return _run(_submit_grouped_allreduce(xs, op, prescale_factor, postscale_factor, name,
                                          process_set, True))


def grouped_allreduce_async(xs: Sequence[Any], op: Any = ReduceOp.AVERAGE,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``grouped_allreduce``; ``handle.synchronize()`` returns the list of results."""
    return _handle(runtime.state(), _submit_grouped_allreduce(
        xs, op, prescale_factor, postscale_factor, name, process_set, False))


# ----------------------------------------------------------------------------- allgather

def _rows(a: np.ndarray) -> np.ndarray:
    """``a`` with a first dimension to gather along (a scalar becomes one row)."""
    return a.reshape(1) if a.ndim == 0 else a


def _row_bytes(a: np.ndarray) -> int:
    return a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))


def _submit_allgather(x: Any, name: Optional[str], process_set: ProcessSet,
                      blocking: bool) -> Submitted:
    st, comm = _setup(process_set, "hvdlike.allgather()")
    a = _rows(_array(x))
    request = Request(_kind("allgather", blocking), name, a.dtype, a.shape[1:])
    _negotiate(st, process_set, comm, request, _dtype_error(a))
    counts = st.transport.allgather_ints(comm, np.array([a.shape[0]], np.int64))[:, 0]
    out = _results.empty((int(counts.sum()),) + a.shape[1:], a.dtype)
    pending = st.transport.allgatherv(comm, st.transport.as_bytes(a),
                                      st.transport.as_bytes(out), counts * _row_bytes(a), blocking)
    return _pending(pending), lambda: out


@accepts_tf_values
def allgather(x: Any, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Concatenate every rank's ``x`` along the first dimension, in rank order.

    Ranks pass the same dtype and the same shape except the first dimension, which may differ
    (a scalar counts as one row). Every rank gets the whole concatenation as a new array.
    """
    return _run(_submit_allgather(x, name, process_set, True))


def allgather_async(x: Any, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``allgather``; ``handle.synchronize()`` returns its result."""
    return _handle(runtime.state(), _submit_allgather(x, name, process_set, False))


def _submit_grouped_allgather(xs: Sequence[Any], name: Optional[str], process_set: ProcessSet,
                              blocking: bool) -> Submitted:
    st, comm = _setup(process_set, "hvdlike.grouped_allgather()")
    arrays = [_rows(_array(x)) for x in xs]
    request = Request(_kind("grouped_allgather", blocking), name,
                      tuple(a.dtype for a in arrays), tuple(a.shape[1:] for a in arrays))
    _negotiate(st, process_set, comm, request,
               next((e for e in map(_dtype_error, arrays) if e), None))
    rows = st.transport.allgather_ints(comm, np.array([a.shape[0] for a in arrays], np.int64))
    row_bytes = np.array([_row_bytes(a) for a in arrays], np.int64)
    seg_bytes = rows * row_bytes  # [rank, tensor]
    u8 = np.dtype(np.uint8)
    send_size, recv_size = int(seg_bytes[comm.Get_rank()].sum()), int(seg_bytes.sum())
    send_base, recv_base = _pool.acquire(u8, send_size), _pool.acquire(u8, recv_size)
    send, recv = send_base[:send_size], recv_base[:recv_size]
    if arrays:
        np.concatenate([st.transport.as_bytes(a) for a in arrays], out=send)
    pending = st.transport.allgatherv(comm, send, recv, seg_bytes.sum(axis=1), blocking)

    def finish() -> List[np.ndarray]:
        outs = [_results.empty((int(rows[:, i].sum()),) + a.shape[1:], a.dtype)
                for i, a in enumerate(arrays)]
        written = [0] * len(arrays)
        offset = 0
        for r in range(rows.shape[0]):
            for i, out in enumerate(outs):
                n = int(seg_bytes[r, i])
                st.transport.as_bytes(out)[written[i]:written[i] + n] = recv[offset:offset + n]
                written[i] += n
                offset += n
        _pool.release(send_base)
        _pool.release(recv_base)
        return outs

    return _pending(pending), finish


@accepts_tf_values
def grouped_allgather(xs: Sequence[Any], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[np.ndarray]:
    """``allgather`` of a list of arrays in one MPI call. Returns a list of new arrays."""
    return _run(_submit_grouped_allgather(xs, name, process_set, True))


def grouped_allgather_async(xs: Sequence[Any], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``grouped_allgather``; ``handle.synchronize()`` returns the list of results."""
    return _handle(runtime.state(), _submit_grouped_allgather(xs, name, process_set, False))


# ----------------------------------------------------------------------------- broadcast

def _root_error(root_rank: Any, process_set: ProcessSet) -> Optional[checks.LocalError]:
    if not isinstance(root_rank, (int, np.integer)) or isinstance(root_rank, bool):
        return ("TypeError", f"root_rank must be an int world rank, got {root_rank!r}")
    if root_rank not in process_set.ranks:
        return ("ValueError", f"root_rank {root_rank} is not a rank of {process_set}; pass one "
                              f"of {process_set.ranks}")
    return None


def _submit_broadcast(x: Any, root_rank: int, name: Optional[str], process_set: ProcessSet,
                      blocking: bool) -> Submitted:
    st, comm = _setup(process_set, "hvdlike.broadcast()")
    a = _array(x)
    request = Request(_kind("broadcast", blocking), name, a.dtype, a.shape, None,
                      root_rank if isinstance(root_rank, (int, np.integer)) else repr(root_rank))
    _negotiate(st, process_set, comm, request,
               _root_error(root_rank, process_set) or _dtype_error(a))
    root = process_set.ranks.index(int(root_rank))
    out = _results.empty(a.shape, a.dtype)
    if root == comm.Get_rank():
        np.copyto(out, a)
    pending = st.transport.bcast(comm, st.transport.as_bytes(out), root, blocking)
    return _pending(pending), lambda: out


@accepts_tf_values
def broadcast(x: Any, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Every rank gets a new array equal to ``x`` on ``root_rank`` (a world rank in the set).

    All ranks pass arrays of the same shape and dtype (non-root contents are ignored)."""
    return _run(_submit_broadcast(x, root_rank, name, process_set, True))


def broadcast_async(x: Any, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``broadcast``; ``handle.synchronize()`` returns its result."""
    return _handle(runtime.state(), _submit_broadcast(x, root_rank, name, process_set, False))


# ----------------------------------------------------------------------------- alltoall

def _splits_or_error(a: np.ndarray, splits: Any, n: int) -> Tuple[np.ndarray, Optional[checks.LocalError]]:
    if a.ndim == 0:
        return np.zeros(n, np.int64), ("ValueError", "alltoall needs an array with at least one "
                                                     "dimension to split, got a scalar")
    if splits is None:
        if a.shape[0] % n:
            return np.zeros(n, np.int64), (
                "ValueError", f"alltoall without splits needs a first dimension divisible by "
                              f"the {n} ranks, got {a.shape[0]}; pass splits=[rows per rank]")
        return np.full(n, a.shape[0] // n, np.int64), None
    s = np.asarray(splits)
    if s.shape != (n,) or s.dtype.kind not in "iu" or (s < 0).any() or s.sum() != a.shape[0]:
        return np.zeros(n, np.int64), (
            "ValueError", f"alltoall splits must be {n} non-negative integers (one per rank) "
                          f"summing to the first dimension {a.shape[0]}, got {s.tolist()}")
    return s.astype(np.int64), None


def _submit_alltoall(x: Any, splits: Any, name: Optional[str], process_set: ProcessSet,
                     blocking: bool) -> Submitted:
    st, comm = _setup(process_set, "hvdlike.alltoall()")
    a = _array(x)
    send_splits, error = _splits_or_error(a, splits, comm.Get_size())
    request = Request(_kind("alltoall", blocking), name, a.dtype, a.shape[1:])
    _negotiate(st, process_set, comm, request, error or _dtype_error(a))
    recv_splits = st.transport.alltoall_ints(comm, send_splits)
    out = _results.empty((int(recv_splits.sum()),) + a.shape[1:], a.dtype)
    row = _row_bytes(a)
    pending = st.transport.alltoallv(comm, st.transport.as_bytes(a), send_splits * row,
                                     st.transport.as_bytes(out), recv_splits * row, blocking)
    return _pending(pending), lambda: (out, recv_splits)


@accepts_tf_values
def alltoall(x: Any, splits: Any = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set) -> Tuple[np.ndarray, np.ndarray]:
    """Send ``splits[r]`` consecutive rows of ``x`` to rank r (equal parts when splits is None).

    Returns (the rows received from every rank, concatenated in rank order; the int64 array of
    how many rows came from each rank). Ranks pass the same dtype and shape after dimension 0.
    """
    return _run(_submit_alltoall(x, splits, name, process_set, True))


def alltoall_async(x: Any, splits: Any = None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``alltoall``; ``handle.synchronize()`` returns (received, received_splits)."""
    return _handle(runtime.state(), _submit_alltoall(x, splits, name, process_set, False))


# ----------------------------------------------------------------------------- reducescatter

def _scatter_rows(d0: int, n: int) -> np.ndarray:
    """Rows each rank receives: as even as possible, the first d0 % n ranks get one more."""
    return np.array([d0 // n + (r < d0 % n) for r in range(n)], np.int64)


def _scatter_error(a: np.ndarray, op: ReduceOp) -> Optional[checks.LocalError]:
    if a.ndim == 0:
        return ("ValueError", "reducescatter needs an array with at least one dimension, got a "
                              "scalar")
    return _reduce_error(a, op)


def _submit_reducescatter(x: Any, op: Any, name: Optional[str], process_set: ProcessSet,
                          prescale_factor: float, postscale_factor: float,
                          blocking: bool) -> Submitted:
    return _submit_grouped_reducescatter([x], op, name, process_set, prescale_factor,
                                         postscale_factor, blocking, single=True)


@accepts_tf_values
def reducescatter(x: Any, op: Any = ReduceOp.AVERAGE, name: Optional[str] = None,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce ``x`` over the ranks and give each rank its block of rows.

    Ranks pass the same shape and dtype; the first dimension is split in rank order, as evenly
    as possible (the first dim0 % size ranks get one extra row). Op semantics as in allreduce.
    """
    return _run(_submit_reducescatter(x, op, name, process_set, prescale_factor,
                                      postscale_factor, True))


def reducescatter_async(x: Any, op: Any = ReduceOp.AVERAGE, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start ``reducescatter``; ``handle.synchronize()`` returns its result."""
    return _handle(runtime.state(), _submit_reducescatter(
        x, op, name, process_set, prescale_factor, postscale_factor, False))


def _submit_grouped_reducescatter(xs: Sequence[Any], op: Any, name: Optional[str],
                                  process_set: ProcessSet, prescale_factor: float,
                                  postscale_factor: float, blocking: bool,
                                  single: bool = False) -> Submitted:
    kind = "reducescatter" if single else "grouped_reducescatter"
    st, comm = _setup(process_set, f"hvdlike.{kind}()")
    arrays = [_array(x) for x in xs]
    op = as_reduce_op(op)
    scale = (float(prescale_factor), float(postscale_factor))
    dts = tuple(a.dtype for a in arrays)
    shapes = tuple(a.shape for a in arrays)
    request = Request(_kind(kind, blocking), name, dts[0] if single else dts,
                      shapes[0] if single else shapes, int(op), None, scale)
    _negotiate(st, process_set, comm, request,
               next((e for e in (_scatter_error(a, op) for a in arrays) if e), None))
    n, me = comm.Get_size(), comm.Get_rank()
    work = [dtypes.reduce_dtype(a.dtype) for a in arrays]
    keys = [a.dtype if a.dtype.kind == "b" else w for a, w in zip(arrays, work)]
    threshold = st.settings.fusion_threshold
    buckets = fusion.plan_buckets(keys, [a.size * w.itemsize for a, w in zip(arrays, work)],
                                  threshold)
    requests: List[Any] = []
    finishers: List[Callable[[], None]] = []
    results: List[Any] = [None] * len(arrays)
    for bucket in buckets:
        members = [arrays[i] for i in bucket]
        rows = [_scatter_rows(a.shape[0], n) for a in members]
        row_elems = [int(np.prod(a.shape[1:], dtype=np.int64)) for a in members]
        # Rank-major layout: rank r's rows of every member, then rank r+1's, ...
        counts = sum(rw * re for rw, re in zip(rows, row_elems))
        wdtype = work[bucket[0]]
        send_base = _pool.acquire(wdtype, int(sum(a.size for a in members)))
        send = send_base[:int(sum(a.size for a in members))]
        offset = 0
        starts = [np.concatenate(([0], np.cumsum(rw))) for rw in rows]
        for r in range(n):
            for a, st_rows, re in zip(members, starts, row_elems):
                block = a[st_rows[r]:st_rows[r + 1]]
                fusion.pack([block], send[offset:offset + block.size], scale[0])
                offset += block.size
        recv_base = _pool.acquire(wdtype, int(counts[me]))
        recv = recv_base[:int(counts[me])]
        requests += _pending(st.transport.reduce_scatter(
            comm, send, recv, counts, _mpi_op(members[0].dtype, op), blocking))

        def finish_bucket(bucket=bucket, members=members, rows=rows, recv=recv,
                          bases=(send_base, recv_base)) -> None:
            out_dtypes = [np.dtype(np.uint8) if a.dtype.kind == "b" else a.dtype for a in members]
            _scale_in_place(recv, op, scale[1], n)
            shapes = [(int(rw[me]),) + a.shape[1:] for a, rw in zip(members, rows)]
            for i, a, r in zip(bucket, members,
                               fusion.unpack(recv, shapes, out_dtypes, _results.empty)):
                results[i] = r.view(np.bool_) if a.dtype.kind == "b" else r
            for base in bases:
                _pool.release(base)

        finishers.append(finish_bucket)

    def finish() -> Any:
        for f in finishers:
            f()
        return results[0] if single else results

    return requests, finish


@accepts_tf_values
def grouped_reducescatter(xs: Sequence[Any], op: Any = ReduceOp.AVERAGE,
                          name: Optional[str] = None,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[np.ndarray]:
    """``reducescatter`` of a list of arrays, fused per dtype like grouped_allreduce."""
    return _run(_submit_grouped_reducescatter(xs, op, name, process_set, prescale_factor,
                                              postscale_factor, True))


def grouped_reducescatter_async(xs: Sequence[Any], op: Any = ReduceOp.AVERAGE,
                                name: Optional[str] = None,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Start ``grouped_reducescatter``; ``handle.synchronize()`` returns the list of results."""
    return _handle(runtime.state(), _submit_grouped_reducescatter(
        xs, op, name, process_set, prescale_factor, postscale_factor, False))


# ----------------------------------------------------------------------------- control

def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank of ``process_set`` has called barrier."""
    st, comm = _setup(process_set, "hvdlike.barrier()")
    _negotiate(st, process_set, comm, Request("barrier", None, None, None), None)
    st.transport.barrier(comm, True)


def join() -> int:
    """Declare that this rank has no more data (uneven inputs). Global process set only.

    Until every rank has joined, this rank takes part in the other ranks' allreduce and
    grouped_allreduce calls (Sum or Average only) with zeros; Average still divides by the full
    size. Returns, on every rank, the rank that joined last (the highest if several joined in
    the same round). Needs the consistency check (HVDLIKE_CONSISTENCY_CHECK=1, the default).
    """
    process_set = global_process_set
    st, comm = _setup(process_set, "hvdlike.join()")
    if not st.settings.consistency_check:
        raise ValueError("hvdlike.join() needs the consistency check: unset "
                         "HVDLIKE_CONSISTENCY_CHECK or set it to 1")
    first = True
    while True:
        done, last, request = checks.join_round(st.transport, comm, process_set._control,
                                                st.rank, first)
        first = False
        if done:
            return last
        assert request is not None
        _serve_with_zeros(st, process_set, request)


def _serve_with_zeros(st: runtime._State, process_set: ProcessSet, request: Request) -> None:
    """Take a joined rank's part in another rank's allreduce: contribute zeros."""
    blocking = not request.kind.endswith("_async")
    op = ReduceOp(request.op)
    if request.kind.startswith("grouped_"):
        zeros = [np.zeros(s, d) for s, d in zip(request.shape, request.dtype)]
        _run(_grouped_allreduce_data(st, process_set, zeros, op, request.scale, blocking))
    else:
        zeros_one = np.zeros(request.shape, request.dtype)
        _run(_allreduce_data(st, process_set, zeros_one, op, request.scale, blocking))


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Every rank gets (an unpickled copy of) the root's picklable ``obj``."""
    st, comm = _setup(process_set, "hvdlike.broadcast_object()")
    request = Request("broadcast_object", name, None, None, None,
                      root_rank if isinstance(root_rank, (int, np.integer)) else repr(root_rank))
    _negotiate(st, process_set, comm, request, _root_error(root_rank, process_set))
    return comm.bcast(obj, root=process_set.ranks.index(int(root_rank)))


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Every rank gets the list of every rank's picklable ``obj``, in rank order."""
    st, comm = _setup(process_set, "hvdlike.allgather_object()")
    _negotiate(st, process_set, comm, Request("allgather_object", name, None, None), None)
    return comm.allgather(obj)
