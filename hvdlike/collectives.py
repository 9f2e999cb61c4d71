"""Collectives on NumPy arrays (any buffer-protocol array in, new NumPy arrays out) and on
GPU arrays (CuPy arrays or any CUDA ``__dlpack__`` object, such as a PyTorch CUDA tensor: new
arrays of the same kind out, on the GPU; see ``hvdlike.transport.gpu`` and docs/gpu.md).

Each collective validates its input on this rank, describes it as a ``Request`` (name,
dtype, shape, op, root, factors) and hands it to the engine, which matches requests across
ranks by name, in whatever order the ranks submitted them, and moves the data on a
background thread (or on the waiting caller's). The ``*_async`` form returns the handle at
once; the blocking form waits on it. Unnamed requests of a process set pair up in call order.
A mismatch, or bad input on any rank, raises the same error on every rank instead of hanging
or returning garbage.
"""
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from .base.reduce_ops import ReduceOp, as_reduce_op
from .base.tracebacks import short
from .engine import checks
from .engine.checks import Kind, Request
from .handles import Handle
from .process_sets import ProcessSet, global_process_set
from .submission import (
    Inputs,
    adasum_error,
    dtype_error,
    factors,
    first_error,
    listed,
    reduce_error_for,
    root,
    root_error,
    submit,
)

# ----------------------------------------------------------------------------- allreduce

def _allreduce(xs: Sequence[Any], op: Any, prescale_factor: float, postscale_factor: float,
               name: Optional[str], process_set: ProcessSet, grouped: bool,
               blocking: bool = False, parts: Optional[Tuple[Any, ...]] = None) -> Any:
    op = as_reduce_op(op)
    scale = factors("grouped_allreduce" if grouped else "allreduce", prescale_factor,
                    postscale_factor)
    given = Inputs(xs)
    arrays = given.arrays
    if grouped:
        request = Request(Kind.GROUPED_ALLREDUCE, name, tuple(a.dtype for a in arrays),
                          tuple(a.shape for a in arrays), int(op), None, scale, parts=parts)
        error = given.error or first_error(reduce_error_for(a.dtype, op) for a in arrays)
    else:
        a = arrays[0]
        request = Request(Kind.ALLREDUCE, name, a.dtype, a.shape, int(op), None, scale)
        error = reduce_error_for(a.dtype, op)
    if op == ReduceOp.ADASUM:
        error = error or adasum_error(process_set, given)
    return submit(process_set, request, error, arrays, blocking, given)


