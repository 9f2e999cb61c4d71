"""Adasum, Horovod's adaptive summation: a reduction of gradients that sums what is orthogonal
and averages what is parallel (Maleki et al., "Scaling Distributed Training with Adaptive
Summation", MLSys 2021).

Two gradients a and b combine as ``(1 - a·b / 2|a|²) a + (1 - a·b / 2|b|²) b`` (a zero vector
counts as nothing: its coefficient is 1). Each tensor is combined on its own, with its own dot
products, also inside a grouped call. 2^k ranks combine in a binary tree: ranks 2i and 2i+1
first, then those pairs' results pairwise, and so on, as Horovod does; this is why the set
size must be a power of two.

A buffer of at most ``WHOLE_BYTES`` goes by distance doubling with whole vectors: at distance
d = 1, 2, 4, ... a rank and rank ``r xor d`` swap their whole buffers and both combine them, the
lower rank's as a, so both get the same bits; log2(n) messages, the least latency.

A larger buffer goes as Horovod's does, by vector halving and distance doubling (MPI point
to point on the set's communicator). At distance d = 1, 2, 4, ... a rank and rank ``r xor d``
hold the same piece of the two vectors to combine; the lower rank keeps the first half of the
piece, the other the second, and they swap the halves they give up. The dot products over the
whole vectors are the sums of every rank's partial products over the pieces it keeps, summed
by recursive doubling within the group of 2d ranks (float addition commutes, so every member
gets the same bits); then each rank combines its half. The pieces are gathered back by the
same exchanges in reverse. Each element of the result is computed by one rank only, so every
rank gets the same bits. A rank sends about twice its bytes in all, and computes on a
shrinking piece.
"""
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

Segments = Sequence[Tuple[int, int]]  # (offset, size) of each tensor in a flat buffer
_CHUNK = 1 << 15  # elements per pass of the dot products (a float64 scratch stays in cache)
WHOLE_BYTES = 64 << 10  # buffers up to this size swap whole vectors: fewer messages than halving


def power_of_two_error(n: int) -> str:
    """Why a set of ``n`` ranks cannot reduce with Adasum ('' if it can)."""
    if n & (n - 1) == 0:
        return ""
    return (f"Adasum needs a process set whose size is a power of two (2, 4, 8, ...), got "
            f"{n} ranks; run a power of two of ranks, or reduce with hvdlike.Average")


def dots(a: np.ndarray, b: np.ndarray,
         scratch: Optional[np.ndarray] = None) -> Tuple[float, float, float]:
    """(a·b, a·a, b·b) of 1-D arrays: products in their dtype, summed in float64 chunk by
    chunk in a fixed order; ``scratch``: float64 room for one chunk, reused across calls."""
    ab = aa = bb = 0.0
    if scratch is None:
        scratch = np.empty(min(a.size, _CHUNK), np.float64)
    for start in range(0, a.size, _CHUNK):
        x, y = a[start:start + _CHUNK], b[start:start + _CHUNK]
        tmp = scratch[:x.size]
        ab += float(np.add.reduce(np.multiply(x, y, out=tmp)))
        aa += float(np.add.reduce(np.multiply(x, x, out=tmp)))
        bb += float(np.add.reduce(np.multiply(y, y, out=tmp)))
    return ab, aa, bb


def factors(ab: float, aa: float, bb: float) -> Tuple[float, float]:
    """The factors of a and b in their Adasum combination, from their dot products."""
    return (1.0 - ab / (2.0 * aa) if aa > 0.0 else 1.0,
            1.0 - ab / (2.0 * bb) if bb > 0.0 else 1.0)


