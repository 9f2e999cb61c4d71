"""Elastic training on plain MPI (ULFM): after ranks died, the survivors build a new world,
with new processes in place of the dead where MPI can start them, and start hvdlike on it."""
import os
import sys
from types import ModuleType
from typing import Any, List, Tuple

from ..base import log
from ..engine import timeline
from . import forget_world, init, state
from .ending import finalize_with_deadline_at_exit
from .recovery_deadline import DEFAULT_SECONDS, RecoveryDeadline


def shrink_after_failure(min_size: int = 1, max_size: int = 0,
                         deadline: float = DEFAULT_SECONDS) -> List[int]:
    """After ranks died (``failure()`` is set): build a new world of the survivors and start
    hvdlike on it. Collective over the survivors. Returns the old world ranks that died.

    With ``max_size``, new processes (the same command line, ``MPI_Comm_spawn``) replace the
    dead up to ``min(max_size, old size)`` ranks; they join after the survivors. When MPI
    cannot start them (no free slots) the survivors go on alone. The old world's
    communicators are revoked; nothing is freed together on them (a dead rank cannot take
    part). Process sets other than the global one are dropped: register them again, with the
    new ranks, in a reset callback. Raises RuntimeError on every rank when fewer than
    ``min_size`` ranks are left. A rank still in it after ``deadline`` seconds (0: none)
    exits with status 1, saying where it was (``recovery_deadline``).

    Lost ranks that make up whole hosts may be alive on the other side of a lost link, and
    have shrunk to a world of their own: then only the side that holds a majority of the old
    world goes on, at a tie the side that holds its rank 0 (``goes_on``); the other side's
    ranks exit, with status 0 (under ULFM a rank's non-zero status ends the whole job), its
    rank 0 saying why.
    """
    st = state("hvdlike.elastic reset")
    error = st.engine.failure
    if error is None:
        raise RuntimeError("hvdlike: no ranks have failed; there is nothing to recover from")
    old_rank, old_size, lost_before = st.rank, st.size, st.lost
    recovery = RecoveryDeadline(f"rank {old_rank} of {old_size}", deadline)
    try:
        failed, world, survivors = _rebuild(st, error, max_size, min_size, recovery)
        recovery.step("starting hvdlike on the new world (collectives over it)")
        try:
            init(comm=world)
        finally:
            if world is not survivors:
                world.Free()
            survivors.Free()
    finally:
        recovery.done()
    new = state()
    new.lost = lost_before + len(failed)
    if new.rank == 0:
        k = old_size - len(failed)
        joined = {0: "", 1: f", and a new rank joined as rank {k}"}.get(
            new.size - k, f", and {new.size - k} new ranks joined as ranks {k}..{new.size - 1}")
        log.logger.warning(f"elastic: ranks {failed} of {old_size} died; {k} ranks go on, "
                           f"renumbered 0..{k - 1} in their old order{joined}")
    log.logger.info(f"elastic: this rank was {old_rank} and is now {new.rank}")
    if new.size < min_size:
        too_few = RuntimeError(
            f"hvdlike.elastic: only {new.size} ranks are left after ranks {failed} died, "
            f"fewer than the minimum of {min_size} (hvdlikerun --min-np); the job ends")
        # rank 0 says it
        too_few.hvdlike_quiet = new.rank != 0  # type: ignore[attr-defined]
        raise too_few
    return failed


def _rebuild(st: Any, error: Any, max_size: int, min_size: int,
             recovery: RecoveryDeadline) -> Tuple[List[int], Any, Any]:
    """The world of the survivors (and of new processes in place of the dead): the ranks
    that died, the new world, the survivors' communicator."""
    recovery.step("stopping the failed engine")
    st.engine.stop()
    timeline.stop_timeline()
    recovery.step("MPI_Comm_shrink (the survivors' communicator)")
    survivors = st.world.Shrink()
    log.logger.debug(f"elastic: shrunk to {survivors.Get_size()} ranks")
    if st.previous_excepthook is not None:
        sys.excepthook = st.previous_excepthook
    old_rank, old_size = st.rank, st.size  # forget_world() clears them
    forget_world()
    finalize_with_deadline_at_exit()
    recovery.step("gathering the survivors' old ranks")
    kept = survivors.allgather(old_rank)
    failed = sorted(set(range(old_size)) - set(kept))
    error.failed[:] = failed
    if not goes_on(kept, old_size, st.node_of_rank):
        if survivors.Get_rank() == 0:
            log.logger.warning(
                f"elastic: ranks {kept} of {old_size} lost touch with ranks {failed}, which "
                "make up whole hosts: those may be alive on the other side of a lost link. "
                f"The side with a majority of the {old_size} ranks (at a tie, the side with "
                "rank 0) goes on; this side holds neither: its ranks exit (status 0, so that "
                "the MPI does not end the side that goes on)")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    world = survivors
    wanted = min(max_size, old_size) - len(kept)
    if wanted > 0 and len(kept) + wanted >= min_size:  # else the job ends below: start none
        recovery.step(f"MPI_Comm_spawn of {wanted} new rank(s) and the merge with them")
        world = _spawn_replacements(st.mpi, survivors, wanted)
    return failed, world, survivors


def goes_on(kept: List[int], size: int, node_of_rank: List[int]) -> bool:
    """Whether the survivors ``kept`` (old world ranks) of a world of ``size`` go on. Ranks
    lost from a host where a survivor lives died (a link is lost by a whole host); when every
    lost rank's host lost all its ranks, the lost ones may be a live side of a split network,
    and only a majority, or half of the world with its rank 0, goes on."""
    lost = set(range(size)) - set(kept)
    kept_nodes = {node_of_rank[r] for r in kept}
    if any(node_of_rank[r] in kept_nodes for r in lost):
        return True
    return 2 * len(kept) > size or (2 * len(kept) == size and 0 in kept)


def _spawn_replacements(MPI: ModuleType, survivors: Any, count: int) -> Any:
    """Start ``count`` processes running this program (collective over the survivors); the
    world of survivors and new processes, or ``survivors`` when MPI could not start them."""
    info = MPI.Info.Create()
    info.Set("wdir", os.getcwd())
    try:
        # the interpreter's own arguments (``-m module``, ``-u``) where Python keeps them (3.10+)
        args = getattr(sys, "orig_argv", [sys.executable, *sys.argv])[1:]
        spawned = survivors.Spawn(sys.executable, args, maxprocs=count, root=0, info=info)
    except MPI.Exception as exc:
        if survivors.Get_rank() == 0:
            what = "a new rank" if count == 1 else f"{count} new ranks"
            log.logger.warning(
                f"elastic: could not start {what} in place of the dead ({exc}); going on with "
                "the survivors. MPI needs free slots for them: give the job more slots than "
                "-np (e.g. -H host:N, a hostfile, a larger allocation) or --oversubscribe")
        return survivors
    finally:
        info.Free()
    merged = spawned.Merge(high=False)
    spawned.Free()  # Open MPI crashes in MPI_Finalize while a spawn's communicators live
    return merged
