"""Result arrays whose memory is reused once the program has let go of them.

Every collective returns a new array. Allocating it afresh on each call makes the allocator
return memory to the kernel and fault it back in every step (measured: 347 page faults and a
5x slower all-reduce of 1 MiB). This cache keeps the memory it handed out and hands it out
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


def size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to the next of 1, 1.25, 1.5 or 1.75 times a power of two (a
    quarter at most wasted, and only in address space: its pages are never touched)."""
    if nbytes <= 4:
        return nbytes
    top = 1 << (nbytes - 1).bit_length()  # the power of two at or above nbytes
    quarter = top // 8  # classes between top/2 and top, a quarter of top/2 apart
    return -(-nbytes // quarter) * quarter


class ResultCache:
    """Result arrays, kept by size class: an array of any shape and dtype is a view of the
    first idle buffer of its class, so results whose shapes change from call to call (a
    fusion bucket holding other tensors each step, gathers of varying length) reuse memory
    as results of one shape do. Over ``max_bytes``, idle buffers of other classes make
    room."""

    def __init__(self, min_bytes: int = 64 * 1024, max_bytes: int = 1 << 30) -> None:
        self.min_bytes, self.max_bytes = min_bytes, max_bytes
        self._buffers: Dict[int, List[np.ndarray]] = {}  # size class -> uint8 buffers
        self._bytes = 0

    def empty(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """An uninitialized array of ``shape`` and ``dtype`` (an np.dtype) that no one else
        refers to."""
        nbytes = dtype.itemsize * math.prod(shape)
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        size = size_class(nbytes)
        buffers = self._buffers.setdefault(size, [])
        for b in buffers:  # the same shape of code as _calibrate's
            if _counts(b) == _IDLE_COUNTS:
                return _as(b, nbytes, shape, dtype)
        b = _aligned_empty((size,), np.dtype(np.uint8), size)
        if self._bytes + size > self.max_bytes:
            self._evict(self._bytes + size - self.max_bytes)
        if self._bytes + size <= self.max_bytes:
            buffers.append(b)
            self._bytes += size
        return _as(b, nbytes, shape, dtype)

    def _evict(self, nbytes: int) -> None:
        """Drop idle buffers until ``nbytes`` are freed or none is left to drop."""
        for size, buffers in self._buffers.items():
            kept = []
            for b in buffers:  # the same shape of code as _calibrate's
                if nbytes > 0 and _counts(b) == _IDLE_COUNTS:
                    nbytes -= size
                    self._bytes -= size
                else:
                    kept.append(b)
            buffers[:] = kept

    def clear(self) -> None:
        self._buffers.clear()
        self._bytes = 0


def _as(buffer: np.ndarray, nbytes: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The first ``nbytes`` of ``buffer`` as an array of ``shape`` and ``dtype`` (a view: its
    base is the buffer's memory, whose reference count shows that it is held)."""
    return buffer[:nbytes].view(dtype).reshape(shape)
