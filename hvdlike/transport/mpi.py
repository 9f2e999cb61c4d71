"""MPI transport: thin wrappers over mpi4py buffer methods.

Each function takes contiguous NumPy buffers and ``blocking``: when True the operation has
completed on return (None is returned); when False the MPI request to wait on is returned.
Reductions take typed buffers; data movement works on uint8 views so any dtype travels as bytes.
Importing this module initializes MPI, so only ``runtime.init`` imports it.
"""
import os
from typing import Optional

import numpy as np

# Open MPI's UCX one-sided component prints a harmless error when the shared-memory transport
# allocates its window; MPI_Init reads this (unless the user set it, or initialized MPI first).
os.environ.setdefault("OMPI_MCA_osc", "^ucx")
from mpi4py import MPI  # noqa: E402

from ..reduce_ops import ReduceOp

Request = MPI.Request
_MPI_OPS = {
    ReduceOp.AVERAGE: MPI.SUM,
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.PRODUCT: MPI.PROD,
}


def as_bytes(a: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array."""
    return a.reshape(-1).view(np.uint8)


def _displacements(counts: np.ndarray) -> np.ndarray:
    displs = np.zeros_like(counts)
    np.cumsum(counts[:-1], out=displs[1:])
    return displs


def allreduce(comm: MPI.Comm, send: Optional[np.ndarray], recv: np.ndarray, op: ReduceOp,
              blocking: bool) -> Optional[Request]:
    """Reduce ``send`` (or ``recv`` in place when send is None) into ``recv`` on every rank."""
    sendbuf = MPI.IN_PLACE if send is None else send
    if blocking:
        comm.Allreduce(sendbuf, recv, _MPI_OPS[op])
        return None
    return comm.Iallreduce(sendbuf, recv, _MPI_OPS[op])


def allgatherv(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray, counts: np.ndarray,
               blocking: bool) -> Optional[Request]:
    """Gather byte buffers of ``counts[r]`` bytes from each rank r into ``recv`` in rank order."""
    spec = [recv, (counts, _displacements(counts)), MPI.BYTE]
    if blocking:
        comm.Allgatherv([send, MPI.BYTE], spec)
        return None
    return comm.Iallgatherv([send, MPI.BYTE], spec)


def bcast(comm: MPI.Comm, buf: np.ndarray, root: int, blocking: bool) -> Optional[Request]:
    """Copy the root's byte buffer into ``buf`` on every rank."""
    if blocking:
        comm.Bcast([buf, MPI.BYTE], root=root)
        return None
    return comm.Ibcast([buf, MPI.BYTE], root=root)


def alltoallv(comm: MPI.Comm, send: np.ndarray, send_counts: np.ndarray, recv: np.ndarray,
              recv_counts: np.ndarray, blocking: bool) -> Optional[Request]:
    """Send ``send_counts[r]`` bytes to each rank r and receive ``recv_counts[r]`` from it."""
    sspec = [send, (send_counts, _displacements(send_counts)), MPI.BYTE]
    rspec = [recv, (recv_counts, _displacements(recv_counts)), MPI.BYTE]
    if blocking:
        comm.Alltoallv(sspec, rspec)
        return None
    return comm.Ialltoallv(sspec, rspec)


def reduce_scatter(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray, counts: np.ndarray,
                   op: ReduceOp, blocking: bool) -> Optional[Request]:
    """Reduce ``send`` over ranks; rank r receives the r-th block of ``counts[r]`` elements."""
    if blocking:
        comm.Reduce_scatter(send, recv, counts, _MPI_OPS[op])
        return None
    return comm.Ireduce_scatter(send, recv, counts, _MPI_OPS[op])


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


def max_ints(comm: MPI.Comm, values: np.ndarray, out: np.ndarray) -> None:
    """Element-wise maximum of an int64 vector over all ranks, written to ``out``."""
    comm.Allreduce(values, out, MPI.MAX)


def barrier(comm: MPI.Comm, blocking: bool) -> Optional[Request]:
    if blocking:
        comm.Barrier()
        return None
    return comm.Ibarrier()
