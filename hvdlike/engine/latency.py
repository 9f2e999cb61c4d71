"""The latency path: a blocking call of a cached name on a rank with nothing else pending
runs its round at once on the calling thread, without queue, entry or handle; for the other
ranks it is an ordinary round."""
import time
from typing import TYPE_CHECKING, Any

from ..handles import Handle
from ..transport.failures import is_process_failure
from . import allreduce, dispatch, failing, timeline
from .checks import Request
from .entries import Entry
from .execute import RUNNERS
from .rounds import Flag, Mine
from .work import ALLREDUCES, Work

if TYPE_CHECKING:
    from .engine import Engine

GENERAL = object()  # direct's answer: take the general path (submit, wait)
# flags after which a round needs more than its all-reduce (direct leaves it then)
_SPECIAL = sum(1 << f for f in (Flag.UNPUBLISHED, Flag.STOPPING, Flag.STALLED, Flag.JOINED,
                                Flag.DETAIL))
_WAITING = 1 << Flag.WAITING


def direct(engine: "Engine", request: Request, inputs: Any, process_set: Any) -> Any:
    """Run ``request`` in a round of its own (``_lock`` held); returns its result, or the
    handle of the request left pending (not ready on every member, or a round with more
    to it than this request), or GENERAL when it must take the general path."""
    tuning = engine.autotuner is not None and not engine.autotuner.done
    if (engine._queue or engine._pending or engine._join_entry is not None or engine._stopping
        or engine._paused or timeline.current is not None or tuning):
        return GENERAL  # (autotune counts rounds by their responses, which this path skips)
    set_id = process_set.process_set_id
    if request.name is None:
        with engine._qlock:
            request = engine._named(request, set_id)
    # (named by now: ``_named``)
    position = engine._neg.cached((set_id, request.name), request)  # type: ignore[arg-type]
    if position is None:  # new to the response cache: negotiated by the general path
        return engine.submit(request, None, inputs, process_set, wake=False)
    engine.count_made((set_id, request.name or ""))
    bit = 1 << position
    mine = engine._direct_mine
    if (mine.bits, mine.stalled, mine.detail, mine.blocked) != (
            bit, engine._stall.flag, engine._want_detail, engine._outside_word):
        mine = engine._direct_mine = Mine(bit, (), True, -1, False, engine._stall.flag,
                                          engine._want_detail, engine._outside_word)
    try:
        engine._neg.vector(mine)
        summary = engine._neg.read(engine._control.exchange())
    except BaseException as exc:
        failing.round_failed(engine, exc)
        raise engine.failure or exc
    if summary.some & _SPECIAL or summary.blocked or engine._neg.completes(summary):
        entry = pend(engine, request, inputs, process_set, position)
        try:
            engine._conclude(summary, mine, [entry])
        except BaseException as exc:
            failing.round_failed(engine, exc)
        return entry.handle
    # nothing but cached requests (no request in negotiation completes): the responses are
    # those every active member has; of the sets this rank is in, that can only be this one
    engine._round_no += 1
    engine._last_round = engine._own_work = time.monotonic()
    engine._keep_company(summary.union)
    engine._helper = False
    if not summary.ready & bit:
        engine._busy = True
        engine._productive, engine._stuck = False, bool(summary.every & _WAITING)
        return pend(engine, request, inputs, process_set, position).handle
    engine._busy = bool(summary.union & ~bit)  # work left somewhere after this
    engine._productive, engine._stuck = True, False
    engine.direct_runs += 1
    engine.watchdog.enter(((request, process_set),))
    try:
        if request.kind in ALLREDUCES:
            return allreduce.allreduce_now(engine._st, request, inputs, process_set)
        work = Work(request, inputs, process_set, dispatch.discard)
        return RUNNERS[request.kind](engine._st, work)
    except Exception as exc:
        if is_process_failure(exc, engine._ctrl):
            failing.fail(engine, exc)
            raise engine.failure or exc
        raise


def pend(engine: "Engine", request: Request, inputs: Any, process_set: Any,
         position: int) -> Entry:
    """``request``, carried in the row of the round that just ran, pending from now on."""
    entry = Entry(request, None, inputs, process_set, Handle(engine))
    entry.carried = entry.negotiated = entry.submitted
    entry.position = position
    engine._bits |= 1 << position
    engine._pending[entry.key] = entry
    return entry
