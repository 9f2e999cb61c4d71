"""Hypothesis property tests over random shapes (zero-size and scalars included) and dtypes,
run in real MPI jobs. A small fusion threshold makes grouped_allreduce use many buckets; the
transport is MPI, or the shared-memory one with a 64-byte buffer (most inputs take rounds)."""
import pytest

from mpi_harness import env_for, run_mpi


TRANSPORTS = {"mpi": env_for(HVDLIKE_SHM_BUFFER=0),
              "shm": env_for(HVDLIKE_SHM_THRESHOLD=0, HVDLIKE_SHM_BUFFER=64)}


@pytest.mark.parametrize("transport", list(TRANSPORTS))
@pytest.mark.parametrize("np_", [2, 4])
def test_random_shapes_and_dtypes_match_numpy_on_every_rank(np_, transport):
    results = run_mpi(np_, "property_cases:run", timeout=300,
                      env=dict(TRANSPORTS[transport], HVDLIKE_FUSION_THRESHOLD="64"))
    for rank, counts in enumerate(results):
        for prop in ("allreduce", "allgather", "grouped_allreduce", "allreduce_nan_inf"):
            assert counts.get(prop, 0) >= 40, f"rank {rank} checked {prop} {counts.get(prop)} times"
        # only the examples with at least one dimension
        assert counts.get("reducescatter_nan_inf", 0) >= 20, f"rank {rank}: {counts}"
