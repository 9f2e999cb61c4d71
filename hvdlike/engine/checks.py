"""Cross-rank consistency of requests: what one rank asks for, and the error every rank raises
when the ranks asked for different things or one rank passed bad input.

The engine's negotiation gathers every rank's ``Request`` for a name once (cached after) and
calls ``resolve_or_error``; every rank gets the same verdict and so raises the same error.
"""
import enum
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..base.errors import CollectiveMismatchError
from ..base.reduce_ops import ReduceOp


class Kind(str, enum.Enum):
    """What a request asks for. A kind is equal to its name and hashes as it does, so that a
    name ("allreduce") may stand for it, and it reads as its name in messages."""

    ALLREDUCE = "allreduce"
    GROUPED_ALLREDUCE = "grouped_allreduce"
    ALLGATHER = "allgather"
    GROUPED_ALLGATHER = "grouped_allgather"
    BROADCAST = "broadcast"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    GROUPED_REDUCESCATTER = "grouped_reducescatter"
    BARRIER = "barrier"
    BROADCAST_OBJECT = "broadcast_object"
    ALLGATHER_OBJECT = "allgather_object"
    JOIN = "join"
    PROCESS_SET = "process_set"
    EXCLUSIVE_MPI = "exclusive_mpi"

    # the str's own methods (C slots: no Python call where a kind is a dict key)
    __hash__ = str.__hash__
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]


class Request(NamedTuple):
    """What one rank asks for; every rank must ask for the same thing under one name."""

    kind: Kind
    name: Optional[str]
    dtype: Any  # np.dtype, or a tuple of them for grouped collectives
    shape: Any  # tuple, or a tuple of tuples for grouped collectives
    op: Optional[int] = None
    root: Optional[int] = None
    scale: Tuple[float, float] = (1.0, 1.0)
    device: str = "cpu"  # "gpu": GPU arrays (every rank must agree, as in Horovod)
    # grouped all-reduce of arrays that each carry several tensors one after another
    # (the TensorFlow frontend packs small tensors so): per array, its tensors' shapes, or
    # None for an array that is one tensor; None when no array carries several
    parts: Optional[Tuple[Optional[Tuple[Tuple[int, ...], ...]], ...]] = None

    def reduce_op(self) -> ReduceOp:
        """The op of a reduction request."""
        assert self.op is not None, self
        return ReduceOp(self.op)

    def root_rank(self) -> int:
        """The root (a world rank) of a broadcast request."""
        assert self.root is not None, self
        return int(self.root)


LocalError = Tuple[str, str]  # ("TypeError" | "ValueError", message)

_ERROR_TYPES = {"TypeError": TypeError, "ValueError": ValueError}
_SHAPE_AFTER_FIRST = (Kind.ALLGATHER, Kind.GROUPED_ALLGATHER, Kind.ALLTOALL)
_JOIN_COMPATIBLE = (Kind.ALLREDUCE, Kind.GROUPED_ALLREDUCE)


def joinable(request: Request) -> bool:
    """Whether ``request`` may run while some ranks have joined (they contribute zeros)."""
    return (request.kind in _JOIN_COMPATIBLE
            and request.op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.ADASUM))


def raised_on_every_rank(exc: Exception, set_rank: int) -> Exception:
    """Mark an error that every rank of a set raises, so that if it goes uncaught only the
    set's first rank prints it before the job is aborted."""
    exc.hvdlike_quiet = set_rank != 0  # type: ignore[attr-defined]
    return exc


def resolve_or_error(answers: Sequence[Optional[Tuple[Request, Optional[LocalError]]]],
                     ranks: Sequence[int]) -> Tuple[Request, Optional[Exception]]:
    """``resolve`` that returns (agreed request, None) or (a request, the exception)."""
    try:
        return resolve(answers, ranks), None
    except (TypeError, ValueError) as exc:
        first = next(a for a in answers if a is not None)
        return first[0], exc


def resolve(answers: Sequence[Optional[Tuple[Request, Optional[LocalError]]]],
            ranks: Sequence[int]) -> Request:
    """Given every rank's (request, error) (None for joined ranks), return the agreed request
    or raise the same exception on every rank. ``ranks``: the world rank of each answer (the
    process set's members), which the messages name."""
    active = [(r, a[0], a[1]) for r, a in zip(ranks, answers) if a is not None]
    name = active[0][1].name
    what = f"hvdlike.{active[0][1].kind}" + (
        f" {name!r}" if name and not name.startswith("noname.") else "")  # given names only
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
            f"{what}: ranks called it with different arguments. {differences}. Requests are "
            "matched by name (unnamed ones in call order): every rank must submit each name "
            "with the same collective, dtype, shape, op, root and device (host or GPU; only the "
            "first dimension may differ in allgather and alltoall).")
    joined = [r for r, a in zip(ranks, answers) if a is None]
    if joined and not joinable(request):
        raise ValueError(
            f"{what}: ranks {joined} have already called hvdlike.join(); until every rank has "
            "joined, only allreduce and grouped_allreduce with op Sum, Average or Adasum may be "
            "called "
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


def _tensor_shapes(request: Request) -> Any:
    """The shapes of a request's tensors: ``shape``, with each array that carries several
    tensors (``parts``) replaced by their shapes."""
    if request.parts is None:
        return request.shape
    return tuple(s for shape, part in zip(request.shape, request.parts)
                 for s in ((shape,) if part is None else part))


def _tensor_dtypes(request: Request) -> Any:
    """The dtypes of a request's tensors: ``dtype``, with an array's repeated for each tensor
    it carries (``parts``)."""
    if request.parts is None:
        return request.dtype
    return tuple(d for d, part in zip(request.dtype, request.parts) for _ in part or (d,))


_SHOWN = {"shape": _tensor_shapes, "dtype": _tensor_dtypes}  # as the caller knows them


def _differences(requests: List[Tuple[int, Request]]) -> str:
    listed = []
    for field in Request._fields:
        if field == "parts":  # shown as the tensors' shapes and dtypes
            continue
        values = [(r, _SHOWN[field](q) if field in _SHOWN else getattr(q, field))
                  for r, q in requests]
        if len({repr(v) for _, v in values}) > 1:
            label = field
            if field == "shape" and requests[0][1].kind in _SHAPE_AFTER_FIRST:
                label = "shape after the first dimension"
            if field == "op":
                values = [(r, ReduceOp(v).name.title() if v is not None else None)
                          for r, v in values]
            listing = ", ".join(f"rank {r} has {_show(v)}" for r, v in values)
            listed.append(f"{label}: {listing}")
    if not listed and len({repr(q.parts) for _, q in requests}) > 1:
        counts = [(r, len(q.shape)) for r, q in requests]
        listing = ", ".join(f"rank {r} has them in {k} array{'s' if k > 1 else ''}"
                            for r, k in counts)
        listed.append(
            f"the same tensors, packed differently: {listing} (a graph packs the small tensors "
            "whose static shape it knows in full: give them the same static shapes on every "
            "rank)")
    return "; ".join(listed)
