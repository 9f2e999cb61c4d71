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

The ranks of such a job also leave their shared-memory BTL's segments
(``/dev/shm/sm_segment.<host>.<uid>.<job>.<rank>``, 16 MiB each): the launcher removes them as
the job ends. They are removed at the same times, where no process maps them any more.
"""
import os
import re
import shutil
import socket
import time
from typing import List, Mapping, Optional, Set

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
    return removed + remove_stale_segments(env, host)


_SEGMENT_MIN_AGE_S = 60.0  # younger ones may belong to a job whose ranks are mapping them now


def remove_stale_segments(env: Mapping[str, str], hostname: Optional[str] = None) -> List[str]:
    """Remove this user's Open MPI shared-memory segments of this host (in
    ``btl_sm_backing_directory``, default /dev/shm) that no process maps and that are older
    than a minute; returns their paths."""
    directory = env.get("OMPI_MCA_btl_sm_backing_directory") or "/dev/shm"
    host = (hostname or socket.gethostname()).split(".")[0]
    prefix = f"sm_segment.{host}.{os.getuid()}."
    now = time.time()
    old = set()
    try:
        for entry in os.scandir(directory):
            if entry.name.startswith(prefix) and entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                if st.st_uid == os.getuid() and now - st.st_mtime > _SEGMENT_MIN_AGE_S:
                    old.add(entry.path)
    except OSError:
        return []
    stale = sorted(old - _mapped(old)) if old else []
    for path in stale:
        try:
            os.unlink(path)
        except OSError:
            pass
    return stale


def _mapped(paths: Set[str]) -> Set[str]:
    """Those of ``paths`` that a process of this machine maps (as far as /proc shows)."""
    found: Set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
        except OSError:  # ended, or another user's: not ours to judge
            continue
        found.update(p for p in paths if p in maps)
    return found


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
