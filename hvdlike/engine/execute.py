"""How a ready response moves its data, run by the engine in the same order on every rank.

All-reduces that became ready together are fused by bytes (``HVDLIKE_FUSION_THRESHOLD``) per
(process set, op, factors, dtype): one dtype per bucket, since 16-bit floats are reduced in
float32 but rounded to their own dtype before the postscale. A bucket goes through the on-node
shared-memory transport straight from the tensors' memory into the results when its set lives
on one node and it has at least ``HVDLIKE_SHM_THRESHOLD`` bytes (from ``HVDLIKE_CMA_THRESHOLD``
bytes single-copy, through cross-memory attach, where the kernel allows); for the world on
several nodes, the same size of bucket goes hierarchically (shared memory inside each node, MPI
across them) with HVDLIKE_HIERARCHICAL_ALLREDUCE=1, or where it measured faster with ``auto``.
The set's ``Group`` (``transport/group.py``) makes that choice. Otherwise a bucket goes through
``MPI_Allreduce`` (one tensor: from its memory into the result; several: packed into a reused
fusion buffer); a set of one rank copies each
tensor into its result. An Adasum bucket is packed and combined by ``engine.adasum`` over
MPI point to point. The other collectives run one response at a time.
"""
import functools
import math
import pickle
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..base import dtypes
from ..base.reduce_ops import ReduceOp
from ..transport.interface import HostAllreduce, InPlacePass
from . import adasum, fusion
from .buffers import ResultCache
from .checks import Request

_pool = fusion.BufferPool()
results = ResultCache()
ALLREDUCES = ("allreduce", "grouped_allreduce")


class Work(NamedTuple):
    """One response as this rank runs it: its inputs (zeros on a rank that has joined) and
    where its result goes."""

    request: Request
    inputs: Any  # list of arrays, or the object / splits the collective needs
    process_set: Any
    done: Callable[[Any], None]  # receives the result
    # GPU work staged through host memory: the CUDA stream its inputs were copied on (and its
    # results go back on); None otherwise
    inputs_stream: Any = None


# ----------------------------------------------------------------------------- scaling

def _scale_in_place(buf: np.ndarray, op: ReduceOp, postscale: float, n: int,
                    half: Optional[np.dtype] = None) -> None:
    """Apply Average's 1/n and the postscale factor to a reduced buffer, in its dtype.
    ``half``: the 16-bit float dtype a float32 ``buf`` stands for; the sum is rounded to it
    first, as Horovod reduces such tensors in their own dtype."""
    if buf.dtype.kind == "f":
        scale = postscale / n if op == ReduceOp.AVERAGE else postscale
        if scale != 1.0:
            if half is not None:
                buf[...] = buf.astype(half)
            if buf.dtype.itemsize == 2:  # float16 reduced natively (GPU): scaled in float32
                buf[...] = (buf.astype(np.float32) * np.float32(scale)).astype(buf.dtype)
            else:
                buf *= scale
    elif buf.dtype.kind in "iu":
        if op == ReduceOp.AVERAGE and postscale == 1.0 and n > 1:
            negative_inexact = (buf % n != 0) & (buf < 0)
            buf //= n
            buf += negative_inexact  # floor -> truncation toward zero
        elif op == ReduceOp.AVERAGE or postscale != 1.0:
            scale = postscale / n if op == ReduceOp.AVERAGE else postscale
            buf[...] = buf * scale  # float64 product, truncated toward zero on assignment


def _scaler(op: ReduceOp, postscale: float, n: int,
            half: Optional[np.dtype] = None) -> Optional[InPlacePass]:
    if op != ReduceOp.AVERAGE and postscale == 1.0:
        return None
    return functools.partial(_scale_in_place, op=op, postscale=postscale, n=n, half=half)


def _half(dtype: np.dtype, work: np.dtype) -> Optional[np.dtype]:
    """``dtype`` when it is a 16-bit float reduced in a wider ``work`` dtype, else None."""
    return dtype if dtype in dtypes.HALF and work != dtype else None


def _wire_op(dtype: np.dtype, op: ReduceOp) -> ReduceOp:
    return dtypes.bool_op(op) if dtype.kind == "b" else op


