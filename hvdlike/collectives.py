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
import contextlib
import functools
import pickle
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import process_sets, runtime
from .base import dtypes
from .base.reduce_ops import ReduceOp, as_reduce_op
from .engine import adasum, checks
from .engine.checks import Request
from .handles import Handle
from .process_sets import ProcessSet, global_process_set
from .transport import gpu

# ----------------------------------------------------------------------------- helpers

def _array(x: Any) -> np.ndarray:
    a = x if type(x) is np.ndarray else np.asarray(x)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


class _Inputs:
    """A call's arrays: NumPy arrays, or CuPy views of GPU arrays (``restore`` then turns the
    results back into the caller's kind of array); ``error``: host and GPU arrays mixed."""

    __slots__ = ("arrays", "restore", "error")

    def __init__(self, xs: Sequence[Any]) -> None:
        self.restore: Optional[Any] = None
        self.error: Optional[checks.LocalError] = None
        if len(xs) == 1 and type(xs[0]) is np.ndarray:  # the latency path: one host array
            self.arrays = [_array(xs[0])]
            return
        if all(type(x) is np.ndarray for x in xs):
            self.arrays = [_array(x) for x in xs]
            return
        if len(xs) == 1 and gpu.is_device_array(xs[0]):
            converted = gpu.as_cupy(xs[0])
            self.arrays, self.restore = [converted.array], converted.restore
            return
        kind, why = gpu.device_kind(xs)
        if kind == "cpu" and why is None:
            self.arrays = [_array(x) for x in xs]
            return
        self.arrays = []
        for x in xs:
            if gpu.is_device_array(x):
                converted = gpu.as_cupy(x)
                self.arrays.append(converted.array)
                self.restore = self.restore or converted.restore
            else:
                self.arrays.append(_array(x))
        if why is not None:
            self.error, self.restore = ("ValueError", why), None


def _engine(process_set: ProcessSet, kind: str) -> Any:
    st = runtime.current()
    if not isinstance(process_set, ProcessSet):
        process_sets.require_process_set(process_set, f"hvdlike.{kind}()")
    if st is None or process_set.group is None:
        st = process_sets.require_member(process_set, f"hvdlike.{kind}()",
                                         "only its member ranks may call collectives on it")
    return st.engine


def require_name(name: Any, where: str) -> None:
    """Raise TypeError unless ``name`` (a collective's ``name=``) is a string or None."""
    if name is not None and type(name) is not str:
        raise TypeError(f"{where}: name= takes a string (the same on every rank) or None, "
                        f"got {type(name).__name__} {name!r}")


def _submit(process_set: ProcessSet, request: Request, error: Optional[checks.LocalError],
            inputs: Any, blocking: bool = False, on_gpu: Optional[_Inputs] = None) -> Any:
    """Hand a request to the engine: returns its handle, or with ``blocking`` its result.
    ``on_gpu``: the call's arrays when they live on a GPU (the request then says so, and the
    handle gives results back on the caller's stream)."""
    require_name(request.name, f"hvdlike.{request.kind}()")
    engine = _engine(process_set, request.kind)
    if on_gpu is None or on_gpu.restore is None:
        if blocking:
            return engine.call(request, error, inputs, process_set)
        return engine.submit(request, error, inputs, process_set)
    handle = engine.submit(request._replace(device="gpu"), error,
                           gpu.submitted(inputs, blocking), process_set, wake=not blocking)
    handle._finish = gpu.finisher(on_gpu.restore)
    return handle.synchronize() if blocking else handle


def _dtype_error(a: np.ndarray) -> Optional[checks.LocalError]:
    msg = dtypes.dtype_error(a.dtype)
    return ("TypeError", msg) if msg else None


@functools.lru_cache(maxsize=256)
def _reduce_error_for(dtype: np.dtype, op: ReduceOp) -> Optional[checks.LocalError]:
    msg = dtypes.dtype_error(dtype) or dtypes.reduce_op_error(dtype, op)
    return ("TypeError", msg) if msg else None


def _adasum_error(process_set: ProcessSet, given: _Inputs) -> Optional[checks.LocalError]:
    why = adasum.power_of_two_error(process_set.size())
    if not why and given.restore is not None:
        why = ("Adasum on GPU arrays is not supported; pass host (NumPy) arrays, or reduce "
               "with hvdlike.Average")
    return ("ValueError", why) if why else None


