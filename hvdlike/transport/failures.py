"""Telling a dead rank from other errors (ULFM), and learning which ranks died."""
import time
from typing import Any, List

from mpi4py.MPI import Exception as MPIException

from .cma import PeerGone


def is_process_failure(exc: BaseException, comm: Any) -> bool:
    """True for an error that comes from a dead rank: MPI's (ULFM) own error classes, or any
    MPI error once ``comm`` knows of a failure (Open MPI's non-blocking collectives may report
    one as MPI_ERR_OTHER), or the single-copy all-reduce finding a peer's process gone (the
    peer may have died after its part of MPI's last step had gone out, so MPI said nothing)."""
    if isinstance(exc, PeerGone):
        return True
    if not isinstance(exc, MPIException):
        return False
    from mpi4py import MPI
    codes = {getattr(MPI, n, None) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING",
                                             "ERR_REVOKED")} - {None}
    return exc.Get_error_class() in codes or comm_failed(comm)


def revoke(comms: List[Any]) -> None:
    """Revoke ``comms`` (ULFM), so that ranks blocked in any of them get out; nothing on an MPI
    without ULFM."""
    for comm in comms:
        try:
            comm.Revoke()
        except (MPIException, NotImplementedError):
            pass


def comm_failed(comm: Any) -> bool:
    """Whether ``comm`` is revoked or knows of a dead member (local, about 0.3 µs)."""
    try:
        if comm.Is_revoked():
            return True
        group = comm.Get_failed()
        failed = group.Get_size() > 0
        group.Free()
        return failed
    except (MPIException, NotImplementedError, AttributeError):
        return False


def failed_ranks(comm: Any, wait: float = 0.0) -> List[int]:
    """The ranks of ``comm`` known here to have died (ULFM's MPI_Comm_get_failed); [] if still
    unknown after ``wait`` seconds, or on an MPI without ULFM. A rank told of a death only by
    a peer's revoke learns who died once MPI makes progress (30-65 ms in our runs), so it
    drives MPI's progress while it waits."""
    from mpi4py import MPI
    deadline = time.monotonic() + wait
    while True:
        try:
            comm.Ack_failed()
            group = comm.Get_failed()
            failed = group.Translate_ranks(list(range(group.Get_size())), comm.Get_group())
            group.Free()
        except (MPIException, NotImplementedError, AttributeError):
            return []
        if failed or time.monotonic() >= deadline:
            return sorted(int(r) for r in failed)
        MPI.COMM_SELF.Iprobe()  # a call into MPI: its progress engine hears of the failure
        time.sleep(0.01)
