"""Deadlocks: ranks that are all blocked waiting for requests that only they could submit.

With requests matched by name, rank 0 blocking on ``a`` and then ``b`` while rank 1 blocks on
``b`` and then ``a`` is a certain deadlock: each waits for a name the other will submit only
after its own wait ends. A round tells every rank when every member of some process set has
been blocked in ``synchronize()`` (or a blocking collective) for ``HVDLIKE_DEADLOCK_SECONDS``
without any of its requests running; the ranks then gather what the blocked ranks wait for and
which of those names each rank has (``gather``), and ``find`` decides, the same
on every rank: a blocked rank is deadlocked when every name it waits for misses only ranks
that are deadlocked too. A rank that is still computing is never part of a deadlock: a name
missing such a rank may still come, and that stays the stall inspector's business.
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
         members: Callable[[int], Sequence[int]]) -> Optional[Found]:
    """``waits[r]``: the (key, kind) rank r's blocked threads wait for (empty: not blocked past
    the deadlock time); ``joined[r]``: it has called join(); ``has[r]``: bit i set when rank r
    has ``keys[i]`` pending. Returns the deadlocked ranks, or None."""
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
    clauses = []
    for r in ranks:
        for key, kind in waits[r]:
            where = "" if key[0] == 0 else f" on process set {key[0]}"
            clauses.append(f"rank {r} waits for {kind} {key[1]!r}{where}, which ranks "
                           f"{missing[key]} have not submitted")
    message = (f"hvdlike: deadlock: ranks {list(ranks)} are all blocked waiting, and what each "
               f"waits for can only come from the others: {'; '.join(clauses)}. Each rank "
               "blocks before submitting what the others wait for. Submit every name a step "
               "needs (e.g. with the *_async forms) before waiting on any, or have all ranks "
               "make their calls in the same order. (Reported after "
               "HVDLIKE_DEADLOCK_SECONDS of waiting; 0 turns this check off.)")
    if any(key[1].startswith("noname.") for r in ranks for key, _ in waits[r]):
        message += " Note: " + _UNNAMED + "."
    return Found(ranks, {r: [key for key, _ in waits[r]] for r in ranks}, message)


def gather(mine: "Mine", net: RoundNet, members: Callable[[int], Sequence[int]]) -> Optional[Found]:
    """Every member of some set is blocked past the deadlock time: gather what the blocked
    ranks wait for, then which of those each rank has, and find the ranks blocked for good."""
    waits = cast(List[Tuple[List[Tuple[Key, str]], bool]],
                 net.allgather((list(mine.waits), mine.joined_round >= 0)))
    keys = sorted({key for w, _ in waits for key, _ in w})
    mask = sum(1 << i for i, key in enumerate(keys) if key in mine.pending)
    has = cast(List[int], net.allgather(mask))
    return find([list(w) for w, _ in waits], [bool(j) for _, j in waits], keys, has, members)