def _factors(kind: str, prescale_factor: Any, postscale_factor: Any) -> Tuple[float, float]:
    try:
        return float(prescale_factor), float(postscale_factor)
    except (TypeError, ValueError):
        raise TypeError(f"hvdlike.{kind}(): prescale_factor and postscale_factor take numbers, "
                        f"got {prescale_factor!r} and {postscale_factor!r}") from None


def listed(xs: Any, what: str) -> List[Any]:
    """The arrays or tensors of a grouped call ``what`` (e.g. "hvdlike.grouped_allreduce"),
    refusing one array or tensor (iterating it would group its rows)."""
    if hasattr(xs, "shape") and hasattr(xs, "dtype"):
        raise TypeError(f"{what}() takes a list, got one {type(xs).__name__}; pass [x], or "
                        f"call {what.replace('grouped_', '')}(x)")
    return list(xs)


def _first(errors: Any) -> Optional[checks.LocalError]:
    return next((e for e in errors if e), None)


# ----------------------------------------------------------------------------- allreduce

def _allreduce(xs: Sequence[Any], op: Any, prescale_factor: float, postscale_factor: float,
               name: Optional[str], process_set: ProcessSet, grouped: bool,
               blocking: bool = False, parts: Optional[Tuple[Any, ...]] = None) -> Any:
    op = as_reduce_op(op)
    scale = _factors("grouped_allreduce" if grouped else "allreduce", prescale_factor,
                     postscale_factor)
    given = _Inputs(xs)
    arrays = given.arrays
    if grouped:
        request = Request("grouped_allreduce", name, tuple(a.dtype for a in arrays),
                          tuple(a.shape for a in arrays), int(op), None, scale, parts=parts)
        error = given.error or _first(_reduce_error_for(a.dtype, op) for a in arrays)
    else:
        a = arrays[0]
        request = Request("allreduce", name, a.dtype, a.shape, int(op), None, scale)
        error = _reduce_error_for(a.dtype, op)
    if op == ReduceOp.ADASUM:
        error = error or _adasum_error(process_set, given)
    return _submit(process_set, request, error, arrays, blocking, given)


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


