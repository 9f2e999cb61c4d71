"""Negotiation: which requests are ready on every rank, matched by name, in any order.

Every round, each rank contributes one fixed-width int64 row and all ranks gather all rows
(one small ``MPI_Iallgather``): a header (how many new requests it announces, the round it
joined in, whether it is shutting down) and a bit per entry of the response cache saying
"I have this one pending". A request seen before with the same metadata is in the cache on
every rank at the same position (the cache only changes through what every rank sees), so
in a repeating training step a round costs that one gather. A request not in the cache is
announced once, in full, through an object allgather in the round it is first submitted; the
table of announcements is the same on every rank, so a name is complete on every rank in the
same round, whatever order the ranks submitted in. Complete requests are checked for
consistency (the same error on every rank, naming ranks and values) and added to the cache.

Everything here is deterministic given the gathered rows and announcements: every rank
computes the same responses in the same order, which is what lets the engine run them with
ordinary blocking collectives.
"""
import struct
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from ..checks import LocalError, Request, resolve_or_error

Key = Tuple[int, str]  # (process set id, name)
HEADER = 5  # [announced count, joined-in round or -1, stopping, cache entries, stalled]
_HEADER = struct.Struct(f"<{HEADER}q")


class Rows(NamedTuple):
    """Every rank's row of a round, parsed."""

    announced: bool  # some rank announced new requests
    joined: List[int]  # the round each rank joined in, or -1
    stopped: Tuple[int, ...]  # the ranks shutting down
    bits: List[int]  # each rank's pending cache positions (bit p = position p)
    waiting: int  # how many ranks had something pending (or had joined)
    stalled: bool  # some rank has waited past the stall shutdown time
    joined_any: bool  # some rank has joined
    same: bool = False  # every rank sent the same row


class Announcement(NamedTuple):
    key: Key
    request: Request
    error: Optional[LocalError]


class Response(NamedTuple):
    """A request every (active) member submitted: run it, or raise ``error`` everywhere."""

    key: Key
    request: Request
    error: Optional[Exception]


class Round(NamedTuple):
    responses: List[Response]
    invalidated: Set[Key]  # cache entries dropped: ranks relying on them announce again
    all_joined: bool
    last_joined: int  # the rank that joined last (highest rank on ties), -1 if not all joined
    stop: bool  # every rank asked to shut down
    drained: bool  # this round runs all the work pending anywhere (and there was some)