# ----------------------------------------------------------------------------- all-reduce

def fusion_key(work: Work, i: int) -> Tuple[Any, ...]:
    r = work.request
    return (id(work.process_set), r.op, r.scale, work.inputs[i].dtype)


Phases = Optional[List[Tuple[str, float, float]]]  # (name, start, end) for the timeline


Empty = Callable[[tuple, np.dtype], np.ndarray]


def run_allreduces(st: Any, works: Sequence[Work],
                   trace: Optional[Callable[[List[int], Phases, Dict[str, Any]], None]] = None,
                   empty: Empty = results.empty) -> None:
    """Run every all-reduce response of a round, fused into buckets by bytes. ``trace``
    (the timeline) gets each bucket's members (indices into ``works``), phases and sizes;
    ``empty(shape, dtype)`` makes the result arrays."""
    if len(works) == 1 and len(works[0].inputs) == 1 and trace is None:  # latency path
        work = works[0]
        work.done(allreduce_now(st, work.request, work.inputs, work.process_set, empty))
        return
    tensors: List[Tuple[int, int]] = [(w, i) for w, work in enumerate(works)
                                      for i in range(len(work.inputs))]
    if len(works) == 1 and works[0].request.kind == "grouped_allreduce":  # same plan each step
        buckets, sizes = _grouped_plan(works[0].request, st.settings.fusion_threshold)
    else:
        keys = [fusion_key(works[w], i) for w, i in tensors]
        sizes = [works[w].inputs[i].size * dtypes.reduce_dtype(works[w].inputs[i].dtype).itemsize
                 for w, i in tensors]
        buckets = fusion.plan_buckets(keys, sizes, st.settings.fusion_threshold)
    outs: List[List[Any]] = [[None] * len(work.inputs) for work in works]
    for number, bucket in enumerate(buckets):
        members = [tensors[b] for b in bucket]
        phases: Phases = [] if trace is not None else None
        first = works[members[0][0]]
        reduced = _allreduce_bucket(st, first.request, first.process_set,
                                    [works[w].inputs[i] for w, i in members], phases, empty)
        for (w, i), r in zip(members, reduced):
            outs[w][i] = r
        if trace is not None:
            carried = sum(_tensors_in(works[w], i) for w, i in members)
            trace(sorted({w for w, _ in members}), phases,
                  {"bucket": number, "tensors": carried,
                   "bytes": int(sum(sizes[b] for b in bucket))})
    for work, out in zip(works, outs):
        work.done(out if work.request.kind == "grouped_allreduce" else out[0])


def _tensors_in(work: Work, i: int) -> int:
    """How many tensors input ``i`` of ``work`` carries (packed ones: ``Request.parts``)."""
    parts = work.request.parts
    mine = None if parts is None else parts[i]
    return 1 if mine is None else len(mine)


@functools.lru_cache(maxsize=256)
def _grouped_plan(request: Request, threshold: int) -> Tuple[List[List[int]], List[int]]:
    """The buckets and byte sizes of one grouped all-reduce request's tensors fused on their
    own, as ``fusion_key`` and ``plan_buckets`` make them (computed once per request)."""
    given = [np.dtype(d) for d in request.dtype]
    sizes = [math.prod(shape) * dtypes.reduce_dtype(d).itemsize
             for shape, d in zip(request.shape, given)]
    return fusion.plan_buckets(given, sizes, threshold), sizes


def allreduce_now(st: Any, request: Request, inputs: List[np.ndarray], process_set: Any,
                  empty: Empty = results.empty) -> Any:
    """The result of one all-reduce response (allreduce or grouped_allreduce) run alone."""
    if len(inputs) == 1:
        (out,) = _allreduce_bucket(st, request, process_set, inputs, None, empty)
        return out if request.kind == "allreduce" else [out]
    box: List[Any] = []
    run_allreduces(st, [Work(request, inputs, process_set, box.append)], None, empty)
    return box[0]


class _Clock:
    """Collects a bucket's phases for the timeline (does nothing when there is none)."""

    def __init__(self, phases: Phases) -> None:
        self.phases = phases
        self.last = time.perf_counter() if phases is not None else 0.0

    def done(self, name: str) -> None:
        if self.phases is not None:
            now = time.perf_counter()
            self.phases.append((name, self.last, now))
            self.last = now


