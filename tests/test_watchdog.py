"""The collective watchdog (hvdlike/engine/watchdog.py) on one host: a rank that stops answering
ends the job after HVDLIKE_COLLECTIVE_TIMEOUT_SECONDS, named by the others and by hvdlikerun;
a rank busy in Python for longer than that is waited for. The same faults across the test
hosts: tests/test_cluster.py."""
import re
import socket

from mpi_harness import run_script

from hvdlike.engine import watchdog

FAST = {"HVDLIKE_COLLECTIVE_TIMEOUT_SECONDS": "3", "HVDLIKE_STALL_CHECK_TIME_SECONDS": "1"}


def test_a_frozen_rank_ends_the_job_naming_the_collective_the_rank_and_its_host(tmp_path):
    """Rank 1 stops itself (SIGSTOP) before step 20: rank 0 is left inside MPI, in the
    all-reduce or in the round that would start it, whichever it was in."""
    job = run_script(2, "fault_cases.py", "frozen", tmp_path, timeout=90, env=FAST)
    assert not job.timed_out and job.returncode != 0, job.output[-3000:]
    assert not job.lines("DONE"), job.output[-3000:]
    (error,) = [line for line in job.output.splitlines()
                if line.startswith("hvdlike[0]: ERROR: collective timeout")]
    assert "(HVDLIKE_COLLECTIVE_TIMEOUT_SECONDS=3)" in error
    assert re.search(r"(allreduce 'gradient' \(1\.0 MiB\) on the global process set|the "
                     r"engine's round .*\)) has been inside MPI for [\d.]+ s on rank 0, waiting "
                     rf"on ranks \[1\] on host {re.escape(socket.gethostname())}", error), error
    last = job.output.strip().splitlines()[-1]
    assert last.startswith("hvdlikerun: the job failed after rank 0 of 2 (pid "), last
    assert "ended it: collective timeout" in last
    assert last.endswith(f"nothing heard since from host {socket.gethostname()} (rank 1): "
                         "unreachable (its network down) or frozen, or its ranks stuck outside "
                         "Python"), last


def test_a_rank_busy_in_python_longer_than_the_timeout_is_waited_for(tmp_path):
    """Rank 1 spins in a Python loop for 6 s at step 20, twice the timeout: its engine goes
    on taking part in rounds, so rank 0 waits outside MPI and is warned, not ended."""
    job = run_script(2, "fault_cases.py", "busy", tmp_path, timeout=90,
                     env=dict(FAST, HVDLIKE_TEST_BUSY_SECONDS="6"))
    assert job.returncode == 0 and "collective timeout" not in job.output, job.output[-3000:]
    done = sorted(job.lines("DONE"))
    assert [line.split()[1] for line in done] == ["rank=0", "rank=1"], job.output[-3000:]
    assert {line.split()[2] for line in done} == {str(float(2 * 60))}  # each step summed 2
    assert "stalled: rank 0 has waited" in job.output  # the stall inspector's warning


def test_the_ranks_waited_on_are_listed_in_runs_and_cut_short():
    assert watchdog._ranks_text([0, 1, 2, 3, 5, 8, 9]) == "[0-3, 5, 8-9]"
    many = list(range(0, 100, 2))
    assert watchdog._ranks_text(many).endswith(", 30, ... (50 ranks)]")
    assert watchdog._size(3 << 20) == "3.0 MiB" and watchdog._size(100) == "100 bytes"
