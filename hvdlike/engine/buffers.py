"""Result arrays whose memory is reused once the program has let go of them.

Every collective returns a new array. Allocating it afresh on each call makes the allocator
return memory to the kernel and fault it back in every step (measured: 347 page faults and a
5x slower all-reduce of 1 MiB). This cache keeps the arrays it handed out and hands one out
again only when nothing but the cache refers to it any more (CPython reference count: no
variable, view, memoryview, tensor or pending MPI request holds it). A caller therefore never
sees an array it still holds change. Small arrays bypass the cache; its total size is capped.
"""
import math
import sys
from typing import Dict, List, Tuple

import numpy as np

_HUGE_PAGE = 2 << 20


def _aligned_empty(shape: tuple, dtype: np.dtype, nbytes: int) -> np.ndarray:
    """An array starting on a 2 MiB boundary (a 64-byte one below 2 MiB), so that large
    results can live on transparent huge pages wherever the allocator placed them."""
    align = _HUGE_PAGE if nbytes >= _HUGE_PAGE else 64
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _counts(a: np.ndarray) -> Tuple[int, int]:
    """The reference counts of ``a`` and of the buffer it views. A view of ``a`` (slice,
    reshape, ``.view(bool)``) refers to that buffer, not to ``a`` (NumPy collapses bases), so
    both show whether anything outside the cache holds ``a``'s memory."""
    return sys.getrefcount(a), sys.getrefcount(a.base)


def _calibrate() -> Tuple[int, int]:
    """``_counts`` of an array that only the cache holds, called as ``ResultCache.empty`` calls
    it (from a loop over the cache's list): measured on this interpreter, because CPython
    versions count references differently (3.14 borrows references on the stack)."""
    arrays = [_aligned_empty((1,), np.dtype(np.uint8), 1)]
    for a in arrays:
        return _counts(a)
    raise AssertionError("unreachable")


_IDLE_COUNTS = _calibrate()


class ResultCache:
    def __init__(self, min_bytes: int = 64 * 1024, max_bytes: int = 1 << 30) -> None:
        self.min_bytes, self.max_bytes = min_bytes, max_bytes
        self._arrays: Dict[Tuple[tuple, np.dtype], List[np.ndarray]] = {}
        self._bytes = 0

    def empty(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """An uninitialized array of ``shape`` and ``dtype`` (an np.dtype) that no one else
        refers to."""
        nbytes = dtype.itemsize * math.prod(shape)
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        key = (tuple(shape), dtype)
        arrays = self._arrays.setdefault(key, [])
        for a in arrays:  # the same shape of code as _calibrate's
            if _counts(a) == _IDLE_COUNTS:
                return a
        a = _aligned_empty(shape, dtype, nbytes)
        if self._bytes + nbytes <= self.max_bytes:
            arrays.append(a)
            self._bytes += nbytes
        return a

    def clear(self) -> None:
        self._arrays.clear()
        self._bytes = 0
