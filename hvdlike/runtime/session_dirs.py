"""Remove the session directories that killed Open MPI launchers left behind.

Open MPI 5's launcher (``prterun``) and its daemons (``prted``) keep their session in
``<tmpdir>/ompi.<pid>`` and ``<tmpdir>/prted.<pid>``, with PMIx rendezvous files
(``pmix.<host>.tool``, ``pmix.<host>.tool.<pid>``) in it, and remove it when they exit. One
killed by SIGKILL (a batch system's time limit, the OOM killer, ``hvdlikerun
--abort-timeout``) leaves it behind, and the next launcher that gets the same process id
cannot create its rendezvous files: it stops with "The PMIx server's listener thread failed
to start" before starting any rank. OpenPMIx reclaims such files since
openpmix/openpmix#4046 (2026), newer than the PMIx of Open MPI 5.0.11; until then hvdlikerun
removes them before and after each launch, and ``hvd.init()`` on each node's first rank of a
job that Open MPI's launcher started (``mpirun`` included): a plain ``mpirun`` cannot remove
them before it starts, but every job that runs cleans its nodes for the next one.
"""
import os
import re
import shutil
import socket
from typing import List, Mapping, Optional

_SESSION = re.compile(r"(?:ompi|prted)\.(\d+)")


def session_base(env: Mapping[str, str]) -> str:
    """Where Open MPI's launcher puts its session directories. In a rank it started: where
    this job's is (PMIx tells the rank, ``PMIX_SERVER_TMPDIR``). Else ``prte_tmpdir_base``,
    ``TMPDIR``, ``TEMP`` or ``TMP``, else /tmp."""
    this_job = _this_job(env)
    if this_job:
        return os.path.dirname(this_job)
    for name in ("PRTE_MCA_prte_tmpdir_base", "TMPDIR", "TEMP", "TMP"):
        if env.get(name):
            return env[name]
    return "/tmp"


def _running(pid: int) -> bool:
    """A process ``pid`` runs (a thread with that id, which ``kill`` also finds, is not one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    try:
        with open(f"/proc/{pid}/status") as f:
            tgid = next((line.split()[1] for line in f if line.startswith("Tgid:")), str(pid))
    except OSError:  # no /proc: take it as a process
        return True
    return tgid == str(pid)


def remove_stale(env: Mapping[str, str], hostname: Optional[str] = None) -> List[str]:
    """Remove this user's session directories whose launcher or daemon ran on this host
    (its rendezvous file names the host) and no longer runs; returns their paths.

    A directory of a process that still runs, of another user, or written on another host
    (a container with its own process ids, sharing the directory) is left alone."""
    host = hostname or socket.gethostname()
    hosts = {host, host.split(".")[0]}  # PMIx names the host without its domain by default
    base = session_base(env)
    removed: List[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        match = _SESSION.fullmatch(entry.name)
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        ours = any(os.path.exists(os.path.join(entry.path, name))
                   for h in hosts for name in (f"pmix.{h}.tool", f"pmix.{h}.tool.{pid}"))
        if ours and not _running(pid):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def remove_stale_from_rank(env: Mapping[str, str]) -> List[str]:
    """``remove_stale`` where this process is a rank that Open MPI 5's launcher started (its
    job's session directory is ``ompi.<pid>`` or ``prted.<pid>``); else nothing (Slurm, MPICH,
    no launcher). Returns the paths removed."""
    return remove_stale(env) if _this_job(env) else []


def _this_job(env: Mapping[str, str]) -> Optional[str]:
    """The session directory of the job this process is a rank of, where Open MPI 5's
    launcher started it (PMIx names it); else None."""
    path = env.get("PMIX_SERVER_TMPDIR", "")
    return path if _SESSION.fullmatch(os.path.basename(path)) else None
