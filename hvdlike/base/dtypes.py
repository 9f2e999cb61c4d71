"""The dtypes hvdlike collectives accept, and how each is reduced.

float16 and bfloat16 have no MPI datatype: they are reduced in float32. Scaling follows
Horovod's definition: a prescaled value is computed in float32 and rounded to the 16-bit dtype
before the reduction; the reduced sum is rounded to it before the postscale (or Average's
1/n) is applied, and the result is rounded once more. bool supports Sum/Max (logical or) and Min/Product (logical and), not Average. Integer
Average keeps the dtype: the sum is divided by the set size and truncated toward zero.
"""
from typing import Optional

import ml_dtypes
import numpy as np

from .reduce_ops import ReduceOp

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

SUPPORTED = tuple(
    np.dtype(t)
    for t in (np.float16, BFLOAT16, np.float32, np.float64, np.int8, np.int16, np.int32,
              np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_)
)
_SUPPORTED_SET = frozenset(SUPPORTED)
_SUPPORTED_NAMES = ", ".join(str(d) for d in SUPPORTED)
_FLOAT32 = np.dtype(np.float32)
_UINT8 = np.dtype(np.uint8)
HALF = frozenset((np.dtype(np.float16), BFLOAT16))


def dtype_error(dtype: np.dtype) -> Optional[str]:
    """Return why ``dtype`` is not accepted, or None if it is."""
    if dtype in _SUPPORTED_SET:
        return None
    if dtype.kind in "USOV":  # strings, bytes, Python objects, records: no cast helps
        advice = ("for strings and other Python objects use hvdlike.broadcast_object or "
                  "hvdlike.allgather_object")
    else:
        advice = "cast the array first (for example x.astype(np.float32))"
    return f"dtype {dtype} is not supported; supported dtypes are {_SUPPORTED_NAMES}: {advice}"


def reduce_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype the reduction itself runs in (float32 for 16-bit floats, uint8 for bool)."""
    if dtype.kind == "b":
        return _UINT8
    if dtype in HALF:
        return _FLOAT32
    return dtype


def reduce_op_error(dtype: np.dtype, op: ReduceOp) -> Optional[str]:
    """Return why ``op`` cannot reduce ``dtype``, or None if it can."""
    if dtype.kind == "b" and op == ReduceOp.AVERAGE:
        return ("Average is not defined for bool; use hvdlike.Sum or hvdlike.Max (logical or) "
                "or hvdlike.Min (logical and), or cast to a number first")
    if op == ReduceOp.ADASUM and dtype.kind != "f" and dtype not in HALF:
        return (f"Adasum combines floating-point gradients; got {dtype}: cast to a float dtype "
                "or reduce with hvdlike.Sum or hvdlike.Average")
    return None


def bool_op(op: ReduceOp) -> ReduceOp:
    """The uint8 reduction that implements ``op`` on bool values."""
    return ReduceOp.MAX if op in (ReduceOp.SUM, ReduceOp.MAX) else ReduceOp.MIN
