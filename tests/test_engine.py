"""The engine matches requests by name in any submission order, returns async handles before
the peers arrive, and keeps results right under threads, repeats and changed metadata."""
import numpy as np
import pytest

from engine_cases import _value
from mpi_harness import run_mpi

NAMES = ["w0", "w1", "bias", "emb", "head"]


@pytest.mark.parametrize("np_", [2, 4])
def test_requests_submitted_in_different_orders_pair_by_name(np_):
    results = run_mpi(np_, "engine_cases:any_order", timeout=60, names=NAMES)
    assert len({tuple(r["order"]) for r in results}) > 1, "the ranks' orders should differ"
    for rank, r in enumerate(results):
        for name in NAMES:
            want = sum(_value(name, q) for q in range(np_)).tolist()
            assert r["sums"][name] == want, f"rank {rank} {name}"
        assert r["gathered"] == [q for q in range(np_) for _ in range(q + 1)]


def test_async_call_returns_before_the_late_rank_arrives():
    results = run_mpi(2, "engine_cases:async_returns_before_peers", timeout=60, delay=0.5)
    assert results[0]["done_at_once"] is False
    for r in results:
        assert r["result"] == [3.0, 3.0, 3.0]


def test_blocking_and_async_forms_of_one_name_pair_up():
    for r in run_mpi(2, "engine_cases:blocking_pairs_with_async", timeout=60):
        assert r == [3.0, 3.0]


@pytest.mark.parametrize("np_", [2, 4])
def test_a_name_submitted_several_times_pairs_instance_by_instance(np_):
    base = sum(range(np_))
    for r in run_mpi(np_, "engine_cases:repeated_name", timeout=60, times=4):
        assert r == [i * 100 * np_ + base for i in range(4)]


def test_threads_submitting_in_rank_dependent_order_get_right_results():
    results = run_mpi(2, "engine_cases:threads", timeout=60, names=NAMES)
    for r in results:
        for name in NAMES:
            assert r[name] == [(_value(name, 0) + _value(name, 1)).tolist()] * 3


def test_a_cached_name_with_new_metadata_is_negotiated_again():
    for r in run_mpi(2, "engine_cases:metadata_changes", timeout=60):
        assert r == [[3.0] * 3, [3.0] * 3, [3.0] * 5, [3.0] * 3]


@pytest.mark.parametrize("env", [{"HVDLIKE_SHM_THRESHOLD": "0"},
                                 {"HVDLIKE_SHM_THRESHOLD": "0", "HVDLIKE_SHM_BUFFER": "256"},
                                 {"HVDLIKE_SHM_THRESHOLD": "0", "HVDLIKE_CMA_THRESHOLD": "0"},
                                 {"HVDLIKE_SHM_BUFFER": "0"}],
                         ids=["shm", "shm-rounds", "cma", "mpi"])
@pytest.mark.parametrize("np_", [2, 4])
def test_grouped_allreduce_straight_from_tensor_memory_matches_numpy(np_, env):
    # small ones are packed, large not; single copy (cma) puts the small results first in one
    # result array, so their order there differs from the request's
    sizes = [1, 7, 20000, 64, 3, 1000, 30000, 5, 129]
    for r in run_mpi(np_, "engine_cases:grouped_shared_memory_from_many_tensors", timeout=60,
                     env=env, sizes=sizes):
        total = sum(range(1, np_ + 1))
        want = [(np.arange(n, dtype=np.float32) * total).tolist() for n in sizes]
        assert r["sum"] == want
        assert r["avg"] == [(np.arange(n, dtype=np.float32) * total / np_).astype(np.float32)
                            .tolist() for n in sizes]
        assert r["inputs_intact"]


def test_unnamed_calls_cycle_through_cached_names_and_stay_right():
    for r in run_mpi(2, "engine_cases:unnamed_loop", timeout=60, calls=700):
        assert r["wrong"] == []
        assert r["cached"] == r["names"]


def test_a_rank_that_joined_numbers_its_unnamed_calls_after_the_ones_it_served():
    # rank 0 runs more unnamed calls than the engine has names for while rank 1 has joined
    for r in run_mpi(2, "engine_cases:join_after_many_unnamed", timeout=60, steps=600):
        assert r["after"] == [[1.0, 1.0], [3.0, 3.0], [5.0, 5.0]]


@pytest.mark.parametrize("np_", [2, 4])
def test_blocking_calls_run_in_rounds_of_their_own_and_stay_right_around_them(np_):
    steps = 50
    results = run_mpi(np_, "engine_cases:blocking_calls_in_rounds_of_their_own", timeout=90,
                      steps=steps)
    total = sum(range(1, np_ + 1))
    for rank, r in enumerate(results):
        assert r["sums"] == [float(i * np_ * np_ + sum(range(np_))) for i in range(steps)]
        # most of a loop of blocking calls takes the latency path (a peer's engine tick may
        # take the odd round); none would if the path were gone
        assert r["direct"] >= steps // 2, f"rank {rank}: {r['direct']} of {steps}"
        assert r["late"] == [float(total)] * 2
        assert r["mixed"] == [float(total)] * 2
        assert r["fresh"] == [float(np_)] * 2
        evens = [q for q in range(np_) if q % 2 == 0]
        assert r["in_set"] == ([[float(sum(q + 1 for q in evens))] * 2] * 3
                               if rank % 2 == 0 else None)
        for other in r["others"]:
            assert other == dict(bcast=[float(np_ - 1)] * 2, gather=[float(q) for q in range(np_)],
                                 unnamed=[sum(range(np_)) / np_] * 2, obj={"r": 0})


