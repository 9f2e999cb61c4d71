"""Name a rank that dies without hvdlike's shutdown (``kill -9``, the OOM killer, a crash).

Open MPI names such a rank only when its launcher notices the death first; when another
rank's TCP transport notices the closed socket first, Open MPI ends the job with
"An error occurred in Socket closed", naming neither the rank nor its host. So each rank
starts a small shell beside it that reads one line from a pipe only the rank writes to:
the rank writes it when it shuts down (or ends the job itself, saying why), and when the
rank dies instead, the pipe closes unwritten and the shell prints, on the rank's stderr::

    hvdlike: rank 3 of 4 (pid 4242 on host b) ended without hvdlike's shutdown
    (t=1796321765.520265): killed (kill -9, the OOM killer), crashed or left by os._exit

``t`` is when the shell saw the death, in seconds since 1970 (with bash 5; ``/bin/sh``
leaves it out). A rank that Open MPI ends after the death (the survivor it aborts on the
transport error) may add a line of its own, later in ``t`` but not always later in the
job's output (another host's lines travel further); ``hvdlikerun``, when its watch (below)
has no record, repeats the line with the earliest ``t``. Not guaranteed: when the machine
is busy, Open MPI can end the job, and the shell with it, before the shell has run (seen
with TCP alone and a busy core: 1 run in 5). POSIX systems with ``/bin/bash`` or
``/bin/sh``; elsewhere there is no notice.

Under ``hvdlikerun`` the rank also connects to the launcher's watch (``WATCH_VARIABLE``,
``hvdlike.runner.death_watch``), which names the first rank whose connection closed without
``SHUTDOWN`` or ``ENDING``: that record does not depend on the job's output and is not cut
off.
"""
import os
import socket
import subprocess
from typing import Optional

WATCH_VARIABLE = "HVDLIKE_DEATH_WATCH"  # address:port:token of hvdlikerun's death watch
HELLO_BYTES = 512  # the most a rank's first line to the watch may take
SHUTDOWN = b"shutdown\n"  # what a rank tells the watch before it shuts down
ENDING = b"ending"  # ... before it ends the job itself, having said why (and a line of why)
REASON_BYTES = 480  # the most of that line sent to the watch
TIMED_OUT = "collective timeout"  # how the collective watchdog's reason begins
ENDED = "ended without hvdlike's shutdown"  # said of a rank that died ...
# ... and how it can have
CAUSE = "killed (kill -9, the OOM killer), crashed or left by os._exit"
# what rank 0 of an elastic job that lost ranks logs once every rank has shut down: the MPI's
# launcher may still wait for the lost ones (a host it cannot reach, a frozen one), and
# hvdlikerun ends the job --abort-timeout after this line (runner/abort_watch.py)
ELASTIC_DONE = "elastic: every rank of the job has shut down"

# printf (and bash's EPOCHREALTIME) are built into the shell: the line leaves as the pipe
# closes, before Open MPI, told of the death by a survivor, can end the job (and this shell)
_SCRIPT = ('IFS= read -r line || printf "%s%s: %s\\n" "$0" '
           '"${EPOCHREALTIME:+ (t=$EPOCHREALTIME)}" "$1" >&2')
_SHELLS = ("/bin/bash", "/bin/sh")  # bash adds the time of death
_watcher: Optional[subprocess.Popen] = None
_watch: Optional[socket.socket] = None  # the connection to hvdlikerun's watch


def start(rank: int, size: int) -> None:
    """Watch this process as ``rank`` of ``size`` (replacing an earlier watch)."""
    global _watcher, _watch
    quiet()
    if size < 2:
        return
    rank_is = f"rank {rank} of {size} (pid {os.getpid()} on host {socket.gethostname()})"
    if os.environ.get(WATCH_VARIABLE):
        _watch = _connect(os.environ[WATCH_VARIABLE], rank_is)
    shell = next((s for s in _SHELLS if os.path.exists(s)), None)
    if shell is None:
        return
    who = f"hvdlike: {rank_is} {ENDED}"
    try:
        # in the rank's process group: when the launcher ends the job, it ends the shells of
        # the ranks it ends with them, most often before they speak
        _watcher = subprocess.Popen([shell, "-c", _SCRIPT, who, CAUSE], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, close_fds=True)
    except OSError:  # no notice, but the job runs as before
        _watcher = None


def quiet(ending: bool = False, reason: str = "") -> None:
    """This process ends as hvdlike means it to: shutdown, or (``ending``) an end of the job
    that it announced itself (``reason``: why, in one line, for the launcher's last line).
    The watch ends without a word."""
    global _watcher, _watch
    watch, _watch = _watch, None
    if watch is not None:
        why = " ".join(reason.split()).encode(errors="replace")[:REASON_BYTES]
        try:
            watch.sendall(ENDING + (b" " + why if why else b"") + b"\n" if ending else SHUTDOWN)
        except OSError:  # the launcher is gone
            pass
        watch.close()
    watcher, _watcher = _watcher, None
    if watcher is None or watcher.stdin is None:
        return
    try:
        watcher.stdin.write(b"shutdown\n")
        watcher.stdin.close()
    except OSError:  # the shell is gone already
        pass
    try:
        watcher.wait(timeout=5)
    except subprocess.TimeoutExpired:
        watcher.kill()


def _forget_in_child() -> None:
    """In a child forked from a rank: close its copies of the watch's pipe and connection
    (unsaid), so that the rank's death is seen even while the child lives, and the child's
    own end says nothing for the rank."""
    global _watcher, _watch
    watch, _watch = _watch, None
    watcher, _watcher = _watcher, None
    for f in (watch, watcher.stdin if watcher is not None else None):
        if f is not None:
            try:
                f.close()
            except OSError:
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _connect(value: str, rank_is: str) -> Optional[socket.socket]:
    """A connection to the watch at ``value`` (``address:port:token``) that has said who this
    rank is; None when there is none to be had (the job runs on without it)."""
    address, _, token = value.rpartition(":")
    host, _, port = address.rpartition(":")
    try:
        s = socket.create_connection((host, int(port)), timeout=5)
    except (OSError, ValueError):
        return None
    try:
        s.sendall(f"{token} {rank_is}\n".encode()[:HELLO_BYTES])
        s.settimeout(None)
    except OSError:
        s.close()
        return None
    return s
