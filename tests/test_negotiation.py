"""The negotiation's rows, in one process: the rows of a round in which every rank sent the
same row are known without reading them; they must say what reading them would say."""
import itertools

import numpy as np
import pytest

from hvdlike.engine.negotiation import Negotiation

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
