"""The negotiation's rows, in one process: the rows of a round in which every rank sent the
same row are known without reading them; they must say what reading them would say."""
import itertools

import numpy as np
import pytest

from hvdlike.checks import Request
from hvdlike.engine.negotiation import Announcement, Negotiation

SIZE = 3
ROWS = list(itertools.product(
    (0, 1, (1 << 100) | 5),  # pending cache positions
    (0, 2),  # announced requests
    (-1, 4),  # joined in round
    (False, True),  # stopping
    (False, True),  # stalled
))


def _negotiation() -> Negotiation:
    return Negotiation(SIZE, 128, lambda set_id: list(range(SIZE)))


@pytest.mark.parametrize("bits,announcing,joined,stop,stalled", ROWS)
def test_a_round_of_identical_rows_parses_as_reading_them_would(bits, announcing, joined,
                                                                stop, stalled):
    neg = _negotiation()
    row = neg.row(bits, announcing, joined, stop, stalled)
    gathered = np.tile(row, (SIZE, 1))
    got = neg.parse(gathered)
    read = neg._parse(gathered.tobytes())
    assert got.same and not read.same
    assert got._replace(same=False) == read
    assert neg.last_rows is got


def test_rows_that_differ_are_read_rank_by_rank():
    neg = _negotiation()
    peer = neg.row(0b110, 1, -1, False, False).copy()
    mine = neg.row(0b011, 0, -1, False, False)
    gathered = np.stack([mine, peer, mine])
    got = neg.parse(gathered)
    assert not got.same
    assert got.bits == [0b011, 0b110, 0b011]
    assert got.announced and got.waiting == SIZE and not got.joined_any


def test_a_changed_row_is_written_again():
    neg = _negotiation()
    first = neg.row(1, 0, -1, False, False).copy()
    again = neg.row(1, 0, -1, False, False).copy()
    other = neg.row(2, 0, 7, False, False).copy()
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    # the parse of a round sent with the new row knows the new fields
    got = neg.parse(np.tile(other, (SIZE, 1)))
    assert got.same and got.bits == [2] * SIZE and got.joined == [7] * SIZE and got.joined_any


SETS = {0: [0, 1, 2], 1: [0, 1]}  # the world, and a set without rank 2


def _cached(rank: int, keys) -> Negotiation:
    """A negotiation of ``rank`` whose cache holds ``keys`` (announced by their sets' members,
    as every rank sees them), in order: position i for keys[i]."""
    neg = Negotiation(SIZE, 128, SETS.__getitem__, rank)
    for key in keys:
        request = Request("allreduce", key[1], np.dtype(np.float32), (4,))
        lists = [[Announcement(key, request, None)] if r in SETS[key[0]] else []
                 for r in range(SIZE)]
        rows = neg.parse(np.stack([neg.row(0, len(lists[r]), -1, False, False).copy()
                                   for r in range(SIZE)]))
        (response,) = neg.decide(rows, lists).responses
        assert response.key == key and neg.cached(key, request) is not None
    return neg


def _decide(neg: Negotiation, bits, joined=(-1, -1, -1)):
    rows = neg.parse(np.stack([neg.row(b, 0, j, False, False).copy()
                               for b, j in zip(bits, joined)]))
    return neg.decide(rows, None)


def test_a_round_that_runs_all_pending_work_is_drained():
    neg = _cached(0, [(0, "a"), (0, "b"), (1, "s")])  # positions 0, 1, 2
    assert _decide(neg, [0b1, 0b1, 0b1]).drained  # a training step: everyone's request ran
    assert _decide(neg, [0b100, 0b100, 0]).drained  # the set's work ran; rank 2 had none
    assert not _decide(neg, [0b11, 0b1, 0b1]).drained  # "b" waits for ranks 1 and 2
    assert not _decide(neg, [0b1, 0b1, 0]).drained  # "a" waits for rank 2
    assert not _decide(neg, [0, 0, 0]).drained  # no work at all: an idle tick
    assert not _decide(neg, [0b1, 0b1, 0], joined=(-1, -1, 5)).drained  # rank 2 joined


def test_the_cache_positions_of_sets_without_this_rank_are_foreign():
    keys = [(0, "a"), (1, "s"), (1, "t")]
    assert _cached(0, keys).foreign == 0  # rank 0 is in both sets
    outside = _cached(2, keys)
    assert outside.foreign == 0b110
    outside.forget_set(1)
    assert outside.foreign == 0
