"""The asynchronous wait kernel of tf.compat.v1 graphs (hvdlike/tensorflow/wait_kernel.cc):
sessions with one inter-op thread run more independent collectives than threads, started in
another order on each rank, with the right results on every rank; errors keep their
TensorFlow classes; a run's timeout ends a wait; without a compiler the numpy_function wait ops
remain."""
import os
import shutil
import subprocess
import sys

import pytest

from mpi_harness import run_script, run_script_once

COMPILER = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
pytestmark = pytest.mark.skipif(
    COMPILER is None, reason="no C++ compiler (c++, g++ or $CXX): the wait kernel cannot be "
    "built here, and v1 graphs keep the numpy_function wait ops")

CHECKS = [
    "named_collectives_built_in_rank_dependent_order_on_one_thread",
    "two_distributed_optimizers_with_backward_passes_in_one_run_on_one_thread",
    "disagreements_and_bad_input_keep_their_tensorflow_error_classes",
    "a_run_timeout_ends_a_wait_that_other_ranks_have_not_joined",
]
WORLDS = {"np1_without_mpirun": (1, False), "np2": (2, True), "np4": (4, True)}
# a stall (the failure these checks look for) ends the job instead of waiting for the timeout
STALL_ENV = {"HVDLIKE_STALL_CHECK_TIME_SECONDS": "10", "HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS": "20"}


def test_the_kernel_builds_and_loads_where_there_is_a_compiler():
    code = ("import tensorflow as tf; from hvdlike.tensorflow import wait_kernel; "
            "path = wait_kernel.build(); tf.load_op_library(path); print(path)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert os.path.basename(done.stdout.split()[-1]).startswith("wait_kernel-tf")


@pytest.mark.parametrize("world", list(WORLDS))
@pytest.mark.parametrize("check", CHECKS)
def test_v1_wait_check_passes_on_every_rank(world, check):
    nranks, mpi = WORLDS[world]
    res = run_script_once(nranks, "v1_wait_checks.py", timeout=240, mpi=mpi, env=STALL_ENV)
    assert res.passed(check, nranks), res.output[-6000:]


def test_without_a_compiler_rank_0_says_why_once_and_the_wait_ops_stay_numpy_functions(
        tmp_path):
    env = {"CXX": "/nonexistent/c++", "XDG_CACHE_HOME": str(tmp_path), **STALL_ENV}
    res = run_script(2, "v1_wait_fallback.py", timeout=180, env=env)
    assert res.passed("v1_graph_without_the_wait_kernel", 2), res.output[-6000:]
    said = [line for line in res.output.splitlines()
            if "cannot use its TensorFlow wait kernel" in line]
    assert len(said) == 1 and said[0].startswith("hvdlike[0]"), said
    assert "no compiler '/nonexistent/c++'" in said[0], said
