"""The meeting point of a tf.data service's dispatchers, workers and training ranks.

A compute job (``python -m hvdlike.tensorflow.data.compute_worker``) runs a ``ComputeService``
on its rank 0; the processes of both jobs reach it with a ``ComputeClient``: dispatchers
register their address, workers register with their dispatcher, training ranks wait until
both are there, and the training job's rank 0 asks for the shutdown that the workers wait for.
Horovod's names and requests (``horovod.runner.common.service.compute_service``), framework
free. Connections are authenticated with a shared key (HMAC challenges of
``multiprocessing.connection``) before anything is unpickled; the service listens on every
interface, and its addresses list each interface's IPv4 address.
"""
import fcntl
import socket
import struct
import threading
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

Addresses = Mapping[str, Sequence[Tuple[str, int]]]

_HANDSHAKE_S = 10  # for the key check and the request of a connection
_CONNECT_S = 5  # to reach one address


def interface_addresses() -> Dict[str, str]:
    """Each network interface of this machine with an IPv4 address, and that address."""
    found: Dict[str, str] = {}
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # SIOCGIFADDR
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address
                continue
        found[name] = socket.inet_ntoa(packed[20:24])
    return found


class ComputeService:
    """Keeps the dispatchers' addresses and their workers, answers each connection on a
    thread of its own until ``shutdown()``."""

    def __init__(self, dispatchers: int, workers_per_dispatcher: int, key: bytes) -> None:
        if dispatchers < 1:
            raise ValueError(f"the number of dispatchers must be 1 or more, got {dispatchers}")
        if workers_per_dispatcher < 1:
            raise ValueError("the number of workers per dispatcher must be 1 or more, got "
                             f"{workers_per_dispatcher}")
        self._key = key
        self._dispatchers: List[Optional[str]] = [None] * dispatchers
        self._workers: List[Set[int]] = [set() for _ in range(dispatchers)]
        self._workers_per_dispatcher = workers_per_dispatcher
        self._stopped = False
        self._changed = threading.Condition()
        self._socket = socket.create_server(("", 0), backlog=128)
        self.port = self._socket.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept, daemon=True,
                                           name="hvdlike-compute-service")
        self._accepting.start()

    def addresses(self) -> Dict[str, List[Tuple[str, int]]]:
        """Where clients reach the service: ``{interface: [(ip, port)]}``."""
        return {name: [(ip, self.port)] for name, ip in interface_addresses().items()}

    def shutdown(self) -> None:
        """Release every waiting request and stop listening."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:  # already shut
            pass
        self._socket.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._socket.accept()
            except OSError:  # shut down
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, sock: socket.socket) -> None:
        try:
            deadline = struct.pack("ll", _HANDSHAKE_S, 0)  # on each read and write
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, deadline)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, deadline)
            with Connection(sock.detach()) as conn:
                deliver_challenge(conn, self._key)
                answer_challenge(conn, self._key)
                request = conn.recv()  # unpickled only once the key is known to match
                try:
                    reply: Any = self._handle(*request)
                except (ValueError, IndexError, TimeoutError, ConnectionError) as exc:
                    reply = exc
                conn.send(reply)
        except Exception:  # noqa: BLE001 - a stranger, a wrong key, a closed connection
            pass

    def _dispatcher(self, index: int) -> int:
        if not 0 <= index < len(self._dispatchers):
            raise IndexError(f"dispatcher {index} does not exist: this compute service has "
                             f"{len(self._dispatchers)} (0..{len(self._dispatchers) - 1})")
        return index

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        if not self._changed.wait_for(lambda: ready() or self._stopped, timeout):
            raise TimeoutError(f"hvdlike compute service: {what} within {timeout:g} s; is "
                               "the compute job running, with as many ranks as its config "
                               "says? (or raise the config's timeout)")
        if not ready():
            raise ConnectionError(f"hvdlike compute service: shut down while {what} yet")

    def _handle(self, request: str, *args: Any) -> Any:
        with self._changed:
            if request == "register_dispatcher":
                index, address = self._dispatcher(args[0]), args[1]
                if self._dispatchers[index] not in (None, address):
                    raise ValueError(f"dispatcher {index} is registered already, at "
                                     f"{self._dispatchers[index]}, not {address}")
                self._dispatchers[index] = address
            elif request == "wait_for_dispatcher":
                index, timeout = self._dispatcher(args[0]), args[1]
                self._wait(lambda: self._dispatchers[index] is not None, timeout,
                           f"no dispatcher {index} registered")
                return self._dispatchers[index]
            elif request == "register_worker":
                self._workers[self._dispatcher(args[0])].add(args[1])
            elif request == "wait_for_workers":
                index, timeout = self._dispatcher(args[0]), args[1]
                self._wait(lambda: len(self._workers[index]) >= self._workers_per_dispatcher,
                           timeout, f"not all {self._workers_per_dispatcher} workers of "
                           f"dispatcher {index} registered")
            elif request == "shutdown":
                self._stopped = True
            elif request == "wait_for_shutdown":
                self._changed.wait_for(lambda: self._stopped)
            else:
                raise ValueError(f"unknown request {request!r}")
            self._changed.notify_all()
        return None


class ComputeClient:
    """Requests to a ``ComputeService`` at ``addresses`` (the first that answers)."""

    def __init__(self, addresses: Addresses, key: bytes, verbose: int = 1) -> None:
        self._addresses = [(str(ip), int(port)) for found in addresses.values()
                           for ip, port in found]
        self._key = key
        self.verbose = verbose

    def register_dispatcher(self, dispatcher_id: int, dispatcher_address: str) -> None:
        self._ask("register_dispatcher", dispatcher_id, dispatcher_address)

    def wait_for_dispatcher_registration(self, dispatcher_id: int, timeout: float) -> str:
        """The dispatcher's address, once it has registered."""
        return str(self._ask("wait_for_dispatcher", dispatcher_id, timeout))

    def register_worker_for_dispatcher(self, dispatcher_id: int, worker_id: int) -> None:
        self._ask("register_worker", dispatcher_id, worker_id)

    def wait_for_dispatcher_worker_registration(self, dispatcher_id: int,
                                                timeout: float) -> None:
        self._ask("wait_for_workers", dispatcher_id, timeout)

    def shutdown(self) -> None:
        """End the compute job: its workers and dispatchers stop."""
        self._ask("shutdown")

    def wait_for_shutdown(self) -> None:
        self._ask("wait_for_shutdown")

    def _connect(self) -> socket.socket:
        failures = []
        for address in self._addresses:
            try:
                return socket.create_connection(address, timeout=_CONNECT_S)
            except OSError as exc:
                failures.append(f"{address[0]}:{address[1]} ({exc})")
        raise ConnectionError("hvdlike: cannot reach the compute service at any of its "
                              f"addresses: {', '.join(failures) or 'none given'}; is its "
                              "compute job still running?")

    def _ask(self, *request: Any) -> Any:
        sock = self._connect()
        sock.settimeout(None)  # a wait may take long: the service bounds it
        with Connection(sock.detach()) as conn:
            try:
                answer_challenge(conn, self._key)
                deliver_challenge(conn, self._key)
            except Exception as exc:  # noqa: BLE001 - AuthenticationError, a closed socket
                raise ConnectionError("hvdlike: the compute service refused this client's key "
                                      f"({exc}): read the config file the compute job wrote "
                                      "this time") from None
            conn.send(request)
            try:
                reply = conn.recv()
            except EOFError:
                raise ConnectionError(f"hvdlike: the compute service closed the connection "
                                      f"during {request[0]!r} (has its compute job "
                                      "ended?)") from None
        if isinstance(reply, Exception):
            raise reply
        return reply