class Negotiation:
    """The state every rank keeps identically: response cache and open announcements (and,
    this rank's own, ``foreign``: which cache positions belong to sets without it)."""

    def __init__(self, size: int, capacity: int,
                 members: Callable[[int], Sequence[int]], rank: int = 0) -> None:
        self.size = size
        self._rank = rank
        self.capacity = max(0, capacity)  # 0: no cache, every request announced in full
        self.words = max(1, -(-self.capacity // 64))
        self._members = members
        self._cache: Dict[Key, Tuple[int, Request]] = {}
        self._by_position: Dict[int, Key] = {}
        self._set_masks: Dict[int, int] = {}  # process set -> its cache positions' bits
        self._outside: Dict[int, bool] = {}  # process set -> whether this rank is not in it
        self.foreign = 0  # the cache positions of sets without this rank
        self._free: List[int] = []
        self._next = 0
        self._announced: Dict[Key, Dict[int, Tuple[Request, Optional[LocalError]]]] = {}
        self.last_rows: Optional[Rows] = None
        self.prev_rows: Optional[Rows] = None  # the round before (the timeline's last ranks)
        self.row_bytes = (HEADER + self.words) * 8
        # this rank's row and everyone's: the same buffers every round (a round's exchange
        # ends within it), so that the exchange can be a persistent collective
        self._row = bytearray(self.row_bytes)
        self.row_array = np.frombuffer(self._row, np.int64)
        self.rows = np.empty((size, self.row_bytes // 8), np.int64)
        # what the row holds now, and that row repeated once per rank: the rows of a round
        # in which every rank has the same requests pending (the steady state of a training
        # step) equal it, and are known without reading them
        self._row_fields: Tuple = ()
        self._row_bytes = b""

    # ------------------------------------------------------------------ this rank's row

    def cached(self, key: Key, request: Request) -> Optional[int]:
        """The cache position of ``key`` if its cached metadata equals ``request``."""
        hit = self._cache.get(key)
        return hit[0] if hit is not None and hit[1] == request else None

    def row(self, bits: int, announcing: int, joined_round: int, stop: bool,
            stalled: bool) -> np.ndarray:
        """This rank's row: header, then ``bits`` (its pending cache positions)."""
        fields = (bits, announcing, joined_round, stop, len(self._cache), stalled)
        if fields != self._row_fields:  # a repeating step sends the same row round after round
            row = self._row
            _HEADER.pack_into(row, 0, announcing, joined_round, int(stop), fields[4],
                              int(stalled))
            row[HEADER * 8:] = bits.to_bytes(self.words * 8, "little")
            self._row_fields, self._row_bytes = fields, bytes(row) * self.size
        return self.row_array

    def parse(self, rows: np.ndarray) -> Rows:
        """The gathered rows (one per rank) as Python values."""
        raw = rows.tobytes()
        self.prev_rows = self.last_rows
        if raw == self._row_bytes:  # every rank sent this rank's row: no need to read them
            bits, announcing, joined_round, stop, _, stalled = self._row_fields
            n, joined = self.size, joined_round >= 0
            self.last_rows = Rows(announcing > 0, [joined_round] * n,
                                  tuple(range(n)) if stop else (), [bits] * n,
                                  n if announcing or bits or joined else 0, bool(stalled),
                                  joined, True)
        else:
            self.last_rows = self._parse(raw)
        return self.last_rows

    def _parse(self, raw: bytes) -> Rows:
        step, at = self.row_bytes, HEADER * 8
        unpack, from_bytes = _HEADER.unpack_from, int.from_bytes
        announced, waiting, stalled, joined_any = False, 0, False, False
        joined, bits, stopped = [], [], []
        for offset in range(0, self.size * step, step):
            announcing, joined_round, stop, _, stall = unpack(raw, offset)
            mine = from_bytes(raw[offset + at:offset + step], "little")
            announced = announced or announcing > 0
            if stop == 1:
                stopped.append(offset // step)
            stalled = stalled or stall == 1
            joined_any = joined_any or joined_round >= 0
            waiting += bool(announcing or mine or joined_round >= 0)
            joined.append(joined_round)
            bits.append(mine)
        return Rows(announced, joined, tuple(stopped), bits, waiting, stalled, joined_any)

    # ------------------------------------------------------------------ every rank alike

    def decide(self, rows: Rows,
               announcements: Optional[Sequence[Sequence[Announcement]]]) -> Round:
        """Turn the gathered rows (and announcement lists, when any rank announced) into this
        round's responses; the same on every rank."""
        joined = [j >= 0 for j in rows.joined]
        all_joined = all(joined)
        invalidated: Set[Key] = set()
        touched: List[Key] = []
        for rank, announced in enumerate(announcements or ()):
            for key, request, error in announced:
                if key in self._cache:  # announced although cached: the metadata changed
                    self._evict(key)
                    invalidated.add(key)
                if key not in touched:
                    touched.append(key)
                self._announced.setdefault(key, {})[rank] = (request, error)
        ready = self._cached_ready(rows, joined, all_joined)
        responses = self._responses(ready)
        for key in touched:
            table = self._announced[key]
            if not all(r in table for r in self._active(key[0], joined)):
                continue
            del self._announced[key]
            members = self._members(key[0])
            request, error = resolve_or_error([table.get(r) for r in members], members)
            if error is None:
                self._insert(key, request)
            responses.append(Response(key, request, error))
        last = -1
        if all_joined:  # the rank that joined last; the highest rank on ties
            last = max(range(self.size), key=lambda r: (rows.joined[r], r))
        drained = (rows.waiting > 0 and not rows.joined_any and not rows.stopped
                   and not self._announced and all(not bits & ~ready for bits in rows.bits))
        return Round(responses, invalidated, all_joined, last,
                     len(rows.stopped) == self.size, drained)

    def announced(self, key: Key) -> Dict[int, Tuple[Request, Optional[LocalError]]]:
        """The ranks that have announced ``key`` so far (it is not complete yet)."""
        return self._announced.get(key, {})

    # ------------------------------------------------------------------ internals

    def _active(self, set_id: int, joined: List[bool]) -> List[int]:
        members = self._members(set_id)
        if set_id != 0:
            return list(members)
        return [r for r in members if not joined[r]]

    def _cached_ready(self, rows: Rows, joined: List[bool], all_joined: bool) -> int:
        """The cache positions (bits) every active member of their set has pending."""
        if not self._cache or all_joined:
            return 0
        if len(self._set_masks) == 1 and 0 in self._set_masks and not any(joined):
            ready = -1  # common: only the global set, nobody joined
            for bits in rows.bits:
                ready &= bits
        else:
            ready = 0
            for set_id, mask in self._set_masks.items():
                active = self._active(set_id, joined)
                for r in active:
                    mask &= rows.bits[r]
                if active:
                    ready |= mask
        return ready

    def _responses(self, ready: int) -> List[Response]:
        """The cached requests at the positions ``ready``, lowest position first."""
        out = []
        while ready:
            low = ready & -ready
            ready ^= low
            key = self._by_position[low.bit_length() - 1]
            out.append(Response(key, self._cache[key][1], None))
        return out

    def _flip(self, set_id: int, position: int) -> None:
        """Set or clear ``position`` in the set's mask (insert sets it, evict clears it)."""
        mask = self._set_masks.get(set_id, 0) ^ (1 << position)
        if self._outside[set_id]:
            self.foreign ^= 1 << position
        if mask:
            self._set_masks[set_id] = mask
        else:
            del self._set_masks[set_id]

    def _insert(self, key: Key, request: Request) -> None:
        if self._free:
            position = min(self._free)
            self._free.remove(position)
        elif self._next < self.capacity:
            position, self._next = self._next, self._next + 1
        else:
            return  # full: this name keeps being announced in full
        self._cache[key] = (position, request)
        self._by_position[position] = key
        if key[0] not in self._outside:
            self._outside[key[0]] = self._rank not in self._members(key[0])
        self._flip(key[0], position)

    def _evict(self, key: Key) -> None:
        position, _ = self._cache.pop(key)
        del self._by_position[position]
        self._flip(key[0], position)
        self._free.append(position)

    def forget_set(self, set_id: int) -> None:
        """Drop a removed process set's cache entries and the announcements of its requests
        that not every member made (every rank does it in the same round)."""
        for key in [k for k in self._cache if k[0] == set_id]:
            self._evict(key)
        self._outside.pop(set_id, None)
        for key in [k for k in self._announced if k[0] == set_id]:
            del self._announced[key]
