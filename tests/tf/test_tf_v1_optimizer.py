"""Horovod's TF1-style training (its README's loop): DistributedOptimizer of a
tf.compat.v1.train optimizer and BroadcastGlobalVariablesHook in a MonitoredTrainingSession,
on 2 and 4 ranks and as one process without mpirun, each rank checking its results against
one process on the global batch."""
import pytest

from mpi_harness import run_script_once

CHECKS = [
    "readme_style_adagrad_minimize_monitored_session_equals_one_process",
    "adam_compute_and_apply_gradients_equals_one_process",
    "without_the_hook_ranks_keep_their_own_starting_values",
    "eager_minimize_with_a_v1_optimizer_equals_one_process",
    "backward_passes_per_step_sums_locally_and_applies_every_kth_pass_like_one_process",
    "eager_backward_passes_per_step_applies_every_kth_pass",
    "adasum_combines_the_updates_every_kth_pass_like_horovod",
    "eager_adasum_with_a_v1_optimizer_combines_every_pass",
    "two_optimizers_with_backward_passes_in_one_graph_keep_their_own_state",
    "v1_bad_inputs_give_clear_errors",
]


@pytest.mark.parametrize("nranks", [1, 2, 4])
@pytest.mark.parametrize("check", CHECKS)
def test_v1_optimizer_check_passes_on_every_rank(check, nranks):
    res = run_script_once(nranks, "v1_checks.py", timeout=300, mpi=nranks > 1)
    assert res.passed(check, nranks), res.output[-6000:]
