"""``hvdlike.run(func, ...)``: run a Python function as every rank of a job and get back what
each rank returned (Horovod's ``horovod.run``, for notebooks and programs that start their own
training jobs).

The caller listens on a TCP port (``multiprocessing.connection``, authenticated with a random
key) and starts ``hvdlikerun -np N python -m hvdlike.runner.run_func``. Each rank connects
back, receives the pickled function and arguments, runs it and sends back its return value or
its exception, on a connection of its own each time (a long function keeps no connection
open). The address and the key are in two variables that ``hvdlikerun`` forwards to every
host; nothing goes through files, so no shared file system is needed.

The function travels by ``cloudpickle``, as in Horovod: a function of an importable module
by reference (the ranks import it, with the caller's ``sys.path``), anything else by value: a
function of the main script or a notebook, a lambda, a closure, with what they refer to.
"""
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import cloudpickle

from ..base.compute_service import interface_addresses
from .command import RUN_KEY_VARIABLE, reachable_address
from .process import end_process

_ADDRESS = "HVDLIKE_RUN_ADDRESS"  # host:port the ranks connect back to
_KEY = RUN_KEY_VARIABLE
_DEADLINE_S = 10  # for each read or write of a connection to the caller
_MOST_AT_ONCE = 64  # connections answered at once


def run(func: Callable[..., Any], args: Sequence[Any] = (),
        kwargs: Optional[Dict[str, Any]] = None, num_proc: int = 1,
        hosts: Optional[str] = None, hostfile: Optional[str] = None,
        output_filename: Optional[str] = None, verbose: Optional[bool] = None,
        use_mpi: Optional[bool] = None, use_gloo: Optional[bool] = None,
        mpi_args: Optional[str] = None, network_interface: Optional[str] = None,
        executable: Optional[str] = None, ssh_port: Optional[int] = None,
        ssh_identity_file: Optional[str] = None, min_num_proc: Optional[int] = None,
        max_num_proc: Optional[int] = None, disable_cache: Optional[bool] = None,
        start_timeout: Optional[int] = None, slots: Optional[int] = None,
        reset_limit: Optional[int] = None, cooldown_range: Any = None,
        np: Optional[int] = None) -> List[Any]:
    """Run ``func(*args, **kwargs)`` on ``num_proc`` ranks started by ``hvdlikerun`` and
    return the list of their return values, indexed by rank. ``func`` calls ``hvd.init()``
    itself, as a training script does.

    The other arguments are ``horovod.run``'s and mean what ``hvdlikerun``'s flags of the same
    names mean (``hosts``: ``host:slots,...``; ``mpi_args``: extra launcher arguments, one
    shell-quoted string; ``executable``: the Python the ranks run, default this one;
    ``np``: Horovod's old name of ``num_proc``). ``disable_cache`` changes nothing (hvdlike
    caches no checks); ``start_timeout`` and ``use_gloo`` (or ``use_mpi=False``) change
    nothing either, with hvdlikerun's note saying why. Raises ValueError for arguments hvdlike
    cannot honour (``min_num_proc``, ``max_num_proc``, ``slots``, ``reset_limit``,
    ``cooldown_range``) or a job hvdlikerun would refuse, and RuntimeError when
    ``func`` raised on a rank (naming the ranks, with the first one's traceback) or the job
    ended before every rank returned."""
    if _ADDRESS in os.environ:  # this process is a rank of hvdlike.run
        raise RuntimeError(
            "hvdlike.run was called in a rank that hvdlike.run started: the function it runs "
            "cannot start a job of its own (MPI does not launch a job from inside one). Call "
            "hvdlike.run from the caller only")
    num_proc = np if np is not None else num_proc
    _check(num_proc, hosts, hostfile, slots, reset_limit, cooldown_range, min_num_proc,
           max_num_proc)
    flags = ["-np", str(num_proc)]
    for flag, value in (("--hosts", hosts), ("--hostfile", hostfile),
                        ("--output-filename", output_filename), ("--mpi-args", mpi_args),
                        ("--network-interface", network_interface), ("--ssh-port", ssh_port),
                        ("--ssh-identity-file", ssh_identity_file),
                        ("--start-timeout", start_timeout)):
        if value is not None:
            flags.append(f"{flag}={value}")
    if verbose:
        flags.append("--verbose")
    if use_gloo or use_mpi is False:
        flags.append("--gloo")  # hvdlikerun notes that the job uses MPI
    job = _payload(func, tuple(args), dict(kwargs or {}))
    program = [executable or sys.executable, "-m", "hvdlike.runner.run_func"]
    _check_launch(flags, program)
    key = os.urandom(32)
    local = hosts is None and hostfile is None
    chosen = _interface_address(network_interface) if network_interface and not local else None
    address = "127.0.0.1" if local else chosen or _address_of(reachable_address(hosts, hostfile))
    with _Server(address, key, job, backlog=num_proc) as server:  # listens there only
        env = dict(os.environ, **{_ADDRESS: f"{address}:{server.port}", _KEY: key.hex()})
        command = [sys.executable, "-m", "hvdlike.runner", *flags, "--", *program]
        returncode = _wait(subprocess.Popen(command, env=env))
    return _results(num_proc, returncode, server.outcomes)


