"""MPI transport: thin wrappers over mpi4py buffer methods.

Each function takes contiguous NumPy buffers and has completed when it returns (the engine runs
them one at a time). Reductions take typed buffers; data movement works on uint8 views so any
dtype travels as bytes.
Importing this module initializes MPI, so only ``runtime.init`` imports it.
"""
import os
from typing import Any, Dict, List, Optional

import numpy as np

from ..base.reduce_ops import ReduceOp
from . import open_mpi_defaults

open_mpi_defaults.apply(os.environ)  # before MPI_Init reads them
from mpi4py import MPI  # noqa: E402

_MPI_OPS = {
    ReduceOp.AVERAGE: MPI.SUM,
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.PRODUCT: MPI.PROD,
}

# Open MPI 5's AVX reduction component adds 8- and 16-bit integers with saturation (uint8
# 200 + 200 = 255, open-mpi/ompi#8045) where NumPy, TensorFlow and the shared-memory transport
# wrap around (144). Their sums go through an operation of ours that adds with NumPy instead.
_SMALL_INTS = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))
_wrapping_sums: Dict[np.dtype, MPI.Op] = {}


def mpi_op(op: ReduceOp, dtype: np.dtype) -> MPI.Op:
    """The MPI operation that reduces ``dtype`` values with ``op`` (the sum of small integers
    wraps around, as in NumPy)."""
    if (op == ReduceOp.SUM or op == ReduceOp.AVERAGE) and np.dtype(dtype) in _SMALL_INTS:
        return _wrapping_sum(np.dtype(dtype))
    return _MPI_OPS[op]


def _wrapping_sum(dtype: np.dtype) -> MPI.Op:
    found = _wrapping_sums.get(dtype)
    if found is None:
        def add(inbuf: Any, inoutbuf: Any, _datatype: Any) -> None:
            into = np.frombuffer(inoutbuf, dtype)
            np.add(into, np.frombuffer(inbuf, dtype), out=into)
        found = _wrapping_sums[dtype] = MPI.Op.Create(add, commute=True)
    return found


