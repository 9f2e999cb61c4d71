"""How the NumPy collectives hand a call to the engine: its arrays taken as they are
(``Inputs``: NumPy or GPU arrays), the checks each rank makes on its own input (dtype, op,
factors, name), the request submitted to its process set's engine (``submit``)."""
import functools
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import process_sets, runtime
from .base import dtypes
from .base.reduce_ops import ReduceOp
from .engine import adasum, checks
from .engine.checks import Request
from .handles import set_finisher
from .process_sets import ProcessSet
from .transport import gpu


def as_array(x: Any) -> np.ndarray:
    a = x if type(x) is np.ndarray else np.asarray(x)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


class Inputs:
    """A call's arrays: NumPy arrays, or CuPy views of GPU arrays (``restore`` then turns the
    results back into the caller's kind of array); ``error``: host and GPU arrays mixed."""

    __slots__ = ("arrays", "restore", "error")

    def __init__(self, xs: Sequence[Any]) -> None:
        self.restore: Optional[Any] = None
        self.error: Optional[checks.LocalError] = None
        if len(xs) == 1 and type(xs[0]) is np.ndarray:  # the latency path: one host array
            self.arrays = [as_array(xs[0])]
            return
        if all(type(x) is np.ndarray for x in xs):
            self.arrays = [as_array(x) for x in xs]
            return
        if len(xs) == 1 and gpu.is_device_array(xs[0]):
            converted = gpu.as_cupy(xs[0])
            self.arrays, self.restore = [converted.array], converted.restore
            return
        kind, why = gpu.device_kind(xs)
        if kind == "cpu" and why is None:
            self.arrays = [as_array(x) for x in xs]
            return
        self.arrays = []
        for x in xs:
            if gpu.is_device_array(x):
                converted = gpu.as_cupy(x)
                self.arrays.append(converted.array)
                self.restore = self.restore or converted.restore
            else:
                self.arrays.append(as_array(x))
        if why is not None:
            self.error, self.restore = ("ValueError", why), None


def engine_of(process_set: ProcessSet, kind: str) -> Any:
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


def submit(process_set: ProcessSet, request: Request, error: Optional[checks.LocalError],
           inputs: Any, blocking: bool = False, on_gpu: Optional[Inputs] = None) -> Any:
    """Hand a request to the engine: returns its handle, or with ``blocking`` its result.
    ``on_gpu``: the call's arrays when they live on a GPU (the request then says so, and the
    handle gives results back on the caller's stream)."""
    if request.name is not None and type(request.name) is not str:
        require_name(request.name, f"hvdlike.{request.kind}()")
    engine = engine_of(process_set, request.kind)
    if on_gpu is None or on_gpu.restore is None:
        if blocking:
            return engine.call(request, error, inputs, process_set)
        return engine.submit(request, error, inputs, process_set)
    handle = engine.submit(request._replace(device="gpu"), error,
                           gpu.submitted(inputs, blocking), process_set, wake=not blocking)
    set_finisher(handle, gpu.finisher(on_gpu.restore))
    return handle.synchronize() if blocking else handle


def dtype_error(a: np.ndarray) -> Optional[checks.LocalError]:
    msg = dtypes.dtype_error(a.dtype)
    return ("TypeError", msg) if msg else None


@functools.lru_cache(maxsize=256)
def reduce_error_for(dtype: np.dtype, op: ReduceOp) -> Optional[checks.LocalError]:
    msg = dtypes.dtype_error(dtype) or dtypes.reduce_op_error(dtype, op)
    return ("TypeError", msg) if msg else None


def adasum_error(process_set: ProcessSet, given: Inputs) -> Optional[checks.LocalError]:
    why = adasum.power_of_two_error(process_set.size())
    if not why and given.restore is not None:
        why = ("Adasum on GPU arrays is not supported; pass host (NumPy) arrays, or reduce "
               "with hvdlike.Average")
    return ("ValueError", why) if why else None


def factors(kind: str, prescale_factor: Any, postscale_factor: Any) -> Tuple[float, float]:
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


def first_error(errors: Any) -> Optional[checks.LocalError]:
    return next((e for e in errors if e), None)


def root_error(root_rank: Any, process_set: ProcessSet) -> Optional[checks.LocalError]:
    """The local error of a ``root_rank`` that is not an int rank of ``process_set``."""
    if not isinstance(root_rank, (int, np.integer)) or isinstance(root_rank, bool):
        return ("TypeError", f"root_rank must be an int world rank, got {root_rank!r}")
    if root_rank not in process_set.ranks:
        return ("ValueError", f"root_rank {root_rank} is not a rank of {process_set}; pass one "
                              f"of {process_set.ranks}")
    return None


def root(root_rank: Any) -> Any:
    """``root_rank`` as a request carries it (a bad one as its repr, for the error)."""
    return int(root_rank) if isinstance(root_rank, (int, np.integer)) else repr(root_rank)
