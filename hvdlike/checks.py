"""Cross-rank consistency check run before every collective ("negotiation").

Each rank hashes its request (kind, name, dtype, shape, op, root, scale factors) and all ranks
take one element-wise MAX over a 6-int64 control vector: [hash, -hash, error, joined, -joined,
newly joined rank]. When every hash agrees, no rank reported bad input and no rank has joined,
that single small allreduce is all it costs (hashes are cached per request). Otherwise all
ranks exchange their full requests and raise the same clear error, or, when ranks have called
``join()``, hand the agreed request to the joined ranks so they can contribute zeros.
"""
import hashlib
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .errors import CollectiveMismatchError
from .reduce_ops import ReduceOp


class Request(NamedTuple):
    """What one rank asks for; every rank must ask for the same thing."""

    kind: str  # "allreduce", "allgather", ... ("_async" appended for the non-blocking forms)
    name: Optional[str]
    dtype: Any  # np.dtype, or a tuple of them for grouped collectives
    shape: Any  # tuple, or a tuple of tuples for grouped collectives
    op: Optional[int] = None
    root: Optional[int] = None
    scale: Tuple[float, float] = (1.0, 1.0)


LocalError = Tuple[str, str]  # ("TypeError" | "ValueError", message)

_NEG = -(1 << 62)
_ERROR_TYPES = {"TypeError": TypeError, "ValueError": ValueError}
_SHAPE_AFTER_FIRST = ("allgather", "grouped_allgather", "alltoall")
_JOIN_COMPATIBLE = ("allreduce", "grouped_allreduce")
_rows: Dict[Request, np.ndarray] = {}


def _ok_row(request: Request) -> np.ndarray:
    """The control vector of a valid request: a 62-bit hash of it, stable across processes
    (unlike ``hash()``), and its negation. Cached, so repeated calls only look it up."""
    row = _rows.get(request)
    if row is None:
        digest = hashlib.blake2b(repr(request).encode(), digest_size=8).digest()
        h = int.from_bytes(digest, "little") >> 2
        if len(_rows) > 8192:
            _rows.clear()
        row = _rows[request] = np.array([h, -h, 0, 0, 0, -1], dtype=np.int64)
    return row


class Control:
    """Preallocated receive vector for one communicator."""

    def __init__(self) -> None:
        self.recv = np.empty(6, dtype=np.int64)


def negotiate(transport: Any, comm: Any, control: Control, request: Request,
              error: Optional[LocalError]) -> None:
    """Return when every rank of ``comm`` made the same valid request; else raise on every rank."""
    send = _ok_row(request)
    if error is not None:
        send = send.copy()
        send[2] = 1
    transport.max_ints(comm, send, control.recv)
    h_max, minus_h_min, any_error, any_joined = control.recv[:4].tolist()
    if not any_error and not any_joined and h_max == -minus_h_min:
        return
    try:
        resolve(comm.allgather((request, error)))
    except (TypeError, ValueError) as exc:
        raise raised_on_every_rank(exc, comm)


def raised_on_every_rank(exc: Exception, comm: Any) -> Exception:
    """Mark an error that every rank of ``comm`` raises, so that if it goes uncaught only the
    first rank prints it before the job is aborted."""
    exc.hvdlike_quiet = comm.Get_rank() != 0  # type: ignore[attr-defined]
    return exc


def join_round(transport: Any, comm: Any, control: Control, rank: int,
               first: bool) -> Tuple[bool, int, Optional[Request]]:
    """One round of a joined rank: (all joined?, last rank to join, request to serve)."""
    send = np.array([_NEG, _NEG, 0, 1, -1, rank if first else -1], dtype=np.int64)
    recv = control.recv
    transport.max_ints(comm, send, recv)
    if -recv[4] == 1:
        return True, int(recv[5]), None
    return False, -1, resolve(comm.allgather(None))


def resolve(answers: Sequence[Optional[Tuple[Request, Optional[LocalError]]]]) -> Request:
    """Given every rank's (request, error) (None for joined ranks), return the agreed request
    or raise the same exception on every rank."""
    active = [(r, a[0], a[1]) for r, a in enumerate(answers) if a is not None]
    what = f"hvdlike.{active[0][1].kind}"
    errors = [(r, e) for r, _, e in active if e is not None]
    if errors:
        etype = _ERROR_TYPES.get(errors[0][1][0], ValueError)
        by_message: Dict[str, List[int]] = {}
        for r, (_, msg) in errors:
            by_message.setdefault(msg, []).append(r)
        detail = "; ".join(f"{_ranks(rs)}: {msg}" for msg, rs in by_message.items())
        raise etype(f"{what} failed on every rank because of bad input. {detail}")
    request = active[0][1]
    differences = _differences([(r, q) for r, q, _ in active])
    if differences:
        raise CollectiveMismatchError(
            f"{what}: ranks called it with different arguments. {differences}. Every rank must "
            "call the same collectives in the same order with the same name, dtype, shape, op "
            "and root (only the first dimension may differ in allgather and alltoall).")
    joined = [r for r, a in enumerate(answers) if a is None]
    if joined and (request.kind.split("_async")[0] not in _JOIN_COMPATIBLE
                   or request.op not in (ReduceOp.SUM, ReduceOp.AVERAGE)):
        raise ValueError(
            f"{what}: ranks {joined} have already called hvdlike.join(); until every rank has "
            "joined, only allreduce and grouped_allreduce with op Sum or Average may be called "
            f"(got {request.kind} with op {request.op}).")
    return request


def _show(value: Any) -> str:
    if isinstance(value, np.dtype):
        return str(value)
    if isinstance(value, tuple) and value and all(isinstance(v, np.dtype) for v in value):
        return "(" + ", ".join(map(str, value)) + ")"
    return repr(value)


def _ranks(ranks: List[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _differences(requests: List[Tuple[int, Request]]) -> str:
    parts = []
    for field in Request._fields:
        values = [(r, getattr(q, field)) for r, q in requests]
        if len({repr(v) for _, v in values}) > 1:
            label = field
            if field == "shape" and requests[0][1].kind.split("_async")[0] in _SHAPE_AFTER_FIRST:
                label = "shape after the first dimension"
            if field == "op":
                values = [(r, ReduceOp(v).name.title() if v is not None else None)
                          for r, v in values]
            listing = ", ".join(f"rank {r} has {_show(v)}" for r, v in values)
            parts.append(f"{label}: {listing}")
    return "; ".join(parts)
