"""Reduction operations accepted by allreduce and reducescatter."""
import enum


class ReduceOp(enum.IntEnum):
    """How values from all ranks are combined. ``Average`` is a sum divided by the set size."""

    AVERAGE = 0
    SUM = 1
    MIN = 2
    MAX = 3
    PRODUCT = 4


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


class _Refused:
    """A Horovod reduction hvdlike does not have: its name exists so that a ported script
    reaches the call, which then says so."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"hvdlike.{self.name} (not supported: a collective given it raises ValueError)"


Adasum = _Refused("Adasum")


def as_reduce_op(op: object) -> ReduceOp:
    """Return ``op`` as a ReduceOp, or raise ValueError naming the accepted values."""
    if type(op) is ReduceOp:
        return op
    if op is Adasum:
        raise ValueError("hvdlike.Adasum (Horovod's adaptive summation) is not supported; "
                         "reduce with hvdlike.Average (the default) or hvdlike.Sum instead, "
                         "and scale the learning rate as for Average")
    try:
        return ReduceOp(op)
    except ValueError:
        names = ", ".join(f"hvdlike.{m.name.title()}" for m in ReduceOp)
        raise ValueError(f"unknown reduction op {op!r}; use one of {names}") from None