class _Plan(NamedTuple):
    """How a bucket of one input dtype, op and factors is reduced."""

    work: np.dtype  # the dtype the reduction runs in
    wire: ReduceOp  # the op on the wire (bool: its logical form on uint8)
    as_is: bool  # reduce straight from the inputs (no cast or prescale first)
    scale: Optional[InPlacePass]  # Average's 1/n and the postscale, applied to the result


@functools.lru_cache(maxsize=1024)
def _plan(dtype: np.dtype, op_value: int, scale: Tuple[float, float], n: int) -> _Plan:
    op = ReduceOp(op_value)
    prescale, postscale = scale
    work = dtypes.reduce_dtype(dtype)
    return _Plan(work, _wire_op(dtype, op),
                 dtype.kind == "b" or (work == dtype and prescale == 1.0),
                 _scaler(op, postscale, n, _half(dtype, work)))


def _allreduce_bucket(st: Any, request: Request, ps: Any, arrays: List[np.ndarray],
                      phases: Phases = None, empty: Empty = results.empty) -> List[np.ndarray]:
    """All-reduce arrays sharing op, factors and reduction dtype; returns new arrays."""
    if request.op == ReduceOp.ADASUM:
        return _adasum_bucket(st, request, ps, arrays, phases, empty)
    dtype = arrays[0].dtype
    group = ps.group
    work, wire, as_is, scale = _plan(dtype, request.op, request.scale, group.size)
    if (as_is and len(arrays) == 1 and phases is None and dtype.kind != "b"
            and arrays[0].nbytes < group.mpi_below):
        out = empty(arrays[0].shape, dtype)  # the latency path: one tensor through MPI
        st.transport.allreduce(group.comm, arrays[0], out, wire)
        if scale is not None:
            scale(out)
        return [out]
    clock = _Clock(phases)
    # sends: what goes in; recvs: where the reduction lands (in the work dtype)
    if dtype.kind == "b":
        sends = [a.view(np.uint8) for a in arrays]
    elif as_is:
        sends = arrays
    else:
        sends = []
        for a in arrays:
            buf = empty(a.shape, work)
            fusion.pack([a], buf.reshape(-1), request.scale[0])
            sends.append(buf)
        clock.done("PRESCALE_OR_CAST")
    elements = sum(a.size for a in arrays)
    total = elements * work.itemsize
    reducer, trial = group.select(total)
    packed: Optional[np.ndarray] = None  # the small tensors' results, already one array
    if not as_is:
        recvs = sends
    elif reducer is not None and len(arrays) > 1:
        # views of one result array: large, so on huge pages, which the peers' writes into
        # it (single copy) pin far faster than 4 KiB ones (ResNet-50's gradient set at np=2:
        # 26 -> 20 ms); the small tensors first, so that their packed results need no
        # unpacking; each large one on a 64-byte boundary, so TensorFlow takes it without a
        # copy
        order = sorted(range(len(arrays)), key=lambda i: arrays[i].nbytes >= SMALL_BYTES)
        starts, offset = [0] * len(arrays), 0
        for i in order:
            if arrays[i].nbytes >= SMALL_BYTES:
                offset += -offset % (_ALIGN // work.itemsize)
            starts[i] = offset
            offset += arrays[i].size
        slab = empty((offset,), work)
        recvs = [slab[at:at + a.size].reshape(a.shape) for at, a in zip(starts, arrays)]
        small = sum(a.size for a in arrays if a.nbytes < SMALL_BYTES)
        packed = slab[:small]
    else:
        recvs = [empty(a.shape, work) for a in arrays]
    started = time.perf_counter()
    if group.size == 1:  # the reduction over one rank is the identity: a copy per tensor
        for send, recv in zip(sends, recvs):
            if send is not recv:
                np.copyto(recv, send)
            if scale is not None:
                scale(recv)
        clock.done("SINGLE_RANK_COPY")
    elif reducer is not None:
        _on_node_allreduce(reducer, sends, recvs, wire, scale, work, packed)
        clock.done(reducer.activity)
    elif len(recvs) == 1:
        st.transport.allreduce(group.comm, None if sends[0] is recvs[0] else sends[0],
                               recvs[0], wire)
        if scale is not None:
            scale(recvs[0])
        clock.done("MPI_ALLREDUCE")
    else:
        size = sum(r.size for r in recvs)
        base = _pool.acquire(work, size)
        buf = base[:size]
        fusion.pack(sends, buf)
        clock.done("MEMCPY_IN_FUSION_BUFFER")
        st.transport.allreduce(group.comm, None, buf, wire)
        if scale is not None:
            scale(buf)
        clock.done("MPI_ALLREDUCE")
        offset = 0
        for r in recvs:
            r.reshape(-1)[:] = buf[offset:offset + r.size]
            offset += r.size
        _pool.release(base)
        clock.done("MEMCPY_OUT_FUSION_BUFFER")
    if trial is not None:  # an ``auto`` choice still trying both: tell it the time
        choice, second = trial
        choice.record(total, second, time.perf_counter() - started)
    reduced = [_result(r, a.dtype, empty) for r, a in zip(recvs, arrays)]
    if work != dtype and dtype.kind != "b":
        clock.done("CAST_OUT")
    return reduced


def _adasum_bucket(st: Any, request: Request, ps: Any, arrays: List[np.ndarray],
                   phases: Phases, empty: Empty) -> List[np.ndarray]:
    """Adasum of float arrays of one dtype: packed (prescaled) into one reused flat buffer in
    the reduction dtype, combined tensor by tensor over the set's ranks through MPI point to
    point (``hvdlike.engine.adasum``), postscaled, unpacked into new arrays."""
    clock = _Clock(phases)
    dtype = arrays[0].dtype
    work = dtypes.reduce_dtype(dtype)
    segments, offset = [], 0
    for a in arrays:
        segments.append((offset, a.size))
        offset += a.size
    base, scratch = _pool.acquire(work, offset), _pool.acquire(work, offset)
    buf = base[:offset]
    fusion.pack(arrays, buf, request.scale[0])
    clock.done("MEMCPY_IN_FUSION_BUFFER")
    adasum.allreduce(ps.group.comm, st.transport.sendrecv, buf, scratch[:offset], segments)
    scale = _scaler(ReduceOp.ADASUM, request.scale[1], ps.group.size, _half(dtype, work))
    if scale is not None:
        scale(buf)
    clock.done("ADASUM")
    out = fusion.unpack(buf, [a.shape for a in arrays], [dtype] * len(arrays), empty)
    _pool.release(base)
    _pool.release(scratch)
    clock.done("MEMCPY_OUT_FUSION_BUFFER")
    return out


SMALL_BYTES = 64 * 1024  # bytes: tensors below this travel together in one packed array
_ALIGN = 64  # bytes: TensorFlow takes NumPy results on such a boundary without copying them


def _on_node_allreduce(reducer: HostAllreduce, sends: List[np.ndarray],
                       recvs: List[np.ndarray], op: ReduceOp, scale: Optional[InPlacePass],
                       work: np.dtype, packed: Optional[np.ndarray] = None) -> None:
    """The on-node all-reduce of a bucket, straight from the tensors' memory; the small
    tensors (biases, norms: most of a model's tensors, little of its bytes) are packed into
    one array first, which saves the per-tensor cost of each of the transport's passes.
    ``packed``: where the small tensors' results lie one after another, in order (their
    ``recvs`` are views of it), so that they need no unpacking; None: they do."""
    small = [i for i, r in enumerate(recvs) if r.nbytes < SMALL_BYTES]
    if len(small) < 2:
        reducer.allreduce_many(sends, recvs, op, scale)
        return
    size = sum(recvs[i].size for i in small)
    send_base = _pool.acquire(work, size)
    packed_send = send_base[:size]
    recv_base: Optional[np.ndarray] = None
    if packed is None:
        recv_base = base = _pool.acquire(work, size)
        packed_recv = base[:size]
    else:
        packed_recv = packed
    np.concatenate([sends[i].reshape(-1) for i in small], out=packed_send)
    first, rest = small[0], set(small[1:])  # the packed array takes the first one's place
    keep = [i for i in range(len(recvs)) if i not in rest]
    reducer.allreduce_many([packed_send if i == first else sends[i] for i in keep],
                       [packed_recv if i == first else recvs[i] for i in keep], op, scale)
    _pool.release(send_base)
    if recv_base is None:
        return
    offset = 0
    for i in small:
        r = recvs[i]
        r.reshape(-1)[:] = packed_recv[offset:offset + r.size]
        offset += r.size
    _pool.release(recv_base)


def _result(buf: np.ndarray, dtype: np.dtype, empty: Empty) -> np.ndarray:
    if dtype.kind == "b":
        return buf.view(np.bool_)
    if buf.dtype == dtype:
        return buf
    out = empty(buf.shape, dtype)
    np.copyto(out, buf, casting="unsafe")
    return out


# ----------------------------------------------------------------------------- the others

def _row_bytes(a: np.ndarray) -> int:
    return a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))


