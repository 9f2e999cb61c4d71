"""hvdlike.exclusive_mpi(): the program's own MPI calls with no hvdlike thread in MPI."""
import pytest

from mpi_harness import run_mpi


@pytest.mark.parametrize("np_", [2, 4])
def test_own_mpi_calls_run_inside_the_block_while_the_engine_stays_out(np_):
    for rank, r in enumerate(run_mpi(np_, "exclusive_cases:own_mpi_inside_the_block",
                                     timeout=60, idle=0.2)):
        total = sum(range(1, np_ + 1))
        assert r["before"] == [float(total)] * 3
        assert r["own"] == total
        assert r["rounds_inside"] == 0, f"rank {rank}: the engine ran rounds inside the block"
        assert "inside hvdlike.exclusive_mpi()" in r["inside_error"], r["inside_error"]
        assert f"rank {rank}" in r["inside_error"]
        assert r["after"] == [[float(sum(range(np_)))] * 2] * 3


@pytest.mark.parametrize("np_", [2, 4])
def test_a_request_pending_across_the_block_cannot_be_waited_for_inside_it(np_):
    results = run_mpi(np_, "exclusive_cases:pending_request_across_the_block", timeout=60)
    total = float(sum(range(1, np_ + 1)))
    assert "waits for a request that has not run yet" in results[0]["waited_inside"]
    for r in results:
        assert r["x"] == [total] * 2
    assert all(r["waited_inside"] is None for r in results[1:])


def test_a_block_that_raises_leaves_the_engine_running():
    for r in run_mpi(2, "exclusive_cases:raising_inside_the_block", timeout=60):
        assert r["after"] == [1.0, 1.0]
        assert r["again"] == 2


@pytest.mark.parametrize("np_", [2, 4])
def test_ranks_leaving_at_different_times_go_on_together(np_):
    for r in run_mpi(np_, "exclusive_cases:ranks_leave_at_different_times", timeout=60):
        assert r["after"] == [float(sum(range(1, np_ + 1)))] * 2