@short
def allreduce(x: Any, op: Any = ReduceOp.AVERAGE, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Reduce ``x`` over the ranks of ``process_set``.

    Every rank passes an array of the same shape and dtype and the same op and factors; every
    rank gets back a new array: op over all ranks of (x * prescale_factor), times
    postscale_factor. Average divides the sum by the set size (integers: truncated toward zero,
    dtype kept). float16/bfloat16 are reduced in float32. bool: Sum/Max = or, Min/Product = and.
    Adasum (floats, host arrays, a set of 2^k ranks) combines the ranks' arrays pairwise as
    Horovod's adaptive summation does (``hvdlike.engine.adasum``).
    """
    return _allreduce([x], op, prescale_factor, postscale_factor, name, process_set, False,
                      True)


@short
def allreduce_async(x: Any, op: Any = ReduceOp.AVERAGE, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``allreduce`` and return at once; ``handle.synchronize()`` returns its result."""
    return _allreduce([x], op, prescale_factor, postscale_factor, name, process_set, False)


@short
def grouped_allreduce(xs: Sequence[Any], op: Any = ReduceOp.AVERAGE, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[np.ndarray]:
    """``allreduce`` of a list of arrays under one name, fused: arrays of one dtype travel
    together (with other all-reduces ready at the same time) in buckets of up to
    HVDLIKE_FUSION_THRESHOLD bytes, straight from their memory where the transport allows.
    Returns a list of new arrays."""
    return _allreduce(listed(xs, "hvdlike.grouped_allreduce"), op, prescale_factor,
                      postscale_factor, name, process_set, True, True)


@short
def grouped_allreduce_async(xs: Sequence[Any], op: Any = ReduceOp.AVERAGE,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``grouped_allreduce``; ``handle.synchronize()`` returns the list of results."""
    return _allreduce(listed(xs, "hvdlike.grouped_allreduce_async"), op, prescale_factor,
                      postscale_factor, name, process_set, True)


def packed_allreduce_async(xs: Sequence[np.ndarray], parts: Tuple[Any, ...], op: Any,
                           prescale_factor: float, postscale_factor: float, name: Optional[str],
                           process_set: ProcessSet) -> Handle:
    """``grouped_allreduce_async`` of flat arrays that each carry several tensors one after
    another (the TensorFlow frontend's small tensors, packed in its graph): ``parts[i]``, the
    shapes of the tensors in ``xs[i]`` (None: it is one tensor). The engine reduces the
    arrays as they are, one result per array; the ranks must agree on ``parts`` too, so
    that a tensor whose shape differs between ranks fails on every rank, naming both."""
    return _allreduce(list(xs), op, prescale_factor, postscale_factor, name, process_set, True,
                      parts=tuple(parts))


# ----------------------------------------------------------------------------- allgather

def _rows(a: np.ndarray) -> np.ndarray:
    """``a`` with a first dimension to gather along (a scalar becomes one row)."""
    return a.reshape(1) if a.ndim == 0 else a


def _allgather(xs: Sequence[Any], name: Optional[str], process_set: ProcessSet,
               grouped: bool, blocking: bool = False) -> Any:
    given = Inputs(xs)
    arrays = [_rows(a) for a in given.arrays]
    dts = tuple(a.dtype for a in arrays)
    shapes = tuple(a.shape[1:] for a in arrays)
    kind = Kind.GROUPED_ALLGATHER if grouped else Kind.ALLGATHER
    request = Request(kind, name, dts if grouped else dts[0], shapes if grouped else shapes[0])
    return submit(process_set, request, given.error or first_error(map(dtype_error, arrays)),
                  arrays, blocking, given)


@short
def allgather(x: Any, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Concatenate every rank's ``x`` along the first dimension, in rank order.

    Ranks pass the same dtype and the same shape except the first dimension, which may differ
    (a scalar counts as one row). Every rank gets the whole concatenation as a new array.
    """
    return _allgather([x], name, process_set, False, True)


@short
def allgather_async(x: Any, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``allgather``; ``handle.synchronize()`` returns its result."""
    return _allgather([x], name, process_set, False)


@short
def grouped_allgather(xs: Sequence[Any], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[np.ndarray]:
    """``allgather`` of a list of arrays in one MPI call. Returns a list of new arrays."""
    return _allgather(listed(xs, "hvdlike.grouped_allgather"), name, process_set, True, True)


@short
def grouped_allgather_async(xs: Sequence[Any], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``grouped_allgather``; ``handle.synchronize()`` returns the list of results."""
    return _allgather(listed(xs, "hvdlike.grouped_allgather_async"), name, process_set, True)


# ----------------------------------------------------------------------------- broadcast

@short
def broadcast(x: Any, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Every rank gets a new array equal to ``x`` on ``root_rank`` (a world rank in the set).

    All ranks pass arrays of the same shape and dtype (non-root contents are ignored)."""
    return _broadcast(x, root_rank, name, process_set, True)


@short
def broadcast_async(x: Any, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``broadcast``; ``handle.synchronize()`` returns its result."""
    return _broadcast(x, root_rank, name, process_set, False)


def _broadcast(x: Any, root_rank: int, name: Optional[str], process_set: ProcessSet,
               blocking: bool) -> Any:
    given = Inputs([x])
    (a,) = given.arrays
    request = Request(Kind.BROADCAST, name, a.dtype, a.shape, None, root(root_rank))
    return submit(process_set, request,
                  root_error(root_rank, process_set) or dtype_error(a), [a], blocking, given)


# ----------------------------------------------------------------------------- alltoall

def _splits_or_error(a: np.ndarray, splits: Any,
                     n: int) -> Tuple[np.ndarray, Optional[checks.LocalError]]:
    if a.ndim == 0:
        return np.zeros(n, np.int64), ("ValueError", "alltoall needs an array with at least one "
                                                     "dimension to split, got a scalar")
    if splits is None:
        if a.shape[0] % n:
            return np.zeros(n, np.int64), (
                "ValueError", f"alltoall without splits needs a first dimension divisible by "
                              f"the {n} ranks, got {a.shape[0]}; pass splits=[rows per rank]")
        return np.full(n, a.shape[0] // n, np.int64), None
    s = np.asarray(splits)
    rows = s.tolist() if s.shape == (n,) and s.dtype.kind in "iu" else None
    # checked as Python integers: NumPy's sum of uint64 or int64 splits wraps around
    if rows is None or min(rows) < 0 or sum(rows) != a.shape[0]:
        return np.zeros(n, np.int64), (
            "ValueError", f"alltoall splits must be {n} non-negative integers (one per rank) "
                          f"summing to the first dimension {a.shape[0]}, got {s.tolist()}")
    return np.array(rows, np.int64), None


@short
def alltoall(x: Any, splits: Any = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set
             ) -> Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]:
    """Send ``splits[r]`` consecutive rows of ``x`` to rank r (equal parts when splits is None).

    Returns the rows received from every rank, concatenated in rank order; with ``splits``
    given, also the int64 array of how many rows came from each rank, as
    ``(received, received_splits)`` (Horovod's rule). Ranks pass the same dtype and shape
    after dimension 0.
    """
    received, received_splits = _alltoall(x, splits, name, process_set, True)
    return received if splits is None else (received, received_splits)


@short
def alltoall_async(x: Any, splits: Any = None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``alltoall``; ``handle.synchronize()`` returns (received, received_splits),
    whether or not ``splits`` was given."""
    return _alltoall(x, splits, name, process_set, False)


def _alltoall(x: Any, splits: Any, name: Optional[str], process_set: ProcessSet,
              blocking: bool) -> Any:
    given = Inputs([x])
    (a,) = given.arrays
    send_splits, error = _splits_or_error(a, splits, process_set.size())
    request = Request(Kind.ALLTOALL, name, a.dtype, a.shape[1:])
    return submit(process_set, request, error or dtype_error(a), (a, send_splits), blocking,
                  given)


# ----------------------------------------------------------------------------- reducescatter

def _scatter_error(a: np.ndarray, op: ReduceOp) -> Optional[checks.LocalError]:
    if a.ndim == 0:
        return ("ValueError", "reducescatter needs an array with at least one dimension, got a "
                              "scalar")
    if op == ReduceOp.ADASUM:
        return ("ValueError", "Adasum is an all-reduce: reducescatter does not support it; use "
                              "hvdlike.Sum or hvdlike.Average")
    return reduce_error_for(a.dtype, op)


def _reducescatter(xs: Sequence[Any], op: Any, name: Optional[str], process_set: ProcessSet,
                   prescale_factor: float, postscale_factor: float, grouped: bool,
                   blocking: bool = False) -> Any:
    given = Inputs(xs)
    arrays = given.arrays
    op = as_reduce_op(op)
    dts = tuple(a.dtype for a in arrays)
    shapes = tuple(a.shape for a in arrays)
    kind = Kind.GROUPED_REDUCESCATTER if grouped else Kind.REDUCESCATTER
    request = Request(kind, name, dts if grouped else dts[0], shapes if grouped else shapes[0],
                      int(op), None, factors(kind, prescale_factor, postscale_factor))
    return submit(process_set, request,
                  given.error or first_error(_scatter_error(a, op) for a in arrays), arrays,
                  blocking, given)


@short
def reducescatter(x: Any, op: Any = ReduceOp.AVERAGE, name: Optional[str] = None,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce ``x`` over the ranks and give each rank its block of rows.

    Ranks pass the same shape and dtype; the first dimension is split in rank order, as evenly
    as possible (the first dim0 % size ranks get one extra row). Op semantics as in allreduce.
    """
    return _reducescatter([x], op, name, process_set, prescale_factor, postscale_factor, False,
                          True)


@short
def reducescatter_async(x: Any, op: Any = ReduceOp.AVERAGE, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start ``reducescatter``; ``handle.synchronize()`` returns its result."""
    return _reducescatter([x], op, name, process_set, prescale_factor, postscale_factor, False)


@short
def grouped_reducescatter(xs: Sequence[Any], op: Any = ReduceOp.AVERAGE,
                          name: Optional[str] = None,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[np.ndarray]:
    """``reducescatter`` of a list of arrays, fused per dtype like grouped_allreduce."""
    return _reducescatter(listed(xs, "hvdlike.grouped_reducescatter"), op, name, process_set,
                          prescale_factor, postscale_factor, True, True)


@short
def grouped_reducescatter_async(xs: Sequence[Any], op: Any = ReduceOp.AVERAGE,
                                name: Optional[str] = None,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Start ``grouped_reducescatter``; ``handle.synchronize()`` returns the list of results."""
    return _reducescatter(listed(xs, "hvdlike.grouped_reducescatter_async"), op, name,
                          process_set, prescale_factor, postscale_factor, True)