def _wait(launcher: "subprocess.Popen[bytes]") -> int:
    """The launcher's exit status. Interrupted (Ctrl-C in a notebook reaches this process
    only), it is told to end the job: hvdlikerun passes SIGTERM on to the MPI's launcher,
    which ends every rank (killing hvdlikerun would leave them running)."""
    try:
        return launcher.wait()
    except BaseException:
        end_process(launcher, 30)
        raise


def _check(num_proc: Any, hosts: Any, hostfile: Any, slots: Any, reset_limit: Any,
           cooldown_range: Any, min_num_proc: Any, max_num_proc: Any) -> None:
    """ValueError for arguments that cannot be run, before anything starts."""
    if not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"hvdlike.run: num_proc must be a whole number >= 1, got {num_proc!r}")
    if hosts is not None and hostfile is not None:
        raise ValueError("hvdlike.run: give hosts or hostfile, not both")
    if min_num_proc is not None or max_num_proc is not None:
        raise ValueError("hvdlike.run: min_num_proc and max_num_proc (elastic training) are not "
                         "supported: it returns one value per rank of a fixed world. Run an "
                         "elastic job with hvdlikerun --min-np/--max-np")
    for name, value in (("slots", slots), ("reset_limit", reset_limit),
                        ("cooldown_range", cooldown_range)):
        if value is not None:
            raise ValueError(f"hvdlike.run: {name} is for Horovod's host discovery, which "
                             "hvdlike's elastic mode does not have (docs/horovod.md); drop it")


