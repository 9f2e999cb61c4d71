"""``hvdlike.run`` (Horovod's ``horovod.run``): a function run as every rank of a real job,
its return values back in the caller, its errors too."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

import hvdlike
from hvdlike.runner import run_func
from hvdlike.runner.command import reachable_address
from test_runner import _alive

CASES = Path(__file__).resolve().parent / "mpi_cases" / "run_func_cases.py"
TIMEOUT = 120


def run_case(case: str, np_: int, *where: str, command=lambda argv: argv,
             stderr: Optional[list] = None) -> dict:
    """Run a caller of hvdlike.run (a main script of its own) with a timeout; its JSON line
    (its stderr appended to ``stderr`` when given)."""
    job = subprocess.run(command([sys.executable, str(CASES), case, str(np_), *where]),
                         capture_output=True, text=True, timeout=TIMEOUT, check=False)
    lines = [line for line in job.stdout.splitlines() if line.startswith(case + " ")]
    assert job.returncode == 0 and len(lines) == 1, job.stdout[-3000:] + job.stderr[-3000:]
    if stderr is not None:
        stderr.append(job.stderr)
    return json.loads(lines[0][len(case) + 1:])


def expected_sums(size: int) -> list:
    """What reduce_rank_arrays(2.0, offset=1.0) returns on every rank of ``size``."""
    return (np.arange(5.0) * 2.0 * sum(r + 1 for r in range(size)) + 1.0).tolist()


@pytest.mark.parametrize("np_", [2, 4])
def test_every_ranks_return_value_comes_back_in_rank_order(np_):
    results = run_case("returns", np_)
    assert results == [{"rank": r, "size": np_, "sum": expected_sums(np_),
                         "host": socket.gethostname(), "caller": "127.0.0.1"}
                        for r in range(np_)]


def test_horovod_run_arguments_without_an_equivalent_run_the_job_with_a_note():
    """start_timeout bounds checks hvdlike does not make; use_gloo: the job runs on MPI."""
    stderr: list = []
    results = run_case("horovod_arguments", 2, stderr=stderr)
    assert [r["sum"] for r in results] == [expected_sums(2)] * 2
    assert "hvdlikerun: note: --start-timeout: no effect" in stderr[0]
    assert "hvdlikerun: note: --gloo: hvdlike runs on MPI only: this job uses MPI" in stderr[0]


def test_an_exception_on_one_rank_ends_the_job_and_is_raised_in_the_caller():
    raised = run_case("raises", 2)
    assert raised["message"].startswith("hvdlike.run: the function raised on rank(s) [1]")
    assert "ValueError: rank 1 found bad data" in raised["message"]  # its traceback
    assert raised["cause"] == "ValueError('rank 1 found bad data')"


def test_a_call_inside_a_rank_says_how_to_fix_it(monkeypatch):
    """A function that calls hvdlike.run again would start a job from every rank."""
    monkeypatch.setenv(run_func._ADDRESS, "127.0.0.1:1")  # as in a rank of hvdlike.run
    with pytest.raises(RuntimeError, match="cannot start a job of its own.*from the caller"):
        hvdlike.run(np.sum, num_proc=2)


def test_interrupting_the_caller_ends_the_ranks():
    """Ctrl-C in a notebook reaches the caller alone: the ranks must not go on running."""
    caller = subprocess.Popen([sys.executable, str(CASES), "interrupted", "2"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    pids: list = []
    deadline = threading.Timer(TIMEOUT, _kill_group, [caller.pid])  # ranks that never start
    deadline.start()
    try:
        for line in caller.stdout:  # each rank says it started
            if line.startswith("SLEEPING "):
                pids.append(int(line.split()[1]))
            if len(pids) == 2:
                break
        assert len(pids) == 2
        caller.send_signal(signal.SIGINT)
        assert caller.wait(timeout=TIMEOUT) != 0  # KeyboardInterrupt
        end = time.monotonic() + 30
        while any(_alive(pid) for pid in pids) and time.monotonic() < end:
            time.sleep(0.1)
        running = [pid for pid in pids if _alive(pid)]
    finally:  # only now: the ranks may be in the caller's process group
        deadline.cancel()
        _kill_group(caller.pid)
    assert running == [], "ranks still run after the caller ended"


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # nothing left in it
        pass


@pytest.mark.parametrize("arguments, says", [
    ({"num_proc": 0}, "num_proc must be a whole number >= 1, got 0"),
    ({"hosts": "a:1", "hostfile": "h"}, "give hosts or hostfile, not both"),
    ({"min_num_proc": 2}, "min_num_proc and max_num_proc .elastic training. are not"),
    ({"max_num_proc": 4}, "min_num_proc and max_num_proc .elastic training. are not"),
    ({"slots": 4}, "slots is for Horovod's host discovery"),
    ({"reset_limit": 1}, "reset_limit is for Horovod's host discovery"),
])
def test_arguments_hvdlike_cannot_honour_are_refused_before_anything_starts(arguments, says):
    with pytest.raises(ValueError, match="hvdlike.run: " + says):
        hvdlike.run(np.sum, **arguments)  # np.sum: any function that pickles


# a notebook's cell: the function and what it uses live in a __main__ without a file
INTERACTIVE = """
import json
import numpy as np
import hvdlike

