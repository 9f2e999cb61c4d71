"""What an engine round carries and concludes, on every rank alike: this rank's contribution
(``Mine``), the reduced vector read (``Summary``), the requests ready everywhere
(``Response``), every rank's row when a round gathers them (``Detail``) and the round's
outcome (``Round``); ``negotiation`` makes and reads them."""
import enum
import struct
from typing import Collection, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from ..transport.interface import RoundNet
from . import deadlock
from .checks import LocalError, Request

Key = Tuple[int, str]  # (process set id, name)
SLOTS = 256  # requests in negotiation at once (seen for the first time, not yet everywhere)


class Flag(enum.IntEnum):
    UNPUBLISHED = 0  # has requests no rank has published yet
    STOPPING = 1  # is shutting down
    STALLED = 2  # has waited past the stall shutdown time
    JOINED = 3  # has called join()
    WAITING = 4  # has requests pending, or has joined
    DETAIL = 5  # wants every rank's detail in this round


class Mine(NamedTuple):
    """What this rank brings to a round."""

    bits: int = 0  # cache positions of its pending requests
    uncached: Sequence[Tuple[Key, Request, Optional[LocalError]]] = ()  # pending, not cached
    waiting: bool = False  # has requests pending (or has joined)
    joined_round: int = -1  # the round it joined in, or -1
    stopping: bool = False
    stalled: bool = False
    detail: bool = False  # wants every rank's detail this round
    blocked: int = 0  # the deadlock word (all ones when blocked and a check is due)
    waits: Sequence[Tuple[Key, str]] = ()  # (key, kind) its blocked threads wait for
    pending: Collection[Key] = ()  # every key it has pending (the deadlock check asks)
    made: Mapping[Key, int] = {}  # how many times it has submitted each key (the same)


class Summary(NamedTuple):
    """The reduced vector, read: every rank reads the same."""

    every: int  # flags every rank has (bit f)
    some: int  # flags some rank has
    ready: int  # cache positions every active member has pending (before masking)
    union: int  # cache positions some rank has pending
    have: int  # slots every member has
    agree: int  # slots where no member disagrees
    blocked: int  # the deadlock word

    def all(self, flag: Flag) -> bool:
        return bool(self.every >> flag & 1)

    def any(self, flag: Flag) -> bool:
        return bool(self.some >> flag & 1)


class Response(NamedTuple):
    """A request every (active) member submitted: run it, or raise ``error`` everywhere."""

    key: Key
    request: Request
    error: Optional[Exception]


class Detail:
    """Every rank's row of a round that gathered them: who has which request, who joined."""

    def __init__(self, joined: List[int], stopping: List[bool], bits: List[int],
                 have: List[int], positions: Dict[Key, int], slots: Dict[Key, int]) -> None:
        self.joined, self.bits, self.have = joined, bits, have
        self.stopped = tuple(r for r, s in enumerate(stopping) if s)
        self._positions, self._slots = positions, slots

    def has(self, rank: int, key: Key) -> Optional[bool]:
        """Whether ``rank`` had ``key`` pending in that round (None: nobody had published it,
        so that round cannot tell)."""
        position = self._positions.get(key)
        if position is not None and self.bits[rank] >> position & 1:
            return True
        slot = self._slots.get(key)
        if slot is not None:
            return bool(self.have[rank] >> slot & 1)
        return False if position is not None else None


class Round(NamedTuple):
    responses: List[Response]
    invalidated: Set[Key]  # cache entries dropped: ranks relying on them take them up again
    all_joined: bool
    last_joined: int  # the rank that joined last (highest rank on ties), -1 if not all joined
    stop: bool  # every rank asked to shut down
    drained: bool  # this round runs all the work pending anywhere (and there was some)
    all_waiting: bool  # every rank had work pending (or had joined)
    any_waiting: bool
    union: int  # cache positions some rank had pending
    stopped: Tuple[int, ...]  # the ranks shutting down (when some are)
    detail: Optional[Detail]  # every rank's row, in the rounds that gathered them
    deadlock: Optional[deadlock.Found]  # ranks blocked for good, and what on


_DETAIL = struct.Struct("<3q")  # a detail row's header: joined-in round, stopping, stalled


def gather_detail(mine: Mine, net: RoundNet, size: int, words: int, slots: Dict[Key, int],
                  positions: Dict[Key, int]) -> Detail:
    """Every rank's row: joined-in round, stopping, stalled, pending cache positions (``words``
    64-bit words) and the slots it has (``slots``: key -> slot; ``positions``: key -> cache
    position, as this round leaves them)."""
    slot_bytes = SLOTS // 8
    have = 0
    for key, _, _ in mine.uncached:
        slot = slots.get(key)
        if slot is not None:
            have |= 1 << slot
    row = (_DETAIL.pack(mine.joined_round, int(mine.stopping), int(mine.stalled))
           + mine.bits.to_bytes(words * 8, "little") + have.to_bytes(slot_bytes, "little"))
    rows = net.allgather_rows(np.frombuffer(row, np.int64)).tobytes()
    step, at = len(row), _DETAIL.size
    joined, stopping, bits, haves = [], [], [], []
    for offset in range(0, size * step, step):
        joined_round, stop, _ = _DETAIL.unpack_from(rows, offset)
        joined.append(joined_round)
        stopping.append(stop == 1)
        end = offset + at + words * 8
        bits.append(int.from_bytes(rows[offset + at:end], "little"))
        haves.append(int.from_bytes(rows[end:offset + step], "little"))
    return Detail(joined, stopping, bits, haves, positions, dict(slots))
