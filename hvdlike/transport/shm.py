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

Hierarchical all-reduce, for ranks on several nodes (``across``): ``comm`` holds this node's
ranks and ``across`` the ranks of equal local rank on every node. Between steps 2 and 3, rank
r all-reduces its reduced chunk r with ``across`` (MPI, over the network), so each node sends
1/local_size of the data per rank and all of it once per node, the two-level minimum; the
node's ranks then copy every chunk as in step 3. Every node must have the same number of
ranks, so that chunk r has the same size on each of them.
"""
import os
import sys
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
from mpi4py import MPI

from ..base.reduce_ops import ReduceOp
from ..base.settings import Settings
from .interface import OnNodeTransport
from .segments import PIECE, UFUNCS, Segments, pieces

_ALIGN = 64
_MIN_WINDOW = 4 << 20
_SHM_DIR = "/dev/shm"


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class SharedMemoryAllreduce:
    """Blocking all-reduce over ``comm``, whose ranks must all share memory (one node).

    ``max_bytes``: the most input bytes reduced per round; larger inputs take several.
    ``across``: the communicator of this rank and the ranks of equal local rank on the other
    nodes, for a hierarchical all-reduce over ``comm``'s node and ``across``'s nodes together.
    Every rank must call ``reserve``, ``allreduce`` and ``free`` together, as with any
    collective (of both communicators, when hierarchical).
    """

    def __init__(self, comm: Any, max_bytes: int, across: Any = None) -> None:
        self._comm = comm
        self.across = across
        if across is not None:
            from .mpi import allreduce  # here: importing it sets MPI's environment defaults
            self._allreduce_across = allreduce
        self._rank, self._size = comm.Get_rank(), comm.Get_size()
        self._max_bytes = max(_round_up(max_bytes, _ALIGN), _ALIGN)
        self._capacity = 0  # input bytes one round can take
        self._win: Optional[MPI.Win] = None
        self._no_room = False  # /dev/shm was too small once: stay on MPI from then on
        self._slots: List[np.ndarray] = []    # per rank: chunks of its input, at their offsets
        self._results: List[np.ndarray] = []  # per rank: the reduced chunk it owns

    @property
    def activity(self) -> str:
        return "SHM_ALLREDUCE" if self.across is None else "HIERARCHICAL_ALLREDUCE"

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
        rank; see ``allreduce_many``."""
        self.allreduce_many([recv if send is None else send], [recv], op, finish)

    def allreduce_many(self, sends: Sequence[np.ndarray], recvs: Sequence[np.ndarray],
                       op: ReduceOp, finish: Optional[Callable[[np.ndarray], None]] = None) -> None:
        """Reduce a list of arrays as if they were one concatenated array, reading straight
        from ``sends`` and writing straight into ``recvs`` (no fusion buffer). ``sends[i]``
        and ``recvs[i]`` are C-contiguous, of one dtype for all i, the same size, and may be
        the same array (in place); every rank passes the same sizes and ``reserve`` of their
        total bytes returned True. ``finish``, an element-wise in-place pass (Average's
        scaling), is applied to each reduced piece while it is still in cache."""
        data = Segments([s.reshape(-1) for s in sends])
        out = Segments([r.reshape(-1) for r in recvs])
        if out.size == 0:
            return
        step = max(1, min(self._capacity, out.size * out.itemsize) // out.itemsize)
        for start in range(0, out.size, step):
            self._round(data, out, start, min(start + step, out.size), op, finish)

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

    def _round(self, data: "Segments", out: "Segments", lo: int, hi: int,
               op: ReduceOp, finish: Optional[Callable[[np.ndarray], None]]) -> None:
        """Reduce elements [lo, hi) of the concatenation (at most one window's worth)."""
        n, dtype, me, ufunc = hi - lo, out.dtype, self._rank, UFUNCS[op]
        nbytes = n * dtype.itemsize
        slot = self._slots[me][:nbytes].view(dtype)
        for j in range(self._size):
            if j != me:
                part = self._chunk(n, j)
                data.read(lo + part.start, lo + part.stop, slot[part])
        self._sync()
        mine = self._chunk(n, me)
        peers = [None if p == me else self._slots[p][:nbytes].view(dtype)
                 for p in range(self._size)]
        result = self._results[me][:(mine.stop - mine.start) * dtype.itemsize].view(dtype)
        piece = max(1, PIECE // dtype.itemsize)
        for a, b in pieces(mine.start, mine.stop, piece):
            for i, s, e, at in data.spans(lo + a, lo + b, base=lo):
                # [s, e) of array i holds elements [at, at + e - s) of this round
                own = data.arrays[i][s:e]
                sources = [own if src is None else src[at:at + e - s] for src in peers]
                dst = result[at - mine.start:at - mine.start + e - s]
                ufunc(sources[0], sources[1], out=dst)
                for src in sources[2:]:
                    ufunc(dst, src, out=dst)
                if self.across is None:
                    if finish is not None:
                        finish(dst)
                    out.arrays[i][s:e] = dst
        if self.across is not None:  # this node's sum of chunk r, summed over the nodes
            self._allreduce_across(self.across, None, result, op)
            if finish is not None:
                finish(result)
            out.write(lo + mine.start, lo + mine.stop, result)
        self._sync()
        for j in range(self._size):
            if j != me:
                part = self._chunk(n, j)
                chunk = self._results[j][:(part.stop - part.start) * dtype.itemsize].view(dtype)
                out.write(lo + part.start, lo + part.stop, chunk)

    def _room_for(self, nbytes: int) -> bool:
        """Whether /dev/shm has ``nbytes`` free on every rank (collective)."""
        try:
            fs = os.statvfs(_SHM_DIR)
            room = fs.f_bavail * fs.f_frsize >= nbytes
        except OSError:
            room = True  # no /dev/shm: the MPI library keeps its windows elsewhere
        everywhere = bool(self._comm.allreduce(int(room), op=MPI.MIN))
        if self.across is not None:  # every node must choose this transport, or none
            everywhere = bool(self.across.allreduce(int(everywhere), op=MPI.MIN))
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
            whole = np.frombuffer(memory, np.uint8)  # type: ignore[call-overload]
            self._slots.append(whole[:capacity])
            self._results.append(whole[capacity:capacity + result_bytes])
        self._win, self._capacity = win, capacity


def _build(comm: Any, across: Any, settings: Settings) -> Optional[SharedMemoryAllreduce]:
    return SharedMemoryAllreduce(comm, settings.shm_buffer, across)


TRANSPORT = OnNodeTransport(
    name="shm", build=_build, threshold=lambda s: s.shm_threshold,
    # HVDLIKE_HIERARCHICAL_ALLREDUCE=auto, on several nodes: flat MPI or node by node
    timed=lambda s, by_node: by_node and s.hierarchical_allreduce == "auto",
    choice_names=("flat", "hierarchical"), self_first=False)