def _allgatherv(st: Any, ps: Any) -> Callable[..., None]:
    """How a blocking all-gather of ``ps`` moves its bytes (send, recv, counts): node by node
    for the world on several nodes numbered node after node (HVDLIKE_HIERARCHICAL_ALLGATHER),
    else one MPI call over the set."""
    comm, t = ps.group.comm, st.transport
    if ps.process_set_id == 0 and st.settings.hierarchical_allgather != "0" and st.nodes_in_blocks:
        return functools.partial(t.allgatherv_by_node, comm, st.local_comm, st.cross_comm)
    return functools.partial(t.allgatherv, comm)


def allgather(st: Any, work: Work) -> Any:
    arrays: List[np.ndarray] = work.inputs
    group, t = work.process_set.group, st.transport
    rows = t.allgather_ints(group.comm, np.array([a.shape[0] for a in arrays], np.int64))
    allgatherv = _allgatherv(st, work.process_set)
    if len(arrays) == 1:
        a = arrays[0]
        out = results.empty((int(rows[:, 0].sum()),) + a.shape[1:], a.dtype)
        allgatherv(t.as_bytes(a), t.as_bytes(out), rows[:, 0] * _row_bytes(a))
        return out if work.request.kind == "allgather" else [out]
    seg_bytes = rows * np.array([_row_bytes(a) for a in arrays], np.int64)  # [rank, tensor]
    u8 = np.dtype(np.uint8)
    send_size, recv_size = int(seg_bytes[group.rank].sum()), int(seg_bytes.sum())
    send_base, recv_base = _pool.acquire(u8, send_size), _pool.acquire(u8, recv_size)
    send, recv = send_base[:send_size], recv_base[:recv_size]
    if arrays:
        np.concatenate([t.as_bytes(a) for a in arrays], out=send)
    allgatherv(send, recv, seg_bytes.sum(axis=1))
    outs = [results.empty((int(rows[:, i].sum()),) + a.shape[1:], a.dtype)
            for i, a in enumerate(arrays)]
    written = [0] * len(arrays)
    offset = 0
    for r in range(rows.shape[0]):
        for i, out in enumerate(outs):
            n = int(seg_bytes[r, i])
            t.as_bytes(out)[written[i]:written[i] + n] = recv[offset:offset + n]
            written[i] += n
            offset += n
    _pool.release(send_base)
    _pool.release(recv_base)
    return outs