def as_bytes(a: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array."""
    return a.reshape(-1).view(np.uint8)


def _displacements(counts: np.ndarray) -> np.ndarray:
    displs = np.zeros_like(counts)
    np.cumsum(counts[:-1], out=displs[1:])
    return displs


# MPI counts and displacements are C ints. Messages with a count or offset past this many
# elements (bytes for data movement) go in pieces of at most this size instead:
# one tensor of any size works, whatever large-count support the MPI library has.
MAX_COUNT = 1 << 30


def _large(*counts: Any) -> bool:
    return any((c if isinstance(c, int) else int(np.sum(c))) > MAX_COUNT for c in counts)


def _pieces(n: int) -> range:
    return range(0, n, MAX_COUNT)


def allreduce(comm: MPI.Comm, send: Optional[np.ndarray], recv: np.ndarray,
              op: ReduceOp) -> None:
    """Reduce ``send`` (or ``recv`` in place when send is None) into ``recv`` on every rank."""
    if recv.size > MAX_COUNT:
        flat_recv = recv.reshape(-1)
        flat_send = None if send is None else send.reshape(-1)
        for at in _pieces(recv.size):
            part = slice(at, at + MAX_COUNT)
            allreduce(comm, None if flat_send is None else flat_send[part], flat_recv[part], op)
        return
    sendbuf = MPI.IN_PLACE if send is None else send
    if op != ReduceOp.MIN and op != ReduceOp.MAX:
        comm.Allreduce(sendbuf, recv, mpi_op(op, recv.dtype))
        return
    nan = _local_nans(comm, recv if send is None else send, op)
    comm.Allreduce(sendbuf, recv, _MPI_OPS[op])
    if nan is not None:
        comm.Allreduce(MPI.IN_PLACE, nan, MPI.MAX)
        recv.reshape(-1)[nan.view(bool)] = np.nan


def _local_nans(comm: MPI.Comm, values: np.ndarray, op: ReduceOp) -> Optional[np.ndarray]:
    """For a floating Min/Max where some rank has a NaN: this rank's NaN mask (uint8, flat),
    to be reduced with MAX like the values; None otherwise (the usual case).

    MPI_MIN/MAX compare with ``<``, so a NaN survives or vanishes depending on the order the
    ranks' values meet; NumPy, TensorFlow and the shared-memory transport return NaN wherever
    an input is NaN. One tiny all-reduce says whether any rank has a NaN."""
    if op not in (ReduceOp.MIN, ReduceOp.MAX) or values.dtype.kind not in "fV":
        return None
    mask = np.isnan(values).reshape(-1).view(np.uint8)
    return mask if comm.allreduce(bool(mask.any()), op=MPI.LOR) else None


def allgatherv(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray, counts: np.ndarray) -> None:
    """Gather byte buffers of ``counts[r]`` bytes from each rank r into ``recv`` in rank order."""
    displs = _displacements(counts)
    if _large(counts):  # each rank's block, broadcast by that rank in pieces
        start = int(displs[comm.Get_rank()])
        recv[start:start + send.size] = send
        for r, (at, n) in enumerate(zip(displs.tolist(), counts.tolist())):
            bcast(comm, recv[at:at + n], r)
    elif counts.min() == counts.max():
        # equal parts: MPI_Allgather, which Open MPI runs hierarchically across nodes (each
        # node's data crosses the network once); its Allgatherv sends it once per remote rank
        comm.Allgather([send, MPI.BYTE], [recv, MPI.BYTE])
    else:
        comm.Allgatherv([send, MPI.BYTE], [recv, (counts, displs), MPI.BYTE])


def allgatherv_by_node(comm: MPI.Comm, local: MPI.Comm, cross: MPI.Comm, send: np.ndarray,
                       recv: np.ndarray, counts: np.ndarray) -> None:
    """``allgatherv`` over ``comm``, whose ranks are numbered node after node, the
    same number on each node. ``local``: this node's ranks; ``cross``: the ranks of this
    local rank on every node, in node order. Local rank 0 gathers its node's parts into the
    node's block of ``recv``, those ranks all-gather the blocks, and each broadcasts the
    whole inside its node: every node's data crosses the network once per other node, where
    a flat MPI_Allgatherv of unequal parts sends every rank's part once per remote rank."""
    if _large(counts) or counts.min() == counts.max():  # pieces; or MPI_Allgather, below
        allgatherv(comm, send, recv, counts)
        return
    per_node = counts.reshape(-1, local.Get_size())
    node_counts = per_node.sum(axis=1)
    node_displs = _displacements(node_counts)
    node = cross.Get_rank()
    start = int(node_displs[node])
    block = recv[start:start + int(node_counts[node])]
    mine = per_node[node]
    leader = local.Get_rank() == 0
    local.Gatherv([send, MPI.BYTE],
                  [block, (mine, _displacements(mine)), MPI.BYTE] if leader else None, root=0)
    if leader:
        cross.Allgatherv(MPI.IN_PLACE, [recv, (node_counts, node_displs), MPI.BYTE])
    local.Bcast([recv, MPI.BYTE], root=0)


def bcast(comm: MPI.Comm, buf: np.ndarray, root: int) -> None:
    """Copy the root's byte buffer into ``buf`` on every rank."""
    if not _large(buf.size):
        comm.Bcast([buf, MPI.BYTE], root=root)
        return
    for at in _pieces(buf.size):
        comm.Bcast([buf[at:at + MAX_COUNT], MPI.BYTE], root=root)


def alltoallv(comm: MPI.Comm, send: np.ndarray, send_counts: np.ndarray, recv: np.ndarray,
              recv_counts: np.ndarray) -> None:
    """Send ``send_counts[r]`` bytes to each rank r and receive ``recv_counts[r]`` from it."""
    sdispls, rdispls = _displacements(send_counts), _displacements(recv_counts)
    # ranks send and receive different amounts: they decide together
    if comm.allreduce(_large(send_counts, recv_counts), op=MPI.LOR):  # point to point, pieces
        requests = []
        for peer in range(comm.Get_size()):
            for at in _pieces(int(recv_counts[peer])):
                start = int(rdispls[peer]) + at
                n = min(MAX_COUNT, int(recv_counts[peer]) - at)
                requests.append(comm.Irecv([recv[start:start + n], MPI.BYTE], peer, tag=7))
            for at in _pieces(int(send_counts[peer])):
                start = int(sdispls[peer]) + at
                n = min(MAX_COUNT, int(send_counts[peer]) - at)
                requests.append(comm.Isend([send[start:start + n], MPI.BYTE], peer, tag=7))
        MPI.Request.Waitall(requests)
        return
    comm.Alltoallv([send, (send_counts, sdispls), MPI.BYTE],
                   [recv, (recv_counts, rdispls), MPI.BYTE])


def sendrecv(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray, peer: int) -> None:
    """Send ``send`` to ``peer`` and receive ``recv`` from it (the peer sends that many bytes
    and receives ``send``'s size; nothing happens when both are empty)."""
    send_bytes, recv_bytes = as_bytes(send), as_bytes(recv)
    for at in _pieces(max(send_bytes.size, recv_bytes.size)):
        piece = slice(at, at + MAX_COUNT)
        comm.Sendrecv([send_bytes[piece], MPI.BYTE], peer, 8,
                      [recv_bytes[piece], MPI.BYTE], peer, 8)


def reduce_scatter(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray, counts: np.ndarray,
                   op: ReduceOp) -> None:
    """Reduce ``send`` over ranks; rank r receives the r-th block of ``counts[r]`` elements."""
    if _large(counts):  # each block reduced to its rank, in pieces
        me = comm.Get_rank()
        for r, (at, n) in enumerate(zip(_displacements(counts).tolist(), counts.tolist())):
            for piece in _pieces(n):
                m = min(MAX_COUNT, n - piece)
                block = send[at + piece:at + piece + m]
                comm.Reduce(block, recv[piece:piece + m] if r == me else None,
                            mpi_op(op, send.dtype), root=r)
        return
    nan = _local_nans(comm, send, op)
    # (an int array serves as MPI's counts, whatever mpi4py's stubs say)
    comm.Reduce_scatter(send, recv, counts, mpi_op(op, send.dtype))  # type: ignore[arg-type]
    if nan is not None:
        mine = np.empty(recv.size, np.uint8)
        comm.Reduce_scatter(nan, mine, counts, MPI.MAX)  # type: ignore[arg-type]
        recv.reshape(-1)[mine.view(bool)] = np.nan


def allgather_ints(comm: MPI.Comm, values: np.ndarray) -> np.ndarray:
    """Gather an equal-length int64 vector from every rank: result has shape (size, len)."""
    out = np.empty((comm.Get_size(), values.size), dtype=np.int64)
    comm.Allgather(values, out)
    return out


def alltoall_ints(comm: MPI.Comm, values: np.ndarray) -> np.ndarray:
    """Send ``values[r]`` (int64) to rank r; return what each rank sent here."""
    out = np.empty_like(values)
    comm.Alltoall(values, out)
    return out


def bcast_object(comm: MPI.Comm, obj: Any, root: int) -> Any:
    """The root's picklable ``obj``, on every rank."""
    return comm.bcast(obj, root=root)


def allgather_object(comm: MPI.Comm, obj: Any) -> List[Any]:
    """Every rank's picklable ``obj``, in rank order."""
    return comm.allgather(obj)


def barrier(comm: MPI.Comm) -> None:
    comm.Barrier()
