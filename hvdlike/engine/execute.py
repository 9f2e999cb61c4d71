"""How the ready responses of the collectives other than all-reduce move their data, one at a
time, in the same order on every rank (``RUNNERS``, by request kind); all-reduces: ``allreduce``."""
import functools
import pickle
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from ..base import dtypes
from . import fusion
from .checks import Kind
from .scaling import half, scale_in_place, wire_op
from .work import Work, pool, results, row_bytes
from .world import World

# ----------------------------------------------------------------------------- the others


def _allgatherv(st: World, ps: Any) -> Callable[..., None]:
    """How a blocking all-gather of ``ps`` moves its bytes (send, recv, counts): node by node
    for the world on several nodes numbered node after node (HVDLIKE_HIERARCHICAL_ALLGATHER),
    else one MPI call over the set."""
    comm, t = ps.group.comm, st.transport
    if ps.process_set_id == 0 and st.settings.hierarchical_allgather != "0" and st.nodes_in_blocks:
        return functools.partial(t.allgatherv_by_node, comm, st.local_comm, st.cross_comm)
    return functools.partial(t.allgatherv, comm)


def allgather(st: World, work: Work) -> Any:
    arrays: List[np.ndarray] = work.inputs
    group, t = work.process_set.group, st.transport
    rows = t.allgather_ints(group.comm, np.array([a.shape[0] for a in arrays], np.int64))
    allgatherv = _allgatherv(st, work.process_set)
    if len(arrays) == 1:
        a = arrays[0]
        out = results.empty((int(rows[:, 0].sum()),) + a.shape[1:], a.dtype)
        allgatherv(t.as_bytes(a), t.as_bytes(out), rows[:, 0] * row_bytes(a))
        return out if work.request.kind == Kind.ALLGATHER else [out]
    seg_bytes = rows * np.array([row_bytes(a) for a in arrays], np.int64)  # [rank, tensor]
    u8 = np.dtype(np.uint8)
    send_size, recv_size = int(seg_bytes[group.rank].sum()), int(seg_bytes.sum())
    send_base, recv_base = pool.acquire(u8, send_size), pool.acquire(u8, recv_size)
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
    pool.release(send_base)
    pool.release(recv_base)
    return outs


def broadcast(st: World, work: Work) -> np.ndarray:
    (a,) = work.inputs
    ps = work.process_set
    root = ps.ranks.index(work.request.root_rank())
    out = results.empty(a.shape, a.dtype)
    if root == ps.group.rank:
        np.copyto(out, a)
    st.transport.bcast(ps.group.comm, st.transport.as_bytes(out), root)
    return out


def alltoall(st: World, work: Work) -> Tuple[np.ndarray, np.ndarray]:
    a, send_splits = work.inputs
    comm, t = work.process_set.group.comm, st.transport
    recv_splits = t.alltoall_ints(comm, send_splits)
    out = results.empty((int(recv_splits.sum()),) + a.shape[1:], a.dtype)
    row = row_bytes(a)
    t.alltoallv(comm, t.as_bytes(a), send_splits * row, t.as_bytes(out), recv_splits * row)
    return out, recv_splits


def scatter_rows(d0: int, n: int) -> np.ndarray:
    """Rows each rank receives: as even as possible, the first d0 % n ranks get one more."""
    return np.array([d0 // n + (r < d0 % n) for r in range(n)], np.int64)


def reducescatter(st: World, work: Work) -> Any:
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
        send_base = pool.acquire(wdtype, total)
        send = send_base[:total]
        offset = 0
        starts = [np.concatenate(([0], np.cumsum(rw))) for rw in rows]
        for r in range(n):  # rank-major: rank r's rows of every member, then rank r+1's
            for a, s, re in zip(members, starts, row_elems):
                block = a[s[r]:s[r + 1]]
                fusion.pack([block], send[offset:offset + block.size], prescale)
                offset += block.size
        recv_base = pool.acquire(wdtype, int(counts[me]))
        recv = recv_base[:int(counts[me])]
        st.transport.reduce_scatter(comm, send, recv, counts, wire_op(members[0].dtype, op))
        scale_in_place(recv, op, postscale, n, half(members[0].dtype, wdtype))
        out_dtypes = [np.dtype(np.uint8) if a.dtype.kind == "b" else a.dtype for a in members]
        shapes = [(int(rw[me]),) + a.shape[1:] for a, rw in zip(members, rows)]
        for i, a, res in zip(bucket, members,
                             fusion.unpack(recv, shapes, out_dtypes, results.empty)):
            out[i] = res.view(np.bool_) if a.dtype.kind == "b" else res
        pool.release(send_base)
        pool.release(recv_base)
    return out[0] if request.kind == Kind.REDUCESCATTER else out


def barrier(st: World, work: Work) -> None:
    st.transport.barrier(work.process_set.group.comm)


def broadcast_object(st: World, work: Work) -> Any:
    """``work.inputs``: the root's pickled object (None elsewhere); every rank unpickles."""
    ps = work.process_set
    root = ps.ranks.index(work.request.root_rank())
    return pickle.loads(st.transport.bcast_object(ps.group.comm, work.inputs, root))


def allgather_object(st: World, work: Work) -> List[Any]:
    """``work.inputs``: this rank's pickled object."""
    return [pickle.loads(b)
            for b in st.transport.allgather_object(work.process_set.group.comm, work.inputs)]


def call(st: World, work: Work) -> Any:
    """Run ``work.inputs`` (a function of no arguments) in the engine: process-set changes,
    pausing the engine for ``exclusive_mpi``."""
    return work.inputs()


RUNNERS: Dict[Kind, Callable[[Any, Work], Any]] = {
    Kind.ALLGATHER: allgather, Kind.GROUPED_ALLGATHER: allgather, Kind.BROADCAST: broadcast,
    Kind.ALLTOALL: alltoall, Kind.REDUCESCATTER: reducescatter,
    Kind.GROUPED_REDUCESCATTER: reducescatter, Kind.BARRIER: barrier,
    Kind.BROADCAST_OBJECT: broadcast_object, Kind.ALLGATHER_OBJECT: allgather_object,
    Kind.PROCESS_SET: call, Kind.EXCLUSIVE_MPI: call,
}


