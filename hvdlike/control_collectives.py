"""The collectives that move no arrays: barrier, join, ``exclusive_mpi``, and the object
collectives (``broadcast_object``, ``allgather_object``)."""
import contextlib
import pickle
from typing import Any, Iterator, List, Optional, Tuple

from . import runtime
from .base.tracebacks import short
from .engine import checks
from .engine.checks import Kind, Request
from .process_sets import ProcessSet, global_process_set
from .submission import root, root_error, submit


@short
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank of ``process_set`` has called barrier."""
    submit(process_set, Request(Kind.BARRIER, None, None, None), None, None, True)


@contextlib.contextmanager
def exclusive_mpi() -> Iterator[None]:
    """A block in which your thread is the only one of this process in MPI: hvdlike's engine
    makes no MPI call from its start to its end. Collective: every rank enters it (in the same
    order as its other collectives; all engines stop in the same round) and leaves it.

    For MPI calls of your own next to hvdlike (mpi4py on your own communicators): Open MPI 5
    over TCP can hang when two threads of a process are in MPI at once (docs/multinode.md).
    Inside the block hvdlike's collectives raise, and so does waiting on a request that has
    not run yet. Leaving does not wait for the other ranks: this rank's engine goes on, and
    its next round waits for theirs (a rank that never leaves is what the stall inspector
    reports).
    """
    engine = runtime.state("hvdlike.exclusive_mpi()").engine
    submit(global_process_set, Request(Kind.EXCLUSIVE_MPI, "hvdlike.exclusive_mpi", None, None),
           None, engine.pause, True)
    try:
        yield
    finally:
        engine.resume()


@short
def join() -> int:
    """Declare that this rank has no more data (uneven inputs). Global process set only.

    Until every rank has joined, this rank takes part in the other ranks' allreduce and
    grouped_allreduce requests (Sum, Average or Adasum only) with zeros; Average still divides
    by the full size, and Adasum leaves zeros out. Returns, on every rank, the rank that
    joined last (the highest if several joined in the same round).
    """
    st = runtime.state("hvdlike.join()")
    return st.engine.submit(Request(Kind.JOIN, "hvdlike.join", None, None), None, None,
                            global_process_set, wake=False).synchronize()


def _pickled(obj: Any, what: str) -> Tuple[Optional[bytes], Optional[checks.LocalError]]:
    """``obj`` pickled here, before it is submitted, so that an object that cannot be pickled
    is an error every rank raises instead of a failure inside the transfer."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), None
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the caller's input
        return None, ("TypeError", f"hvdlike.{what}: the object on rank {runtime.rank()} "
                                   f"cannot be pickled ({type(exc).__name__}: {exc}); pass "
                                   "something picklable, e.g. convert it to plain data first")


@short
def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Every rank gets (an unpickled copy of) the root's picklable ``obj``."""
    request = Request(Kind.BROADCAST_OBJECT, name, None, None, None, root(root_rank))
    error = root_error(root_rank, process_set)
    payload = None
    if error is None and root_rank == runtime.rank():
        payload, error = _pickled(obj, "broadcast_object")
    return submit(process_set, request, error, payload, True)


@short
def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Every rank gets the list of every rank's picklable ``obj``, in rank order."""
    payload, error = _pickled(obj, "allgather_object")
    return submit(process_set, Request(Kind.ALLGATHER_OBJECT, name, None, None), error,
                  payload, True)
