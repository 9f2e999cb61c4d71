"""Single-copy all-reduce for ranks on one node, through Linux cross-memory attach (CMA).

``process_vm_readv`` / ``process_vm_writev`` copy between this process's memory and another
process's, in the kernel, with no buffer in between. So a rank reads its peers' inputs where
they are and writes its results straight into their outputs:

1. every rank publishes where its inputs and outputs are (one small MPI all-gather, which is
   also the call's first synchronisation: every rank's input is ready);
2. rank r owns chunk r of the (concatenated) data. Piece by piece (so that a piece is still
   in cache when it is used again) it reads the piece from every peer's input, reduces all
   ranks' contributions in rank order into its own output, applies ``finish`` (Average's
   scaling) and writes the result into every peer's output;
3. a one-integer MPI all-reduce tells every rank that every chunk has landed and whether any
   rank's copy failed.

Per rank that is one copy of the peers' data in, one reduction pass and one copy out, with no
shared window and no fusion buffer, against the window's 2.5 copies: at np=2 (2 cores,
scripts/bench_on_node.py) 64 MiB took 11 ms against the window's 18 ms. The kernel pins each
page it copies, which makes this slower than the window below a few MiB (the engine's
HVDLIKE_CMA_THRESHOLD) and on 4 KiB pages slower than on huge ones.
Each chunk is computed by one rank and copied to the others, so every rank gets the same bits,
and in rank order, so they equal a rank-ordered NumPy reduction.

Hierarchical (``across``, the world on several nodes): rank r reduces chunk r over its node
as above, all-reduces it with the ranks of equal local rank on the other nodes (MPI), then
writes it to its node's peers; the shared-memory window's hierarchical path, single-copy.

The kernel allows these calls only where this process may ptrace the peer (same user, and no
Yama restriction or seccomp filter in the way): ``create`` tries a read and a write between
every pair of neighbours and returns None on every rank unless all of them worked, and the
caller then uses the shared-memory window (hierarchical: on every node, so that the nodes'
ranks meet in the same cross-node calls).
"""
import ctypes
import errno
import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..base.reduce_ops import ReduceOp
from ..base.settings import Settings
from .interface import OnNodeTransport
from .segments import PIECE, UFUNCS, Segments

_IOV_MAX = 1024  # iovecs one call may take (Linux's UIO_MAXIOV)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_IovArray = _Iovec * _IOV_MAX


def _bind() -> Optional[Tuple[Any, Any]]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        read, write = libc.process_vm_readv, libc.process_vm_writev
    except (OSError, AttributeError):  # not Linux, or a libc without them
        return None
    for fn in (read, write):
        fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                       ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
        fn.restype = ctypes.c_ssize_t
    return read, write


_CALLS = _bind()

# (address here, address in the peer, bytes)
Span = Tuple[int, int, int]


def _address(a: np.ndarray) -> int:
    """The address of ``a``'s first byte; through ctypes' buffer view where ``a`` is writable
    (a quarter of the time ``a.ctypes.data`` takes, which shows with hundreds of tensors)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))  # type: ignore[arg-type]
    except (TypeError, ValueError):  # read-only, or empty
        return a.ctypes.data


class CopyFailed(OSError):
    """A cross-memory copy to or from a peer failed."""


class PeerGone(CopyFailed):
    """A peer's process no longer exists (ESRCH): a rank of the all-reduce died. The engine
    takes it as a dead rank, as it takes MPI's own errors for one (ULFM)."""


