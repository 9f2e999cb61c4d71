"""The negotiation of several ranks in one process (the real ``Negotiation`` of each rank,
through scripts/simulated_world.py's stand-in for the round's collectives): what a round
decides, and that its collectives do not grow with the number of ranks."""
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest

from hvdlike.engine import checks
from hvdlike.engine.checks import Request
from hvdlike.engine import deadlock
from hvdlike.engine.negotiation import Negotiation
from hvdlike.engine.rounds import Mine, Round

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from simulated_world import SimNet, World, run_classes  # noqa: E402

Key = Tuple[int, str]
F32 = np.dtype(np.float32)


def _request(name: str, shape=(4,), op: int = 1, kind: str = "allreduce") -> Request:
    return Request(kind, name, F32, shape, op)


class Rank:
    """One simulated rank: its pending requests (as the engine keeps them) and its
    negotiation."""

    def __init__(self, rank: int, size: int, sets: Dict[int, List[int]]) -> None:
        self.neg = Negotiation(size, 64, sets.__getitem__, rank)
        self.rank = rank
        self.pending: Dict[Key, List[Any]] = {}  # key -> [request, error, position]
        self.joined_round = -1
        self.detail = False
        self.rounds: List[Round] = []
        self.calls: Dict[str, int] = {}

    def submit(self, key: Key, request: Request, error: Optional[checks.LocalError] = None):
        self.pending[key] = [request, error, None]

    def mine(self) -> Mine:
        bits, uncached = 0, []
        for key, entry in self.pending.items():
            request, error, position = entry
            if position is None and error is None:
                position = entry[2] = self.neg.cached(key, request)
            if position is None:
                uncached.append((key, request, error))
            else:
                bits |= 1 << position
        return Mine(bits=bits, uncached=uncached, waiting=bool(self.pending)
                    or self.joined_round >= 0, joined_round=self.joined_round,
                    detail=self.detail, pending=self.pending)

    def round(self, net: SimNet) -> Round:
        mine = self.mine()
        self.neg.vector(mine)
        result = self.neg.conclude(self.neg.read(net.band(self.neg.contribution)), mine,
                                   _Counted(net, self.calls))
        for key in result.invalidated:
            if key in self.pending:
                self.pending[key][2] = None
        for response in result.responses:
            self.pending.pop(response.key, None)
        self.rounds.append(result)
        return result


class _Counted:
    """A Net that counts the collectives a round calls beyond its all-reduce."""

    def __init__(self, net: SimNet, calls: Dict[str, int]) -> None:
        self._net, self._calls = net, calls

    def __getattr__(self, name: str) -> Any:
        self._calls[name] = self._calls.get(name, 0) + 1
        return getattr(self._net, name)


def _job(size: int, plan: Callable[[int, Rank], None], rounds: int,
         sets: Optional[Dict[int, List[int]]] = None) -> List[Rank]:
    """``size`` ranks, each its own class, run ``rounds`` rounds; before each round
    ``plan(round_no, rank)`` may submit or join."""
    sets = sets or {0: list(range(size))}
    world = World(size, [range(r, r + 1) for r in range(size)])
    ranks = [Rank(r, size, sets) for r in range(size)]

    def body(index: int, net: SimNet) -> Rank:
        me = ranks[index]
        for round_no in range(rounds):
            plan(round_no, me)
            me.round(net)
        return me

    return run_classes(world, body)


def _responses(rank: Rank) -> List[List[Key]]:
    return [[r.key for r in rnd.responses] for rnd in rank.rounds]


def test_the_round_vector_has_the_same_size_at_any_world_size():
    sizes = {Negotiation(p, 1024, lambda s: range(p)).vector_bytes for p in (2, 1024, 16384)}
    assert len(sizes) == 1 and sizes.pop() < 512


def test_new_names_submitted_in_different_rounds_and_orders_run_once_every_rank_has_them():
    names = ["a", "b", "c", "d"]

    def plan(round_no: int, me: Rank) -> None:
        order = names if me.rank % 2 == 0 else names[::-1]
        if round_no == me.rank:  # rank r submits in round r, in its own order
            for n in order:
                me.submit((0, n), _request(n))

    ranks = _job(3, plan, 5)
    want = [[], [], [(0, n) for n in names], [], []]  # all of them once rank 2 has them
    for me in ranks:
        assert sorted(_responses(me)[2]) == want[2] and _responses(me)[:2] == [[], []]
        assert not me.pending
        # published once, by rank 0, in round 0; in the cache at the same place on every rank
        assert [me.neg.cached((0, n), _request(n)) for n in names] == \
            [ranks[0].neg.cached((0, n), _request(n)) for n in names]
    assert all(None not in [me.neg.cached((0, n), _request(n)) for n in names] for me in ranks)


