"""NumPy references for every collective, computed from all ranks' inputs."""
from typing import List, Sequence

import numpy as np


def reduce(arrays: Sequence[np.ndarray], op: str, prescale: float = 1.0,
           postscale: float = 1.0) -> np.ndarray:
    """What every rank should get from allreduce(op) of ``arrays`` (one per rank)."""
    dtype = arrays[0].dtype
    n = len(arrays)
    stack = np.stack(arrays)
    if dtype.kind == "b":
        return (stack.any(0) if op in ("Sum", "Max") else stack.all(0)).astype(bool)
    if dtype.kind == "f" or str(dtype) == "bfloat16":
        # Horovod's definition: scaled in the dtype (16-bit floats: in float32, rounded to
        # the dtype after the prescale and before the postscale)
        work = np.float64 if dtype == np.float64 else np.float32
        half = dtype.itemsize == 2
        s = stack.astype(work)
        if prescale != 1.0:
            s = s * work(prescale)
            if half:
                s = s.astype(dtype).astype(work)
        r = _apply(s, op)
        scale = postscale / n if op == "Average" else postscale
        if scale != 1.0:
            if half:
                r = r.astype(dtype).astype(work)
            r = r * work(scale)
        return r.astype(work).astype(dtype)
    # integers: prescale truncates each input; Average/postscale truncate toward zero
    s = np.trunc(stack.astype(np.float64) * prescale).astype(dtype) if prescale != 1.0 else stack
    r = _apply(s, op)
    if op == "Average" or postscale != 1.0:
        scale = postscale / n if op == "Average" else postscale
        r = np.trunc(r.astype(np.float64) * scale).astype(dtype)
    return r


def _apply(stack: np.ndarray, op: str) -> np.ndarray:
    if op in ("Sum", "Average"):
        return stack.sum(0, dtype=stack.dtype)
    if op == "Min":
        return stack.min(0)
    if op == "Max":
        return stack.max(0)
    if op == "Product":
        return stack.prod(0, dtype=stack.dtype)
    raise ValueError(op)


def scatter_block(full: np.ndarray, rank: int, n: int) -> np.ndarray:
    """Rank's rows of ``full`` in reducescatter's split (first d0 % n ranks get one more)."""
    d0 = full.shape[0]
    counts = [d0 // n + (r < d0 % n) for r in range(n)]
    start = sum(counts[:rank])
    return full[start:start + counts[rank]]


def alltoall(inputs: Sequence[np.ndarray], splits: Sequence[Sequence[int]], rank: int) -> np.ndarray:
    """Rows that ``rank`` receives: from each source s, the block s addressed to it."""
    parts: List[np.ndarray] = []
    for s, x in enumerate(inputs):
        start = sum(splits[s][:rank])
        parts.append(x[start:start + splits[s][rank]])
    return np.concatenate(parts)


def adasum(arrays: Sequence[np.ndarray], prescale: float = 1.0,
           postscale: float = 1.0) -> np.ndarray:
    """What every rank should get from allreduce(op=Adasum) of ``arrays`` (one per rank, 2^k
    of them): neighbours combined pairwise, then those results pairwise, ..., in float64.
    16-bit floats are rounded to their dtype after the prescale and before the postscale."""
    dtype = arrays[0].dtype
    half = dtype.itemsize == 2
    level = []
    for a in arrays:
        v = a.astype(np.float64).reshape(-1) * prescale
        level.append(v.astype(dtype).astype(np.float64) if half else v)
    while len(level) > 1:
        level = [_adasum_pair(a, b) for a, b in zip(level[0::2], level[1::2])]
    (r,) = level
    if postscale != 1.0:
        r = (r.astype(dtype).astype(np.float64) if half else r) * postscale
    return r.astype(dtype).reshape(arrays[0].shape)


def _adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ab, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    return (1 - ab / (2 * aa) if aa else 1.0) * a + (1 - ab / (2 * bb) if bb else 1.0) * b
