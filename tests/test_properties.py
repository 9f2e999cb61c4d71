"""Hypothesis property tests over random shapes (zero-size and scalars included) and dtypes,
run in real MPI jobs. A small fusion threshold makes grouped_allreduce use many buckets."""
import pytest

from mpi_harness import env_for, run_mpi


@pytest.mark.parametrize("np_", [2, 4])
def test_random_shapes_and_dtypes_match_numpy_on_every_rank(np_):
    results = run_mpi(np_, "property_cases:run", timeout=300,
                      env=env_for(HVDLIKE_FUSION_THRESHOLD=64))
    for rank, counts in enumerate(results):
        for prop in ("allreduce", "allgather", "grouped_allreduce"):
            assert counts.get(prop, 0) >= 40, f"rank {rank} checked {prop} {counts.get(prop)} times"
