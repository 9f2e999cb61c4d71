"""Bad input gets the same clear error on every rank, never a hang or a wrong result."""
import pytest

from mpi_harness import run_mpi

# case -> (exception type, words the message must contain)
EXPECTED = {
    "shape_mismatch": ("CollectiveMismatchError", ["hvdlike.allreduce: ranks called it with",
                                                   "shape", "rank 0 has (3,)", "rank 1 has (4,)"]),
    "dtype_mismatch": ("CollectiveMismatchError", ["dtype", "float32", "float64"]),
    "op_mismatch": ("CollectiveMismatchError", ["op", "Sum", "Max"]),
    "same_name_shape_mismatch": ("CollectiveMismatchError", ["hvdlike.allreduce 'grad': ranks",
                                                             "shape", "rank 0 has (3,)",
                                                             "matched by name"]),
    "root_mismatch": ("CollectiveMismatchError", ["root"]),
    "root_out_of_range": ("ValueError", ["root_rank", "is not a rank of"]),
    "root_out_of_range_one_rank": ("ValueError", ["root_rank -1"]),
    "unsupported_dtype_one_rank": ("TypeError", ["complex64", "not supported", "cast"]),
    "unsupported_dtype_allgather": ("TypeError", ["<U1", "not supported",
                                                  "hvdlike.allgather_object"]),
    "bool_average": ("TypeError", ["Average", "bool"]),
    "unknown_op": ("ValueError", ["unknown reduction op 17"]),
    "adasum_reducescatter": ("ValueError", ["Adasum is an all-reduce",
                                            "reducescatter does not support it"]),
    "adasum_integers": ("TypeError", ["Adasum combines floating-point gradients; got int32"]),
    "adasum_on_some_ranks": ("CollectiveMismatchError", ["op", "Adasum", "Sum"]),
    "alltoall_bad_splits": ("ValueError", ["splits", "summing to the first dimension", "got [1, 1"]),
    "alltoall_indivisible": ("ValueError", ["divisible", "splits="]),
    "allgather_trailing_shape": ("CollectiveMismatchError", ["shape after the first dimension"]),
    "grouped_length_mismatch": ("CollectiveMismatchError", ["shape"]),
    "packed_shape_mismatch": ("CollectiveMismatchError", [
        "shape: rank 0 has ((2, 3), (4,), (3,)), rank 1 has ((3, 2), (4,), (3,))"]),
    "packed_differently": ("CollectiveMismatchError", [
        "the same tensors, packed differently", "rank 0 has them in 1 array,",
        "rank 1 has them in 2 arrays", "same static shapes"]),
    "reducescatter_scalar": ("ValueError", ["scalar"]),
    "different_collectives": ("CollectiveMismatchError", ["kind", "allgather", "allreduce"]),
    "named_dtype_mismatch_async": ("CollectiveMismatchError", ["hvdlike.allreduce 'g': ranks",
                                                               "dtype", "int32", "int64"]),
    "broadcast_object_unpicklable_on_root": ("TypeError", ["broadcast_object",
                                                            "rank 0 cannot be pickled"]),
    "allgather_object_unpicklable_one_rank": ("TypeError", ["allgather_object",
                                                             "rank 1 cannot be pickled"]),
    "set_not_registered": ("ValueError", ["not registered", "add_process_set"]),
    "set_given_as_ranks": ("TypeError", ["process_set= takes a ProcessSet", "got list"]),
    "name_not_a_string": ("TypeError", ["name= takes a string", "got int 123"]),
    "factor_not_a_number": ("TypeError", ["prescale_factor and postscale_factor take numbers",
                                          "got 'a' and 1.0"]),
    "grouped_given_one_array": ("TypeError", ["grouped_allreduce() takes a list, got one ndarray",
                                              "hvdlike.allreduce(x)"]),
}


@pytest.fixture(scope="module", params=[2, 4], ids=["np2", "np4"])
def seen(request):
    return run_mpi(request.param, "error_cases:run", timeout=120)


@pytest.mark.parametrize("case", list(EXPECTED))
def test_bad_input_raises_the_same_clear_error_on_every_rank(seen, case):
    etype, words = EXPECTED[case]
    for rank, per_rank in enumerate(seen):
        got_type, message = per_rank[case]
        assert got_type == etype, f"rank {rank}: {got_type}: {message}"
        for word in words:
            assert word in message, f"rank {rank}: {word!r} not in {message!r}"
        assert per_rank[case + "/after"][0] == "ok", f"rank {rank}: job unusable after {case}"


@pytest.mark.parametrize("np_", [2, 3])
def test_alltoall_splits_whose_numpy_sum_wraps_around_raise_on_every_rank(np_):
    seen = run_mpi(np_, "error_cases:run", timeout=60, only="alltoall_splits_wrapping")
    for rank, per_rank in enumerate(seen):
        for case, words in (("uint64", ["first dimension 4", "got [18446744073709551615, 5"]),
                            ("int64", ["first dimension 6", "got [9223372036854775807, 92"])):
            got_type, message = per_rank[f"alltoall_splits_wrapping_{case}"]
            assert per_rank[f"alltoall_splits_wrapping_{case}/after"][0] == "ok", rank
            if case == "int64" and np_ == 2:  # only 3 ranks or more have such splits
                assert got_type == "no error", f"rank {rank}: {got_type}: {message}"
                continue
            assert got_type == "ValueError", f"rank {rank}: {got_type}: {message}"
            assert all(word in message for word in words), f"rank {rank}: {message}"


def test_non_member_rank_gets_a_local_error_and_members_proceed():
    results = run_mpi(2, "error_cases:not_a_member", timeout=60)
    assert results[0] == ("ok", "[1.0, 1.0]")
    assert results[1][0] == "ValueError"
    assert "rank 1 is not a member of ProcessSet(process_set_id=1, ranks=[0], mpi_comm=None)" in results[1][1]


def test_errors_on_a_process_set_name_the_ranks_by_their_world_rank():
    results = run_mpi(4, "error_cases:mismatch_on_a_set", timeout=60)
    assert results[0] == results[1] == {}
    for rank in (2, 3):
        got_type, message = results[rank]["shape"]
        assert got_type == "CollectiveMismatchError", message
        assert "rank 2 has (5,), rank 3 has (6,)" in message, message
        got_type, message = results[rank]["dtype"]
        assert got_type == "TypeError", message
        assert "rank 3: dtype complex64 is not supported" in message, message


def test_collective_before_init_says_to_call_init():
    for got_type, message in run_mpi(2, "error_cases:before_init", timeout=60):
        assert got_type == "NotInitializedError"
        assert "call hvdlike.init()" in message
