"""The messages between parameter-server workers and servers (tags, header kinds, the flag at
the end of a pull's reply, waiting without spinning), and how a failure on one rank ends
``run`` on every rank: a failed server answers until its workers are done, then every rank
learns who failed first."""
import time
from typing import Any, Iterable, List, Optional, Set, Type

import numpy as np

import hvdlike as _core

HEADER, PAYLOAD, REPLY = 11, 12, 13  # message tags
PUSH, DONE, PULL = 1, 2, 3  # header kinds: [kind, 0], int64
GO, STOP, FAILED = 0.0, 1.0, 2.0  # a reply's last element: go on, stop training, the server failed


def wait(request: Any, status: Any = None) -> None:
    """Wait for ``request``, sleeping rather than spinning after the first 50 µs: a server
    and its workers often share cores, and MPI's blocking receive polls a whole core. Sleeps
    grow to at most 250 µs, which a reply or push waits at worst past its arrival."""
    start = time.perf_counter()
    sleep = 20e-6
    while not request.Test(status):
        if time.perf_counter() - start > 50e-6:
            time.sleep(sleep)
            sleep = min(2 * sleep, 250e-6)


def as_bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def answer_failed_until_done(comm: Any, any_source: int, status: Any, active: Set[int],
                             waiting: Iterable[int], reply_size: int, push_bytes: int) -> None:
    """A server whose loop raised: answer every pull ``FAILED`` (those held back by the
    staleness bound, ``waiting``, at once) and take every push's payload, until each worker
    in ``active`` has said it is done, so that no worker waits for this server forever."""
    reply = np.zeros(reply_size + 1, np.float32)
    reply[-1] = FAILED
    for worker in waiting:
        comm.Send(reply, dest=worker, tag=REPLY)
    header = np.empty(2, np.int64)
    payload = np.empty(push_bytes, np.uint8)
    while active:
        wait(comm.Irecv(header, source=any_source, tag=HEADER), status)
        worker = status.Get_source()
        if header[0] == DONE:
            active.discard(worker)
        elif header[0] == PULL:
            comm.Send(reply, dest=worker, tag=REPLY)
        else:
            comm.Recv(payload, source=worker, tag=PAYLOAD)


def raise_on_every_rank(error: Optional[Exception], own: bool, rank: int, servers: List[int],
                        size: int, where: str, others: Type[Exception]) -> None:
    """Collective: raise on every rank if any raised. The lowest rank whose ``error`` was its
    ``own`` (not a worker stopped by a failed server) raises it; the others raise ``others``,
    naming that rank and its error."""
    first = int(_core.allreduce(np.array([rank if own else size], np.int64), op=_core.Min,
                                name=f"{where}.failed")[0])
    if first == size:
        if error is not None:
            raise error
        return
    what = _core.broadcast_object(f"{type(error).__name__}: {error}"[:2000]
                                  if rank == first else None, root_rank=first)
    if rank == first and error is not None:
        raise error
    role = f"server {servers.index(first)}" if first in servers else f"worker {first}"
    raise others(f"{where}: {role} (rank {first}) raised {what}; it raises on every rank "
                 "(that rank's traceback says where)") from error
