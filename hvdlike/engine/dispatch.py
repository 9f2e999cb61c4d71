"""Running a round's responses, the same on every rank: all-reduces first (fused), then the
other collectives in the order every rank computes alike; a collective's error goes to its
handle, a dead rank fails the engine; the timeline's record of each."""
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ..handles import Handle, complete, succeed
from ..transport.failures import is_process_failure
from . import allreduce, execute_gpu, pending, timeline
from .checks import Kind, raised_on_every_rank
from .entries import NONAME_NAMES, Entry
from .execute import RUNNERS
from .rounds import Key
from .watchdog import ROUND
from .work import ALLREDUCES, Work, zeros_for

if TYPE_CHECKING:
    from .engine import Engine


def run_responses(engine: "Engine", responses: List[Any], ready: float) -> None:
    tl = timeline.current
    reductions: List[Work] = []
    others: List[Work] = []
    served: List[Key] = []  # what this rank serves with zeros, having joined
    if tl is not None and tl.mark_cycles and responses:
        tl.instant("engine", "CYCLE_START", ready)
    for response in responses:
        ps = engine.sets.get(response.key[0])
        if ps is None or ps.group is None:  # not a member
            continue
        entry = engine._pending.get(response.key)
        if entry is not None:
            if tl is not None:
                trace_negotiation(engine, tl, entry, ready)
            pending.retire(engine, entry)
        if response.error is not None:
            error = raised_on_every_rank(response.error, ps.rank())
            if entry is not None:
                complete(entry.handle, None, error)
            elif engine._join_entry is not None:  # a joined rank cannot serve this one
                join, engine._join_entry, engine._joined_round = engine._join_entry, None, -1
                complete(join.handle, None, error)
            continue
        if entry is None:  # joined: take part with zeros, keep nothing
            served.append(response.key)
            zeros = execute_gpu.zeros_for if response.request.device == "gpu" else zeros_for
            work = Work(response.request, zeros(response.request), ps, discard)
        else:
            work = Work(response.request, entry.inputs, ps, partial(succeed, entry.handle),
                        handle=entry.handle)
        (reductions if response.request.kind in ALLREDUCES else others).append(work)
    # a process set's removal last, after the round's collectives on that set
    others.sort(key=lambda work: work.request.kind == Kind.PROCESS_SET)
    if served:
        count_unnamed(engine, served)
    engine._in_flight = reductions + others
    if reductions:
        host = [w for w in reductions if w.request.device != "gpu"]
        gpu = [w for w in reductions if w.request.device == "gpu"]
        for run, works in ((allreduce.run_allreduces, host),
                           (execute_gpu.run_allreduces, gpu)):
            if works:
                trace = None if tl is None else tracer(engine, tl, works)
                guarded(engine, lambda: run(engine._st, works, trace), works)
    for work in others:
        start = time.perf_counter()
        run_one = (execute_gpu.run if work.request.device == "gpu"
                   else RUNNERS[work.request.kind])
        guarded(engine, lambda: work.done(run_one(engine._st, work)), [work])
        if tl is not None:
            tl.span(row_name(work.process_set, work.request.name or ""),
                    "MPI_" + work.request.kind.upper(), start, time.perf_counter())
    if others and others[-1].request.kind == Kind.PROCESS_SET:  # sorted last: sets changed
        engine._outside_word = pending.outside_sets(engine)
    engine._in_flight = []
    if tl is not None:
        tl.flush()


def last_ranks(engine: "Engine", entry: Entry) -> List[int]:
    """The members whose request for ``entry`` came in this round: those that did not
    have it in the last earlier round that gathered every rank's row (with a timeline
    recording, a rank asks for them in each round in which it waits)."""
    detail = engine._neg.prev_detail if engine._round_detail is not None else \
        engine._neg.last_detail
    members = engine.sets[entry.key[0]].ranks
    if detail is None:
        return list(members)
    return [r for r in members if (entry.key[0] != 0 or detail.joined[r] < 0)
            and not detail.has(r, entry.key)]


def tracer(engine: "Engine", tl: Any, works: List[Work]) -> Any:
    """The timeline's record of a round's all-reduce buckets (indices into ``works``)."""
    def trace(members: List[int], phases: Any, args: Dict[str, Any]) -> None:
        args = dict(args, round=engine._round_no,
                    members=[works[m].request.name for m in members[:8]])
        for m in members:
            row = row_name(works[m].process_set, works[m].request.name)
            for phase, start, end in phases:
                tl.span(row, phase, start, end, args)
    return trace


def count_unnamed(engine: "Engine", served: List[Key]) -> None:
    """A joined rank served other ranks' unnamed requests ``noname.<k mod NONAME_NAMES>``
    in this round: its own next unnamed request must be numbered after them, as the
    others' are. Its counter c was theirs when it joined, so each served k is the first
    number from c on with that remainder."""
    with engine._qlock:
        after: Dict[int, int] = {}
        for set_id, name in served:
            if name.startswith("noname."):
                c = engine._noname.get(set_id, 0)
                k = c + (int(name[len("noname."):]) - c) % NONAME_NAMES
                after[set_id] = max(after.get(set_id, c), k + 1)
        engine._noname.update(after)


def guarded(engine: "Engine", run: Any, works: List[Work]) -> None:
    engine.watchdog.enter(works)
    try:
        run()
    except Exception as exc:  # noqa: BLE001 - handed to the caller, raised there
        if is_process_failure(exc, engine._ctrl):
            raise  # the whole engine fails, with every request in it (failing.fail)
        for work in works:
            if isinstance(work.handle, Handle) and not work.handle.poll():
                complete(work.handle, None, exc)
    finally:
        engine.watchdog.enter(ROUND)  # the rest of the round


def discard(result: Any) -> None:
    return None


def row_name(process_set: Any, name: Optional[str]) -> str:
    set_id = process_set.process_set_id
    return str(name) if set_id == 0 else f"{name} (process set {set_id})"


def trace_negotiation(engine: "Engine", tl: Any, entry: Entry, ready: float) -> None:
    """The timeline phases of a request from its submission to the round that found it
    ready on every rank (Horovod's names: NEGOTIATE_ALLREDUCE, ...)."""
    kind = entry.request.kind
    row = row_name(entry.process_set, entry.request.name or "")
    tl.span(row, "QUEUED", entry.submitted, entry.carried)
    tl.span(row, "NEGOTIATE_" + kind.replace("grouped_", "").upper(), entry.carried,
            entry.negotiated, {"kind": kind})
    if ready > entry.negotiated:
        tl.span(row, "WAIT_FOR_RANKS", entry.negotiated, ready,
                {"last_ranks": last_ranks(engine, entry)})
