"""Average's 1/n and the factors, applied to reduced buffers; the dtype a reduction runs in on
the wire."""
import functools
from typing import Optional

import numpy as np

from ..base import dtypes
from ..base.reduce_ops import ReduceOp
from ..transport.interface import InPlacePass


def scale_in_place(buf: np.ndarray, op: ReduceOp, postscale: float, n: int,
                   half: Optional[np.dtype] = None) -> None:
    """Apply Average's 1/n and the postscale factor to a reduced buffer, in its dtype.
    ``half``: the 16-bit float dtype a float32 ``buf`` stands for; the sum is rounded to it
    first, as Horovod reduces such tensors in their own dtype."""
    if buf.dtype.kind == "f":
        scale = postscale / n if op == ReduceOp.AVERAGE else postscale
        if scale != 1.0:
            if half is not None:
                buf[...] = buf.astype(half)
            if buf.dtype.itemsize == 2:  # float16 reduced natively (GPU): scaled in float32
                buf[...] = (buf.astype(np.float32) * np.float32(scale)).astype(buf.dtype)
            else:
                buf *= scale
    elif buf.dtype.kind in "iu":
        if op == ReduceOp.AVERAGE and postscale == 1.0 and n > 1:
            negative_inexact = (buf % n != 0) & (buf < 0)
            buf //= n
            buf += negative_inexact  # floor -> truncation toward zero
        elif op == ReduceOp.AVERAGE or postscale != 1.0:
            scale = postscale / n if op == ReduceOp.AVERAGE else postscale
            buf[...] = buf * scale  # float64 product, truncated toward zero on assignment


def scaler(op: ReduceOp, postscale: float, n: int,
           half: Optional[np.dtype] = None) -> Optional[InPlacePass]:
    if op != ReduceOp.AVERAGE and postscale == 1.0:
        return None
    return functools.partial(scale_in_place, op=op, postscale=postscale, n=n, half=half)


def half(dtype: np.dtype, work: np.dtype) -> Optional[np.dtype]:
    """``dtype`` when it is a 16-bit float reduced in a wider ``work`` dtype, else None."""
    return dtype if dtype in dtypes.HALF and work != dtype else None


def wire_op(dtype: np.dtype, op: ReduceOp) -> ReduceOp:
    return dtypes.bool_op(op) if dtype.kind == "b" else op
