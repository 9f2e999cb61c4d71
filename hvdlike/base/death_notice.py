"""Name a rank that dies without hvdlike's shutdown (``kill -9``, the OOM killer, a crash).

Open MPI names such a rank only when its launcher notices the death first; when another
rank's TCP transport notices the closed socket first, Open MPI ends the job with
"An error occurred in Socket closed", naming neither the rank nor its host. So each rank
starts a small shell beside it that reads one line from a pipe only the rank writes to:
the rank writes it when it shuts down (or ends the job itself, saying why), and when the
rank dies instead, the pipe closes unwritten and the shell prints, on the rank's stderr::

    hvdlike: rank 3 of 4 (pid 4242 on host b) ended without hvdlike's shutdown
    (t=1796321765.520265): killed (kill -9, the OOM killer) or crashed

``t`` is when the shell saw the death, in seconds since 1970 (with bash 5; ``/bin/sh``
leaves it out). A rank that Open MPI ends after the death (the survivor it aborts on the
transport error) may add a line of its own, later in ``t`` but not always later in the
job's output (another host's lines travel further); ``hvdlikerun`` repeats the line with the
earliest ``t``. Not guaranteed: when the machine is busy, Open MPI can end the job, and the
shell with it, before the shell has run (seen with TCP alone and a busy core: 1 run in 5).
POSIX systems with ``/bin/bash`` or ``/bin/sh``; elsewhere there is no notice.
"""
import os
import socket
import subprocess
from typing import Optional

# printf (and bash's EPOCHREALTIME) are built into the shell: the line leaves as the pipe
# closes, before Open MPI, told of the death by a survivor, can end the job (and this shell)
_SCRIPT = ('IFS= read -r line || printf "%s%s: killed (kill -9, the OOM killer) or '
           'crashed\\n" "$0" "${EPOCHREALTIME:+ (t=$EPOCHREALTIME)}" >&2')
_SHELLS = ("/bin/bash", "/bin/sh")  # bash adds the time of death
_watcher: Optional[subprocess.Popen] = None


def start(rank: int, size: int) -> None:
    """Watch this process as ``rank`` of ``size`` (replacing an earlier watch)."""
    global _watcher
    quiet()
    shell = next((s for s in _SHELLS if os.path.exists(s)), None)
    if size < 2 or shell is None:
        return
    who = (f"hvdlike: rank {rank} of {size} (pid {os.getpid()} on host "
           f"{socket.gethostname()}) ended without hvdlike's shutdown")
    try:
        # in the rank's process group: when the launcher ends the job, it ends the shells of
        # the ranks it ends with them, most often before they speak
        _watcher = subprocess.Popen([shell, "-c", _SCRIPT, who], stdin=subprocess.PIPE,
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
