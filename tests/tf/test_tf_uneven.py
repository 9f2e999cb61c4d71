"""Uneven data (tests/tf/workers/uneven_checks.py): UnevenDataCallback and join() train every
rank to a single-process reference when ranks run different numbers of steps; without them
the DeadlockError names the step counts. np=2 and np=4."""
import pytest

from mpi_harness import run_script_once

CHECKS = [
    "fit_with_uneven_data_callback_one_row_more_on_rank_0",
    "fit_with_uneven_data_callback_many_steps_apart",
    "custom_loop_join_after_rank_dependent_steps",
    "without_the_callback_the_deadlock_error_names_the_step_counts",
]
# the deadlock check reports after HVDLIKE_DEADLOCK_SECONDS of waiting
ENV = {"HVDLIKE_DEADLOCK_SECONDS": "2"}


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("check", CHECKS)
def test_uneven_data_check_passes_on_every_rank(nranks, check):
    res = run_script_once(nranks, "uneven_checks.py", timeout=240, env=ENV)
    assert res.passed(check, nranks), res.output[-6000:]


@pytest.mark.parametrize("nranks", [2, 4])
def test_rank_0_names_the_step_counts_once_per_fit(nranks):
    res = run_script_once(nranks, "uneven_checks.py", timeout=240, env=ENV)
    warned = [line for line in res.output.splitlines()
              if "the ranks ran different numbers of steps (per rank:" in line]
    # two fits of two epochs each, uneven in both epochs: one warning per fit, from rank 0
    assert len(warned) == 2 and all(w.startswith("hvdlike[0]: WARNING") for w in warned), warned
    want = "[65, 64]" if nranks == 2 else "[33, 32, 32, 32]"
    assert want in warned[0], warned
