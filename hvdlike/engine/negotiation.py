"""Negotiation: which requests are ready on every rank, matched by name, in any order, at a
cost per rank that does not grow with the number of ranks.

A round is one all-reduce (bitwise AND) of a fixed-size vector of 64-bit words that every rank
contributes (``vector``); its size depends on the response-cache capacity, never on the world
size. The words are:

* flags, two bits each (has it, lacks it), so that the AND says whether every rank has a flag
  and whether any has: new requests to publish, shutting down, stalled, joined, waiting for
  something, per-rank detail wanted;
* the deadlock word: bit s says "blocked past the deadlock time, or not a member of set s";
* the response cache: a bit per cache position the rank has pending, with the positions of
  sets it is not in (and, once it has joined, of the global set) set as well, so the AND is
  exactly the positions every active member has pending; then the complement of its own
  pending positions, whose AND is the complement of what any rank has pending;
* the requests in negotiation (``SLOTS`` slots): "I have it, or I am not in its set", and
  "mine agrees with the published one".

A request seen before with the same metadata sits at the same cache position on every rank
(the cache changes only through what every rank sees), so in a repeating training step a
round is that one all-reduce. A request not in the cache is *published* once, by one rank:
in a round whose flags say some rank has unpublished requests, the lowest such rank (one small
MIN all-reduce) broadcasts their metadata, and every rank gives each a slot. Each rank then
says whether it has the request and whether its own metadata equals the published one: at
once, in one more AND of the slots' words, and in every later round's vector while the
request waits for some member. When every member has it, it runs, and enters the cache. Only
when some member disagrees (or had bad input) are the members' requests gathered, to raise
the error, with every rank's values, on every rank.

Per-rank detail (which ranks have which request, who joined when, who is shutting down) is
gathered only in rounds that need it: when some rank asks (the stall inspector, the timeline's
``last_ranks``), while some rank shuts down or has stalled, when every rank has joined, or in
a round that removes a process set. The deadlock word starts a two-step gather of what the
blocked ranks wait for (``deadlock``).

Everything here is deterministic given the reduced vector and what the collectives deliver:
every rank computes the same responses in the same order, which is what lets the engine run
them with ordinary blocking collectives. ``Net`` (``transport.interface.RoundNet``) is the
handful of collectives it uses; the engine passes MPI's (``control``),
``scripts/bench_control_plane.py`` an in-process stand-in.
"""
from typing import (
    Callable,
    Collection,
    Dict,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    cast,
)

import numpy as np

from ..transport.interface import RoundNet as Net
from . import deadlock
from .checks import Kind, Request, joinable, resolve_or_error
from .rounds import (
    SLOTS,
    Detail,
    Flag,
    Key,
    Mine,
    Response,
    Round,
    Summary,
    gather_detail,
)

_SLOT_WORDS = SLOTS // 64


_FLAGS = [int(f) for f in Flag]


