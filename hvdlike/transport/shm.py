"""Shared-memory transport: all-reduce through an MPI-3 shared window, for ranks on one node.

MPI_Allreduce between processes of one node moves every byte through the MPI library's own
buffers several times. Here each rank maps every other rank's part of one shared window and
the reduction is a reduce-scatter plus an allgather done with NumPy on that memory:

1. rank r copies every chunk j != r of its input into its slot (the peers read it there);
2. barrier; rank r reduces chunk r over all ranks (in rank order, so every rank's result is
   bitwise the same) into its result area and into its own output;
3. barrier; rank r copies every other chunk's result from its owner's result area.

Per rank that is about 2.5 copies of the data instead of MPI's 4 or more (measured at 64 MiB
on 2 ranks: 2.2x MPI_Allreduce). Two barriers per call are enough: a rank writes its slot or
result area again only after a barrier that every reader of it has passed. Inputs larger than
the window go through in segments. The window is allocated on first use and grown (never past
``max_bytes`` per rank), collectively, which is safe because every rank reduces the same
number of bytes in the same call. When the shared-memory file system (/dev/shm) has no room
for it (containers often give it 64 MiB), ``reserve`` says so on every rank, once, and the
caller stays on MPI: writing past a full /dev/shm would kill the job with SIGBUS.
"""
import os
import sys
from typing import Any, Callable, Dict, List, Optional

import numpy as np
from mpi4py import MPI

from ..reduce_ops import ReduceOp

