"""The stall inspector: a collective that some ranks never submit is reported, naming the
missing ranks and the tensor, and with a shutdown time every rank exits instead of hanging."""
import re
import sys
import time

import pytest

from mpi_harness import TESTS, launch, run_mpi

CASES = str(TESTS / "mpi_cases" / "stall_cases.py")
STALL = {"HVDLIKE_STALL_CHECK_TIME_SECONDS": "1", "HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS": "3"}


def _run(np_: int, mode: str, missing: int, env: dict, timeout: float = 40):
    job = launch(np_, [sys.executable, CASES, mode, str(missing)], timeout=timeout, env=env)
    ended = time.time()
    assert not job.timed_out, f"the job hung:\n{job.output[-4000:]}"
    start = float(re.search(r"^STALL_START (\S+)$", job.output, re.M).group(1))
    return job, ended - start


def _shutdown_lines(output: str, rank: int):
    return [line for line in output.splitlines()
            if line.startswith(f"hvdlike[{rank}]: ERROR: stall shutdown")]


@pytest.mark.parametrize("np_,missing,mode", [(2, 1, "cached"), (4, 2, "cached"), (2, 1, "new")])
def test_a_skipped_collective_ends_every_rank_with_a_message_naming_rank_and_tensor(
        np_, missing, mode):
    job, waited = _run(np_, mode, missing, STALL)
    assert job.returncode != 0
    name = "layer1/kernel" if mode == "cached" else "a_new_name"
    for rank in range(np_):
        lines = _shutdown_lines(job.output, rank)
        assert len(lines) == 1, f"rank {rank}:\n{job.output[-3000:]}"
        waiting = sorted(set(range(np_)) - {missing})
        assert (f"rank {waiting[0]} has waited" if np_ == 2 else f"ranks {waiting} have waited"
                ) in lines[0]
        assert f"allreduce {name!r}, which ranks [{missing}] have not submitted" in lines[0]
    for waiting in set(range(np_)) - {missing}:  # the warning came first, once per rank
        # (a round MPI held past the check time adds a warning without answer: not counted)
        warnings = [line for line in job.output.splitlines()
                    if line.startswith(f"hvdlike[{waiting}]: WARNING: stalled:")
                    and "no answer from some rank" not in line]
        assert len(warnings) == 1 and f"which ranks [{missing}]" in warnings[0]
    assert "RESULT" not in job.output
    assert waited <= 3 + 5, f"ended {waited:.1f} s after the stall began"


def test_a_skipped_unnamed_collective_is_reported_with_a_hint_to_name_it():
    job, waited = _run(2, "unnamed", 1, STALL)
    assert job.returncode != 0
    line = _shutdown_lines(job.output, 0)[0]
    assert re.search(r"rank 0 has waited \S+ s for allreduce 'noname\.\d+', which ranks \[1\] "
                     r"have not submitted; requests named 'noname.<k>' were submitted without a "
                     r"name: .* pass name= to such calls", line), line
    assert waited <= 3 + 5


def test_a_late_rank_is_reported_once_and_the_job_goes_on():
    job, _ = _run(2, "late", 1, {"HVDLIKE_STALL_CHECK_TIME_SECONDS": "1"})
    assert job.returncode == 0, job.output[-3000:]
    warnings = [line for line in job.output.splitlines() if "WARNING: stalled" in line]
    assert len(warnings) == 1, job.output[-3000:]
    assert warnings[0].startswith("hvdlike[0]: WARNING: stalled: rank 0 has waited")
    assert "allreduce 'layer1/kernel', which ranks [1] have not submitted" in warnings[0]
    # no stall shutdown set: the warning says how to make such a wait end the job
    assert "set HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS to end it" in warnings[0]
    for rank in range(2):
        assert f"RESULT rank={rank} [1.0, 1.0, 1.0]" in job.output


def test_the_stall_inspector_can_be_turned_off():
    job, _ = _run(2, "late", 1, {"HVDLIKE_STALL_CHECK_TIME_SECONDS": "1",
                                 "HVDLIKE_STALL_CHECK_DISABLE": "1"})
    assert job.returncode == 0, job.output[-3000:]
    assert "stalled" not in job.output
    assert job.output.count("RESULT") == 2


