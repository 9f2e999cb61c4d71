"""Reduction operations accepted by allreduce and reducescatter (Adasum: all-reduces only)."""
import enum
from typing import Any


class ReduceOp(enum.IntEnum):
    """How values from all ranks are combined. ``Average`` is a sum divided by the set size;
    ``Adasum`` is Horovod's adaptive summation of floating-point gradients
    (hvdlike.engine.adasum)."""

    AVERAGE = 0
    SUM = 1
    MIN = 2
    MAX = 3
    PRODUCT = 4
    ADASUM = 5


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM


def as_reduce_op(op: Any) -> ReduceOp:
    """Return ``op`` as a ReduceOp, or raise ValueError naming the accepted values."""
    if type(op) is ReduceOp:
        return op
    try:
        return ReduceOp(op)
    except ValueError:
        names = ", ".join(f"hvdlike.{m.name.title()}" for m in ReduceOp)
        raise ValueError(f"unknown reduction op {op!r}; use one of {names}") from None