def test_a_repeated_step_takes_one_all_reduce_and_nothing_else():
    def plan(round_no: int, me: Rank) -> None:
        for n in ("w", "b"):
            me.submit((0, n), _request(n))

    ranks = _job(4, plan, 6)
    for me in ranks:
        assert all(sorted(keys) == [(0, "b"), (0, "w")] for keys in _responses(me)[1:])
        # the first round publishes (one MIN, one broadcast, the new names' votes in one more
        # AND); the cached rounds call nothing beyond their all-reduce
        assert me.calls == {"min": 1, "bcast": 1, "band": 1}
        assert all(r.drained for r in me.rounds[1:])


def test_ranks_that_ask_for_different_shapes_get_the_error_resolve_gives_on_every_rank():
    shapes = {0: (4,), 1: (5,), 2: (4,)}

    def plan(round_no: int, me: Rank) -> None:
        if round_no == 0:
            me.submit((0, "x"), _request("x", shapes[me.rank]))

    ranks = _job(3, plan, 3)
    want = checks.resolve_or_error([(_request("x", shapes[r]), None) for r in range(3)],
                                   [0, 1, 2])[1]
    for me in ranks:
        (response,) = [r for rnd in me.rounds for r in rnd.responses]
        assert type(response.error) is type(want) and str(response.error) == str(want)
        assert "rank 1 has (5,)" in str(response.error)
        assert me.neg.cached((0, "x"), _request("x")) is None  # an error is never cached


def test_bad_input_on_one_rank_fails_the_name_on_every_rank_with_its_message():
    def plan(round_no: int, me: Rank) -> None:
        if round_no == 0:
            error = ("TypeError", "float128 is not supported") if me.rank == 1 else None
            me.submit((0, "y"), _request("y"), error)

    for me in _job(2, plan, 2):
        (response,) = [r for rnd in me.rounds for r in rnd.responses]
        assert isinstance(response.error, TypeError)
        assert "rank 1: float128 is not supported" in str(response.error)


def test_a_cached_name_with_new_metadata_on_every_rank_is_negotiated_again():
    def plan(round_no: int, me: Rank) -> None:
        me.submit((0, "z"), _request("z", (3,) if round_no < 2 else (5,)))

    ranks = _job(3, plan, 4)
    for me in ranks:
        assert _responses(me) == [[(0, "z")]] * 4
        assert [r.responses[0].request.shape for r in me.rounds] == [(3,), (3,), (5,), (5,)]
        assert (0, "z") in me.rounds[2].invalidated
        assert me.neg.cached((0, "z"), _request("z", (5,))) is not None


def test_a_cached_name_with_new_metadata_on_one_rank_fails_on_every_rank_naming_it():
    def plan(round_no: int, me: Rank) -> None:
        if round_no < 2:
            changed = round_no == 1 and me.rank == 1
            me.submit((0, "m"), _request("m", (7,) if changed else (3,)))

    for me in _job(3, plan, 3):
        first, second, third = me.rounds
        assert [r.key for r in first.responses] == [(0, "m")]
        (failed,) = second.responses + third.responses
        assert "shape: rank 0 has (3,), rank 1 has (7,), rank 2 has (3,)" in str(failed.error)
        assert (0, "m") in second.invalidated


def test_a_rank_that_joined_stands_in_for_global_all_reduces_but_not_for_broadcasts():
    def plan(round_no: int, me: Rank) -> None:
        if round_no == 0:
            me.submit((0, "g"), _request("g"))
        elif me.rank == 2 and round_no == 2:
            me.joined_round = 2
        elif me.rank != 2 and round_no == 3:
            me.submit((0, "g"), _request("g"))  # cached: runs without rank 2
            me.submit((0, "bc"), Request("broadcast", "bc", F32, (4,), None, 0))

    for me in _job(3, plan, 5):
        got = _responses(me)
        assert got[0] == [(0, "g")] and got[3][0] == (0, "g")
        (bc,) = [r for rnd in me.rounds for r in rnd.responses if r.key == (0, "bc")]
        assert "ranks [2] have already called hvdlike.join()" in str(bc.error)
        assert not any(r.all_joined for r in me.rounds)


def test_when_every_rank_has_joined_the_last_to_join_is_named():
    def plan(round_no: int, me: Rank) -> None:
        if round_no == {0: 1, 1: 3, 2: 3}[me.rank]:
            me.joined_round = round_no

    for me in _job(3, plan, 4):
        assert [r.all_joined for r in me.rounds] == [False, False, False, True]
        assert me.rounds[3].last_joined == 2  # rank 1 and 2 joined last: the highest of them


def test_a_set_without_a_rank_negotiates_among_its_members_only():
    sets = {0: [0, 1, 2], 1: [0, 1]}

    def plan(round_no: int, me: Rank) -> None:
        if me.rank in sets[1]:
            me.submit((1, "s"), _request("s"))

    ranks = _job(3, plan, 3, sets)
    for me in ranks:
        assert _responses(me) == [[(1, "s")]] * 3
    assert ranks[2].neg.foreign == 1 << ranks[2].neg.cached((1, "s"), _request("s"))
    assert ranks[0].neg.foreign == 0
    # rank 2 saw the set's work in the rounds' union of pending positions
    assert ranks[2].rounds[2].union & ranks[2].neg.foreign


