"""Name a rank that dies without hvdlike's shutdown (``kill -9``, the OOM killer, a crash).

Open MPI names such a rank only when its launcher notices the death first; when another
rank's TCP transport notices the closed socket first, Open MPI ends the job with
"An error occurred in Socket closed", naming neither the rank nor its host. So each rank
starts a small shell beside it that reads one line from a pipe only the rank writes to:
the rank writes it when it shuts down (or ends the job itself, saying why), and when the
rank dies instead, the pipe closes unwritten and the shell prints, on the rank's stderr::

    hvdlike: rank 3 of 4 (pid 4242 on host b) ended without hvdlike's shutdown: killed
    (kill -9, the OOM killer) or crashed

A rank whose launcher ends it with the job takes its shell with it (they share a process
group), so the line names the rank that died, not the ones ended after it. Linux and other
POSIX systems with ``/bin/sh``; elsewhere there is no notice.
"""
import os
import socket
import subprocess
from typing import Optional

# printf is built into the shell: the line leaves as the pipe closes, before Open MPI, told
# of the death by a survivor, can end the job (and this shell with it)
_SCRIPT = ('IFS= read -r line || printf "%s: killed (kill -9, the OOM killer) or crashed\\n" '
           '"$0" >&2')
_watcher: Optional[subprocess.Popen] = None


def start(rank: int, size: int) -> None:
    """Watch this process as ``rank`` of ``size`` (replacing an earlier watch)."""
    global _watcher
    quiet()
    if size < 2 or not os.path.exists("/bin/sh"):
        return
    who = (f"hvdlike: rank {rank} of {size} (pid {os.getpid()} on host "
           f"{socket.gethostname()}) ended without hvdlike's shutdown")
    try:
        _watcher = subprocess.Popen(["/bin/sh", "-c", _SCRIPT, who], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, close_fds=True)
    except OSError:  # no notice, but the job runs as before
        _watcher = None


def quiet() -> None:
    """This process ends as hvdlike means it to (shutdown, or an end it announces itself):
    the watch ends without a word."""
    global _watcher
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
