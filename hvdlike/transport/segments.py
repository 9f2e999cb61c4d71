"""Pieces the on-node transports share: the reduction of each op as a NumPy ufunc, the size
of a piece reduced at a time, and a list of arrays seen as one."""
import bisect
from typing import Any, Callable, Dict, Iterator, List, Tuple

import numpy as np

from ..base.reduce_ops import ReduceOp

UFUNCS: Dict[ReduceOp, Callable[..., Any]] = {
    ReduceOp.AVERAGE: np.add,
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}
PIECE = 256 << 10  # bytes reduced at a time, so the result is still in cache when copied


def pieces(lo: int, hi: int, piece: int) -> Iterator[Tuple[int, int]]:
    for a in range(lo, hi, piece):
        yield a, min(a + piece, hi)


class Segments:
    """A list of flat arrays seen as one concatenated array (element offsets)."""

    def __init__(self, arrays: List[np.ndarray]) -> None:
        self.arrays = arrays
        self.starts = [0]
        for a in arrays:
            self.starts.append(self.starts[-1] + a.size)
        self.size = self.starts[-1]
        self.dtype = arrays[0].dtype if arrays else np.dtype(np.uint8)
        self.itemsize = self.dtype.itemsize

    def spans(self, lo: int, hi: int, base: int = 0) -> Iterator[Tuple[int, int, int, int]]:
        """(array index, start, stop within it, element offset of start minus ``base``) for
        the elements [lo, hi) of the concatenation."""
        i = bisect.bisect_right(self.starts, lo) - 1
        while lo < hi:
            while self.starts[i + 1] <= lo:
                i += 1
            stop = min(hi, self.starts[i + 1])
            yield i, lo - self.starts[i], stop - self.starts[i], lo - base
            lo = stop

    def read(self, lo: int, hi: int, into: np.ndarray) -> None:
        """Copy elements [lo, hi) into the flat array ``into``."""
        at = 0
        for i, s, e, _ in self.spans(lo, hi):
            into[at:at + e - s] = self.arrays[i][s:e]
            at += e - s

    def write(self, lo: int, hi: int, values: np.ndarray) -> None:
        """Copy the flat array ``values`` into elements [lo, hi)."""
        at = 0
        for i, s, e, _ in self.spans(lo, hi):
            self.arrays[i][s:e] = values[at:at + e - s]
            at += e - s