def broadcast(st: Any, work: Work) -> np.ndarray:
    (a,) = work.inputs
    ps = work.process_set
    root = ps.ranks.index(work.request.root_rank())
    out = results.empty(a.shape, a.dtype)
    if root == ps.group.rank:
        np.copyto(out, a)
    st.transport.bcast(ps.group.comm, st.transport.as_bytes(out), root)
    return out


def alltoall(st: Any, work: Work) -> Tuple[np.ndarray, np.ndarray]:
    a, send_splits = work.inputs
    comm, t = work.process_set.group.comm, st.transport
    recv_splits = t.alltoall_ints(comm, send_splits)
    out = results.empty((int(recv_splits.sum()),) + a.shape[1:], a.dtype)
    row = _row_bytes(a)
    t.alltoallv(comm, t.as_bytes(a), send_splits * row, t.as_bytes(out), recv_splits * row)
    return out, recv_splits


def scatter_rows(d0: int, n: int) -> np.ndarray:
    """Rows each rank receives: as even as possible, the first d0 % n ranks get one more."""
    return np.array([d0 // n + (r < d0 % n) for r in range(n)], np.int64)


def reducescatter(st: Any, work: Work) -> Any:
    arrays: List[np.ndarray] = work.inputs
    request, ps = work.request, work.process_set
    comm = ps.group.comm
    op = request.reduce_op()
    prescale, postscale = request.scale
    n, me = ps.group.size, ps.group.rank
    wdtypes = [dtypes.reduce_dtype(a.dtype) for a in arrays]
    out: List[Any] = [None] * len(arrays)
    sizes = [a.size * w.itemsize for a, w in zip(arrays, wdtypes)]
    for bucket in fusion.plan_buckets([a.dtype for a in arrays], sizes,
                                      st.settings.fusion_threshold):
        members = [arrays[i] for i in bucket]
        rows = [scatter_rows(a.shape[0], n) for a in members]
        row_elems = [int(np.prod(a.shape[1:], dtype=np.int64)) for a in members]
        counts = np.sum([rw * re for rw, re in zip(rows, row_elems)], axis=0)
        wdtype = wdtypes[bucket[0]]
        total = int(sum(a.size for a in members))
        send_base = _pool.acquire(wdtype, total)
        send = send_base[:total]
        offset = 0
        starts = [np.concatenate(([0], np.cumsum(rw))) for rw in rows]
        for r in range(n):  # rank-major: rank r's rows of every member, then rank r+1's
            for a, s, re in zip(members, starts, row_elems):
                block = a[s[r]:s[r + 1]]
                fusion.pack([block], send[offset:offset + block.size], prescale)
                offset += block.size
        recv_base = _pool.acquire(wdtype, int(counts[me]))
        recv = recv_base[:int(counts[me])]
        st.transport.reduce_scatter(comm, send, recv, counts, _wire_op(members[0].dtype, op))
        _scale_in_place(recv, op, postscale, n, _half(members[0].dtype, wdtype))
        out_dtypes = [np.dtype(np.uint8) if a.dtype.kind == "b" else a.dtype for a in members]
        shapes = [(int(rw[me]),) + a.shape[1:] for a, rw in zip(members, rows)]
        for i, a, res in zip(bucket, members,
                             fusion.unpack(recv, shapes, out_dtypes, results.empty)):
            out[i] = res.view(np.bool_) if a.dtype.kind == "b" else res
        _pool.release(send_base)
        _pool.release(recv_base)
    return out[0] if request.kind == "reducescatter" else out


def barrier(st: Any, work: Work) -> None:
    st.transport.barrier(work.process_set.group.comm)


def broadcast_object(st: Any, work: Work) -> Any:
    """``work.inputs``: the root's pickled object (None elsewhere); every rank unpickles."""
    ps = work.process_set
    root = ps.ranks.index(work.request.root_rank())
    return pickle.loads(st.transport.bcast_object(ps.group.comm, work.inputs, root))


def allgather_object(st: Any, work: Work) -> List[Any]:
    """``work.inputs``: this rank's pickled object."""
    return [pickle.loads(b)
            for b in st.transport.allgather_object(work.process_set.group.comm, work.inputs)]


def call(st: Any, work: Work) -> Any:
    """Run ``work.inputs`` (a function of no arguments) in the engine: process-set changes,
    pausing the engine for ``exclusive_mpi``."""
    return work.inputs()


RUNNERS: Dict[str, Callable[[Any, Work], Any]] = {
    "allgather": allgather, "grouped_allgather": allgather, "broadcast": broadcast,
    "alltoall": alltoall, "reducescatter": reducescatter,
    "grouped_reducescatter": reducescatter, "barrier": barrier,
    "broadcast_object": broadcast_object, "allgather_object": allgather_object,
    "process_set": call, "exclusive_mpi": call,
}


def zeros_for(request: Request) -> List[np.ndarray]:
    """What a rank that has joined contributes to an all-reduce: zeros of the agreed shape."""
    if request.kind == "grouped_allreduce":
        return [np.zeros(s, d) for s, d in zip(request.shape, request.dtype)]
    return [np.zeros(request.shape, request.dtype)]
