"""Collectives on TF values: every check runs on every rank of one MPI job per world size."""
import pytest

from mpi_harness import run_script, run_script_once

CHECKS = [
    "allreduce_average_eager",
    "allreduce_ops_and_scaling",
    "allreduce_variable_and_int_dtypes",
    "allreduce_in_tf_function_static_shape",
    "allreduce_gradient_is_allreduce_of_gradient",
    "grouped_allreduce_eager_and_function_with_gradient",
    "small_tensors_cross_a_graph_packed_and_come_back_in_their_shapes",
    "packed_graph_allreduce_takes_zeros_from_joined_ranks",
    "large_eager_results_stay_intact_while_held",
    "allgather_uneven_first_dim_and_gradient",
    "broadcast_and_gradient_reduced_to_root",
    "alltoall_even_and_explicit_splits_with_gradient",
    "bad_alltoall_splits_raise_invalid_argument_on_every_rank",
    "reducescatter_static_shape_values_and_gradient",
    "indexed_slices_allgather_and_sparse_as_dense",
    "indexed_slices_follow_horovods_rules",
    "compression_fp16_and_bf16_roundtrip",
    "rank_size_ops_barrier_join",
    "string_tensor_is_rejected_with_clear_error",
    "shape_mismatch_across_ranks_raises_on_every_rank",
    "jit_compile_gives_clear_error",
    "broadcast_variables_object_and_allgather_object",
    "independent_collectives_in_v1_graph_run_in_any_order",
    "named_collectives_built_in_rank_dependent_order_in_tf_function",
    "hvdlike_runs_as_written_inside_autographed_functions",
    "horovod_gradient_cases_eager_function_and_v1_graph",
    "horovod_prescale_postscale_and_dtypes",
    "horovod_port_names",
    "horovod_mpi_ops_module",
]

WORLDS = {"np1_without_mpirun": (1, False), "np2": (2, True), "np4": (4, True)}


def _job(world):
    nranks, mpi = WORLDS[world]
    return run_script_once(nranks, "ops_checks.py", timeout=240, mpi=mpi)


@pytest.mark.parametrize("world", list(WORLDS))
@pytest.mark.parametrize("check", CHECKS)
def test_tf_collective_check_passes_on_every_rank(world, check):
    res = _job(world)
    assert res.passed(check, WORLDS[world][0]), res.output[-6000:]


@pytest.mark.parametrize("world", list(WORLDS))
def test_tf_collectives_job_exits_cleanly(world):
    res = _job(world)
    assert res.returncode == 0, res.output[-6000:]


DISPATCH_CHECKS = ["toplevel_allreduce_tensor", "toplevel_grouped_allreduce_variables",
                   "toplevel_broadcast_and_allgather_in_tf_function", "toplevel_numpy_stays_numpy",
                   "toplevel_lazy_tf_names"]


def test_toplevel_hvdlike_collectives_accept_tf_values_on_every_rank():
    res = run_script(2, "dispatch_checks.py", timeout=180)
    assert res.returncode == 0, res.output[-6000:]
    for check in DISPATCH_CHECKS:
        assert res.passed(check, 2), (check, res.output[-6000:])
