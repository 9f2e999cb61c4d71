"""The one way tests start MPI jobs: a real ``hvdlikerun -np N`` with a hard timeout.

``run_mpi(np, "module:function", **kwargs)`` runs ``function(**kwargs)`` on every rank after
``hvdlike.init()`` (modules are looked up in tests/mpi_cases/) and returns the list of each
rank's pickled return value, indexed by rank. ``launch`` runs any command and returns the
completed job, for tests that expect a failure.
"""
import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "mpi_worker.py"
DEFAULT_TIMEOUT = 120.0


@dataclasses.dataclass
class Job:
    returncode: int
    output: str
    seconds: float
    timed_out: bool


def launch(np: int, argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT,
           env: Optional[Mapping[str, str]] = None) -> Job:
    """Run ``hvdlikerun -np N argv...``; kill the whole job if it runs past ``timeout``."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "hvdlike.runner", "-np", str(np), *argv]
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
    return Job(proc.returncode, out, time.monotonic() - start, timed_out)


def run_mpi(np: int, target: str, timeout: float = DEFAULT_TIMEOUT,
            env: Optional[Mapping[str, str]] = None, **kwargs: Any) -> List[Any]:
    """Run ``target`` ("module:function" in tests/mpi_cases) on ``np`` ranks; return each
    rank's result. Fails the test with the job's output on error or timeout."""
    with tempfile.TemporaryDirectory(prefix="hvdlike-test-") as tmp:
        args_file = Path(tmp) / "kwargs.pkl"
        args_file.write_bytes(pickle.dumps(kwargs))
        job = launch(np, [sys.executable, str(WORKER), target, tmp], timeout, env)
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


def env_for(**values: Any) -> Dict[str, str]:
    return {k: str(v) for k, v in values.items()}
