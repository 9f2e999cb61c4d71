"""hvdlikerun's own record of the rank that died first (``kill -9``, the OOM killer, a crash).

Open MPI names a dead rank only when its launcher notices the death first, and ranks'
printed notices (``hvdlike.base.death_notice``) can be cut off when Open MPI ends the job
at once. So ``hvdlikerun`` also listens on a TCP port of its own, on the address the job's
hosts reach it at (``HVDLIKE_DEATH_WATCH``: ``address:port:token``, forwarded to every
host). Each rank connects at ``hvd.init()`` and says who it is; before it ends as hvdlike
means it to it says so: ``shutdown``, or ``ending`` and a line of why when it ends the job
itself (an uncaught exception, the stall inspector, the collective watchdog), having printed
why. A connection that closes without either is a rank that died. The kernel closes a
process's sockets as it dies, before its parent (Open MPI's daemon) is told, so the dead
rank's connection closes before that of any rank that Open MPI ends because of the death. ``first_death`` names the rank whose connection
closed first, unless a rank had announced the job's end before (then that rank's output
says why the job ended, and the ranks Open MPI ended after it are no news), and only when
every rank of the job has connected (a rank the watch does not see could have died first).
``ended_by`` names the rank that announced the job's end and why; ``unheard`` the ranks that
said nothing: after a collective timeout, those on a host that lost its network (their
connections stay open) or was frozen.

Its cost: one connection per rank, and one line of at most ``HELLO_BYTES`` at
``hvd.init()``; nothing per step. ``hvdlikerun`` raises its soft limit of open files to
hold a connection per rank (up to the hard limit); when it cannot accept more, the watch
stops listening and has no record for that job.
"""
from __future__ import annotations

import errno
import secrets
import selectors
import socket
import threading
import time
from typing import Dict, List, Mapping, Optional, Tuple

from ..base.death_notice import ENDING, HELLO_BYTES, REASON_BYTES, SHUTDOWN, WATCH_VARIABLE
from .command import LaunchError, on_this_machine, reachable_address

_MOST = HELLO_BYTES + len(ENDING) + REASON_BYTES + 2  # what a rank may send in all
HELLO_DEADLINE_S = 10.0  # for a connection to say who it is (a rank does as it connects)
MOST_UNKNOWN = 128  # connections yet to say who they are, at once (below _OWN_FILES)