def _check_launch(flags: List[str], program: List[str]) -> None:
    """ValueError with hvdlikerun's reason where it would refuse to start ``program`` with
    ``flags`` (too many ranks for the hosts' slots, no MPI launcher, ...): its ``--dry-run``
    builds the MPI command and starts nothing."""
    try:
        done = subprocess.run([sys.executable, "-m", "hvdlike.runner", *flags, "--dry-run",
                               "--", *program], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return  # the launch itself will say what hangs
    if done.returncode == 0:
        return
    said = [line for line in done.stderr.splitlines() if line.startswith("hvdlikerun: error: ")]
    reason = said[-1][len("hvdlikerun: error: "):] if said else done.stderr.strip()[-2000:]
    raise ValueError(f"hvdlike.run: hvdlikerun refuses this job: {reason} (hvdlike.run's "
                     "num_proc is its -np, hosts its -H, hostfile its --hostfile, mpi_args its "
                     "--mpi-args)")


def _payload(func: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bytes:
    """What every rank receives: the function and its arguments, and ``sys.path`` (for the
    modules they refer to)."""
    try:
        blob = cloudpickle.dumps((func, args, kwargs))
    except Exception as e:  # noqa: BLE001 - pickle raises several types
        raise ValueError(f"hvdlike.run: cannot pickle the function or its arguments ({e}); "
                         "pass objects that pickle (an open file, a lock or a socket does "
                         "not)") from e
    return pickle.dumps((blob, list(sys.path)))


def _interface_address(interfaces: str) -> Optional[str]:
    """This machine's IPv4 address on the first of ``interfaces`` that has one here: names
    (``eth1``) or subnets (``10.1.0.0/16``), comma-separated, as the MPI is given them; None
    when none has (the caller may be a machine outside the job's network)."""
    import ipaddress
    here = interface_addresses()
    for item in (i.strip() for i in interfaces.split(",")):
        if "/" not in item:
            if item in here:
                return here[item]
            continue
        try:
            subnet = ipaddress.ip_network(item, strict=False)
        except ValueError as e:
            raise ValueError(f"hvdlike.run: network_interface {item!r} is neither an "
                             "interface name nor a subnet such as 10.1.0.0/16") from e
        for address in here.values():
            if ipaddress.ip_address(address) in subnet:
                return address
    return None


def _address_of(host: str) -> str:
    """The IPv4 address ``host`` (a name or an address) resolves to here."""
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise ValueError(f"hvdlike.run: cannot tell which address of this machine the job's "
                         f"hosts reach ({host!r}: {exc}); pass network_interface=") from exc


class _Server:
    """The caller's listener on ``address``: a ``("hello", rank)`` gets ``job``, a ``(kind,
    rank, blob)`` is that rank's outcome (in ``outcomes``). Each connection is answered on a
    thread of its own, at most ``_MOST_AT_ONCE`` at a time (the others wait in the kernel's
    queue), and must take each step of the key check and its message within
    ``_DEADLINE_S``: a connection that says nothing, or not the key, is closed then and holds
    up no rank and no result."""

    def __init__(self, address: str, key: bytes, job: bytes, backlog: int) -> None:
        self._key, self._job = key, job
        self.outcomes: Dict[int, Tuple[str, Any]] = {}
        self._socket = socket.create_server((address, 0), backlog=max(128, backlog))
        self.port = self._socket.getsockname()[1]
        self._free = threading.Semaphore(_MOST_AT_ONCE)
        self._answering: List[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True,
                                           name="hvdlike.run-listener")
        self._accepting.start()

    def __enter__(self) -> "_Server":
        return self

    def __exit__(self, *_: Any) -> None:
        """Stop listening; wait for the connections being answered (a rank's last outcome may
        still be on its way in; a stranger's ends at its deadline)."""
        self._socket.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._socket.close()
        self._accepting.join()
        for thread in list(self._answering):
            thread.join()

    def _accept(self) -> None:
        while True:
            self._free.acquire()
            try:
                conn, _ = self._socket.accept()
            except OSError:  # closed: the job has ended
                self._free.release()
                return
            thread = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self._answering = [t for t in self._answering if t.is_alive()] + [thread]
            thread.start()

    def _answer(self, sock: socket.socket) -> None:
        try:
            deadline = struct.pack("ll", _DEADLINE_S, 0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, deadline)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, deadline)
            with Connection(sock.detach()) as conn:
                deliver_challenge(conn, self._key)
                answer_challenge(conn, self._key)
                message = conn.recv()  # unpickled only once the key is known to match
                if message[0] == "hello":
                    conn.send_bytes(self._job)
                else:
                    kind, rank, blob = message
                    self.outcomes[rank] = (kind, blob)
        except Exception:  # noqa: BLE001 - a stranger, a timeout, a broken connection: its own
            pass
        finally:
            sock.close()
            self._free.release()


def _results(num_proc: int, returncode: int,
             outcomes: Dict[int, Tuple[str, Any]]) -> List[Any]:
    """The ranks' return values, or RuntimeError saying which ranks raised or never
    returned."""
    raised = sorted(r for r, (kind, _) in outcomes.items() if kind == "raised")
    if raised:
        text, exc = outcomes[raised[0]][1]
        try:
            cause = pickle.loads(exc) if exc is not None else None
        except Exception:  # noqa: BLE001 - an exception class the caller cannot import
            cause = None
        raise RuntimeError(f"hvdlike.run: the function raised on rank(s) {raised}; rank "
                           f"{raised[0]}'s traceback:\n{text}") from cause
    missing = [r for r in range(num_proc) if r not in outcomes]
    if missing:
        raise RuntimeError(f"hvdlike.run: the job ended with exit status {returncode} before "
                           f"rank(s) {missing} returned (the job's output above says why)")
    if returncode != 0:
        raise RuntimeError(f"hvdlike.run: every rank returned, but the job ended with exit "
                           f"status {returncode} (the job's output above says why)")
    return [pickle.loads(outcomes[r][1]) for r in range(num_proc)]


# ---------------------------------------------------------------------------- each rank

def _connect() -> Any:
    host, port = os.environ[_ADDRESS].rsplit(":", 1)
    return Client((host, int(port)), authkey=bytes.fromhex(os.environ[_KEY]))


def _rank_main() -> None:
    from ..transport import mpi  # hvdlike's MPI defaults, then MPI_Init
    rank = mpi.MPI.COMM_WORLD.Get_rank()
    try:
        with _connect() as conn:
            conn.send(("hello", rank))
            blob, path = pickle.loads(conn.recv_bytes())
        sys.path.extend(p for p in path if p not in sys.path)
        func, args, kwargs = pickle.loads(blob)
        result = func(*args, **kwargs)
        try:
            value = cloudpickle.dumps(result)
        except Exception as e:  # noqa: BLE001 - pickle raises several types
            raise TypeError(f"hvdlike.run: the return value of rank {rank} cannot be pickled "
                            f"back to the caller: {e}") from e
    except BaseException as e:
        try:
            exc: Optional[bytes] = cloudpickle.dumps(e)
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            exc = None
        with _connect() as conn:
            conn.send(("raised", rank, (traceback.format_exc(), exc)))
        raise  # and so end the job (hvdlike's abort hook), as a script's exception does
    with _connect() as conn:
        conn.send(("returned", rank, value))


if __name__ == "__main__":
    _rank_main()
