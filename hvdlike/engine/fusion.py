"""Tensor fusion: many small tensors travel in one buffer, one transport call per buffer.

``plan_buckets`` groups tensors (in call order, per reduction dtype) into buckets of at most
``threshold`` bytes; ``pack``/``unpack`` copy tensors into and out of a flat buffer; ``BufferPool``
keeps fusion buffers for reuse so steady-state training allocates none.
"""
from typing import Callable, Dict, Hashable, List, Sequence

import numpy as np

from ..base.dtypes import HALF


def plan_buckets(keys: Sequence[Hashable], nbytes: Sequence[int], threshold: int) -> List[List[int]]:
    """Indices of tensors grouped into buckets: same key (reduction dtype), in call order, each
    bucket at most ``threshold`` bytes unless a single tensor is larger (it then travels alone)."""
    buckets: List[List[int]] = []
    open_bucket: Dict[Hashable, int] = {}  # key -> index into buckets
    filled: Dict[Hashable, int] = {}
    for i, (key, size) in enumerate(zip(keys, nbytes)):
        b = open_bucket.get(key)
        if b is not None and filled[key] + size <= threshold:
            buckets[b].append(i)
            filled[key] += size
        else:
            open_bucket[key] = len(buckets)
            filled[key] = size
            buckets.append([i])
    return buckets


def pack(arrays: Sequence[np.ndarray], buffer: np.ndarray, scale: float = 1.0) -> None:
    """Copy ``arrays`` one after another into the flat ``buffer`` (cast to its dtype, times
    ``scale``, as Horovod scales: integers in float64, truncated toward zero; 16-bit floats in
    float32, rounded to their dtype; other floats in their dtype)."""
    offset = 0
    for a in arrays:
        n = a.size
        dst = buffer[offset:offset + n]
        flat = a.reshape(-1)
        if scale == 1.0:
            np.copyto(dst, flat, casting="unsafe")
        elif a.dtype in HALF:
            np.copyto(dst, (flat.astype(np.float32) * np.float32(scale)).astype(a.dtype),
                      casting="unsafe")
        elif buffer.dtype.kind == "f":
            np.multiply(flat, buffer.dtype.type(scale), out=dst, casting="unsafe")
        else:
            np.copyto(dst, flat * scale, casting="unsafe")
        offset += n


def unpack(buffer: np.ndarray, shapes: Sequence[tuple], dtypes: Sequence[np.dtype],
           empty: Callable[[tuple, np.dtype], np.ndarray] = np.empty) -> List[np.ndarray]:
    """New arrays (from ``empty(shape, dtype)``) of the given shapes and dtypes, read one after
    another from ``buffer``."""
    out = []
    offset = 0
    for shape, dtype in zip(shapes, dtypes):
        n = int(np.prod(shape, dtype=np.int64))
        a = empty(shape, dtype)
        np.copyto(a.reshape(-1), buffer[offset:offset + n], casting="unsafe")
        out.append(a)
        offset += n
    return out


class BufferPool:
    """Flat buffers by dtype, handed out and returned so that they are reused."""

    def __init__(self) -> None:
        self._free: Dict[np.dtype, List[np.ndarray]] = {}

    def acquire(self, dtype: np.dtype, size: int) -> np.ndarray:
        """A buffer of at least ``size`` elements of ``dtype`` (slice it to the size needed)."""
        free = self._free.get(dtype, [])
        for i, buf in enumerate(free):
            if buf.size >= size:
                return free.pop(i)
        return np.empty(size, dtype=dtype)

    def release(self, buf: np.ndarray) -> None:
        self._free.setdefault(buf.dtype, []).append(buf)
