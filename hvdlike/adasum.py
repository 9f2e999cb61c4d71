"""Adasum, Horovod's adaptive summation: a reduction of gradients that sums what is orthogonal
and averages what is parallel (Maleki et al., "Scaling Distributed Training with Adaptive
Summation", MLSys 2021).

Two gradients a and b combine as ``(1 - a·b / 2|a|²) a + (1 - a·b / 2|b|²) b`` (a zero vector
counts as nothing: its coefficient is 1). Each tensor is combined on its own, with its own dot
products, also inside a grouped call. 2^k ranks combine in a binary tree: ranks 2i and 2i+1
first, then those pairs' results pairwise, and so on, as Horovod does; this is why the set
size must be a power of two.

The tree runs as recursive doubling: at distance d = 1, 2, 4, ... every rank exchanges its
whole current vector with rank ``r xor d`` (MPI point to point on the set's communicator) and
both compute the same combination. The dot products are NumPy's pairwise sums of float64
products, a fixed order of operations, so both partners (and at the end every rank) hold
bit-identical results. Each rank sends log2(size) times its bytes: fine on a few nodes, not
bandwidth-optimal (Horovod halves the vectors at each level).
"""
from typing import Any, Sequence, Tuple

import numpy as np

Segments = Sequence[Tuple[int, int]]  # (offset, size) of each tensor in a flat buffer


def power_of_two_error(n: int) -> str:
    """Why a set of ``n`` ranks cannot reduce with Adasum ('' if it can)."""
    if n & (n - 1) == 0:
        return ""
    return (f"Adasum needs a process set whose size is a power of two (2, 4, 8, ...), got "
            f"{n} ranks; run a power of two of ranks, or reduce with hvdlike.Average")


_CHUNK = 1 << 15  # elements per pass of the dot products (a float64 scratch stays in cache)


def coefficients(a: np.ndarray, b: np.ndarray) -> Tuple[float, float]:
    """The factors of ``a`` and ``b`` in their Adasum combination (1-D arrays). The three dot
    products are float64 sums, chunk by chunk in a fixed order, so swapping a and b swaps the
    factors bit for bit."""
    ab = aa = bb = 0.0
    scratch = np.empty(min(a.size, _CHUNK), np.float64)
    for start in range(0, a.size, _CHUNK):
        x, y = a[start:start + _CHUNK], b[start:start + _CHUNK]
        tmp = scratch[:x.size]
        ab += float(np.add.reduce(np.multiply(x, y, out=tmp)))
        aa += float(np.add.reduce(np.multiply(x, x, out=tmp)))
        bb += float(np.add.reduce(np.multiply(y, y, out=tmp)))
    return (1.0 - ab / (2.0 * aa) if aa > 0.0 else 1.0,
            1.0 - ab / (2.0 * bb) if bb > 0.0 else 1.0)


def combine_into(mine: np.ndarray, theirs: np.ndarray, segments: Segments) -> None:
    """Overwrite the flat ``mine`` with the Adasum combination of ``mine`` and ``theirs``,
    tensor by tensor (``theirs`` is scratch: it is overwritten too). The partner, which
    holds the same two vectors the other way round, computes the same bits: the formula is
    symmetric, the dot products are the same sums of the same products, and each element is
    ``fl(ca * a) + fl(cb * b)`` on both sides, whose addition commutes exactly."""
    for offset, size in segments:
        m, t = mine[offset:offset + size], theirs[offset:offset + size]
        own, other = coefficients(m, t)
        m *= m.dtype.type(own)
        t *= t.dtype.type(other)
        m += t


def allreduce(comm: Any, sendrecv: Any, buf: np.ndarray, scratch: np.ndarray,
              segments: Segments) -> None:
    """Replace the flat float buffer ``buf`` by the Adasum of every rank's ``buf``, in place;
    ``scratch``: a buffer like it, overwritten. ``sendrecv(comm, send, recv, peer)`` swaps two
    equal buffers with ``peer``."""
    rank, n = comm.Get_rank(), comm.Get_size()
    distance = 1
    while distance < n:
        peer = rank ^ distance
        sendrecv(comm, buf, scratch, peer)
        combine_into(buf, scratch, segments)
        distance *= 2
