"""NCCL transport for GPU arrays, through CuPy's NCCL bindings.

One communicator per (process set, device), created the first time that set runs a GPU
collective: the set's first rank makes the unique id, MPI broadcasts it, and every member
creates its rank's communicator (a collective call, made by every member at the same point of
the engine's identical run order). Every call is enqueued on the given stream and returns
without waiting for the GPU. Buffers are CuPy arrays; counts are elements of their dtype.

NCCL has no 16-bit integer or bool reductions: the engine reduces int16 and uint16 in int32,
bfloat16 in float32 and bool as uint8 (max = or, min = and). NCCL refuses two ranks on one GPU ("Duplicate
GPU detected"), so the engine checks for shared GPUs before it makes a communicator here (see
``shares_gpu``).
"""
from typing import Any, Dict, List, Tuple

import numpy as np

from ..base import dtypes
from ..base.reduce_ops import ReduceOp
from .gpu import cupy, nccl_module

# NCCL's enums (nccl.h): stable since NCCL 2.0, bfloat16 since 2.10, avg since 2.10
_TYPES = {
    np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int32): 2,
    np.dtype(np.uint32): 3, np.dtype(np.int64): 4, np.dtype(np.uint64): 5,
    np.dtype(np.float16): 6, np.dtype(np.float32): 7, np.dtype(np.float64): 8,
    dtypes.BFLOAT16: 9,
}
_OPS = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3,
        ReduceOp.AVERAGE: 0}
NCCL_AVG = 4
_UINT8 = 1


def reduce_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype NCCL reduces ``dtype`` in: itself, except int16, uint16 and bfloat16 (int32,
    float32: NCCL has no 16-bit integers, and CuPy's bfloat16 arithmetic for the scaling is
    limited) and bool (uint8). float16 is reduced natively, as Horovod does on GPUs."""
    if dtype.kind == "b":
        return np.dtype(np.uint8)
    if dtype in (np.int16, np.uint16):
        return np.dtype(np.int32)
    if dtype == dtypes.BFLOAT16:
        return np.dtype(np.float32)
    return dtype


def device_identity(cp: Any, device_id: int) -> str:
    """A name for the GPU that is the same in every process using it (its UUID)."""
    props = cp.cuda.runtime.getDeviceProperties(device_id)
    uuid = props.get("uuid")
    return bytes(uuid).hex() if uuid else f"pci:{cp.cuda.Device(device_id).pci_bus_id}"


class Communicator:
    """A process set's NCCL communicator on one device, and its collectives."""

    def __init__(self, mpi_comm: Any, device_id: int) -> None:
        self.nccl = nccl_module()
        uid = self.nccl.get_unique_id() if mpi_comm.Get_rank() == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        self.size, self.rank = mpi_comm.Get_size(), mpi_comm.Get_rank()
        self.device_id = device_id
        with cupy().cuda.Device(device_id):
            self.comm = self.nccl.NcclCommunicator(self.size, uid, self.rank)

    def allreduce(self, send: Any, recv: Any, op: ReduceOp, stream: Any,
                  average: bool = False) -> None:
        """Reduce ``send`` into ``recv`` (may be the same array) on every rank; ``average``:
        NCCL's own average (floating dtypes only)."""
        self.comm.allReduce(send.data.ptr, recv.data.ptr, recv.size, _TYPES[recv.dtype],
                            NCCL_AVG if average else _OPS[op], stream.ptr)

    def allgather(self, send: Any, recv: Any, stream: Any) -> None:
        """Every rank's ``send`` (the same number of bytes each) into ``recv``, rank order."""
        self.comm.allGather(send.data.ptr, recv.data.ptr, send.nbytes, _UINT8, stream.ptr)

    def broadcast(self, buf: Any, root: int, stream: Any) -> None:
        self.comm.bcast(buf.data.ptr, buf.nbytes, _UINT8, root, stream.ptr)

    def reduce_scatter(self, send: Any, recv: Any, op: ReduceOp, stream: Any) -> None:
        """``send`` holds size blocks of ``recv.size`` elements; block r, reduced, goes to r."""
        self.comm.reduceScatter(send.data.ptr, recv.data.ptr, recv.size, _TYPES[recv.dtype],
                                _OPS[op], stream.ptr)

    def alltoallv(self, send: Any, send_bytes: np.ndarray, recv: Any, recv_bytes: np.ndarray,
                  stream: Any) -> None:
        """Send ``send_bytes[r]`` consecutive bytes of ``send`` to each rank r and receive
        ``recv_bytes[r]`` from it, as one group of point-to-point calls."""
        send_at = np.concatenate(([0], np.cumsum(send_bytes)))
        recv_at = np.concatenate(([0], np.cumsum(recv_bytes)))
        self.nccl.groupStart()
        try:
            for peer in range(self.size):
                if send_bytes[peer]:
                    self.comm.send(send.data.ptr + int(send_at[peer]), int(send_bytes[peer]),
                                   _UINT8, peer, stream.ptr)
                if recv_bytes[peer]:
                    self.comm.recv(recv.data.ptr + int(recv_at[peer]), int(recv_bytes[peer]),
                                   _UINT8, peer, stream.ptr)
        finally:
            self.nccl.groupEnd()


def shares_gpu(identities: List[str]) -> List[Tuple[str, List[int]]]:
    """The GPUs that more than one rank of a set would use, with those ranks."""
    ranks: Dict[str, List[int]] = {}
    for r, ident in enumerate(identities):
        ranks.setdefault(ident, []).append(r)
    return [(ident, rs) for ident, rs in ranks.items() if len(rs) > 1]
