"""How the ready all-reduces of a round move their data, in the same order on every rank.

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
fusion buffer); a set of one rank copies each tensor into its result. An Adasum bucket is packed and combined by ``engine.adasum`` over
MPI point to point. The other collectives run one response at a time (``execute``).
"""
import functools
import math
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..base import dtypes
from ..base.reduce_ops import ReduceOp
from ..transport.interface import HostAllreduce, InPlacePass
from . import adasum, fusion
from .checks import Kind, Request
from .scaling import half, scaler, wire_op
from .work import Empty, Phases, Work, pool, results
from .world import World


def fusion_key(work: Work, i: int) -> Tuple[Any, ...]:
    r = work.request
    return (id(work.process_set), r.op, r.scale, work.inputs[i].dtype)


def run_allreduces(st: World, works: Sequence[Work],
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
    if len(works) == 1 and works[0].request.kind == Kind.GROUPED_ALLREDUCE:  # same plan each step
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
        work.done(out if work.request.kind == Kind.GROUPED_ALLREDUCE else out[0])


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


def allreduce_now(st: World, request: Request, inputs: List[np.ndarray], process_set: Any,
                  empty: Empty = results.empty) -> Any:
    """The result of one all-reduce response (allreduce or grouped_allreduce) run alone."""
    if len(inputs) == 1:
        (out,) = _allreduce_bucket(st, request, process_set, inputs, None, empty)
        return out if request.kind == Kind.ALLREDUCE else [out]
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
    return _Plan(work, wire_op(dtype, op),
                 dtype.kind == "b" or (work == dtype and prescale == 1.0),
                 scaler(op, postscale, n, half(dtype, work)))


def _allreduce_bucket(st: World, request: Request, ps: Any, arrays: List[np.ndarray],
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
        base = pool.acquire(work, size)
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
        pool.release(base)
        clock.done("MEMCPY_OUT_FUSION_BUFFER")
    if trial is not None:  # an ``auto`` choice still trying both: tell it the time
        choice, second = trial
        choice.record(total, second, time.perf_counter() - started)
    reduced = [_result(r, a.dtype, empty) for r, a in zip(recvs, arrays)]
    if work != dtype and dtype.kind != "b":
        clock.done("CAST_OUT")
    return reduced


def _adasum_bucket(st: World, request: Request, ps: Any, arrays: List[np.ndarray],
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
    base, scratch = pool.acquire(work, offset), pool.acquire(work, offset)
    buf = base[:offset]
    fusion.pack(arrays, buf, request.scale[0])
    clock.done("MEMCPY_IN_FUSION_BUFFER")
    adasum.allreduce(ps.group.comm, st.transport.sendrecv, buf, scratch[:offset], segments)
    scale = scaler(ReduceOp.ADASUM, request.scale[1], ps.group.size, half(dtype, work))
    if scale is not None:
        scale(buf)
    clock.done("ADASUM")
    out = fusion.unpack(buf, [a.shape for a in arrays], [dtype] * len(arrays), empty)
    pool.release(base)
    pool.release(scratch)
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
    send_base = pool.acquire(work, size)
    packed_send = send_base[:size]
    recv_base: Optional[np.ndarray] = None
    if packed is None:
        recv_base = base = pool.acquire(work, size)
        packed_recv = base[:size]
    else:
        packed_recv = packed
    np.concatenate([sends[i].reshape(-1) for i in small], out=packed_send)
    first, rest = small[0], set(small[1:])  # the packed array takes the first one's place
    keep = [i for i in range(len(recvs)) if i not in rest]
    reducer.allreduce_many([packed_send if i == first else sends[i] for i in keep],
                           [packed_recv if i == first else recvs[i] for i in keep], op, scale)
    pool.release(send_base)
    if recv_base is None:
        return
    offset = 0
    for i in small:
        r = recvs[i]
        r.reshape(-1)[:] = packed_recv[offset:offset + r.size]
        offset += r.size
    pool.release(recv_base)


def _result(buf: np.ndarray, dtype: np.dtype, empty: Empty) -> np.ndarray:
    if dtype.kind == "b":
        return buf.view(np.bool_)
    if buf.dtype == dtype:
        return buf
    out = empty(buf.shape, dtype)
    np.copyto(out, buf, casting="unsafe")
    return out