_UFUNCS: Dict[ReduceOp, Callable[..., Any]] = {
    ReduceOp.AVERAGE: np.add,
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}
_ALIGN = 64
_MIN_WINDOW = 4 << 20
_PIECE = 256 << 10  # bytes reduced at a time, so the result is still in cache when copied
_SHM_DIR = "/dev/shm"


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class SharedMemoryAllreduce:
    """Blocking all-reduce over ``comm``, whose ranks must all share memory (one node).

    ``max_bytes``: the most input bytes reduced per round; larger inputs take several.
    Every rank must call ``reserve``, ``allreduce`` and ``free`` together, as with any
    collective.
    """

    def __init__(self, comm: Any, max_bytes: int) -> None:
        self._comm = comm
        self._rank, self._size = comm.Get_rank(), comm.Get_size()
        self._max_bytes = max(_round_up(max_bytes, _ALIGN), _ALIGN)
        self._capacity = 0  # input bytes one round can take
        self._win: Optional[MPI.Win] = None
        self._no_room = False  # /dev/shm was too small once: stay on MPI from then on
        self._slots: List[np.ndarray] = []    # per rank: chunks of its input, at their offsets
        self._results: List[np.ndarray] = []  # per rank: the reduced chunk it owns

    def reserve(self, nbytes: int) -> bool:
        """Make the window big enough to reduce ``nbytes`` (in rounds of at most ``max_bytes``).
        Returns the same answer on every rank: False when there is no room for it."""
        needed = min(nbytes, self._max_bytes)
        if needed <= self._capacity:
            return True
        if self._no_room:
            return False
        capacity = min(self._max_bytes, max(_MIN_WINDOW, 1 << (needed - 1).bit_length()))
        result_bytes = _round_up(capacity // self._size, _ALIGN) + _ALIGN
        current = self._capacity + (len(self._results[0]) if self._results else 0)
        if not self._room_for(self._size * (capacity + result_bytes - current)):
            self._no_room = True
            return False
        self._allocate(capacity, result_bytes)
        return True

    def allreduce(self, send: Optional[np.ndarray], recv: np.ndarray, op: ReduceOp,
                  finish: Optional[Callable[[np.ndarray], None]] = None) -> None:
        """Reduce ``send`` (or ``recv`` in place when send is None) into ``recv`` on every
        rank. Both are C-contiguous with the same dtype and size; ``reserve(recv.nbytes)``
        returned True. ``finish``, an element-wise in-place pass (Average's scaling), is
        applied to each reduced piece while it is still in cache."""
        out = recv.reshape(-1)
        if out.size == 0:
            return
        data = out if send is None else send.reshape(-1)
        ufunc = _UFUNCS[op]
        step = max(1, min(self._capacity, out.nbytes) // out.itemsize)
        for start in range(0, out.size, step):
            stop = min(start + step, out.size)
            self._round(data[start:stop], out[start:stop], ufunc, finish)

    def free(self) -> None:
        """Release the window (collective); ``reserve`` allocates it again when needed."""
        if self._win is not None:
            self._win.Unlock_all()
            self._win.Free()
        self._win, self._slots, self._results, self._capacity = None, [], [], 0

    # ------------------------------------------------------------------ internals

    def _chunk(self, n: int, r: int) -> slice:
        q, extra = divmod(n, self._size)
        lo = r * q + min(r, extra)
        return slice(lo, lo + q + (1 if r < extra else 0))

    def _sync(self) -> None:
        assert self._win is not None
        self._win.Sync()
        self._comm.Barrier()
        self._win.Sync()

    def _round(self, data: np.ndarray, out: np.ndarray, ufunc: Callable[..., Any],
               finish: Optional[Callable[[np.ndarray], None]]) -> None:
        n, dtype, me = data.size, data.dtype, self._rank
        slot = self._slots[me][:data.nbytes].view(dtype)
        for j in range(self._size):
            if j != me:
                part = self._chunk(n, j)
                slot[part] = data[part]
        self._sync()
        mine = self._chunk(n, me)
        sources = [data if p == me else self._slots[p][:data.nbytes].view(dtype)
                   for p in range(self._size)]
        result = self._results[me][:(mine.stop - mine.start) * dtype.itemsize].view(dtype)
        piece = max(1, _PIECE // dtype.itemsize)
        for lo in range(mine.start, mine.stop, piece):
            hi = min(lo + piece, mine.stop)
            dst = result[lo - mine.start:hi - mine.start]
            ufunc(sources[0][lo:hi], sources[1][lo:hi], out=dst)
            for src in sources[2:]:
                ufunc(dst, src[lo:hi], out=dst)
            if finish is not None:
                finish(dst)
            out[lo:hi] = dst
        self._sync()
        for j in range(self._size):
            if j != me:
                part = self._chunk(n, j)
                out[part] = self._results[j][:(part.stop - part.start) * dtype.itemsize].view(dtype)

    def _room_for(self, nbytes: int) -> bool:
        """Whether /dev/shm has ``nbytes`` free on every rank (collective)."""
        try:
            fs = os.statvfs(_SHM_DIR)
            room = fs.f_bavail * fs.f_frsize >= nbytes
        except OSError:
            room = True  # no /dev/shm: the MPI library keeps its windows elsewhere
        everywhere = bool(self._comm.allreduce(int(room), op=MPI.MIN))
        if not everywhere and self._rank == 0:
            sys.stderr.write(
                f"hvdlike: {_SHM_DIR} has less than the {nbytes >> 20} MiB the on-node "
                "shared-memory all-reduce needs; using MPI instead (slower). Give the "
                "container more shared memory (docker run --shm-size=1g) or lower "
                "HVDLIKE_SHM_BUFFER.\n")
        return everywhere

    def _allocate(self, capacity: int, result_bytes: int) -> None:
        self.free()
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")
        win = MPI.Win.Allocate_shared(capacity + result_bytes, 1, info=info, comm=self._comm)
        info.Free()
        win.Lock_all(MPI.MODE_NOCHECK)
        self._slots, self._results = [], []
        for r in range(self._size):
            memory, _ = win.Shared_query(r)
            whole = np.frombuffer(memory, np.uint8)
            self._slots.append(whole[:capacity])
            self._results.append(whole[capacity:capacity + result_bytes])
        self._win, self._capacity = win, capacity
