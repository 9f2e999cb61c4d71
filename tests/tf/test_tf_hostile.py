"""Hostile input to the TensorFlow API (tests/tf/workers/hostile_checks.py): random
collectives, dtypes, shapes, ops, roots, splits, NaN and inf, eager and in tf.function, at
np=2 and np=4; every call gives NumPy's answer or the documented error on every rank."""
import pytest

from mpi_harness import run_script_once

CHECKS = ["hostile_tensorflow_calls_give_numpy_or_the_documented_error_on_every_rank",
          "unpicklable_object_and_bad_process_sets_raise_on_every_rank",
          "wrong_kinds_of_arguments_say_what_is_expected_on_every_rank",
          "callback_arguments_that_cannot_work_are_refused_on_every_rank",
          "keras3_compile_takes_horovods_flag_only_with_a_distributed_optimizer"]


@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.parametrize("check", CHECKS)
def test_hostile_input_gives_numpy_or_the_documented_error(np_, check):
    job = run_script_once(np_, "hostile_checks.py", timeout=400)
    assert not job.timed_out, job.output[-5000:]
    assert job.passed(check, np_), job.output[-5000:]