def allreduce_async(x: Any, op: Any = ReduceOp.AVERAGE, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``allreduce`` and return at once; ``handle.synchronize()`` returns its result."""
    return _allreduce([x], op, prescale_factor, postscale_factor, name, process_set, False)


def grouped_allreduce(xs: Sequence[Any], op: Any = ReduceOp.AVERAGE, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[np.ndarray]:
    """``allreduce`` of a list of arrays under one name, fused: arrays of one dtype travel
    together (with other all-reduces ready at the same time) in buckets of up to
    HVDLIKE_FUSION_THRESHOLD bytes, straight from their memory where the transport allows.
    Returns a list of new arrays."""
    return _allreduce(listed(xs, "hvdlike.grouped_allreduce"), op, prescale_factor,
                      postscale_factor, name, process_set, True, True)


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
    given = _Inputs(xs)
    arrays = [_rows(a) for a in given.arrays]
    dts = tuple(a.dtype for a in arrays)
    shapes = tuple(a.shape[1:] for a in arrays)
    kind = "grouped_allgather" if grouped else "allgather"
    request = Request(kind, name, dts if grouped else dts[0], shapes if grouped else shapes[0])
    return _submit(process_set, request, given.error or _first(map(_dtype_error, arrays)),
                   arrays, blocking, given)


def allgather(x: Any, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Concatenate every rank's ``x`` along the first dimension, in rank order.

    Ranks pass the same dtype and the same shape except the first dimension, which may differ
    (a scalar counts as one row). Every rank gets the whole concatenation as a new array.
    """
    return _allgather([x], name, process_set, False, True)


def allgather_async(x: Any, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``allgather``; ``handle.synchronize()`` returns its result."""
    return _allgather([x], name, process_set, False)


def grouped_allgather(xs: Sequence[Any], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[np.ndarray]:
    """``allgather`` of a list of arrays in one MPI call. Returns a list of new arrays."""
    return _allgather(listed(xs, "hvdlike.grouped_allgather"), name, process_set, True, True)


def grouped_allgather_async(xs: Sequence[Any], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``grouped_allgather``; ``handle.synchronize()`` returns the list of results."""
    return _allgather(listed(xs, "hvdlike.grouped_allgather_async"), name, process_set, True)


# ----------------------------------------------------------------------------- broadcast

def _root_error(root_rank: Any, process_set: ProcessSet) -> Optional[checks.LocalError]:
    if not isinstance(root_rank, (int, np.integer)) or isinstance(root_rank, bool):
        return ("TypeError", f"root_rank must be an int world rank, got {root_rank!r}")
    if root_rank not in process_set.ranks:
        return ("ValueError", f"root_rank {root_rank} is not a rank of {process_set}; pass one "
                              f"of {process_set.ranks}")
    return None


def _root(root_rank: Any) -> Any:
    return int(root_rank) if isinstance(root_rank, (int, np.integer)) else repr(root_rank)


def broadcast(x: Any, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Every rank gets a new array equal to ``x`` on ``root_rank`` (a world rank in the set).

    All ranks pass arrays of the same shape and dtype (non-root contents are ignored)."""
    return _broadcast(x, root_rank, name, process_set, True)


def broadcast_async(x: Any, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``broadcast``; ``handle.synchronize()`` returns its result."""
    return _broadcast(x, root_rank, name, process_set, False)


def _broadcast(x: Any, root_rank: int, name: Optional[str], process_set: ProcessSet,
               blocking: bool) -> Any:
    given = _Inputs([x])
    (a,) = given.arrays
    request = Request("broadcast", name, a.dtype, a.shape, None, _root(root_rank))
    return _submit(process_set, request,
                   _root_error(root_rank, process_set) or _dtype_error(a), [a], blocking, given)


# ----------------------------------------------------------------------------- alltoall

def _splits_or_error(a: np.ndarray, splits: Any, n: int) -> Tuple[np.ndarray, Optional[checks.LocalError]]:
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
    if s.shape != (n,) or s.dtype.kind not in "iu" or (s < 0).any() or s.sum() != a.shape[0]:
        return np.zeros(n, np.int64), (
            "ValueError", f"alltoall splits must be {n} non-negative integers (one per rank) "
                          f"summing to the first dimension {a.shape[0]}, got {s.tolist()}")
    return s.astype(np.int64), None


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


def alltoall_async(x: Any, splits: Any = None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start ``alltoall``; ``handle.synchronize()`` returns (received, received_splits),
    whether or not ``splits`` was given."""
    return _alltoall(x, splits, name, process_set, False)


def _alltoall(x: Any, splits: Any, name: Optional[str], process_set: ProcessSet,
              blocking: bool) -> Any:
    given = _Inputs([x])
    (a,) = given.arrays
    send_splits, error = _splits_or_error(a, splits, process_set.size())
    request = Request("alltoall", name, a.dtype, a.shape[1:])
    return _submit(process_set, request, error or _dtype_error(a), (a, send_splits), blocking,
                   given)


# ----------------------------------------------------------------------------- reducescatter

def _scatter_error(a: np.ndarray, op: ReduceOp) -> Optional[checks.LocalError]:
    if a.ndim == 0:
        return ("ValueError", "reducescatter needs an array with at least one dimension, got a "
                              "scalar")
    if op == ReduceOp.ADASUM:
        return ("ValueError", "Adasum is an all-reduce: reducescatter does not support it; use "
                              "hvdlike.Sum or hvdlike.Average")
    return _reduce_error_for(a.dtype, op)


def _reducescatter(xs: Sequence[Any], op: Any, name: Optional[str], process_set: ProcessSet,
                   prescale_factor: float, postscale_factor: float, grouped: bool,
                   blocking: bool = False) -> Any:
    given = _Inputs(xs)
    arrays = given.arrays
    op = as_reduce_op(op)
    dts = tuple(a.dtype for a in arrays)
    shapes = tuple(a.shape for a in arrays)
    kind = "grouped_reducescatter" if grouped else "reducescatter"
    request = Request(kind, name, dts if grouped else dts[0], shapes if grouped else shapes[0],
                      int(op), None, _factors(kind, prescale_factor, postscale_factor))
    return _submit(process_set, request,
                   given.error or _first(_scatter_error(a, op) for a in arrays), arrays,
                   blocking, given)


def reducescatter(x: Any, op: Any = ReduceOp.AVERAGE, name: Optional[str] = None,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce ``x`` over the ranks and give each rank its block of rows.

    Ranks pass the same shape and dtype; the first dimension is split in rank order, as evenly
    as possible (the first dim0 % size ranks get one extra row). Op semantics as in allreduce.
    """
    return _reducescatter([x], op, name, process_set, prescale_factor, postscale_factor, False,
                          True)


def reducescatter_async(x: Any, op: Any = ReduceOp.AVERAGE, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start ``reducescatter``; ``handle.synchronize()`` returns its result."""
    return _reducescatter([x], op, name, process_set, prescale_factor, postscale_factor, False)


def grouped_reducescatter(xs: Sequence[Any], op: Any = ReduceOp.AVERAGE,
                          name: Optional[str] = None,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[np.ndarray]:
    """``reducescatter`` of a list of arrays, fused per dtype like grouped_allreduce."""
    return _reducescatter(listed(xs, "hvdlike.grouped_reducescatter"), op, name, process_set,
                          prescale_factor, postscale_factor, True, True)


def grouped_reducescatter_async(xs: Sequence[Any], op: Any = ReduceOp.AVERAGE,
                                name: Optional[str] = None,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Start ``grouped_reducescatter``; ``handle.synchronize()`` returns the list of results."""
    return _reducescatter(listed(xs, "hvdlike.grouped_reducescatter_async"), op, name,
                          process_set, prescale_factor, postscale_factor, True)


# ----------------------------------------------------------------------------- control

def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank of ``process_set`` has called barrier."""
    _submit(process_set, Request("barrier", None, None, None), None, None, True)


@contextlib.contextmanager
def exclusive_mpi() -> Iterator[None]:
    """A block in which your thread is the only one of this process in MPI: hvdlike's engine
    makes no MPI call from its start to its end. Collective: every rank enters it (in the same
    order as its other collectives; all engines stop in the same round) and leaves it.

    For MPI calls of your own next to hvdlike (mpi4py on your own communicators): Open MPI 5
    over TCP can hang when two threads of a process are in MPI at once (docs/multinode.md).
    Inside the block hvdlike's collectives raise, and so does waiting on a request that has
    not run yet. Leaving does not wait for the other ranks: this rank's engine goes on, and
    its next round waits for theirs (a rank that never leaves is what the stall inspector
    reports).
    """
    engine = runtime.state("hvdlike.exclusive_mpi()").engine
    _submit(global_process_set, Request("exclusive_mpi", "hvdlike.exclusive_mpi", None, None),
            None, engine.pause, True)
    try:
        yield
    finally:
        engine.resume()


def join() -> int:
    """Declare that this rank has no more data (uneven inputs). Global process set only.

    Until every rank has joined, this rank takes part in the other ranks' allreduce and
    grouped_allreduce requests (Sum, Average or Adasum only) with zeros; Average still divides
    by the full size, and Adasum leaves zeros out. Returns, on every rank, the rank that
    joined last (the highest if several joined in the same round).
    """
    st = runtime.state("hvdlike.join()")
    return st.engine.submit(Request("join", "hvdlike.join", None, None), None, None,
                            global_process_set, wake=False).synchronize()


def _pickled(obj: Any, what: str) -> Tuple[Optional[bytes], Optional[checks.LocalError]]:
    """``obj`` pickled here, before it is submitted, so that an object that cannot be pickled
    is an error every rank raises instead of a failure inside the transfer."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), None
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the caller's input
        return None, ("TypeError", f"hvdlike.{what}: the object on rank {runtime.rank()} "
                                   f"cannot be pickled ({type(exc).__name__}: {exc}); pass "
                                   "something picklable, e.g. convert it to plain data first")


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Every rank gets (an unpickled copy of) the root's picklable ``obj``."""
    request = Request("broadcast_object", name, None, None, None, _root(root_rank))
    error = _root_error(root_rank, process_set)
    payload = None
    if error is None and root_rank == runtime.rank():
        payload, error = _pickled(obj, "broadcast_object")
    return _submit(process_set, request, error, payload, True)


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Every rank gets the list of every rank's picklable ``obj``, in rank order."""
    payload, error = _pickled(obj, "allgather_object")
    return _submit(process_set, Request("allgather_object", name, None, None), error,
                   payload, True)
