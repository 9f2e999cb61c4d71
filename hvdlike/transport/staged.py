"""Host staging for GPU arrays: device -> pinned host memory -> the host transports -> device.

The engine stages a process set's GPU collectives this way where NCCL cannot serve it (ranks
that share a GPU, ranks without NCCL) or when ``HVDLIKE_GPU_TRANSPORT=staged``. Copies go
through pinned memory (CuPy's pinned pool), so both directions run at the bus's pinned rate;
the host all-reduce writes its results straight into pinned memory (``pinned_empty``).
"""
from typing import Any

import numpy as np

from . import gpu


def to_host(value: Any, stream: Any) -> Any:
    """Pinned host copies of the CuPy arrays in ``value`` (lists and tuples kept; host arrays
    and None as they are), enqueued on ``stream``: synchronize it before reading them."""
    if isinstance(value, list):
        return [to_host(v, stream) for v in value]
    if isinstance(value, tuple):
        return tuple(to_host(v, stream) for v in value)
    if isinstance(value, np.ndarray) or value is None:
        return value
    host = pinned_empty(value.shape, value.dtype)
    value.get(stream=stream, out=host, blocking=False)
    return host


def pinned_empty(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """An uninitialized NumPy array in pinned (page-locked) host memory."""
    import cupyx

    return cupyx.empty_pinned(shape, dtype)


def to_device(value: Any, stream: Any) -> Any:
    """New CuPy arrays holding the host arrays in ``value``, copied on ``stream`` (for
    alltoall's (rows, splits) pair, the splits stay on the host)."""
    if isinstance(value, list):
        return [to_device(v, stream) for v in value]
    if isinstance(value, tuple):
        return (to_device(value[0], stream), value[1])
    out = gpu.cupy().empty(value.shape, value.dtype)
    out.set(value, stream=stream)
    return out