def test_a_round_that_runs_all_pending_work_is_drained_and_one_with_a_late_rank_is_not():
    def plan(round_no: int, me: Rank) -> None:
        if round_no < 2 or me.rank != 2:  # rank 2 stops submitting after round 1
            me.submit((0, "a"), _request("a"))

    for me in _job(3, plan, 4):
        assert [r.drained for r in me.rounds] == [False, True, False, False]
        assert [r.all_waiting for r in me.rounds] == [True, True, False, False]


def test_the_detail_a_rank_asks_for_says_who_has_what():
    def plan(round_no: int, me: Rank) -> None:
        me.detail = round_no == 2 and me.rank == 0
        if round_no == 0 or me.rank == 1:
            me.submit((0, "q"), _request("q"))

    ranks = _job(3, plan, 3)
    for me in ranks:
        assert [r.detail is not None for r in me.rounds] == [False, False, True]
        detail = me.rounds[2].detail
        assert [detail.has(r, (0, "q")) for r in range(3)] == [False, True, False]
        assert detail.joined == [-1, -1, -1]
        assert me.calls.get("allgather_rows") == 1


@pytest.mark.parametrize("waits,pending,joined,want", [
    # rank 0 waits for a (only it has a), rank 1 for b (only it has b): both, for good
    ([[("a", "allreduce")], [("b", "allreduce")]], [{"a"}, {"b"}], [False, False], (0, 1)),
    # rank 1 is not blocked (still computing): it may still submit a
    ([[("a", "allreduce")], []], [{"a"}, {"b"}], [False, False], None),
    # b is on rank 0 too: it is ready, rank 1 is not stuck, so rank 0 waits on a live rank
    ([[("a", "allreduce")], [("b", "allreduce")]], [{"a", "b"}, {"b"}], [False, False], None),
    # three ranks in a cycle: each waits for a name the next one lacks
    ([[("a", "allreduce")], [("b", "allreduce")], [("c", "allreduce")]],
     [{"a", "c"}, {"b", "a"}, {"c", "b"}], [False] * 3, (0, 1, 2)),
    # the same chain, but its last rank is not blocked: it may still submit
    ([[("a", "allreduce")], [("b", "allreduce")], []],
     [{"a", "c"}, {"b", "a"}, {"c", "b"}], [False] * 3, None),
    # a rank in join() waits for the others; the all-reduce they wait for runs with the
    # joined rank's zeros
    ([[("hvdlike.join", "join")], [("a", "allreduce")]], [set(), {"a"}], [True, False], None),
])
def test_deadlocks_are_the_blocked_ranks_that_wait_only_on_each_other(waits, pending, joined,
                                                                       want):
    keys = sorted({(0, n) for w in waits for n, _ in w})
    has = [sum(1 << i for i, k in enumerate(keys) if k[1] in p) for p in pending]
    found = deadlock.find([[((0, n), kind) for n, kind in w] for w in waits], joined, keys, has,
                          lambda s: range(len(waits)))
    assert (found.ranks if found else None) == want
    if found:
        for r in want:
            (name, kind), = waits[r]
            assert f"rank {r} waits for {kind} {name!r}" in found.message


def test_a_deadlock_of_ranks_that_ran_different_numbers_of_steps_says_so():
    # rank 0 waits for its 65th step's gradients, which rank 1 made 64 times before it went on
    # to the epoch's end; rank 1 waits for the metric average rank 0 has not reached
    keys = [(0, "MetricAverageCallback"), (0, "gradient/dense/bias+3")]
    waits = [[(keys[1], "grouped_allreduce")], [(keys[0], "allreduce")]]
    uneven = deadlock.find(waits, [False, False], keys, [0b10, 0b01], lambda s: range(2),
                           made=[[0, 65], [1, 64]])
    assert uneven is not None and uneven.ranks == (0, 1)
    assert uneven.message.startswith(
        "hvdlike: deadlock: the ranks ran different numbers of steps (uneven data?): rank 0 "
        "waits for its 65th grouped_allreduce 'gradient/dense/bias+3', which rank 1 made 64 "
        "times and went on; rank 1 waits for allreduce 'MetricAverageCallback', which ranks "
        "[0] have not submitted."), uneven.message
    assert "UnevenDataCallback" in uneven.message and "drop_remainder" in uneven.message
    # the same waits on the first call of each name: calls made in different orders
    ordered = deadlock.find(waits, [False, False], keys, [0b10, 0b01], lambda s: range(2),
                            made=[[0, 1], [1, 0]])
    assert ordered is not None and "different numbers of steps" not in ordered.message
    assert "have all ranks make their calls in the same order" in ordered.message