class _Copier:
    """Copies lists of spans to or from one peer process, 1024 spans per system call,
    finishing what a call left partly done."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn
        self._local, self._remote = _IovArray(), _IovArray()

    def __call__(self, pid: int, spans: Sequence[Span]) -> None:
        at = 0
        while at < len(spans):
            batch = spans[at:at + _IOV_MAX]
            total = 0
            for i, (here, there, n) in enumerate(batch):
                self._local[i].base, self._local[i].len = here, n
                self._remote[i].base, self._remote[i].len = there, n
                total += n
            done = self._fn(pid, self._local, len(batch), self._remote, len(batch), 0)
            if done < 0:
                err = ctypes.get_errno()
                raise CopyFailed(err, f"cross-memory copy with process {pid}: "
                                      f"{os.strerror(err)}")
            if done == total:
                at += len(batch)
                continue
            # partly done (the kernel stops at a span's end or a fault): skip what landed
            for here, there, n in batch:
                if done < n:
                    break
                done -= n
                at += 1
            here, there, n = spans[at]
            spans = list(spans[:at]) + [(here + done, there + done, n - done)] + \
                list(spans[at + 1:])


class CrossMemoryAllreduce:
    """Blocking all-reduce over ``comm``, whose ranks all run on this node, through
    cross-memory attach; make one with ``create``. The engine's interface of the
    shared-memory window's reducer (``reserve``, ``allreduce_many``, ``free``).

    ``across``: the communicator of this rank and the ranks of equal local rank on the other
    nodes (every node with the same number of ranks), for a hierarchical all-reduce: rank r
    reduces chunk r over its node, all-reduces it with ``across`` (MPI, over the network),
    then writes it to its node's peers, as the window's hierarchical path does."""

    def __init__(self, comm: Any, pids: Sequence[int], across: Any = None) -> None:
        assert _CALLS is not None
        self._comm = comm
        self.across = across
        if across is not None:
            from .mpi import allreduce  # here: importing it sets MPI's environment defaults
            self._allreduce_across = allreduce
        self._rank, self._size = comm.Get_rank(), comm.Get_size()
        self._pids = list(pids)
        self._read, self._write = _Copier(_CALLS[0]), _Copier(_CALLS[1])
        self._scratch = np.empty((self._size + 1) * PIECE, np.uint8)
        self._chunk = np.empty(0, np.uint8)  # hierarchical: a chunk spread over outputs
        self._flag = np.zeros(1, np.int32)

    @classmethod
    def create(cls, comm: Any, across: Any = None) -> Optional["CrossMemoryAllreduce"]:
        """Collective over ``comm`` (and ``across``): the reducer on every rank when every
        rank can read and write its neighbour's memory (on every node), otherwise None on
        every rank."""
        me, size = comm.Get_rank(), comm.Get_size()
        token = np.frombuffer(os.urandom(8), np.uint64).copy()  # proves the right process
        landing = np.zeros(1, np.uint64)
        mine = np.array([os.getpid(), token.ctypes.data, landing.ctypes.data, token[0]],
                        np.uint64)
        table = np.empty((size, 4), np.uint64)
        comm.Allgather(mine, table)
        nxt, prev = (me + 1) % size, (me - 1) % size
        got = np.zeros(1, np.uint64)
        calls = _CALLS
        ok = calls is not None
        if calls is not None:
            pid = int(table[nxt, 0])
            try:
                _Copier(calls[0])(pid, [(got.ctypes.data, int(table[nxt, 1]), 8)])
                _Copier(calls[1])(pid, [(token.ctypes.data, int(table[nxt, 2]), 8)])
            except CopyFailed:
                ok = False
            ok = ok and got[0] == table[nxt, 3]
        flag = np.array([int(ok)], np.int32)
        comm.Allreduce(MPI.IN_PLACE, flag, MPI.MIN)  # every write has landed, too
        flag[0] = int(bool(flag[0]) and landing[0] == table[prev, 3])
        comm.Allreduce(MPI.IN_PLACE, flag, MPI.MIN)
        if across is not None:  # every node takes this path, or none: they meet in across
            across.Allreduce(MPI.IN_PLACE, flag, MPI.MIN)
        if not flag[0]:
            return None
        return cls(comm, [int(p) for p in table[:, 0]], across)

    @property
    def activity(self) -> str:
        return "CMA_ALLREDUCE" if self.across is None else "HIERARCHICAL_ALLREDUCE"

    def reserve(self, nbytes: int) -> bool:
        """Always room: nothing is allocated."""
        return True

    def allreduce_many(self, sends: Sequence[np.ndarray], recvs: Sequence[np.ndarray],
                       op: ReduceOp, finish: Optional[Callable[[np.ndarray], None]] = None) -> None:
        """Reduce a list of arrays as if they were one concatenated array, from ``sends``
        straight into ``recvs`` on every rank. ``sends[i]`` and ``recvs[i]`` are C-contiguous,
        of one dtype for all i, the same size, and may be the same array (in place); every
        rank passes the same sizes. ``finish``: an element-wise in-place pass applied to each
        reduced piece before it is sent. Raises ``CopyFailed`` on every rank when a copy (or
        anything else in the reduction) failed on any, ``PeerGone`` when a peer's process
        was gone (a rank died after its part of this call's last step had gone out: the
        others may see MPI's error for the death instead)."""
        data = Segments([s.reshape(-1) for s in sends])
        out = Segments([r.reshape(-1) for r in recvs])
        if out.size == 0:
            return
        where = np.array([_address(a) for a in data.arrays + out.arrays], np.uint64)
        table = np.empty((self._size, where.size), np.uint64)
        self._comm.Allgather(where, table)
        q, extra = divmod(out.size, self._size)  # this rank's chunk: elements [lo, hi)
        lo = self._rank * q + min(self._rank, extra)
        hi = lo + q + (1 if self._rank < extra else 0)
        failure: Optional[Exception] = None
        try:  # a peer died, the kernel refused, a bug: every rank must hear of it below
            self._reduce_pieces(data, out, table, op, lo, hi,
                                None if self.across is not None else finish)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            failure = e
        if self.across is not None:  # this node's sum of chunk r, summed over the nodes
            spans = list(out.spans(lo, hi, base=lo))
            chunk = self._gather(out, spans, hi - lo)
            # even after a failure: the ranks of this local rank on other nodes wait for it
            self._allreduce_across(self.across, None, chunk, op)
            if failure is None:
                try:
                    if finish is not None:
                        finish(chunk)
                    if len(spans) > 1:  # else chunk is a view of the output
                        for i, s, stop, at in spans:
                            out.arrays[i][s:stop] = chunk[at:at + stop - s]
                    self._send(table, out, spans)
                except Exception as e:  # noqa: BLE001 - reported on every rank below
                    failure = e
        # the worst outcome of any rank: 0 done, 1 failed, 2 a peer's process is gone
        gone = isinstance(failure, CopyFailed) and failure.errno == errno.ESRCH
        self._flag[0] = 0 if failure is None else 2 if gone else 1
        self._comm.Allreduce(MPI.IN_PLACE, self._flag, MPI.MAX)
        if self.across is not None:  # every node's outcome, on every node
            self.across.Allreduce(MPI.IN_PLACE, self._flag, MPI.MAX)
        if self._flag[0] == 2:  # a rank died after its part of the outcome had gone out
            raise PeerGone(
                errno.ESRCH,
                "the on-node single-copy all-reduce lost a peer: a rank's process is gone "
                f"({'seen on this rank: ' + str(failure) if gone else 'seen on another rank'})"
            ) from failure
        if self._flag[0]:
            raise CopyFailed(
                getattr(failure, "errno", None) or 0,
                "the on-node single-copy all-reduce (cross-memory attach) failed on "
                f"{'this' if failure else 'another'} rank"
                f"{': ' + str(failure) if failure else ''}; set HVDLIKE_CMA=0 to use the "
                "shared-memory window instead") from failure

    def free(self) -> None:
        """Nothing to release."""

    # ------------------------------------------------------------------ internals

    def _reduce_pieces(self, data: Segments, out: Segments, table: np.ndarray,
                       op: ReduceOp, lo: int, hi: int,
                       finish: Optional[Callable[[np.ndarray], None]]) -> None:
        """Reduce elements [lo, hi) over this node's ranks into this rank's outputs, piece by
        piece; unless hierarchical, finish each piece and write it into the peers' outputs."""
        me, size, dtype, ufunc = self._rank, self._size, out.dtype, UFUNCS[op]
        item = dtype.itemsize
        piece = max(1, PIECE // item)
        scratch = self._scratch
        base = scratch.ctypes.data
        slots = [scratch[p * PIECE:(p + 1) * PIECE].view(dtype) for p in range(size + 1)]
        for a in range(lo, hi, piece):
            b = min(a + piece, hi)
            spans = list(data.spans(a, b, base=a))  # (array, start, stop, offset in piece)
            # every peer's part of this piece, into its scratch slot
            for p in range(size):
                if p != me:
                    slot = base + p * PIECE
                    self._read(self._pids[p], [
                        (slot + at * item, int(table[p, i]) + s * item, (e - s) * item)
                        for i, s, e, at in spans])
            for i, s, e, at in spans:
                dst = out.arrays[i][s:e]
                own = data.arrays[i][s:e]
                if me >= 2 and np.may_share_memory(own, dst):  # in place: keep it for later
                    kept = slots[size][at:at + e - s]
                    kept[...] = own
                    own = kept
                sources = [own if p == me else slots[p][at:at + e - s] for p in range(size)]
                ufunc(sources[0], sources[1], out=dst)
                for src in sources[2:]:
                    ufunc(dst, src, out=dst)
                if finish is not None:
                    finish(dst)
            if self.across is None:
                self._send(table, out, spans)

    def _gather(self, out: Segments, spans: List[Tuple[int, int, int, int]],
                n: int) -> np.ndarray:
        """The ``n`` output elements of ``spans`` as one contiguous array: a view when they
        lie in one output, else a copy in a buffer reused from call to call."""
        if len(spans) == 1:
            i, s, e, _ = spans[0]
            return out.arrays[i][s:e]
        if self._chunk.nbytes < n * out.itemsize:
            self._chunk = np.empty(n * out.itemsize, np.uint8)
        chunk = self._chunk[:n * out.itemsize].view(out.dtype)
        for i, s, e, at in spans:
            chunk[at:at + e - s] = out.arrays[i][s:e]
        return chunk

    def _send(self, table: np.ndarray, out: Segments,
              spans: List[Tuple[int, int, int, int]]) -> None:
        """Write ``spans`` of this rank's outputs into every peer's outputs."""
        arrays, item = len(out.arrays), out.itemsize
        mine = table[self._rank, arrays:]
        for p in range(self._size):
            if p != self._rank:
                self._write(self._pids[p], [
                    (int(mine[i]) + s * item, int(table[p, arrays + i]) + s * item,
                     (e - s) * item)
                    for i, s, e, _ in spans])


def _build(comm: Any, across: Any, settings: Settings) -> Optional[CrossMemoryAllreduce]:
    return None if settings.cma == "0" else CrossMemoryAllreduce.create(comm, across)


TRANSPORT = OnNodeTransport(
    name="cma", build=_build, threshold=lambda s: s.cma_threshold,
    # HVDLIKE_CMA=auto, on one node: single copy or the shared-memory window
    timed=lambda s, by_node: not by_node and s.cma == "auto",
    choice_names=("single copy", "window"), self_first=True)
