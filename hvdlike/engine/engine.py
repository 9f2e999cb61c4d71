"""The engine: one place per process that owns collective communication.

Any thread submits a request and gets a handle at once. Requests are matched across ranks by
name in any submission order. Unnamed ones get ``noname.<k mod 256>``, k counting a process
set's unnamed requests on this rank: instances of one name pair in submission order, so the
k-th unnamed request pairs with every rank's k-th, and a loop of unnamed calls reuses 256
names, which the response cache then knows. Progress happens in *rounds*,
the same sequence of rounds on every rank: one fixed-size AND all-reduce says what is ready
everywhere (``negotiation``; ``control`` runs it), then what became ready runs (fused
all-reduces first, then the others, in an order every rank computes alike) and the handles
complete. When every member of a set has been blocked waiting past
``HVDLIKE_DEADLOCK_SECONDS``, each for names only the others could submit, those ranks'
waits fail with ``DeadlockError`` (``deadlock``).

Who runs a round: a thread blocked in ``synchronize()`` (or a blocking collective) runs it
itself when no round is running (no thread hand-off); a blocking call of a cached name on a
rank with nothing else pending runs its round without queue or handle (``call``, the latency
path); otherwise the
background thread ``hvdlike-engine`` does, as soon as work is queued, and every
``HVDLIKE_CYCLE_TIME`` ms while any rank has work pending (ten times slower when every rank is
idle, as after a round that ran all the work pending), so that a rank without work of its own
still takes part in its peers' rounds. A rank outside a process set whose members are at work
ticks every cycle for 100 ms after it saw their work, and when it has nothing of its own,
joins the round after a round of theirs at once (``_keep_company``). Because
every rank runs every round and runs its responses in the same order, the transports can use
ordinary blocking MPI collectives. MPI is initialised with MPI_THREAD_MULTIPLE (mpi4py's
default): the engine serialises its own calls with a lock, so collectives never have two
threads in MPI at once; application threads may use MPI on their own communicators
meanwhile (but see docs/multinode.md: Open MPI 5 over TCP can hang when they do).

Shutting down is collective too: a stopping rank's engine keeps taking part in rounds until
every rank stops. Meanwhile the others fail, in the round that sees it, their requests that
wait for a stopping rank (it will submit nothing more); requests of sets without it go on.
"""
import dataclasses
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional

from ..base.errors import RanksFailedError
from ..handles import Handle, complete, sleep_on
from ..transport.control import Control
from . import autotune, dispatch, execute_gpu, failing, latency, pending, timeline
from .checks import LocalError, Request
from .entries import NONAME_NAMES, NONAMES, Entry
from .negotiation import Negotiation
from .rounds import Detail, Flag, Key, Mine, Summary
from .stall import StallInspector
from .watchdog import ROUND, Watchdog
from .work import Work, results
from .world import World

_IDLE_FACTOR = 10  # idle ticks are this many cycle times apart
_COMPANY_SECONDS = 0.1  # ticks stay a cycle apart this long after a set without this rank had work
_DEADLOCK_CHECK_EVERY = 1.0  # seconds between deadlock checks while ranks stay blocked