def test_a_process_set_collective_names_its_set_and_missing_member():
    job, waited = _run(4, "process_set", 3, STALL)
    assert job.returncode != 0
    line = _shutdown_lines(job.output, 0)[0]
    assert "ranks [1, 2] have waited" in line
    assert "on process set 1, which ranks [3] have not submitted" in line
    assert waited <= 3 + 5


def test_a_member_that_joined_instead_is_named_as_joined():
    job, waited = _run(4, "joined", 3, STALL)
    assert job.returncode != 0
    line = _shutdown_lines(job.output, 1)[0]
    assert ("on process set 1, which ranks [3] have not submitted (ranks [3] have called "
            "hvdlike.join(), which takes part only in all-reduces on the global process set)"
            ) in line, line
    assert waited <= 3 + 5


def test_a_rank_whose_engine_stops_answering_ends_the_job():
    # SIGSTOP stops the whole process, engine thread included: its peers' rounds get no answer;
    # they exit alone a grace past the shutdown time (not before: a round Open MPI holds for a
    # moment must not pre-empt the shared report)
    from hvdlike.engine.stall import LONE_EXIT_GRACE
    job, waited = _run(2, "stopped", 1, STALL)
    assert job.returncode != 0
    assert "hvdlike[0]: ERROR: stall shutdown" in job.output
    assert "no answer from some rank" in job.output
    assert waited <= 3 + LONE_EXIT_GRACE + 5


@pytest.mark.parametrize("np_,missing", [(2, 1), (4, 2)])
def test_a_rank_whose_script_ends_early_fails_the_others_collective_at_once(np_, missing):
    # no stall settings (the inspector would speak after 60 s, past the job's 40 s timeout):
    # what ends the job is the error itself
    job, _ = _run(np_, "finished", missing, {})
    assert job.returncode != 0
    assert "RESULT" not in job.output
    assert (f"hvdlike.allreduce 'layer1/kernel' cannot complete: ranks [{missing}] shut "
            "hvdlike down") in job.output, job.output[-3000:]
    assert "stalled" not in job.output


def test_ranks_blocked_on_names_only_the_others_submit_raise_a_deadlock_error_naming_them():
    # rank 0 blocks on a then b, rank 1 on b then a: at default settings both raise, each
    # with the same message naming both ranks and both names
    results = run_mpi(2, "deadlock_cases:mutual_wait", timeout=60)
    for rank, r in enumerate(results):
        assert r["sums"] == {} and r["ranks"] == [0, 1], r
        assert "rank 0 waits for allreduce 'a', which ranks [1] have not submitted" in r["error"]
        assert "rank 1 waits for allreduce 'b', which ranks [0] have not submitted" in r["error"]
    assert results[0]["error"] == results[1]["error"]


def test_deadlocks_on_a_set_and_in_a_cycle_are_named_and_a_slow_rank_is_only_waited_for():
    results = run_mpi(4, "deadlock_cases:several", timeout=90, slow=2.5,
                      env={"HVDLIKE_DEADLOCK_SECONDS": "1"})
    for rank, r in enumerate(results):
        if rank < 2:  # the set {0, 1} deadlocked; ranks 2 and 3 were busy on their own set
            assert r["set"]["ranks"] == [0, 1], r
            assert "on process set 1" in r["set"]["error"]
        else:
            assert r["set"]["error"] is None
            assert r["set"]["sums"] == {f"h{i}": [7.0, 7.0] for i in range(20)}
        # rank 3 computed longer than the deadlock time: the others waited for it
        assert r["slow"] == {"sums": {"late": [10.0, 10.0]}, "error": None}, r
        # every rank blocked on its own name, which the others submit only after theirs
        assert r["cycle"]["ranks"] == [0, 1, 2, 3] and r["cycle"]["sums"] == {}
        for q in range(4):
            others = [p for p in range(4) if p != q]
            assert (f"rank {q} waits for allreduce 'c{q}', which ranks {others} have not "
                    "submitted") in r["cycle"]["error"]
