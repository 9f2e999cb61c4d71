"""The one way tests start MPI jobs: a real ``hvdlikerun -np N`` with a hard timeout.

``run_mpi(np, "module:function", **kwargs)`` runs ``function(**kwargs)`` on every rank after
``hvdlike.init()`` (modules are looked up in tests/mpi_cases/) and returns the list of each
rank's pickled return value, indexed by rank. ``run_script(np, script, *args)`` runs a whole
script (an example, or a worker under tests/tf/workers that prints ``CHECK <name> rank=<r> OK``
lines) and returns the completed Job. ``launch`` runs any command under hvdlikerun.
"""
import dataclasses
import os
import re
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
WORKER = TESTS / "mpi_worker.py"
SCRIPT_DIRS = (REPO, TESTS / "mpi_cases", TESTS / "tf" / "workers")
DEFAULT_TIMEOUT = 120.0
# an elastic recovery that MPI does not finish ends (saying where) before the jobs' timeouts
TEST_ENV = dict(TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0", CUDA_VISIBLE_DEVICES="",
                PYTHONUNBUFFERED="1", HVDLIKE_ELASTIC_RECOVERY_TIMEOUT="45")


@dataclasses.dataclass
class Job:
    returncode: int
    output: str
    seconds: float
    timed_out: bool

    def passed(self, check: str, nranks: int) -> bool:
        """True when every rank 0..nranks-1 printed ``CHECK <check> rank=<r> OK``."""
        return all(re.search(rf"^CHECK {re.escape(check)} rank={r} OK$", self.output, re.M)
                   for r in range(nranks))

    def lines(self, prefix: str) -> List[str]:
        return [line for line in self.output.splitlines() if line.startswith(prefix)]


def launch(np: int, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT,
           env: Optional[Mapping[str, str]] = None, mpi: bool = True,
           launcher: Optional[Callable[[List[str]], List[str]]] = None) -> Job:
    """Run ``hvdlikerun -np N argv...`` (or argv alone, as one process, when ``mpi`` is False;
    or ``launcher(argv)``, e.g. mpirun on the test cluster); kill the whole job if it runs past
    ``timeout``."""
    full_env = dict(os.environ, **TEST_ENV)
    full_env.update(env or {})
    if launcher is not None:
        cmd = launcher(list(argv))
    else:
        cmd = [sys.executable, "-m", "hvdlike.runner", "-np", str(np), *argv] if mpi else list(argv)
    state = _state_dir(argv)
    kept = set(state.iterdir()) if state is not None and state.is_dir() else None
    job = _run(cmd, full_env, timeout)
    if startup_failed(job.output, job.seconds):
        if state is not None:  # a later launch (a restart) may be what failed to start,
            _restore(state, kept)  # after the first committed state: start from nothing again
        job = _run(cmd, full_env, timeout)
    return job


def _state_dir(argv: Sequence[str]) -> Optional[Path]:
    """hvdlikerun's ``--state-dir`` in ``argv``, if any."""
    argv = [str(a) for a in argv]
    return Path(argv[argv.index("--state-dir") + 1]) if "--state-dir" in argv else None


def _restore(directory: Path, kept: Optional[set]) -> None:
    """Remove what a job wrote into ``directory``: all of it when it did not exist before
    (``kept`` None), else every entry not in ``kept``."""
    import shutil
    if kept is None:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for entry in set(directory.iterdir()) - kept:
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def startup_failed(output: str, seconds: float) -> bool:
    """Open MPI's launcher now and then cannot start its PMIx server, or (on the test
    cluster, once in CI) its daemon on the second host: nothing ran yet (or, under
    ``hvdlikerun --restarts``, a restart did not start), which says nothing about the job, and
    the caller starts it once more. The cause found: a launcher or daemon that a test killed
    left its session directory, and a later one got its process id (hvdlike/session_dirs.py;
    hvdlikerun, hvd.init() on each node and the test cluster's teardown now remove such
    directories; a plain mpirun of a program that does not call hvd.init() does not)."""
    if "The PMIx server's listener thread failed to start" in output and seconds < 5:
        what = "Open MPI's PMIx server did not start"
    elif "A daemon failed to report back after being spawned" in output and \
            _only_launcher_messages(output):
        what = "Open MPI's daemon on another host did not start"
    else:
        return False
    print(f"[harness] {what}: starting the job again", file=sys.stderr)
    return True


def _only_launcher_messages(output: str) -> bool:
    """Whether every line of ``output`` lies in one of Open MPI's boxed messages (between
    lines of dashes): then no rank has printed anything."""
    inside = False
    for line in output.splitlines():
        if re.fullmatch(r"-{20,}", line.strip()):
            inside = not inside
        elif line.strip() and not inside:
            return False
    return True


def _run(cmd: List[str], full_env: Dict[str, str], timeout: float) -> Job:
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, cwd=TESTS.parent, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    job = Job(proc.returncode, out, time.monotonic() - start, timed_out)
    _log_job(cmd, job)
    return job


