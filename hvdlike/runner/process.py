"""Running the launcher's command: signals forwarded to it, an MPI abort notice that the job
outlives ended (``abort_watch``), the rank that died first named (``death_watch``), failed
jobs restarted from their committed state."""
from __future__ import annotations

import signal
import subprocess
import sys
from typing import Dict, List, Mapping, Optional, Sequence

from ..base.death_notice import CAUSE, ENDED
from ..runtime import session_dirs
from . import startup_noise
from .abort_watch import OutputWatch
from .death_watch import DeathWatch


def run_command(argv: Sequence[str], env: Mapping[str, str],
                received: Optional[List[int]] = None, abort_grace: float = 0.0,
                deaths: Optional[DeathWatch] = None) -> int:
    """Run argv and return its exit status (128+N if it died of signal N).

    The child stays in our process group, so a terminal's Ctrl-C reaches it exactly as it
    reaches a plain mpirun; SIGINT, SIGTERM and SIGHUP sent to this process alone (a batch
    system, ``timeout``, ``kill``) are forwarded to the child, and added to ``received``.
    The child's output passes through an ``OutputWatch``, which leaves TensorFlow's start-up
    lines out of its stderr (unless ``HVDLIKE_TF_STARTUP_LOGS=1`` in ``env``) and, with
    ``abort_grace`` > 0, ends a job still running that long after the MPI printed an abort
    notice (status 1). A job that fails after a rank died ends with a line naming the rank
    that died first: ``deaths``' record (the job's ranks connect to it), else the earliest
    death notice in the output.
    """
    proc: Optional[subprocess.Popen] = None
    pending: List[int] = []
    quiet = not startup_noise.kept(env)
    watch = OutputWatch() if (abort_grace > 0 or quiet) and hasattr(
        sys.stdout, "buffer") and hasattr(sys.stderr, "buffer") else None

    def forward(signum: int, _frame: object) -> None:
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
        code = (_wait_watched(proc, watch, abort_grace) if watch is not None and abort_grace > 0
                else proc.wait())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watch is not None:
            watch.finish()
        session_dirs.remove_stale(env)  # this launcher's, if it was killed
    if code != 0:
        # the MPI's own last words may name neither rank nor host (docs/reliability.md)
        died = deaths.first_death() if deaths is not None else None
        if died is not None:
            print(f"hvdlikerun: the job failed after {died} {ENDED}: {CAUSE}", file=sys.stderr,
                  flush=True)
        elif watch is not None and watch.first_death:
            print(f"hvdlikerun: the job failed after {watch.first_death[len('hvdlike: '):]}",
                  file=sys.stderr, flush=True)
    return 128 - code if code < 0 else code


def _wait_watched(proc: subprocess.Popen, watch: OutputWatch, grace: float) -> int:
    """Wait for ``proc``; end it when an abort notice is more than ``grace`` seconds old."""
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        if watch.overdue(grace):
            print(f"hvdlikerun: error: the MPI printed an abort notice (above) {grace:g} s ago "
                  "and the job has not ended; ending it now (--abort-timeout)",
                  file=sys.stderr, flush=True)
            end_process(proc, 10)
            return 1


def end_process(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM ``proc``, SIGKILL it if it still runs ``grace`` seconds later; wait for it."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_with_restarts(cmd: Sequence[str], env: Dict[str, str], restarts: int,
                       abort_grace: float = 0.0, deaths: Optional[DeathWatch] = None) -> int:
    """Run the job; while it fails and restarts are left, run it again (``HVDLIKE_RESTART``
    says which run this is). A job interrupted (Ctrl-C, or a signal to hvdlikerun) is not
    restarted."""
    attempt, received = 0, []  # type: int, List[int]
    while True:
        if restarts:
            env = dict(env, HVDLIKE_RESTART=str(attempt))
        try:
            code = run_command(cmd, env, received, abort_grace, deaths)
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