def allreduce(comm: Any, sendrecv: Any, buf: np.ndarray, scratch: np.ndarray,
              segments: Segments) -> None:
    """Replace the flat float buffer ``buf`` by the Adasum of every rank's ``buf``, in place;
    ``scratch``: a buffer like it, overwritten. ``sendrecv(comm, send, recv, peer)`` sends
    ``send`` to ``peer`` and receives ``recv`` (the sizes the peer sends) from it."""
    if buf.nbytes <= WHOLE_BYTES:
        _whole_vectors(comm, sendrecv, buf, scratch, segments)
        return
    rank, n = comm.Get_rank(), comm.Get_size()
    lo, hi = 0, buf.size
    pieces: List[Tuple[int, int]] = []  # the piece held before each level
    chunk = np.empty(_CHUNK, np.float64)  # the dot products' room, for every tensor and level
    distance = 1
    while distance < n:
        lower = rank & distance == 0
        mid = lo + (hi - lo) // 2
        keep, give = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        sendrecv(comm, buf[give[0]:give[1]], scratch[keep[0]:keep[1]], rank ^ distance)
        parts = _partial_dots(buf, scratch, keep, segments, lower, chunk)
        _combine(buf, scratch, keep, segments, _group_sum(comm, sendrecv, parts, distance),
                 lower)
        pieces.append((lo, hi))
        lo, hi = keep
        distance *= 2
    while pieces:  # back down: each level's other half comes from the same partner
        distance //= 2
        was_lo, was_hi = pieces.pop()
        other = (hi, was_hi) if lo == was_lo else (was_lo, lo)
        sendrecv(comm, buf[lo:hi], buf[other[0]:other[1]], rank ^ distance)
        lo, hi = was_lo, was_hi


def _whole_vectors(comm: Any, sendrecv: Any, buf: np.ndarray, scratch: np.ndarray,
                   segments: Segments) -> None:
    """Distance doubling with whole vectors (the module's docstring): one message a level."""
    rank, n = comm.Get_rank(), comm.Get_size()
    whole = (0, buf.size)
    chunk = np.empty(max(1, min(_CHUNK, buf.size)), np.float64)
    distance = 1
    while distance < n:
        lower = rank & distance == 0
        sendrecv(comm, buf, scratch, rank ^ distance)
        parts = _partial_dots(buf, scratch, whole, segments, lower, chunk)
        _combine(buf, scratch, whole, segments, parts, lower)
        distance *= 2


def _overlaps(keep: Tuple[int, int], segments: Segments) -> List[Tuple[int, int, int]]:
    """(segment index, start, end) of each segment's part inside ``keep``."""
    out = []
    for i, (offset, size) in enumerate(segments):
        start, end = max(offset, keep[0]), min(offset + size, keep[1])
        if start < end:
            out.append((i, start, end))
    return out


def _partial_dots(buf: np.ndarray, scratch: np.ndarray, keep: Tuple[int, int],
                  segments: Segments, lower: bool, chunk: np.ndarray) -> np.ndarray:
    """Per segment, (low·high, low·low, high·high) over this rank's kept piece, where low is
    the vector of the lower half of the group."""
    parts = np.zeros((len(segments), 3))
    for i, start, end in _overlaps(keep, segments):
        mine, theirs = buf[start:end], scratch[start:end]
        ab, mm, tt = dots(mine, theirs, chunk)
        parts[i] = (ab, mm, tt) if lower else (ab, tt, mm)
    return parts


def _group_sum(comm: Any, sendrecv: Any, parts: np.ndarray, distance: int) -> np.ndarray:
    """The sum of ``parts`` over the 2 * distance ranks of this rank's group."""
    other = np.empty_like(parts)
    step = 1
    while step <= distance:
        sendrecv(comm, parts, other, comm.Get_rank() ^ step)
        parts = parts + other
        step *= 2
    return parts


def _combine(buf: np.ndarray, scratch: np.ndarray, keep: Tuple[int, int], segments: Segments,
             sums: np.ndarray, lower: bool) -> None:
    for i, start, end in _overlaps(keep, segments):
        low, high = factors(*sums[i])
        mine, theirs = buf[start:end], scratch[start:end]
        mine *= mine.dtype.type(low if lower else high)
        theirs *= theirs.dtype.type(high if lower else low)
        mine += theirs
