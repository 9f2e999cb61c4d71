"""Deadlocks: ranks that are all blocked waiting for requests that only they could submit.

With requests matched by name, rank 0 blocking on ``a`` and then ``b`` while rank 1 blocks on
``b`` and then ``a`` is a certain deadlock: each waits for a name the other will submit only
after its own wait ends. A round tells every rank when every member of some process set has
been blocked in ``synchronize()`` (or a blocking collective) for ``HVDLIKE_DEADLOCK_SECONDS``
without any of its requests running; the ranks then gather what the blocked ranks wait for and
which of those names each rank has and how many times it has submitted each (``gather``),
and ``find`` decides, the same on every rank: a blocked rank is deadlocked when every name it
waits for misses only ranks that are deadlocked too. A rank that is still computing is never
part of a deadlock: a name missing such a rank may still come, and that stays the stall
inspector's business.

The counts tell the commonest deadlock, ranks that ran different numbers of steps (uneven
data), from calls made in different orders: a rank waits for its n-th call of a name that a
missing rank made fewer times, but at least once, and went past.
"""
from typing import (
    TYPE_CHECKING,
    Callable,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    cast,
)

from ..transport.interface import RoundNet

if TYPE_CHECKING:
    from .rounds import Mine

Key = Tuple[int, str]
JOIN_KEY: Key = (0, "hvdlike.join")
_UNNAMED = ("names 'noname.<k>' are unnamed calls, which pair up in call order on each rank; "
            "pass name= to such calls")


class Found(NamedTuple):
    ranks: Tuple[int, ...]  # the deadlocked ranks
    waits: Dict[int, List[Key]]  # per deadlocked rank, the keys it waits for
    message: str  # the same on every rank


def find(waits: Sequence[Sequence[Tuple[Key, str]]], joined: Sequence[bool],
         keys: Sequence[Key], has: Sequence[int],
         members: Callable[[int], Sequence[int]],
         made: Optional[Sequence[Sequence[int]]] = None) -> Optional[Found]:
    """``waits[r]``: the (key, kind) rank r's blocked threads wait for (empty: not blocked past
    the deadlock time); ``joined[r]``: it has called join(); ``has[r]``: bit i set when rank r
    has ``keys[i]`` pending; ``made[r][i]``: how many times rank r has submitted ``keys[i]``
    (None: not known). Returns the deadlocked ranks, or None."""
    index = {key: i for i, key in enumerate(keys)}

    def submitted(rank: int, key: Key) -> bool:
        if key == JOIN_KEY or key[0] == 0 and joined[rank]:
            return joined[rank]  # join() stands in for the global set's all-reduces
        return bool(has[rank] >> index[key] & 1)

    missing: Dict[Key, List[int]] = {
        key: [q for q in members(key[0]) if not submitted(q, key)] for key in keys}
    stuck = {r for r, w in enumerate(waits) if w}
    changed = True
    while changed:  # the largest set of blocked ranks that wait only on each other
        changed = False
        for r in sorted(stuck):
            if any(not missing[key] or any(q not in stuck for q in missing[key])
                   for key, _ in waits[r]):
                stuck.discard(r)
                changed = True
    if not stuck:
        return None
    ranks = tuple(sorted(stuck))
    counts = made or [[0] * len(keys) for _ in waits]
    clauses, uneven = [], False
    for r in ranks:
        for key, kind in waits[r]:
            n = counts[r][index[key]]
            behind: Dict[int, List[int]] = {}  # times made -> missing ranks
            for q in missing[key]:
                behind.setdefault(counts[q][index[key]], []).append(q)
            uneven = uneven or any(0 < m < n for m in behind)
            clauses.append(_clause(r, key, kind, n, behind))
    if uneven:
        message = (f"hvdlike: deadlock: the ranks ran different numbers of steps (uneven "
                   f"data?): {'; '.join(clauses)}. Every rank must make the same collectives "
                   "the same number of times: give every rank the same number of batches "
                   "(shard, then drop the remainder: ds.shard(hvd.size(), hvd.rank()) and "
                   "batch(..., drop_remainder=True), or pass steps_per_epoch), or let ranks "
                   "that run out of data wait for the others (hvd.callbacks.UnevenDataCallback()"
                   " first in fit's callbacks; hvd.join() after a custom loop's epoch). "
                   "(Reported after HVDLIKE_DEADLOCK_SECONDS of waiting; 0 turns this check "
                   "off.)")
    else:
        message = (f"hvdlike: deadlock: ranks {list(ranks)} are all blocked waiting, and what "
                   f"each waits for can only come from the others: {'; '.join(clauses)}. Each "
                   "rank blocks before submitting what the others wait for. Submit every name "
                   "a step needs (e.g. with the *_async forms) before waiting on any, or have "
                   "all ranks make their calls in the same order. (Reported after "
                   "HVDLIKE_DEADLOCK_SECONDS of waiting; 0 turns this check off.)")
    if any(key[1].startswith("noname.") for r in ranks for key, _ in waits[r]):
        message += " Note: " + _UNNAMED + "."
    return Found(ranks, {r: [key for key, _ in waits[r]] for r in ranks}, message)


def _clause(rank: int, key: Key, kind: str, n: int, behind: Dict[int, List[int]]) -> str:
    """What ``rank`` waits for (its ``n``-th call of ``key``) and how far the ranks that lack
    it got: ``behind`` maps times made to those ranks."""
    where = "" if key[0] == 0 else f" on process set {key[0]}"
    nth = f"its {_ordinal(n)} " if n > 1 else ""
    if set(behind) == {0}:
        lacking = f"which ranks {behind[0]} have not submitted"
    else:
        lacking = "which " + " and ".join(
            f"{_who(qs)} made {_times(m)} and went on" if m else
            f"{_who(qs)} {'has' if len(qs) == 1 else 'have'} not submitted"
            for m, qs in sorted(behind.items(), reverse=True))
    return f"rank {rank} waits for {nth}{kind} {key[1]!r}{where}, {lacking}"


def _who(ranks: List[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _times(m: int) -> str:
    return "once" if m == 1 else "twice" if m == 2 else f"{m} times"


def gather(mine: "Mine", net: RoundNet, members: Callable[[int], Sequence[int]]) -> Optional[Found]:
    """Every member of some set is blocked past the deadlock time: gather what the blocked
    ranks wait for, then which of those each rank has, and find the ranks blocked for good."""
    waits = cast(List[Tuple[List[Tuple[Key, str]], bool]],
                 net.allgather((list(mine.waits), mine.joined_round >= 0)))
    keys = sorted({key for w, _ in waits for key, _ in w})
    mask = sum(1 << i for i, key in enumerate(keys) if key in mine.pending)
    rows = cast(List[Tuple[int, List[int]]],
                net.allgather((mask, [mine.made.get(key, 0) for key in keys])))
    return find([list(w) for w, _ in waits], [bool(j) for _, j in waits], keys,
                [mask for mask, _ in rows], members, [made for _, made in rows])
