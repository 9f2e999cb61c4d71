"""How the engine fails requests, the same on every rank: a round that raised (ranks died:
every request fails with ``RanksFailedError``; an internal error aborts the job), a
deadlock found, ranks that shut down, a process set removed, the engine stopped."""
from typing import TYPE_CHECKING, Dict, List, Sequence

from ..base.errors import DeadlockError, RanksFailedError
from ..handles import Handle, complete
from ..transport.failures import failed_ranks, is_process_failure, revoke
from . import execute_gpu, pending
from .checks import Kind
from .deadlock import JOIN_KEY, Found
from .entries import Entry

if TYPE_CHECKING:
    from .engine import Engine

_FAILED_RANKS_WAIT = 2.0  # seconds a failed engine waits to learn which ranks died


def forget_set(engine: "Engine", set_id: int) -> None:
    """A process set is being removed (in a round, on every rank). This rank's requests on
    it that have not run (not every member submitted them) fail, saying so. A later set
    may get its id, with other members: its unnamed requests are numbered from 0 again."""
    waiting = [e for k, e in engine._pending.items() if k[0] == set_id]
    missing = {id(e): pending.missing(engine, e) for e in waiting}  # while the set is registered
    for key in [k for k in engine._later if k[0] == set_id]:
        waiting += engine._later.pop(key)
    for entry in waiting:
        if engine._pending.get(entry.key) is entry:
            if entry.position is not None:
                pending.clear_bit(engine, entry)
            del engine._pending[entry.key]
        ranks = missing.get(id(entry))
        complete(entry.handle, None, RuntimeError(
            f"hvdlike.{entry.request.kind} {entry.request.name!r} on process set {set_id} "
            "cannot complete: the set was removed (hvdlike.remove_process_set) before "
            + (f"ranks {ranks} submitted it" if ranks else "it ran") + ". Every member "
            "must make the set's collective calls before it is removed."))
    engine._neg.forget_set(set_id)
    execute_gpu.forget_set(set_id)
    with engine._qlock:
        engine._noname.pop(set_id, None)


def round_failed(engine: "Engine", exc: BaseException) -> None:
    """A round raised: ranks died (ULFM), or an internal error, which (unlike an error in
    a collective's data, which goes to its handle) leaves this rank's rounds out of step
    with its peers': stop the job rather than hang."""
    if is_process_failure(exc, engine._ctrl):
        fail(engine, exc)
    else:
        import sys
        import traceback
        traceback.print_exception(type(exc), exc, exc.__traceback__)
        sys.stderr.write(f"hvdlike: internal error in the engine on rank {engine._st.rank}; "
                         "aborting the job\n")
        sys.stderr.flush()
        engine.end_job()


def fail_deadlocked(engine: "Engine", found: Found) -> None:
    """This round found ranks blocked for good: on those, fail what their threads wait
    for with the report (the same text on every rank)."""
    me = engine._st.rank
    if me not in found.ranks:
        return
    keys = found.waits[me]
    for handle in list(engine._waited):
        entry = pending.entry_of(engine, handle)
        if entry is None or (JOIN_KEY if entry.request.kind == Kind.JOIN else entry.key) \
                not in keys:
            continue
        if entry is engine._join_entry:
            engine._join_entry, engine._joined_round = None, -1
        elif engine._pending.get(entry.key) is entry:
            pending.retire(engine, entry)
        else:
            engine._later[entry.key].remove(entry)
            if not engine._later[entry.key]:
                del engine._later[entry.key]
        error = DeadlockError(found.message, list(found.ranks))
        error.hvdlike_quiet = me != found.ranks[0]  # type: ignore[attr-defined]
        complete(entry.handle, None, error)


def fail_waiting_on(engine: "Engine", stopped: Sequence[int]) -> None:
    """Ranks ``stopped`` are shutting down: they submit nothing more (their engines still
    take part in rounds until every rank has shut down). Fail this rank's requests that
    wait for one of them at once, instead of waiting for ever; requests of sets without
    them go on. Every rank decides from the same rows, so all fail a request alike."""
    def error(what: str, ranks: List[int]) -> RuntimeError:
        return RuntimeError(
            f"{what} cannot complete: ranks {ranks} shut hvdlike down "
            "(hvdlike.shutdown() or the end of their script) without submitting it. Every "
            "rank must make the same collective calls; when ranks have different amounts of "
            "data, stop all of them at the same step, or let the ones that run out call "
            "hvdlike.join() (allreduce only).")
    involved: Dict[int, bool] = {}  # process set id -> has a rank in ``stopped``
    for entry in list(engine._pending.values()):
        set_id = entry.key[0]
        if set_id not in involved:
            involved[set_id] = any(r in stopped for r in engine.sets[set_id].ranks)
        if not involved[set_id]:
            continue  # a set without them: its requests go on as usual
        gone = [r for r in pending.missing(engine, entry) if r in stopped]
        if gone:
            pending.retire(engine, entry)
            complete(entry.handle, None, error(
                f"hvdlike.{entry.request.kind} {entry.request.name!r}", gone))
    if engine._join_entry is not None and not engine._stopping:
        entry, engine._join_entry, engine._joined_round = engine._join_entry, None, -1
        complete(entry.handle, None, error("hvdlike.join", list(stopped)))


def stop_now(engine: "Engine") -> None:
    engine.stopped = True
    for entry in take_all(engine):
        complete(entry.handle, None, RuntimeError(
            f"hvdlike.{entry.request.kind} {entry.request.name!r} was still pending when "
            "hvdlike shut down"))


def take_all(engine: "Engine") -> List[Entry]:
    """Every request not yet completed, taken out of the engine."""
    with engine._qlock:
        left, engine._queue = engine._queue, []
    left += list(engine._pending.values()) + [e for q in engine._later.values() for e in q]
    if engine._join_entry is not None:
        left.append(engine._join_entry)
    engine._pending.clear()
    engine._later.clear()
    engine._join_entry = None
    return left


def fail(engine: "Engine", exc: BaseException) -> None:
    """Ranks died (MPI with ULFM reported it): revoke every communicator of this world, so
    that survivors blocked in any of them get out too, and fail every request with the
    same RanksFailedError, naming the dead ranks. The engine is over; see
    ``hvdlike.elastic`` for going on."""
    st = engine._st
    revoke([engine._ctrl, st.world, st.local_comm, st.cross_comm] + [
        ps.group.comm for ps in engine.sets.values() if ps.group is not None])
    engine._control.end_in_flight()  # the revoke failed it
    failed = failed_ranks(engine._ctrl, _FAILED_RANKS_WAIT)
    named = f"ranks {failed}" if failed else "some ranks"
    error = RanksFailedError(
        f"hvdlike: {named} of the {st.size}-rank job died ({exc}). Collectives cannot go on "
        "on this world. In hvdlike.elastic.run the survivors shrink the world and resume "
        "from the last committed state; otherwise the job ends.", failed)
    with engine._qlock:
        engine.failure = error
        engine._stopping = True
    engine.stopped = True
    engine.on_failure()  # e.g. MPI_Finalize bounded at exit, also where the script catches it
    from ..base.log import logger
    logger.debug(f"engine: failed ({exc}); revoked every communicator; failed ranks "
                 f"known here: {failed}")
    for entry in take_all(engine):
        complete(entry.handle, None, error)
    for work in engine._in_flight:
        if isinstance(work.handle, Handle) and not work.handle.poll():
            complete(work.handle, None, error)
    engine._in_flight = []
