"""Under ULFM, tell the other ranks that a rank ends the job on purpose.

With ``--with-ft ulfm`` a rank that leaves after an uncaught exception looks to the others
like a rank that crashed, and ``hvdlike.elastic.run`` recovers from it: the survivors go on
without it, and under ``hvdlikerun --max-np`` new processes start in its place. When the
exception is a bug that every rank hits (a reset callback that raises, say), the new
processes hit it again and the job never ends: MPI_Abort ends the job it was called in,
not the processes an elastic reset spawned.

So every rank keeps a receive posted on a communicator of its own for a notice, and the
abort hook sends one to every other rank (synchronous sends, waited for a moment) before
the rank leaves. ``elastic.run`` asks ``sender()`` before it recovers: a rank that sent a
notice ended the job, and the survivors end too instead of recovering.
"""
import time
from typing import Any, List, Optional

import numpy as np

_TAG = 7


class AbortNotice:
    """The posted receive for a notice on a duplicate of ``world`` (collective)."""

    def __init__(self, mpi: Any, world: Any) -> None:
        self._mpi = mpi
        self._comm = world.Dup()
        self._rank, self._size = world.Get_rank(), world.Get_size()
        self._got = np.full(1, -1, np.int64)
        self._request = self._comm.Irecv([self._got, mpi.INT64_T], source=mpi.ANY_SOURCE,
                                         tag=_TAG)

    def send(self, seconds: float = 2.0) -> None:
        """Send the notice to every other rank and wait up to ``seconds`` for them to have
        it (a rank inside an MPI call takes it at once; one computing takes it at its next
        MPI call, which then also learns that this rank is gone)."""
        mine = np.array([self._rank], np.int64)
        sends: List[Any] = []
        for peer in range(self._size):
            if peer != self._rank:
                try:
                    sends.append(self._comm.Issend([mine, self._mpi.INT64_T], peer, _TAG))
                except self._mpi.Exception:  # that rank is dead already
                    pass
        deadline = time.monotonic() + seconds
        while sends and time.monotonic() < deadline:
            sends = [s for s in sends if not _done(self._mpi, s)]
            time.sleep(0.001)

    def sender(self, seconds: float = 0.5) -> Optional[int]:
        """The rank that sent a notice, or None when none came within ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                if self._request.Test():
                    return int(self._got[0])
            except self._mpi.Exception:  # ULFM: a failed rank might have sent to this receive
                try:
                    self._comm.Ack_failed()  # count it as seen, then look again
                except self._mpi.Exception:
                    return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

    def free(self) -> None:
        """Cancel the receive and free the communicator (collective)."""
        try:
            self._request.Cancel()
            self._request.Wait()
            self._comm.Free()
        except self._mpi.Exception:  # ranks died: left to MPI_Finalize, as the world's are
            pass


def _done(mpi: Any, request: Any) -> bool:
    try:
        return bool(request.Test())
    except mpi.Exception:  # the peer died: nothing to wait for
        return True
