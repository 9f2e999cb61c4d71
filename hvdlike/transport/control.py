"""The engine's control communicator: each round's AND all-reduce of the negotiation vector
(a persistent collective where the MPI has them: MPI-4's ``MPI_Allreduce_init``), and the few
other collectives a round may need (``interface.RoundNet``). Data never moves here:
collectives' data go over the process sets' communicators."""
import time
from typing import Any, List

import numpy as np
from mpi4py import MPI

from .failures import comm_failed

_SPIN_SECONDS = 50e-6  # busy-test an exchange this long before sleeping between tests
_MAX_SLEEP = 200e-6


class Control:
    def __init__(self, world: Any, contribution: np.ndarray, reduced: np.ndarray,
                 stall: Any) -> None:
        self.comm = world.Dup()
        self._stall = stall
        self._contribution, self._reduced = contribution, reduced
        self._min = np.zeros(2, np.int64)
        try:
            self._persistent: Any = self.comm.Allreduce_init(contribution, reduced, MPI.BAND)
        except (NotImplementedError, AttributeError, MPI.Exception):
            self._persistent = None

    def exchange(self) -> np.ndarray:
        """The round's all-reduce of this rank's contribution; returns the reduced vector.
        Tests it briefly, then sleeps between tests (other threads get the interpreter),
        warning (and, past the stall shutdown time, exiting) when some rank never answers, and
        raising when ULFM says a rank died."""
        if self._persistent is not None:
            request = self._persistent
            request.Start()
        else:
            request = self.comm.Iallreduce(self._contribution, self._reduced, MPI.BAND)
        start = time.perf_counter()
        while not request.Test():
            if time.perf_counter() - start > _SPIN_SECONDS:
                self._wait(request, start)
                break
        return self._reduced

    def _wait(self, request: Any, start: float) -> None:
        sleep, warned, check = 20e-6, False, start + self._stall.first_check
        while not request.Test():
            time.sleep(sleep)
            sleep = min(2 * sleep, _MAX_SLEEP)
            now = time.perf_counter()
            if now >= check:  # no answer from some rank for a long time
                warned = self._stall.exchange_waited(now - start, warned)
                check = now + self._stall.interval
            if comm_failed(self.comm):  # ULFM: a rank died; do not wait on
                raise MPI.Exception(MPI.ERR_PROC_FAILED)

    # ------------------------------------------------------------------ interface.RoundNet

    def band(self, vector: np.ndarray) -> np.ndarray:
        out = np.empty_like(vector)
        self.comm.Allreduce(vector, out, MPI.BAND)
        return out

    def min(self, value: int) -> int:
        self._min[0] = value
        self.comm.Allreduce(self._min[:1], self._min[1:], MPI.MIN)
        return int(self._min[1])

    def bcast(self, obj: object, root: int) -> object:
        return self.comm.bcast(obj, root)

    def allgather(self, obj: object) -> List[object]:
        return self.comm.allgather(obj)

    def allgather_rows(self, row: np.ndarray) -> np.ndarray:
        rows = np.empty((self.comm.Get_size(), row.size), row.dtype)
        self.comm.Allgather(np.ascontiguousarray(row), rows)
        return rows

    # ------------------------------------------------------------------ the end

    def end_in_flight(self) -> None:
        """After a revoke (ranks died): end the exchange in flight, so that MPI_Finalize has
        nothing left to wait for."""
        if self._persistent is not None:
            try:
                self._persistent.Wait()
            except MPI.Exception:
                pass

    def free(self, failed: bool) -> None:
        if self._persistent is not None:
            self._persistent.Free()
        if not failed:  # revoked communicators have nothing to free together
            self.comm.Free()