class DeathWatch:
    """Listens on ``address`` (an ephemeral port) until ``close()``, for a job of ``ranks``
    ranks (0: of any number)."""

    def __init__(self, address: str, ranks: int = 0) -> None:
        self._token = secrets.token_hex(16)
        self._ranks = ranks
        _allow_open_files(ranks + _OWN_FILES)
        # the kernel caps the backlog (net.core.somaxconn); ranks that find it full retry
        self._listener = socket.create_server((address, 0), backlog=max(128, ranks))
        self._listener.setblocking(False)
        self._events: List[Tuple[str, str, str]] = []  # ("died" or "ending", who, why)
        self._last_word: Dict[str, str] = {}  # who -> "", "ending", "shutdown" or "died"
        self.ended_at: Optional[float] = None  # time.monotonic() of the first "ending"
        self._kept_unheard: Optional[List[str]] = None  # keep_unheard's
        self._deaf = False  # the watch stopped accepting (out of file descriptors)
        self._lock = threading.Lock()
        self._caught_up = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name="hvdlikerun-death-watch")
        self._thread.start()

    @property
    def variable(self) -> Tuple[str, str]:
        """The variable (name, value) that tells the ranks where to connect."""
        host, port = self._listener.getsockname()[:2]
        return WATCH_VARIABLE, f"{host}:{port}:{self._token}"

    def first_death(self, timeout: float = 2.0) -> Optional[str]:
        """Who died first, as the rank said it (``rank 3 of 4 (pid 42 on host b)``), or None
        (no death, a rank announced the job's end before, or the watch did not see every
        rank). Takes in first what happened before the call (waiting up to ``timeout`` s for
        this thread)."""
        self._catch_up(timeout)
        with self._lock:
            kind, who, _ = self._events[0] if self._events else ("", "", "")
            seen_all = not self._deaf and len(self._last_word) >= self._ranks
        return who if kind == "died" and seen_all else None

    def ended_by(self, timeout: float = 2.0) -> Optional[Tuple[str, str]]:
        """``(who, why)`` of the rank that announced the job's end before any rank died (its
        one-line reason, or ""); None otherwise. Catches up as ``first_death`` does."""
        self._catch_up(timeout)
        with self._lock:
            kind, who, why = self._events[0] if self._events else ("", "", "")
        return (who, why) if kind == "ending" else None

    def unheard(self) -> List[str]:
        """The ranks that have said neither that they shut down nor that they end the job:
        still connected, or gone without a word (as of the last catch-up, or of
        ``keep_unheard``)."""
        with self._lock:
            if self._kept_unheard is not None:
                return list(self._kept_unheard)
            return [who for who, word in self._last_word.items() if word in ("", "died")]

    def keep_unheard(self) -> None:
        """Fix ``unheard()`` as it is now, before hvdlikerun ends the job: what ranks say
        while it is torn down (a frozen rank woken to be killed) does not count."""
        found = self.unheard()
        with self._lock:
            self._kept_unheard = found

    def clear(self) -> None:
        """Forget what was seen so far (a restarted job starts afresh)."""
        with self._lock:
            self._events.clear()
            self._last_word.clear()
            self.ended_at = None
            self._kept_unheard = None

    def _catch_up(self, timeout: float) -> None:
        """Wait (up to ``timeout`` s) for this thread to take in what happened before."""
        self._caught_up.clear()
        self._wake_w.send(b"c")
        self._caught_up.wait(timeout)

    def close(self) -> None:
        self._wake_w.send(b"q")
        self._thread.join(5)
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()

    def _serve(self) -> None:
        # one selector for all: it reports the connections that closed in the order the
        # kernel saw them close, whatever this thread was doing meanwhile
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        said: Dict[socket.socket, bytes] = {}  # what each connection has sent so far
        # connections yet to say who they are, and when they must have: a rank sends its
        # hello as it connects, a stranger's connection holds no file for long
        unknown: Dict[socket.socket, float] = {}
        listening = True
        while True:
            caught_up = False
            wait = min(unknown.values()) - time.monotonic() if unknown else None
            for key, _ in sel.select(None if wait is None else max(wait, 0.0)):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                if s is self._wake_r:
                    if b"q" in s.recv(64):
                        for conn in said:
                            conn.close()
                        sel.close()
                        return
                    caught_up = True  # set once this round's events are in
                elif s is self._listener:
                    conn = self._accept(sel)
                    if conn is not None:
                        said[conn] = b""
                        unknown[conn] = time.monotonic() + HELLO_DEADLINE_S
                elif s in said:  # not closed earlier in this round
                    try:
                        self._read(sel, s, said, unknown)
                    except Exception:  # noqa: BLE001 - whatever a stranger sent: its own end
                        if s in said:
                            _forget(sel, s, said, unknown)
            now = time.monotonic()
            for conn in [c for c, deadline in unknown.items() if deadline <= now]:
                _forget(sel, conn, said, unknown)  # said nothing, or not enough, in time
            full = len(unknown) >= MOST_UNKNOWN  # the rest wait in the kernel's queue
            if listening and (full or self._deaf):
                sel.unregister(self._listener)
            elif not listening and not full and not self._deaf:
                sel.register(self._listener, selectors.EVENT_READ)
            listening = not full and not self._deaf
            if caught_up:
                self._caught_up.set()

    def _accept(self, sel: selectors.BaseSelector) -> Optional[socket.socket]:
        """A new connection, registered; None when there was none to take (or no file
        descriptor left for it: then the watch stops listening, as its record would be
        incomplete)."""
        try:
            conn, _ = self._listener.accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                with self._lock:
                    self._deaf = True
            return None
        conn.setblocking(False)
        sel.register(conn, selectors.EVENT_READ)
        return conn

    def _read(self, sel: selectors.BaseSelector, s: socket.socket,
              said: Dict[socket.socket, bytes], unknown: Dict[socket.socket, float]) -> None:
        try:
            data = s.recv(4096)
        except BlockingIOError:
            return
        except OSError:  # reset: a close
            data = b""
        before = said[s]
        said[s] = before + data
        hello, newline, rest = said[s].partition(b"\n")
        if data and not newline and len(hello) < HELLO_BYTES:
            return  # the rest of the hello is on its way
        token, _, who_bytes = hello.partition(b" ")
        who = who_bytes.decode(errors="replace")
        ours = (secrets.compare_digest(token, self._token.encode()) and bool(who)
                and len(said[s]) <= _MOST)
        if ours and newline and b"\n" not in before:
            unknown.pop(s, None)
            with self._lock:
                self._last_word[who] = ""
        word, whole, _ = rest.partition(b"\n")  # the rank's last word, once it is whole
        ending = bool(whole) and word.split(b" ", 1)[0] == ENDING
        if ours and ending and before.count(b"\n") < 2:  # just now
            with self._lock:
                self._events.append(("ending", who, word[len(ENDING) + 1:].decode(
                    errors="replace")))
                self._last_word[who] = "ending"
                if self.ended_at is None:
                    self.ended_at = time.monotonic()
        if ours and rest == SHUTDOWN:
            with self._lock:
                self._last_word[who] = "shutdown"
        if data and ours:
            return
        _forget(sel, s, said, unknown)  # closed, or a stranger
        if ours and not ending and rest != SHUTDOWN:
            with self._lock:
                self._events.append(("died", who, ""))
                self._last_word[who] = "died"


def _forget(sel: selectors.BaseSelector, s: socket.socket, said: Dict[socket.socket, bytes],
            unknown: Dict[socket.socket, float]) -> None:
    """Close connection ``s`` and forget it."""
    sel.unregister(s)
    del said[s]
    unknown.pop(s, None)
    s.close()


_OWN_FILES = 256  # what hvdlikerun needs open besides the ranks' connections


def _allow_open_files(count: int) -> None:
    """Raise this process's soft limit of open files to ``count`` (at most the hard limit)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= count:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (count if hard == resource.RLIM_INFINITY else min(count, hard), hard))
    except (ValueError, OSError):  # as it was: the watch may stop listening (no record)
        pass


def for_job(hosts: Optional[str], hostfile: Optional[str], env: Mapping[str, str],
            ranks: int = 0) -> Optional[DeathWatch]:
    """A watch on the address the job's hosts reach this machine at: 127.0.0.1 for a job on
    this machine alone; in a batch allocation without ``-H``/``--hostfile`` (the hosts are the
    allocation's), the address of this host's name. None when there is none to listen on
    (the job runs without it: the ranks' own notices remain). ``ranks``: the job's size."""
    try:
        if hosts or hostfile:
            address = reachable_address(hosts, hostfile)
        elif not on_this_machine(hosts, hostfile, env):  # in a batch allocation
            address = socket.gethostbyname(socket.gethostname())
            if address.startswith("127."):  # other hosts could not reach it
                return None
        else:
            address = "127.0.0.1"
        return DeathWatch(address, ranks)
    except (OSError, LaunchError):  # a bad host list or hostfile: the launch says what is wrong
        return None