def scaled_sum(scale):
    import hvdlike as hvd
    hvd.init()
    return float(hvd.allreduce(np.ones(3) * (hvd.rank() + 1) * scale, op=hvd.Sum)[0])

def closure(offset):
    def rank_plus():
        import hvdlike as hvd
        hvd.init()
        return offset + hvd.rank()
    return rank_plus

print("interactive " + json.dumps({
    "function": hvdlike.run(scaled_sum, args=(2.0,), num_proc=NP),
    "lambda": hvdlike.run(lambda: "ran", num_proc=NP),
    "closure": hvdlike.run(closure(100), num_proc=NP)}), flush=True)
"""


@pytest.mark.parametrize("np_", [2, 4])
def test_functions_typed_into_a_notebook_lambdas_and_closures_run_on_the_ranks(np_):
    job = subprocess.run([sys.executable, "-"], input=INTERACTIVE.replace("NP", str(np_)),
                         capture_output=True, text=True, timeout=TIMEOUT, check=False)
    lines = [line for line in job.stdout.splitlines() if line.startswith("interactive ")]
    assert job.returncode == 0 and len(lines) == 1, job.stdout[-3000:] + job.stderr[-3000:]
    total = 2.0 * sum(r + 1 for r in range(np_))
    assert json.loads(lines[0][len("interactive "):]) == {
        "function": [total] * np_, "lambda": ["ran"] * np_,
        "closure": [100 + r for r in range(np_)]}


def test_a_function_or_argument_that_does_not_pickle_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="cannot pickle the function or its arguments"):
        hvdlike.run(np.sum, args=(threading.Lock(),), num_proc=2)


def test_a_malformed_host_list_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="bad host list 'a:0,b': expected host"):
        hvdlike.run(np.sum, num_proc=2, hosts="a:0,b")


def test_a_job_hvdlikerun_would_refuse_is_refused_before_anything_starts():
    # Open MPI (the embedded default) refuses more ranks than the hosts' slots
    with pytest.raises(ValueError, match=r"hvdlike.run: hvdlikerun refuses this job: -np 3 asks "
                                         r"for more ranks than -H localhost:2 has slots .*"
                                         r"num_proc is its -np, hosts its -H"):
        hvdlike.run(np.sum, num_proc=3, hosts="localhost:2")
    with pytest.raises(ValueError, match="hvdlike.run: hvdlikerun refuses this job: hostfile "
                                         "'/no/such/hostfile' does not exist"):
        hvdlike.run(np.sum, num_proc=2, hostfile="/no/such/hostfile")


def test_network_interface_picks_the_address_the_ranks_are_told():
    """Names or subnets, the first that this machine has; None when it has none of them
    (then the route is used, as without the argument)."""
    assert run_func._interface_address("lo") == "127.0.0.1"
    assert run_func._interface_address("nosuchif0,127.0.0.0/8") == "127.0.0.1"
    assert run_func._interface_address("nosuchif0,203.0.113.0/24") is None
    with pytest.raises(ValueError, match="neither an interface name nor a subnet"):
        run_func._interface_address("10.0.0.0/33")


def _first_interface():
    """This machine's first interface other than loopback with an IPv4 address, and that
    address; None if it has none (Open MPI refuses loopback alone for its own connections)."""
    for _, name in socket.if_nameindex():
        address = run_func._interface_address(name)
        if address and not address.startswith("127."):
            return name, address
    return None


@pytest.mark.parametrize("named", [False, True])
def test_with_hosts_the_caller_listens_on_the_address_the_ranks_are_told_only(named):
    """The address of the route to the hosts (127.0.0.1 for localhost), or this machine's
    address on the network that network_interface names. The ranks (on this machine) try the
    caller's port at the address they were told and at 127.0.0.2, which only a socket bound
    to every interface takes."""
    found = _first_interface()
    if named and found is None:
        pytest.skip("this machine has no network interface but loopback to name")
    where = ["localhost:2", ""] + ([found[0]] if named else [])
    assert run_case("listens", 2, *where) == [{"told": True, "127.0.0.2": False}] * 2


def test_connections_that_send_nothing_or_half_a_message_hold_up_no_result(tmp_path):
    """Another local user's idle and half-sent connections to the caller's port, held open
    while the job runs and after it: each is closed at its deadline, the ranks' results
    come back."""
    pid_file = tmp_path / "stranger.pid"
    try:
        results = run_case("stranger", 2, str(pid_file))
    finally:
        if pid_file.exists():
            _kill_group(int(pid_file.read_text()))
    assert [r["sum"] for r in results] == [expected_sums(2)] * 2


def test_the_ranks_are_told_an_address_of_this_machine_they_can_reach(tmp_path):
    """127.0.0.1 when every host is this machine; else the source address of the route to
    the first other host (the test cluster checks that one end to end)."""
    assert reachable_address("localhost:2,127.0.0.1:1", None) == "127.0.0.1"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# this machine only\nlocalhost slots=2\n\n127.0.0.1 slots=2\n")
    assert reachable_address(None, str(hostfile)) == "127.0.0.1"