class Engine:
    """The engine of one world. ``st``: the world (the runtime's state: its settings, ranks,
    communicators); ``sets``: its registered process sets by id, which the api keeps (each with
    ``ranks``, and ``group``, the set's transports on a member, None elsewhere);
    ``on_failure``: called once ranks died and the engine is over."""

    def __init__(self, st: World, sets: Mapping[int, Any],
                 on_failure: Callable[[], None] = lambda: None,
                 end_job: Optional[Callable[[], None]] = None) -> None:
        self._st = st
        self.sets = sets
        self.on_failure = on_failure
        # ends the whole job after an internal error (the runtime's way: under ULFM an exit)
        self.end_job = end_job or (lambda: st.mpi.COMM_WORLD.Abort(1))
        self._neg = Negotiation(st.size, st.settings.cache_capacity,
                                lambda set_id: sets[set_id].ranks, st.rank)
        self._cycle = st.settings.cycle_time_ms / 1000.0
        self._stall = StallInspector(st.settings, st.rank)
        self._control = Control(st.world, self._neg.contribution, self._neg.reduced, self._stall)
        self._ctrl = self._control.comm  # rounds only; data moves on the process sets' comms
        self._want_detail = False  # ask for every rank's detail in the next round
        self._round_detail: Optional[Detail] = None  # the detail the last round gathered
        self._deadlock_seconds = st.settings.deadlock_seconds
        self._deadlock_next = 0.0  # no deadlock check before then (the same on every rank)
        self._waited: List[Handle] = []  # the handles threads are blocked on (in wait())
        self._wait_start = 0.0  # since when some thread has been blocked in wait()
        self._progress_at = 0.0  # when a request of this rank last completed
        self._outside_word = pending.outside_sets(self)  # the deadlock word while not blocked
        self._direct_mine = Mine()  # the latency path's last contribution
        self._qlock = threading.Lock()  # guards the queue, the counters and _stopping
        self._cv = threading.Condition(self._qlock)  # wakes the background thread
        self._queue: List[Entry] = []
        self._noname: Dict[int, int] = {}
        # how many times this rank has submitted each (set, name): a deadlock report tells
        # ranks that ran different numbers of steps from ranks that call in another order
        self.made: Dict[Key, int] = {}
        self._stopping = False
        self._lock = threading.Lock()  # held while a round runs; guards everything below
        self._pending: Dict[Key, Entry] = {}
        self._later: Dict[Key, Deque[Entry]] = {}  # further instances of a pending name
        self._bits = 0  # the cache positions of this rank's pending requests
        self._waiters = 0  # threads in wait(): they run the rounds, the background need not
        self._joined_round = -1
        self._join_entry: Optional[Entry] = None
        self._round_no = 0
        self._busy = True  # the last round had work pending somewhere
        self._company_until = 0.0  # tick every cycle until then: sets without this rank are busy
        self._helper = False  # the last round ran others' work only, this rank had none
        self._own_work = 0.0  # when this rank last had work of its own in a round
        self._productive = False
        self._stuck = False  # every rank had work pending in the last round, none ran
        self._last_round = 0.0
        self._idle_gap = float("inf")  # the least time from a round to one with no work in it
        self._in_flight: List[Work] = []  # the works of the round that is running
        self.direct_runs = 0  # requests run in a round of their own by Engine.call
        self._paused = False  # inside exclusive_mpi(): no round runs, nothing is submitted
        self._paused_at = 0.0
        self.stopped = False
        # HVDLIKE_AUTOTUNE: changes the knobs between samples of rounds (autotune.py)
        self.autotuner = autotune.start(st, sets.get(0), self._control.bcast, self.retune)
        self.failure: Optional[RanksFailedError] = None  # ranks died (ULFM): the engine is over
        self.watchdog = Watchdog(st, sets)  # sees a round or a bucket stuck inside MPI
        self._thread = threading.Thread(target=self._run, name="hvdlike-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ any thread

    def submit(self, request: Request, error: Optional[LocalError], inputs: Any,
               process_set: Any, wake: bool = True) -> Handle:
        """Queue a request; returns its handle at once. ``wake=False``: the caller is about
        to wait on the handle (and so run the round itself): leave the background thread be."""
        handle = Handle(self)
        with self._qlock:
            if self.failure is not None:
                raise self.failure
            if self._paused:
                raise RuntimeError(
                    f"hvdlike.{request.kind} {request.name or ''!r} was called inside "
                    f"hvdlike.exclusive_mpi() on rank {self._st.rank}; hvdlike's collectives "
                    "cannot run there (its engine stays out of MPI until the block ends). Call "
                    "it before or after the block.")
            if self._stopping:
                raise RuntimeError(f"hvdlike.{request.kind}: hvdlike is shutting down on this "
                                   "rank; no more collectives can be submitted")
            if request.name is None:
                request = self._named(request, process_set.process_set_id)
            entry = Entry(request, error, inputs, process_set, handle)
            self.count_made(entry.key)
            self._queue.append(entry)
            if wake:
                self._cv.notify()
        return handle

    def call(self, request: Request, error: Optional[LocalError], inputs: Any,
             process_set: Any) -> Any:
        """A blocking collective on host arrays: submit, wait, return the result (or raise).

        The latency path: when no round is running and this rank has nothing else pending,
        this thread runs the next round at once with the request in its row, without queue,
        entry or handle, and when every member has the request, runs it and returns. It is an
        ordinary round for every other rank: they cannot tell it from one run by ``wait``."""
        outcome: Any = latency.GENERAL
        if error is None and self._lock.acquire(blocking=False):
            self.watchdog.enter(ROUND)
            try:
                outcome = latency.direct(self, request, inputs, process_set)
            finally:
                self.watchdog.leave()
                self._lock.release()
            if type(outcome) is not Handle and outcome is not latency.GENERAL:
                return outcome
        if outcome is latency.GENERAL:
            outcome = self.submit(request, error, inputs, process_set, wake=False)
        return outcome.synchronize()


    def count_made(self, key: Key) -> None:
        """This rank submits ``key`` once more (``made``)."""
        self.made[key] = self.made.get(key, 0) + 1

    def _named(self, request: Request, set_id: int) -> Request:
        """``request`` (unnamed) with the set's next unnamed name (``_qlock`` held)."""
        k = self._noname.get(set_id, 0)
        self._noname[set_id] = k + 1
        return Request(request.kind, NONAMES[k % NONAME_NAMES], *request[2:])


    def wait(self, handle: Handle) -> None:
        """Return once ``handle`` is complete, running rounds on this thread when none runs."""
        with self._qlock:
            if not self._waiters:
                self._wait_start = time.perf_counter()
            self._waiters += 1
            self._waited.append(handle)
        try:
            self._wait(handle)
        finally:
            with self._qlock:
                self._waiters -= 1
                self._waited.remove(handle)

    def _wait(self, handle: Handle) -> None:
        while not handle.poll():
            # While another thread runs a round, wait for it to end (it may complete this
            # handle, or have left this request queued for the next round) rather than sleep
            # a cycle: the background thread leaves the rounds to waiting threads.
            with self._lock:
                if handle.poll():
                    return
                if self.stopped:
                    raise self.failure or RuntimeError(
                        "hvdlike was shut down before this request ran")
                if self._paused:
                    raise RuntimeError(
                        f"hvdlike: synchronize() inside hvdlike.exclusive_mpi() on rank "
                        f"{self._st.rank} waits for a request that has not run yet; it can only "
                        "run after the block ends (the engine stays out of MPI inside it). "
                        "Synchronize before the block or after it.")
                pause = self._pause()
                if pause <= 0:
                    self._round()
                    continue
            sleep_on(handle, pause)

    def stop(self) -> None:
        """Shut down together with the other ranks (collective); fails what is left."""
        if self._paused:
            raise RuntimeError("hvdlike.shutdown() was called inside hvdlike.exclusive_mpi(); "
                               "shut down after the block ends")
        with self._qlock:
            self._stopping = True
            self._cv.notify()
        self._thread.join()
        self.watchdog.close()
        execute_gpu.reset()
        results.clear()  # the result arrays kept for reuse (up to 1 GiB)
        # revoked communicators (ranks died) have nothing to free together
        self._control.free(failed=self.failure is not None)

    def pause(self) -> None:
        """Run no more rounds after this one (``exclusive_mpi``: it runs in a round, the same
        one on every rank), until ``resume``."""
        self._paused, self._paused_at = True, time.perf_counter()

    def resume(self) -> None:
        """Run rounds again (this rank only: its next round waits for the other ranks' next
        round, which they run once they have left their blocks too)."""
        tl = timeline.current
        if tl is not None:
            tl.span("engine", "EXCLUSIVE_MPI", self._paused_at, time.perf_counter())
        with self._qlock:
            self._paused = False
            self._last_round = time.monotonic()
            self._cv.notify()


    def _missing_of(self, entry: Entry) -> List[int]:
        return pending.missing(self, entry)

    def forget_set(self, set_id: int) -> None:
        """A process set is being removed, in a round on every rank (``failing.forget_set``)."""
        failing.forget_set(self, set_id)

    # ------------------------------------------------------------------ rounds

    def _pause(self) -> float:
        """How long to wait before the next round. None when there is news, when this
        rank waits for a peer that may submit any moment (it then waits inside the round's
        exchange, and so answers at once when the peer comes), or when it only keeps a busy
        set company and a round of the set's work just ran. A cycle time when every rank
        waited for something in the last round and nothing came of it (names submitted in
        different orders: rounds back to back would only spin) or while joined; a tick, to
        keep peers company, otherwise."""
        if self._paused:
            return 3600.0  # until resume()
        if self._queue or self._stopping:
            return 0.0
        if self._pending and (self._productive or not self._stuck):
            return 0.0
        now = time.monotonic()
        if (self._helper and now < self._company_until
            and now - self._own_work > self._cycle * _IDLE_FACTOR):
            return 0.0  # in no busy set: be in the round the busy set starts next, at once
        if self._busy or self._pending or now < self._company_until:
            tick = self._cycle
        else:
            tick = self._cycle * _IDLE_FACTOR
        if self._st.size == 1 and not self._pending:
            tick = 3600.0  # no peers to keep company: wait for work
        return self._last_round + tick - now

    def _run(self) -> None:
        while True:
            with self._qlock:
                pause = self._pause()
                if pause > 0 or (self._waiters and not self._stopping):
                    self._cv.wait(pause if pause > 0 else self._cycle)
                    continue
            with self._lock:
                if self.stopped:
                    return
                if self._pause() <= 0:
                    self._round()

    def _round(self) -> None:
        self.watchdog.enter(ROUND)
        try:
            self._negotiate_and_run()
        except BaseException as exc:
            failing.round_failed(self, exc)
        finally:
            self.watchdog.leave()


    def _negotiate_and_run(self) -> None:
        fresh: List[Entry] = []
        gap = time.monotonic() - self._last_round
        uncached = pending.take_queue(self, time.perf_counter(), fresh)
        if self._pending or self._join_entry is not None:
            self._own_work = time.monotonic()
        mine = pending.mine(self, uncached, fresh)
        self._neg.vector(mine)
        summary = self._neg.read(self._control.exchange())
        if not summary.some:  # no rank had anything: a tick
            self._idle_gap = min(self._idle_gap, gap)
        self._conclude(summary, mine, fresh)

    def _conclude(self, summary: Summary, mine: Mine, fresh: List[Entry]) -> None:
        """The rest of a round once the all-reduce is in, the same on every rank: the
        negotiation's decision, stall shutdown, running the responses."""
        decision = self._neg.conclude(summary, mine, self._control)
        self._round_detail = decision.detail
        if decision.detail is not None:
            self._want_detail = False
        if summary.any(Flag.STALLED):  # some rank waited past the stall shutdown time: all end
            report = self._stall.report(list(self._pending.values()), self._missing_of,
                                        time.perf_counter(), pending.joined(self))
            self._stall.shut_down(self._ctrl.allgather(report), self._ctrl.Barrier)
        now = time.perf_counter()
        for entry in fresh:
            entry.negotiated = now
        if summary.blocked:  # every rank checked for a deadlock in this round
            self._deadlock_next = now + _DEADLOCK_CHECK_EVERY
        self._round_no += 1
        self._last_round = time.monotonic()
        self._keep_company(decision.union)
        # work left somewhere after this round. When all of it ran, a member of a set submits
        # its next request itself (and starts a round then): no follow-up tick; a rank that
        # is in no set with work keeps the others company (_keep_company)
        self._busy = decision.any_waiting and not decision.drained
        for key in decision.invalidated:
            stale = self._pending.get(key)
            if stale is not None and stale.position is not None:
                pending.clear_bit(self, stale)
        self._productive = bool(decision.responses)
        self._helper = self._productive and not mine.bits and not mine.uncached
        self._stuck = not self._productive and decision.all_waiting
        if decision.responses:
            dispatch.run_responses(self, decision.responses, now)
            if self.autotuner is not None:
                self.autotuner.after_round(decision.responses)
        if decision.all_joined and self._join_entry is not None:
            entry, self._join_entry, self._joined_round = self._join_entry, None, -1
            self._progress_at = now
            complete(entry.handle, decision.last_joined, None)
        if decision.deadlock is not None:
            failing.fail_deadlocked(self, decision.deadlock)
        if decision.stop:
            failing.stop_now(self)
            return
        if decision.stopped:
            failing.fail_waiting_on(self, decision.stopped)
        if self._pending and self._stall.due(now):
            if decision.detail is not None:
                self._stall.scan(list(self._pending.values()), self._missing_of, now,
                                 pending.joined(self))
            elif any(now - e.submitted >= self._stall.first_check
                     for e in self._pending.values()):
                self._want_detail = True  # the scan names the missing ranks: rows next round
            else:
                self._stall.next_scan = now + self._stall.interval


    def retune(self, values: Dict[str, Any]) -> None:
        """Set knobs (``Settings`` fields) from the next round on: autotune's choice, made in
        the same round on every rank."""
        st = self._st
        st.settings = dataclasses.replace(st.settings, **values)
        self._cycle = st.settings.cycle_time_ms / 1000.0
        for ps in self.sets.values():
            if ps.group is not None:
                ps.group.settings = st.settings

    def _keep_company(self, union: int) -> None:
        """A set without this rank had work pending: its members' rounds need this rank's
        too, and it has nothing of its own to start one with. For a while, tick every cycle
        (not ten cycles apart), and, while this rank has had no work of its own either, be in
        the next round at once after a round of others' work (``_pause``): the set's next
        call finds this rank there."""
        if union & self._neg.foreign:
            self._company_until = self._last_round + _COMPANY_SECONDS