@pytest.mark.parametrize("np_", [2, 4])
def test_a_step_whose_work_ran_on_every_rank_needs_no_follow_up_round(np_):
    # one async all-reduce a step, 2 ms of "compute" on each side of its wait: a round that
    # ran every rank's work is not followed by a tick one cycle later (the ranks start the
    # next round when they submit). Such a tick would be a round in which no rank had
    # anything, one cycle after the last; a rank only ticks idle rounds ten cycles apart.
    # (How many rounds a step takes depends on how late the ranks' submissions are, which
    # on a loaded machine can exceed the idle tick: not asserted.)
    steps = 40
    for rank, r in enumerate(run_mpi(np_, "engine_cases:async_steps", timeout=90, steps=steps,
                                     pause=0.002)):
        assert r["sums"] == [[float(i * np_ * np_ + sum(range(np_)))] * 4 for i in range(steps)]
        assert r["rounds"] >= steps
        assert r["idle_gap"] >= 5 * r["cycle"], \
            f"rank {rank}: a round with nothing in it {r['idle_gap']:.4f} s after the last"


def test_a_rank_in_no_busy_set_keeps_the_busy_set_company_and_results_stay_right():
    # ranks 0 and 1 loop on a set of their own; rank 2 has nothing to do. Every round needs
    # rank 2 too, so it ticks every cycle while the set is busy (not ten cycles apart), and
    # after a round of the set's work it starts the next round at once, so that the set's
    # next call finds it there (docs/collectives.md: process sets)
    steps = 150
    results = run_mpi(3, "engine_cases:set_with_an_idle_rank", timeout=90, steps=steps,
                      pause=0.003)
    for rank in (0, 1):
        assert results[rank]["sums"] == [[20.0 * i + 1] * 2 for i in range(steps)]
    samples = results[2]["samples"]
    company = sum(c for c, _ in samples)
    assert company >= 0.9 * len(samples), samples
    assert any(helper for _, helper in samples), samples
    # one round a call: the set's rounds do not wait for, or add, ticks of rank 2's
    assert results[0]["rounds"] < 1.25 * steps, results[0]["rounds"]


@pytest.mark.parametrize("np_,env,faults", [
    (2, {}, False),
    (3, {"HVDLIKE_SHM_THRESHOLD": "1024", "HVDLIKE_CYCLE_TIME": "0.1"}, False),
    (4, {"HVDLIKE_SHM_THRESHOLD": "0", "HVDLIKE_SHM_BUFFER": "64",
         "HVDLIKE_FUSION_THRESHOLD": "64"}, False),
    (3, {"HVDLIKE_SHM_THRESHOLD": "1024"}, True),
], ids=["np2", "np3-shm", "np4-shm-rounds", "np3-bad-dtypes"])
def test_random_mixes_in_rank_dependent_orders_from_threads_match_numpy(np_, env, faults):
    """Every kind of collective, async on the world and on overlapping process sets, each
    rank submitting the same mix in its own order from three threads, blocking calls in
    between (engine_mix_cases). With faults, one op in ten has a member passing another
    dtype: that op raises the same mismatch error, naming the rank, on every member, and
    the rest of the mix still matches NumPy."""
    for rank, r in enumerate(run_mpi(np_, "engine_mix_cases:run_seeds", timeout=120, env=env,
                                     first=0, count=12, faults=faults)):
        assert r["errors"] == [], f"rank {rank}: " + "\n".join(r["errors"][:5])
        assert r["checked"] == r["expected"] >= 12 * 25, f"rank {rank}: {r}"


@pytest.mark.parametrize("np_,env", [
    (2, {}),
    (3, {"HVDLIKE_SHM_THRESHOLD": "0", "HVDLIKE_SHM_BUFFER": "4096",
         "HVDLIKE_FUSION_THRESHOLD": "64"}),
], ids=["np2", "np3-shm-rounds"])
def test_ranks_with_uneven_steps_join_and_async_calls_in_any_order_stay_right(np_, env):
    """Each rank runs its own number of steps of async all-reduces (named, in a
    rank-dependent order), then joins; joined ranks count as zeros, and join returns the
    same rank everywhere, one that ran the most steps (engine_mix_cases.uneven_steps)."""
    results = run_mpi(np_, "engine_mix_cases:uneven_steps_seeds", timeout=120, env=env,
                      first=0, count=15)
    for rank, r in enumerate(results):
        assert r["errors"] == [], f"rank {rank}: " + "\n".join(r["errors"][:5])
        assert r["lasts"] == results[0]["lasts"]


def test_a_cache_capacity_of_zero_turns_the_response_cache_off():
    """HVDLIKE_CACHE_CAPACITY=0 (Horovod's way to turn the cache off): nothing is cached,
    every request is negotiated in full, and results stay right."""
    results = run_mpi(2, "engine_cases:without_response_cache", timeout=120, steps=20,
                      env={"HVDLIKE_CACHE_CAPACITY": "0"})
    for rank, r in enumerate(results):
        assert r["sums"] == [float(i * 4 + 1) for i in range(20)], f"rank {rank}"
        assert r["mix_errors"] == [], f"rank {rank}: " + "\n".join(r["mix_errors"][:5])
        assert (r["cached"], r["direct"]) == (0, 0), f"rank {rank}: {r}"
