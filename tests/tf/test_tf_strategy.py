"""hvdlike.tensorflow.MPIStrategy (the tf.distribute adapter) and TF_CONFIG emulation.

Each world runs tests/tf/workers/strategy_checks.py once; every check compares against a
single-process reference trained with the global batch (rtol 1e-5, float32) and/or checks
that all ranks hold identical values.  The native MultiWorkerMirroredStrategy job starts
TensorFlow's own collective runtime through hvdlike.tensorflow.export_tf_config().
"""
import re

import pytest

from mpi_harness import run_script, run_script_once

CHECKS = [
    "strategy_is_multiworker_with_global_replicas_and_cluster_resolver",
    "keras_fit_cnn_equals_single_process_global_batch_sgd",
    "keras_fit_cnn_equals_single_process_global_batch_adam",
    "evaluate_and_predict_cover_the_global_data_on_every_rank",
    "fit_history_logs_are_global_and_identical_on_every_rank",
    "custom_loop_run_and_reduce_matches_single_process_on_every_rank",
    "experimental_distribute_dataset_splits_each_global_batch_over_ranks",
    "distribute_datasets_from_function_gets_rank_input_context",
    "strategy_reduce_gather_and_replica_all_reduce_span_all_ranks",
    "chief_only_checkpointing_with_should_checkpoint",
    "tf_config_lists_every_rank_once_with_distinct_ports",
]

# world -> (ranks, under mpirun, extra environment)
WORLDS = {
    "np1_without_mpirun": (1, False, {}),
    "np2_keras3": (2, True, {}),
    # tf_keras, with every reduction through the on-node shared-memory transport
    "np2_tf_keras_shm": (2, True, {"TF_USE_LEGACY_KERAS": "1", "HVDLIKE_SHM_THRESHOLD": "0"}),
}
NATIVE_CHECKS = [
    "export_tf_config_starts_native_multiworker_strategy",
    "native_strategy_servers_listen_only_on_the_published_address",
    "native_strategy_tf_keras_fit_equals_single_process_global_batch",
    "native_strategy_keras3_fit_fails_with_perreplica_error",
]


def _job(world):
    if world == "native_np2":
        return run_script_once(2, "strategy_native.py", timeout=180)
    nranks, mpi, env = WORLDS[world]
    return run_script_once(nranks, "strategy_checks.py", timeout=240, mpi=mpi, env=env)


@pytest.mark.parametrize("world", list(WORLDS))
@pytest.mark.parametrize("check", CHECKS)
def test_strategy_check_passes_on_every_rank(world, check):
    res = _job(world)
    assert res.passed(check, WORLDS[world][0]), res.output[-6000:]


@pytest.mark.parametrize("world", list(WORLDS))
def test_strategy_job_exits_cleanly(world):
    res = _job(world)
    assert res.returncode == 0 and not res.timed_out, res.output[-6000:]


@pytest.mark.parametrize("check", NATIVE_CHECKS)
def test_native_multiworker_strategy_via_export_tf_config(check):
    res = _job("native_np2")
    assert res.passed(check, 2), res.output[-6000:]
    assert res.returncode == 0, res.output[-6000:]


NATIVE_PS_CHECKS = [
    "native_ps_roles_come_from_the_mpi_world",
    "native_ps_servers_listen_only_on_their_published_addresses",
    "native_ps_fit_with_a_dataset_function_trains_variables_on_the_ps",
    "native_ps_schedule_and_join_run_every_step_on_the_workers",
]


@pytest.mark.parametrize("roles", ["", "chief,worker,worker,ps"], ids=["num_ps=1", "ps_last"])
@pytest.mark.parametrize("check", NATIVE_PS_CHECKS)
def test_native_parameter_server_strategy_via_export_tf_config(check, roles):
    """np=4, ``num_ps=1`` (rank 1 the ps task) or explicit ``roles`` (rank 3): the chief
    (rank 0) runs the checks; the ps and worker ranks serve and end with it, so the job
    exits 0."""
    res = run_script_once(4, "native_ps.py", timeout=300,
                          env={"TF_USE_LEGACY_KERAS": "1", "NATIVE_PS_ROLES": roles})
    assert res.passed(check, 1), res.output[-6000:]
    assert res.returncode == 0 and "FINISHED" in res.output, res.output[-6000:]


@pytest.mark.parametrize("example", ["examples/strategy_keras_mnist.py",
                                     "examples/strategy_custom_loop.py"])
def test_strategy_example_runs_at_np2_and_reports_identical_weights(example):
    res = run_script(2, example, "--steps", "4", timeout=180)
    assert res.returncode == 0 and not res.timed_out, res.output[-5000:]
    m = re.search(r"^max weight difference between ranks: ([0-9.e+-]+)$", res.output, re.M)
    assert m, res.output[-5000:]
    assert float(m.group(1)) == 0.0, res.output[-5000:]