def _word(value: int) -> bytes:
    return (value & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")


def _slot_words(have: int, differ: int) -> bytes:
    """The slot part of a vector: the slots a rank has, then those where it agrees."""
    return (have.to_bytes(_SLOT_WORDS * 8, "little")
            + (~differ & (1 << SLOTS) - 1).to_bytes(_SLOT_WORDS * 8, "little"))


class Negotiation:
    """The state every rank keeps identically: the response cache and the requests in
    negotiation (and, this rank's own, ``foreign``: the cache positions of sets without it)."""

    def __init__(self, size: int, capacity: int,
                 members: Callable[[int], Sequence[int]], rank: int = 0) -> None:
        self.size = size
        self.rank = rank
        self.capacity = max(0, capacity)  # 0: no cache, every request negotiated in full
        self.words = max(1, -(-self.capacity // 64))
        self._members = members
        self._cache: Dict[Key, Tuple[int, Request]] = {}
        self._by_position: Dict[int, Key] = {}
        self._response: List[Optional[Response]] = [None] * self.capacity  # by position
        self._set_changes = 0  # the positions of cached process-set changes
        self._set_masks: Dict[int, int] = {}  # process set -> its cache positions' bits
        self._outside: Dict[int, bool] = {}  # process set -> whether this rank is not in it
        self.foreign = 0  # the cache positions of sets without this rank
        self._used = 0  # every cache position in use
        self._free: List[int] = []
        self._next = 0
        # requests in negotiation: slot -> (key, the published request)
        self._open: Dict[int, Tuple[Key, Request]] = {}
        self._slots: Dict[Key, int] = {}
        self._slot_foreign = 0  # open slots of sets without this rank
        self._slot_global = 0  # open slots of the global set (a rank that joined has them)
        self._agrees: Dict[Key, Tuple[Request, bool]] = {}  # this rank's request vs published
        self.last_detail: Optional[Detail] = None
        self.prev_detail: Optional[Detail] = None  # the one before (the timeline's last ranks)
        # the vector this rank contributes and the reduced one: the same buffers every round,
        # so that the all-reduce can be a persistent collective
        self.width = 2 + 2 * self.words + 2 * _SLOT_WORDS
        self.vector_bytes = self.width * 8
        self._raw = bytearray(self.vector_bytes)
        self.contribution = np.frombuffer(self._raw, np.uint64)
        self.reduced = np.zeros(self.width, np.uint64)
        self._all_positions = (1 << (64 * self.words)) - 1
        # a repeating step sends the same vector and gets the same back round after round:
        # what this rank's vector was made of (with the tables' version), and the last read
        self._version = 0  # bumped whenever the cache or the slots change
        self._vector_of: Optional[tuple] = None
        self._read_of = b""
        self._read: Optional[Summary] = None

    # ------------------------------------------------------------------ this rank's vector

    def cached(self, key: Key, request: Request) -> Optional[int]:
        """The cache position of ``key`` if its cached metadata equals ``request``."""
        hit = self._cache.get(key)
        return hit[0] if hit is not None and hit[1] == request else None

    def slot(self, key: Key) -> Optional[int]:
        """The slot of ``key`` while it is in negotiation (published, not yet complete)."""
        return self._slots.get(key)

    def completes(self, s: Summary) -> bool:
        """Whether a request in negotiation is complete in this round (every rank must then
        take it into its cache)."""
        return bool(self._open) and any(s.have >> slot & 1 for slot in self._open)

    def vector(self, mine: Mine) -> np.ndarray:
        """This rank's contribution to the round's AND all-reduce."""
        joined = mine.joined_round >= 0
        made_of = None
        if not mine.uncached:
            made_of = (mine.bits, joined, mine.stopping, mine.stalled, mine.waiting,
                       mine.detail, mine.blocked, self._version)
            if made_of == self._vector_of:
                return self.contribution
        self._vector_of = made_of
        have, differ, unpublished = self._votes(mine)
        flags = 0
        for flag, value in ((Flag.UNPUBLISHED, unpublished), (Flag.STOPPING, mine.stopping),
                            (Flag.STALLED, mine.stalled), (Flag.JOINED, joined),
                            (Flag.WAITING, mine.waiting), (Flag.DETAIL, mine.detail)):
            flags |= 1 << (2 * flag + (0 if value else 1))
        ready = mine.bits | self.foreign | (self._set_masks.get(0, 0) if joined else 0)
        positions = self.words * 8
        raw, at = self._raw, 16
        raw[0:16] = _word(flags) + _word(mine.blocked)
        raw[at:at + positions] = ready.to_bytes(positions, "little")
        at += positions
        raw[at:at + positions] = (~mine.bits & self._all_positions).to_bytes(positions, "little")
        at += positions
        raw[at:at + 2 * _SLOT_WORDS * 8] = _slot_words(have, differ)
        return self.contribution

    def _votes(self, mine: Mine) -> Tuple[int, int, bool]:
        """Over the slots: which this rank has (or need not have: sets without it, the global
        set's once it has joined) and where its request differs from the published one; and
        whether it has requests nobody has published."""
        have = self._slot_foreign | (self._slot_global if mine.joined_round >= 0 else 0)
        differ = 0
        unpublished = False
        for key, request, error in mine.uncached:
            slot = self._slots.get(key)
            if slot is None:
                unpublished = True
                continue
            have |= 1 << slot
            if error is not None or not self._agrees_with_published(key, slot, request):
                differ |= 1 << slot
        return have, differ, unpublished

    def _agrees_with_published(self, key: Key, slot: int, request: Request) -> bool:
        seen = self._agrees.get(key)
        if seen is None or seen[0] is not request:
            seen = (request, request == self._open[slot][1])
            self._agrees[key] = seen
        return seen[1]

    def read(self, reduced: np.ndarray) -> Summary:
        """The reduced vector as Python values."""
        raw = reduced.tobytes()
        if raw == self._read_of:
            return self._read  # type: ignore[return-value]
        flags = int.from_bytes(raw[0:8], "little")
        every = some = 0
        for flag in _FLAGS:
            every |= (flags >> (2 * flag) & 1) << flag
            some |= (not flags >> (2 * flag + 1) & 1) << flag
        positions = self.words * 8
        at = 16
        ready = int.from_bytes(raw[at:at + positions], "little")
        at += positions
        union = ~int.from_bytes(raw[at:at + positions], "little") & self._all_positions
        at += positions
        have = int.from_bytes(raw[at:at + _SLOT_WORDS * 8], "little")
        agree = int.from_bytes(raw[at + _SLOT_WORDS * 8:], "little")
        self._read_of = raw
        self._read = Summary(every, some, ready, union, have, agree,
                             int.from_bytes(raw[8:16], "little"))
        return self._read

    # ------------------------------------------------------------------ every rank alike

    def conclude(self, s: Summary, mine: Mine, net: Net) -> Round:
        """The rest of the round, the same on every rank: the collectives the flags call for,
        then this round's responses."""
        all_joined, joined_any = s.all(Flag.JOINED), s.any(Flag.JOINED)
        detail = None
        if (s.any(Flag.DETAIL) or s.any(Flag.STOPPING) or s.any(Flag.STALLED) or all_joined):
            detail = self._gather_detail(mine, net)
        published = self._publish(mine, net) if s.any(Flag.UNPUBLISHED) else []
        invalidated: Set[Key] = set()
        for key, _ in published:
            if key in self._cache:  # published although cached: its metadata changed
                self._evict(key)
                invalidated.add(key)
        ready = 0 if all_joined else s.ready & self._used
        responses = self._responses(ready)
        completed = self._completed(s.have, s.agree, self._open, mine, net, joined_any)
        if published:  # the new slots' votes at once: a name every rank has runs this round
            new = {self._open_slot(key, request): (key, request) for key, request in published}
            have, differ, _ = self._votes(mine)
            votes = net.band(np.frombuffer(_slot_words(have, differ), np.uint64).copy())
            raw = votes.tobytes()
            completed += self._completed(int.from_bytes(raw[:_SLOT_WORDS * 8], "little"),
                                         int.from_bytes(raw[_SLOT_WORDS * 8:], "little"),
                                         new, mine, net, joined_any)
        responses += completed
        if detail is None and (ready & self._set_changes or any(
                r.request.kind == Kind.PROCESS_SET for r in completed if r.error is None)):
            detail = self._gather_detail(mine, net)  # a set's removal names who was missing
        found = deadlock.gather(mine, net, self._members) if s.blocked else None
        last = -1
        if all_joined:  # the rank that joined last; the highest rank on ties
            assert detail is not None
            joined = detail.joined
            last = max(range(self.size), key=lambda r: (joined[r], r))
        stopping = s.any(Flag.STOPPING)
        drained = (s.any(Flag.WAITING) and not joined_any and not stopping
                   and not s.any(Flag.UNPUBLISHED) and not self._open and not s.union & ~ready)
        return Round(responses, invalidated, all_joined, last, s.all(Flag.STOPPING), drained,
                     s.all(Flag.WAITING), s.any(Flag.WAITING), s.union,
                     detail.stopped if detail is not None and stopping else (), detail, found)

    # ------------------------------------------------------------------ internals

    def _publish(self, mine: Mine, net: Net) -> List[Tuple[Key, Request]]:
        """The lowest rank with unpublished requests publishes them (as many as there are
        free slots); returns them, in its order."""
        free = SLOTS - len(self._open)
        if free <= 0:  # every slot taken: publish once some complete
            return []
        own = [(key, request) for key, request, _ in mine.uncached
               if key not in self._slots][:free]
        publisher = net.min(self.rank if own else self.size)
        got = net.bcast(own if publisher == self.rank else None, publisher)
        return list(got)  # type: ignore[call-overload]

    def _open_slot(self, key: Key, request: Request) -> int:
        slot = next(s for s in range(SLOTS) if s not in self._open)
        self._open[slot] = (key, request)
        self._slots[key] = slot
        self._version += 1
        if self._is_outside(key[0]):
            self._slot_foreign |= 1 << slot
        if key[0] == 0:
            self._slot_global |= 1 << slot
        return slot

    def _close_slot(self, slot: int) -> Tuple[Key, Request]:
        key, request = self._open.pop(slot)
        del self._slots[key]
        self._version += 1
        self._agrees.pop(key, None)
        self._slot_foreign &= ~(1 << slot)
        self._slot_global &= ~(1 << slot)
        return key, request

    def _completed(self, have: int, agree: int, slots: Collection[int], mine: Mine, net: Net,
                   joined_any: bool) -> List[Response]:
        """Of ``slots``, the requests that every member has now (``have``): into the cache,
        unless a member disagrees (``agree`` clear) or had bad input, or the request cannot
        run with ranks joined: then every member's request is gathered and the error is
        raised on every rank."""
        done = [slot for slot in sorted(slots) if have >> slot & 1]
        if not done:
            return []
        suspect = [slot for slot in done if not agree >> slot & 1
                   or (joined_any and not joinable(self._open[slot][1]))]
        answers: List[object] = []
        if suspect:  # the error path: every rank's request for each, to name the values
            own = {key: (request, error) for key, request, error in mine.uncached}
            answers = net.allgather([own.get(self._open[slot][0]) for slot in suspect])
        out = []
        for slot in done:
            key, request = self._close_slot(slot)
            error: Optional[Exception] = None
            if slot in suspect:
                i = suspect.index(slot)
                members = self._members(key[0])
                request, error = resolve_or_error(
                    [answers[r][i] for r in members], members)  # type: ignore[index]
            if error is None:
                self._insert(key, request)
            out.append(Response(key, request, error))
        return out

    def _gather_detail(self, mine: Mine, net: Net) -> Detail:
        detail = gather_detail(mine, net, self.size, self.words, self._slots,
                               {k: p for k, (p, _) in self._cache.items()})
        self.prev_detail, self.last_detail = self.last_detail, detail
        return detail

    def _is_outside(self, set_id: int) -> bool:
        outside = self._outside.get(set_id)
        if outside is None:
            outside = self._outside[set_id] = self.rank not in self._members(set_id)
        return outside

    def _responses(self, ready: int) -> List[Response]:
        """The cached requests at the positions ``ready``, lowest position first."""
        if not ready:
            return []
        if ready & (ready - 1) == 0:  # one position: the latency path's round
            return cast(List[Response], [self._response[ready.bit_length() - 1]])
        bits = np.unpackbits(np.frombuffer(ready.to_bytes(self.words * 8, "little"), np.uint8),
                             bitorder="little")
        response = self._response  # a ready position holds a response
        return cast(List[Response], [response[p] for p in np.flatnonzero(bits).tolist()])

    def _flip(self, set_id: int, position: int) -> None:
        """Set or clear ``position`` in the set's mask (insert sets it, evict clears it)."""
        bit = 1 << position
        self._version += 1
        mask = self._set_masks.get(set_id, 0) ^ bit
        self._used ^= bit
        if self._is_outside(set_id):
            self.foreign ^= bit
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
            return  # full: this name keeps being negotiated in full
        self._cache[key] = (position, request)
        self._by_position[position] = key
        self._response[position] = Response(key, request, None)
        if request.kind == Kind.PROCESS_SET:
            self._set_changes |= 1 << position
        self._flip(key[0], position)

    def _evict(self, key: Key) -> None:
        position, _ = self._cache.pop(key)
        del self._by_position[position]
        self._response[position] = None
        self._set_changes &= ~(1 << position)
        self._flip(key[0], position)
        self._free.append(position)

    def forget_set(self, set_id: int) -> None:
        """Drop a removed process set's cache entries and its requests in negotiation (every
        rank does it in the same round)."""
        for key in [k for k in self._cache if k[0] == set_id]:
            self._evict(key)
        for slot in [s for s, (k, _) in self._open.items() if k[0] == set_id]:
            self._close_slot(slot)
        self._outside.pop(set_id, None)
