"""How a rank ends when something went wrong: an uncaught exception aborts the whole job
(``install_abort_hook``), and a rank that saw ranks die finalizes MPI with a deadline at exit,
since Open MPI then does not always return (ULFM)."""
import atexit
import os
import sys
import time
from typing import TYPE_CHECKING, Any, List

from ..base import death_notice

if TYPE_CHECKING:
    from . import State

_QUIET_ABORT_DELAY = 3.0  # seconds


_finalize_registered: List[bool] = []


def install_abort_hook(st: "State") -> None:
    previous = sys.excepthook
    # after an elastic reset MPI_COMM_WORLD holds dead ranks (a replacement: only itself)
    world = st.world if _finalize_registered else st.mpi.COMM_WORLD

    def abort_job(etype: Any, value: Any, tb: Any) -> None:
        if getattr(value, "hvdlike_quiet", False):
            # Raised on every rank of a collective; the set's first rank prints it and aborts.
            # Abort here too after a grace period, in case that rank is not going to.
            time.sleep(_QUIET_ABORT_DELAY)
            end_job(world)
        previous(etype, value, tb)
        sys.stderr.write(
            f"hvdlike: rank {st.rank} of {st.size} raised an uncaught {etype.__name__}; "
            "ending the whole job (MPI_Abort) so the other ranks do not hang "
            "(opt out: hvdlike.init(abort_on_exception=False) or HVDLIKE_ABORT_ON_EXCEPTION=0)\n")
        sys.stderr.flush()
        sys.stdout.flush()
        if st.abort_notice is not None:  # ULFM: so that elastic.run does not recover from it
            st.abort_notice.send()
        if st.engine is not None and st.engine.failure is not None:
            # Ranks died under ULFM: Open MPI 5's prterun deadlocked now and then when the
            # survivors called MPI_Abort, so exit instead; the first exit ends the job. A rank
            # that could not learn which ranks died (engine.failures.failed_ranks) waits a moment, so
            # that one that could is heard first.
            if not st.engine.failure.failed:
                time.sleep(1.0)
            death_notice.quiet(ending=True)
            os._exit(1)
        end_job(world)

    st.previous_excepthook = previous
    sys.excepthook = abort_job


def end_job(world: Any) -> None:
    """End the whole job: MPI_Abort, with a way out if it does not return. Under ULFM
    (``--with-ft ulfm``) the rank exits with status 1 instead, which ends the job there just as
    well (only a death by signal is survived): Open MPI 5's prterun deadlocked when two ranks
    called MPI_Abort at about the same time (every rank raising the same error), with every
    rank gone and SIGTERM ignored (``scripts/repro_ulfm_abort.py``: 6 jobs in 15 hung; with exits
    instead, none)."""
    death_notice.quiet(ending=True)  # this rank says why it ends
    if ulfm():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    _exit_soon()
    world.Abort(1)


def finalize_with_deadline_at_exit() -> None:
    """Once ranks have died under ULFM: at exit, shut down and finalize MPI with a deadline
    (``_finalize_with_deadline``), whether or not an elastic reset follows. A script that
    catches the error itself and returns otherwise ended in mpi4py's MPI_Finalize, which
    now and then never returned (1 job in about 16 here)."""
    if not _finalize_registered:
        atexit.register(_finalize_with_deadline)
        _finalize_registered.append(True)


def _finalize_with_deadline(seconds: float = 10.0) -> None:
    """At exit of a rank that saw ranks die (or was started in place of one): shut hvdlike
    down, then MPI_Finalize, leaving after ``seconds`` if it has not returned. Open MPI 5's
    finalize waits on a fence with every process of the job, and after a death it now and
    then never returns; the status is then 1 if an uncaught exception ended the program,
    else 0. The deadline covers hvdlike's shutdown too (it frees communicators of the
    world)."""
    sys.stdout.flush()
    sys.stderr.flush()
    status = 1 if hasattr(sys, "last_type") else 0
    _exit_soon(seconds, status, "MPI_Finalize after ranks died")
    from . import shutdown
    shutdown()
    from mpi4py import MPI
    if not MPI.Is_finalized():
        _finalize_without_gil(MPI)


def _finalize_without_gil(mpi: Any) -> None:
    """MPI_Finalize through ctypes, which lets go of the GIL while it runs: mpi4py's Finalize
    keeps it, and the deadline's timer thread could then never run."""
    import ctypes
    try:
        with open("/proc/self/maps") as maps:  # Linux: where the MPI library was loaded from
            paths = [line.split()[-1] for line in maps if "/libmpi.so" in line]
    except OSError:
        paths = []
    if not paths:
        mpi.Finalize()
        return
    ctypes.CDLL(paths[0]).MPI_Finalize()


def _exit_soon(seconds: float = 3.0, status: int = 1, what: str = "MPI_Abort") -> None:
    """Exit with ``status`` after ``seconds`` in case MPI does not end or return (MPI_Abort
    or MPI_Finalize under ULFM once ranks have died), saying so on stderr."""
    import threading

    def leave() -> None:
        os.write(2, f"hvdlike: {what} had not returned after {seconds:g} s; this rank exits "
                    f"with status {status}\n".encode())
        os._exit(status)

    timer = threading.Timer(seconds, leave)
    timer.daemon = True
    timer.start()


def ulfm() -> bool:
    """Whether the job runs with ULFM (``--with-ft ulfm``: a dead rank does not end it)."""
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes")
