"""This rank's pending requests, as the engine keeps them between rounds: the queue taken
into the pending table, what this rank brings to a round (``mine``), which members lack a
request, and a request retired once its response ran."""
import time
from collections import deque
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from ..handles import Handle, complete
from . import timeline
from .checks import Kind, Request
from .deadlock import JOIN_KEY
from .entries import Entry
from .rounds import Key, Mine

if TYPE_CHECKING:
    from .engine import Engine

ALL_SETS = (1 << 64) - 1  # the deadlock word of a rank blocked past the deadlock time


def take_queue(engine: "Engine", now: float,
               fresh: List[Entry]) -> List[Tuple[Key, Request, Any]]:
    """Move the queue into the pending requests; returns the pending requests that are not
    in the response cache (key, request, local error) and adds the requests this round
    carries for the first time to ``fresh``."""
    with engine._qlock:
        new, engine._queue = engine._queue, []
    for entry in new:
        if engine.sets.get(entry.key[0]) is not entry.process_set:  # removed meanwhile
            complete(entry.handle, None, RuntimeError(
                f"hvdlike.{entry.request.kind} {entry.request.name!r}: its process set "
                "was removed (hvdlike.remove_process_set, on another thread) before the "
                "request could be sent"))
            continue
        if entry.request.kind == Kind.JOIN:
            engine._joined_round, engine._join_entry = engine._round_no, entry
        elif entry.key in engine._pending:
            engine._later.setdefault(entry.key, deque()).append(entry)
        else:
            engine._pending[entry.key] = entry
    uncached = []
    for entry in engine._pending.values():
        if entry.position is None:
            position = None if entry.error else engine._neg.cached(entry.key, entry.request)
            if position is None:
                uncached.append((entry.key, entry.request, entry.error))
            else:
                entry.position = position
                engine._bits |= 1 << position
        if not entry.carried:
            entry.carried = now
            fresh.append(entry)
    return uncached


def outside_sets(engine: "Engine") -> int:
    """The deadlock word of a rank not blocked: a bit for each set it is not in (kept in
    ``_outside_word``, made again when sets change)."""
    word = 0
    for set_id, ps in engine.sets.items():
        if ps.group is None:
            word |= 1 << min(set_id, 63)
    return word


def mine(engine: "Engine", uncached: List[Tuple[Key, Request, Any]],
         fresh: List[Entry]) -> Mine:
    """What this rank brings to the round."""
    now = time.perf_counter()
    blocked_on: Tuple[Tuple[Key, str], ...] = ()
    blocked = engine._outside_word
    if (engine._waiters and engine._deadlock_seconds > 0 and now >= engine._deadlock_next
        and now - max(engine._wait_start, engine._progress_at) >= engine._deadlock_seconds):
        blocked, blocked_on = ALL_SETS, tuple(waits(engine))
    # the timeline names the ranks a request waited for: rows of the rounds it waits in
    detail = engine._want_detail or (timeline.current is not None
                                     and len(engine._pending) > len(fresh))
    return Mine(engine._bits, uncached, bool(engine._pending) or engine._joined_round >= 0,
                engine._joined_round, engine._stopping, engine._stall.flag, detail, blocked,
                blocked_on, engine._pending, engine.made)


def waits(engine: "Engine") -> List[Tuple[Key, str]]:
    """What the threads blocked in wait() wait for: (key, kind)."""
    out: List[Tuple[Key, str]] = []
    for handle in list(engine._waited):
        entry = entry_of(engine, handle)
        if entry is not None and (entry.key, entry.request.kind) not in out:
            out.append((JOIN_KEY if entry.request.kind == Kind.JOIN else entry.key,
                        entry.request.kind))
    return out


def entry_of(engine: "Engine", handle: Handle) -> Optional[Entry]:
    if engine._join_entry is not None and engine._join_entry.handle is handle:
        return engine._join_entry
    for entry in engine._pending.values():
        if entry.handle is handle:
            return entry
    for later in engine._later.values():
        for entry in later:
            if entry.handle is handle:
                return entry
    return None


def joined(engine: "Engine") -> List[int]:
    """The ranks that have joined, as the last rows gathered say."""
    detail = engine._neg.last_detail
    return [] if detail is None else [r for r, j in enumerate(detail.joined) if j >= 0]


def missing(engine: "Engine", entry: Entry) -> List[int]:
    """The members that had not submitted ``entry``'s request in the last round that
    gathered every rank's row (stall reports, ranks that shut down, a removed set)."""
    set_id = entry.key[0]
    members = engine.sets[set_id].ranks
    detail, me = engine._neg.last_detail, engine._st.rank
    if detail is None:
        return [r for r in members if r != me]
    out = []
    for r in members:
        if set_id == 0 and detail.joined[r] >= 0:
            continue
        has = detail.has(r, entry.key)
        if not (r == me if has is None else has):  # None: not published then
            out.append(r)
    return out


def retire(engine: "Engine", entry: Entry) -> None:
    engine._progress_at = time.perf_counter()  # a request of this rank completes
    if entry.position is not None:
        clear_bit(engine, entry)
    del engine._pending[entry.key]
    later = engine._later.get(entry.key)
    if later:
        engine._pending[entry.key] = later.popleft()
        if not later:
            del engine._later[entry.key]


def clear_bit(engine: "Engine", entry: Entry) -> None:
    position = entry.position
    assert position is not None
    engine._bits &= ~(1 << position)
    entry.position = None
