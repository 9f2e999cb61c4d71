"""hvdlike.exclusive_mpi(): inside the block the engine makes no MPI call, so the program's
own MPI calls have the process to themselves; hvdlike's collectives raise there; afterwards
everything works as before."""
import time
from typing import Any, Dict

import numpy as np
from mpi4py import MPI

import hvdlike as hvd


def own_mpi_inside_the_block(idle: float) -> Dict[str, Any]:
    """Collectives, then the program's own MPI calls inside the block (the engine stays out of
    MPI: its round count does not move while it idles ``idle`` seconds there), then
    collectives again."""
    from hvdlike import runtime

    rank, size = hvd.rank(), hvd.size()
    engine = runtime.state().engine
    before = hvd.allreduce(np.full(3, rank + 1.0), op=hvd.Sum, name="before").tolist()
    mine = MPI.COMM_WORLD.Dup()
    with hvd.exclusive_mpi():
        rounds = engine._round_no
        own = mine.allreduce(rank + 1)
        mine.Barrier()
        time.sleep(idle)  # the engine would run idle rounds about every 10 ms
        try:
            hvd.allreduce(np.ones(2), name="inside")
            inside_error = None
        except RuntimeError as exc:
            inside_error = str(exc)
        rounds_inside = engine._round_no - rounds
    mine.Free()
    after = [hvd.allreduce(np.full(2, float(rank)), op=hvd.Sum, name=f"after{i}").tolist()
             for i in range(3)]
    return dict(before=before, own=own, rounds_inside=rounds_inside, inside_error=inside_error,
                after=after, size=size)


def pending_request_across_the_block() -> Dict[str, Any]:
    """Rank 0 submits "x" before the block, the others after it: inside the block rank 0's
    wait on "x" raises (it cannot run there), after it "x" completes on every rank."""
    rank = hvd.rank()
    handle = hvd.allreduce_async(np.full(2, rank + 1.0), op=hvd.Sum, name="x") if rank == 0 \
        else None
    waited_inside = None
    with hvd.exclusive_mpi():
        if handle is not None:
            try:
                handle.synchronize()
            except RuntimeError as exc:
                waited_inside = str(exc)
    if handle is None:
        handle = hvd.allreduce_async(np.full(2, rank + 1.0), op=hvd.Sum, name="x")
    return dict(waited_inside=waited_inside, x=handle.synchronize().tolist())


def ranks_leave_at_different_times() -> Dict[str, Any]:
    """Rank r stays in the block 0.1 r s: the ranks that leave first go on into a collective,
    which completes once the last rank is out."""
    rank = hvd.rank()
    with hvd.exclusive_mpi():
        time.sleep(0.1 * rank)
    return dict(after=hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum, name="after").tolist())


def raising_inside_the_block() -> Dict[str, Any]:
    """The block raises on every rank and the program catches it: the engine runs again."""
    rank = hvd.rank()
    try:
        with hvd.exclusive_mpi():
            raise KeyError("inside")
    except KeyError:
        pass
    hvd.barrier()
    return dict(after=hvd.allreduce(np.full(2, float(rank)), op=hvd.Sum).tolist(),
                again=_twice())


def _twice() -> int:
    """Two blocks in a row, with a collective between them."""
    for _ in range(2):
        with hvd.exclusive_mpi():
            MPI.COMM_WORLD.Barrier()
        hvd.barrier()
    return 2
