"""Running the launcher's command: signals forwarded to it, an MPI abort notice that the job
outlives ended (``abort_watch``), the rank that died first named (``death_watch``), failed
jobs restarted from their committed state."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..base.death_notice import CAUSE, ENDED, TIMED_OUT
from ..runtime import session_dirs
from ..runtime.launched_world import parent_of
from . import startup_noise
from .abort_watch import OutputWatch
from .death_watch import DeathWatch


def run_command(argv: Sequence[str], env: Mapping[str, str],
                received: Optional[List[int]] = None, abort_grace: float = 0.0,
                deaths: Optional[DeathWatch] = None, signal_grace: float = 0.0,
                done_grace: float = 0.0) -> int:
    """Run argv and return its exit status (128+N if it died of signal N, or if this process
    was sent signal N).

    The child stays in our process group, so a terminal's Ctrl-C reaches it exactly as it
    reaches a plain mpirun; SIGINT, SIGTERM and SIGHUP sent to this process alone (a batch
    system, ``timeout``, ``kill``) are forwarded to the child, and added to ``received``.
    A child still running ``signal_grace`` seconds (> 0) after the first such signal (an MPI
    launcher stuck in its own abort, waiting on a host it cannot reach) is killed with what it
    started. The child's output passes through an ``OutputWatch``, which leaves TensorFlow's
    start-up lines out of its stderr (unless ``HVDLIKE_TF_STARTUP_LOGS=1`` in ``env``) and,
    with ``abort_grace`` > 0, ends a job still running that long after the MPI printed an
    abort notice, or its launcher said the job ends (also under ``done_grace``; status 1); with ``done_grace`` > 0 (elastic jobs), ends a job still running
    that long after its rank 0 said every rank shut down (``ELASTIC_DONE``: the launcher
    waits for ranks it cannot reach, or frozen ones; status 0). The last line says why a job
    ended: the signal received; else,
    for a job that failed, the rank that died first (``deaths``' record, else the earliest
    death notice in the output), or the rank whose collective timed out and the hosts not
    heard from since.
    """
    proc: Optional[subprocess.Popen] = None
    pending: List[int] = []
    caught: List[Tuple[int, float]] = []  # (signal, when) for each signal received
    quiet = not startup_noise.kept(env)
    watch = OutputWatch() if (abort_grace > 0 or done_grace > 0 or quiet) and hasattr(
        sys.stdout, "buffer") and hasattr(sys.stderr, "buffer") else None

    def forward(signum: int, _frame: object) -> None:
        caught.append((signum, time.monotonic()))
        if received is not None:
            received.append(signum)
        if proc is None:
            pending.append(signum)
        else:
            proc.send_signal(signum)  # a no-op once the child has been reaped

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, forward) for sig in handled}
    session_dirs.remove_stale(env)  # a killed launcher's, which would stop this one's start
    if deaths is not None:
        deaths.clear()
    try:
        piped = subprocess.PIPE if watch is not None else None
        proc = subprocess.Popen(list(argv), env=dict(env), stdout=piped, stderr=piped)
        if watch is not None:
            watch.follow(proc.stdout, sys.stdout.buffer)
            watch.follow(proc.stderr, sys.stderr.buffer,
                         startup_noise.is_startup_line if quiet else None)
        for signum in pending:
            proc.send_signal(signum)
        code = _wait(proc, watch, deaths, abort_grace, caught, signal_grace, done_grace)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watch is not None:
            watch.finish()
        session_dirs.remove_stale(env)  # this launcher's, if it was killed
    if caught:
        signum = caught[0][0]
        print(f"hvdlikerun: the job was ended by {signal.Signals(signum).name} sent to "
              f"hvdlikerun (exit status {128 + signum})", file=sys.stderr, flush=True)
        return 128 + signum
    if code != 0:
        _say_why(deaths, watch)
    return 128 - code if code < 0 else code


def _say_why(deaths: Optional[DeathWatch], watch: Optional[OutputWatch]) -> None:
    """The last line of a failed job: who died first, or who ended it on a collective
    timeout and which hosts were not heard from (the MPI's own last words may name neither
    rank nor host, docs/reliability.md)."""
    died = deaths.first_death() if deaths is not None else None
    ended = deaths.ended_by() if deaths is not None and died is None else None
    if died is not None:
        print(f"hvdlikerun: the job failed after {died} {ENDED}: {CAUSE}", file=sys.stderr,
              flush=True)
    elif deaths is not None and ended is not None and ended[1].startswith(TIMED_OUT):
        who, why = ended
        silent = _by_host(deaths.unheard())
        print(f"hvdlikerun: the job failed after {who} ended it: {why}"
              + (f"; nothing heard since from {silent}: unreachable (its network down) or "
                 "frozen, or its ranks stuck outside Python" if silent else ""),
              file=sys.stderr, flush=True)
    elif watch is not None and watch.first_death:
        print(f"hvdlikerun: the job failed after {watch.first_death[len('hvdlike: '):]}",
              file=sys.stderr, flush=True)


def _by_host(ranks: List[str]) -> str:
    """``host b (ranks 2, 3), host c (rank 4)`` from the watch's ``rank 2 of 4 (pid 7 on
    host b)``."""
    hosts: Dict[str, List[str]] = {}
    for who in ranks:
        found = re.fullmatch(r"rank (\d+) of \d+ \(pid \d+ on host (.*)\)", who)
        if found:
            hosts.setdefault(found.group(2), []).append(found.group(1))
    return ", ".join(f"host {h} (rank{'s' if len(r) > 1 else ''} "
                     f"{', '.join(sorted(r, key=int))})" for h, r in hosts.items())


def _wait(proc: subprocess.Popen, watch: Optional[OutputWatch], deaths: Optional[DeathWatch],
          abort_grace: float, caught: List[Tuple[int, float]], signal_grace: float,
          done_grace: float = 0.0) -> int:
    """Wait for ``proc``; end it when an abort notice, or a rank's word that it ends the job
    (``deaths``), is more than ``abort_grace`` seconds old, or an elastic job's word that
    every rank shut down more than ``done_grace``, or the launcher's that the job ends more
    than either; kill it with what it started when it outlives the first signal by
    ``signal_grace``."""
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        notice = watch is not None and watch.overdue(abort_grace)
        ended = deaths is not None and deaths.ended_at is not None and \
            time.monotonic() - deaths.ended_at > abort_grace
        if abort_grace > 0 and (notice or ended):
            what = "the MPI printed an abort notice (above)" if notice else \
                "a rank said it ends the job (above)"
            print(f"hvdlikerun: error: {what} {abort_grace:g} s ago and the job has not ended; "
                  "ending it now (--abort-timeout)", file=sys.stderr, flush=True)
            if deaths is not None:
                deaths.keep_unheard()
            end_process(proc, min(10.0, abort_grace))
            return 1
        if done_grace > 0 and watch is not None and watch.done_overdue(done_grace):
            print(f"hvdlikerun: every rank of the job shut down {done_grace:g} s ago (above), "
                  "but the MPI's launcher still waits for the ranks it lost (a host it cannot "
                  "reach, or frozen): ending it (--abort-timeout)", file=sys.stderr, flush=True)
            end_process(proc, min(10.0, done_grace))
            return 0
        grace = max(abort_grace, done_grace)
        if grace > 0 and watch is not None and watch.ends_overdue(grace):
            print(f"hvdlikerun: error: the MPI's launcher said the job ends (above) {grace:g} s "
                  "ago, but still runs (it may wait for a host it cannot reach); ending it "
                  "(--abort-timeout)", file=sys.stderr, flush=True)
            end_process(proc, min(10.0, grace))
            return 1
        if caught and signal_grace > 0 and time.monotonic() - caught[0][1] > signal_grace:
            print(f"hvdlikerun: error: the job still runs {signal_grace:g} s after "
                  f"{signal.Signals(caught[0][0]).name} was passed on to {proc.args[0]}; "
                  "killing it and what it started (--abort-timeout)", file=sys.stderr,
                  flush=True)
            kill_tree(proc)
            return proc.wait()


def end_process(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM ``proc``; if it still runs ``grace`` seconds later, SIGKILL it and what it
    started; wait for it."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        proc.wait()


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process below it on this machine (an MPI launcher's ranks
    and agents, which a killed launcher would leave running)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        parent = parent_of(int(entry)) if entry.isdigit() else None
        if parent is not None:
            children.setdefault(parent, []).append(int(entry))
    tree, i = [proc.pid], 0
    while i < len(tree):
        tree.extend(children.get(tree[i], []))
        i += 1
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone already
            pass


def run_with_restarts(cmd: Sequence[str], env: Dict[str, str], restarts: int,
                      abort_grace: float = 0.0, deaths: Optional[DeathWatch] = None,
                      signal_grace: float = 0.0, done_grace: float = 0.0) -> int:
    """Run the job (``run_command``); while it fails and restarts are left, run it again
    (``HVDLIKE_RESTART`` says which run this is). A job interrupted (Ctrl-C, or a signal to
    hvdlikerun) is not restarted."""
    attempt, received = 0, []  # type: int, List[int]
    while True:
        if restarts:
            env = dict(env, HVDLIKE_RESTART=str(attempt))
        try:
            code = run_command(cmd, env, received, abort_grace, deaths, signal_grace,
                               done_grace)
        except OSError as exc:
            print(f"hvdlikerun: error: cannot start {cmd[0]}: {exc}", file=sys.stderr)
            return 2
        if code == 0 or attempt >= restarts or received or code == 128 + signal.SIGINT:
            return code
        attempt += 1
        where = env.get("HVDLIKE_STATE_DIR")
        resume = (f"it resumes from the state committed in {where}" if where else
                  "no --state-dir: it starts again from whatever checkpoint your script loads")
        print(f"hvdlikerun: the job exited with status {code}; restart {attempt} of "
              f"{restarts} ({resume})", file=sys.stderr, flush=True)