def _log_job(cmd: List[str], job: Job) -> None:
    """With HVDLIKE_TEST_JOB_LOG set, append one JSON line per job: the test that started
    it, its command, its seconds (scripts/suite_times.py sums them per test file)."""
    path = os.environ.get("HVDLIKE_TEST_JOB_LOG")
    if path:
        import json
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, "cmd": [str(c) for c in cmd][-4:],
                                "seconds": round(job.seconds, 3),
                                "returncode": job.returncode}) + "\n")


def mpich_prefix() -> str:
    """The MPICH virtual environment (HVDLIKE_TEST_MPICH_PREFIX, made by
    scripts/setup_test_extras.sh); skips the calling test, saying why, when there is none."""
    import pytest
    prefix = os.environ.get("HVDLIKE_TEST_MPICH_PREFIX")
    if not prefix or not Path(prefix, "bin", "mpiexec").exists():
        pytest.skip("set HVDLIKE_TEST_MPICH_PREFIX to a venv with `pip install mpich mpi4py "
                    "numpy ml_dtypes` (scripts/setup_test_extras.sh makes .venv-mpich)")
    return prefix


def run_mpi(np: int, target: str, timeout: float = DEFAULT_TIMEOUT,
            env: Optional[Mapping[str, str]] = None, mpi_prefix: Optional[str] = None,
            launcher: Optional[Callable[[List[str]], List[str]]] = None,
            **kwargs: Any) -> List[Any]:
    """Run ``target`` ("module:function" in tests/mpi_cases) on ``np`` ranks; return each
    rank's result. Fails the test with the job's output on error or timeout. ``mpi_prefix``:
    run with another virtual environment's MPI and Python (e.g. ``mpich_prefix()``), with this
    checkout's hvdlike. ``launcher``: turns the rank command into the job's (see ``launch``)."""
    with tempfile.TemporaryDirectory(prefix="hvdlike-test-") as tmp:
        args_file = Path(tmp) / "kwargs.pkl"
        args_file.write_bytes(pickle.dumps(kwargs))
        argv = [sys.executable, str(WORKER), target, tmp]
        if mpi_prefix is not None:
            argv = ["--mpirun", f"{mpi_prefix}/bin/mpiexec", f"{mpi_prefix}/bin/python", *argv[1:]]
            env = dict(env or {}, PYTHONPATH=str(REPO))
        job = launch(np, argv, timeout, env, launcher=launcher)
        if job.timed_out:
            raise AssertionError(f"MPI job {target} (np={np}) timed out after {timeout:.0f} s:\n"
                                 f"{job.output[-6000:]}")
        if job.returncode != 0:
            raise AssertionError(f"MPI job {target} (np={np}) exited with {job.returncode}:\n"
                                 f"{job.output[-6000:]}")
        results = []
        for r in range(np):
            path = Path(tmp) / f"rank{r}.pkl"
            if not path.exists():
                raise AssertionError(f"rank {r} of {target} wrote no result:\n{job.output[-6000:]}")
            results.append(pickle.loads(path.read_bytes()))
        return results


def run_script(np: int, script: str, *args: Any, timeout: float = DEFAULT_TIMEOUT,
               env: Optional[Mapping[str, str]] = None, mpi: bool = True,
               launcher: Optional[Callable[[List[str]], List[str]]] = None) -> Job:
    """Run ``python script args...`` on ``np`` ranks (or as one plain process when ``mpi`` is
    False; ``launcher`` as in ``launch``). ``script`` is a path relative to the repository,
    tests/mpi_cases or tests/tf/workers."""
    path = next((d / script for d in SCRIPT_DIRS if (d / script).is_file()), None)
    if path is None:
        raise FileNotFoundError(f"no script {script} in {[str(d) for d in SCRIPT_DIRS]}")
    job = launch(np, [sys.executable, str(path), *map(str, args)], timeout, env, mpi,
                 launcher=launcher)
    if job.timed_out:
        job.output += f"\n[harness] TIMEOUT after {timeout:.0f} s: {script}"
    return job


_finished: Dict[tuple, Job] = {}


def run_script_once(np: int, script: str, *args: Any, timeout: float = DEFAULT_TIMEOUT,
                    env: Optional[Mapping[str, str]] = None, mpi: bool = True) -> Job:
    """``run_script``, run at most once per distinct call in a test session: one job prints
    many ``CHECK`` lines and a test per check reads them."""
    key = (np, script, tuple(map(str, args)), tuple(sorted((env or {}).items())), mpi)
    if key not in _finished:
        _finished[key] = run_script(np, script, *args, timeout=timeout, env=env, mpi=mpi)
    return _finished[key]


def env_for(**values: Any) -> Dict[str, str]:
    return {k: str(v) for k, v in values.items()}
