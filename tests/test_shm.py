"""The on-node all-reduce in real MPI jobs, through the shared-memory window
(hvdlike/transport/shm.py) and single-copy through cross-memory attach (transport/cma.py):
results equal NumPy on every rank while the window grows and large inputs go in rounds, every
rank gets the same bits, only sets within one node use it, a full /dev/shm falls back to MPI,
a rank that may not attach makes every rank take the window, and a failed copy is an error on
every rank. (The full collective matrix also runs over both: the *-shm and *-cma configs in
test_collectives.)"""
import errno
import platform

import numpy as np
import pytest

import reference
from hvdlike.transport import cma
from mpi_harness import mpich_prefix, run_mpi
from shm_cases import SECCOMP_SYSCALLS, inputs

MIB = 1 << 20


WINDOW = {"HVDLIKE_CMA": "0"}


@pytest.mark.parametrize("np_,transport", [(2, "window"), (4, "window"), (2, "cma"), (4, "cma")])
def test_large_inputs_match_numpy_through_the_window_in_rounds_and_single_copy(np_, transport):
    # window: below the threshold, the first window (4 MiB), grown to its 6 MiB cap, 3 rounds
    # (6 + 6 MiB and 8 bytes); cma: below the threshold, through the window (its first
    # size: 4 MiB), single-copy (the window would grow)
    sizes = [4096, 3 * MIB, 12 * MIB + 8] if transport == "window" else [4096, MIB, 6 * MIB + 8]
    dtypes = ["float32", "int64", "bool"]
    env = {"HVDLIKE_SHM_THRESHOLD": "65536", "HVDLIKE_SHM_BUFFER": str(6 * MIB),
           **(WINDOW if transport == "window" else {"HVDLIKE_CMA_THRESHOLD": str(4 * MIB)})}
    results = run_mpi(np_, "shm_cases:sizes_and_ops", timeout=240, env=env, sizes=sizes,
                      dtypes=dtypes)
    for nbytes in sizes:
        for dtype in dtypes:
            xs = [inputs(nbytes, dtype, r) for r in range(np_)]
            for op in (["Sum", "Min"] if dtype == "bool" else
                       ["Sum", "Average", "Min", "Max", "Product"]):
                want = reference.reduce(xs, op)
                for rank, got in enumerate(results):
                    np.testing.assert_array_equal(got[f"{nbytes}-{dtype}-{op}"], want,
                                                  err_msg=f"{nbytes} {dtype} {op} rank {rank}")
            grouped_want = [reference.reduce(xs, "Max"),
                            reference.reduce([x[: x.size // 3] for x in xs], "Max")]
            for rank, got in enumerate(results):
                for g, w in zip(got[f"{nbytes}-{dtype}-grouped"], grouped_want):
                    np.testing.assert_array_equal(g, w, err_msg=f"grouped {nbytes} {dtype}")
    capacity = 6 * MIB if transport == "window" else 4 * MIB  # cma: 6 MiB did not grow it
    assert [(r["cma"], r["capacity"]) for r in results] == [(transport == "cma", capacity)] * np_


@pytest.mark.parametrize("env", [{"HVDLIKE_CMA_THRESHOLD": "0"}, WINDOW], ids=["cma", "window"])
def test_every_rank_gets_bitwise_the_same_float_sum(env):
    results = run_mpi(4, "shm_cases:identical_bits", timeout=120, nbytes=3 * MIB + 4, env=env)
    assert all(r["close"] for r in results)
    assert len({r["digest"] for r in results}) == 1


@pytest.mark.parametrize("hierarchical", ["auto", "0"])
def test_sets_within_one_node_use_shared_memory_and_the_world_on_several_is_hierarchical(
        hierarchical):
    env = {"HVDLIKE_NODE_NAMES": "a,a,b,b", "HVDLIKE_HIERARCHICAL_ALLREDUCE": hierarchical}
    results = run_mpi(4, "shm_cases:who_uses_shared_memory", timeout=120, env=env)
    on = hierarchical == "auto"
    for rank, r in enumerate(results):
        assert r["global"] == dict(shm=on, hierarchical=on, cma=on, sum=10.0)
        if rank in (0, 1):  # one node: the window and single copy
            assert r["01"] == dict(shm=True, hierarchical=False, cma=True, sum=3.0)
        if rank in (1, 2):  # spans nodes a and b, and is not the world: MPI
            assert r["12"] == dict(shm=False, hierarchical=False, cma=False, sum=5.0)
        if rank == 3:  # nothing to share
            assert r["3"] == dict(shm=False, hierarchical=False, cma=False, sum=4.0)


def test_nodes_of_different_sizes_all_reduce_flat():
    results = run_mpi(4, "shm_cases:who_uses_shared_memory", timeout=120,
                      env={"HVDLIKE_NODE_NAMES": "a,a,a,b"})
    for r in results:
        assert r["global"] == dict(shm=False, hierarchical=False, cma=False, sum=10.0)


def test_under_mpich_one_node_uses_single_copy_too():
    results = run_mpi(4, "shm_cases:who_uses_shared_memory", timeout=120,
                      mpi_prefix=mpich_prefix())
    for r in results:
        assert r["global"] == dict(shm=True, hierarchical=False, cma=True, sum=10.0)


@pytest.mark.parametrize("env", [{"HVDLIKE_CMA_THRESHOLD": "0"}, WINDOW], ids=["cma", "window"])
def test_hierarchical_float_sum_is_bitwise_the_same_on_every_rank(env):
    results = run_mpi(4, "shm_cases:identical_bits", timeout=120, nbytes=3 * MIB + 4,
                      env={"HVDLIKE_NODE_NAMES": "a,a,b,b", "HVDLIKE_HIERARCHICAL_ALLREDUCE": "1",
                           **env})
    assert all(r["close"] for r in results)
    assert len({r["digest"] for r in results}) == 1


def test_auto_tries_both_algorithms_per_size_then_every_rank_keeps_the_same():
    sizes = [MIB, 3 * MIB]
    results = run_mpi(4, "shm_cases:auto_choice", timeout=120, sizes=sizes, after=2,
                      env={"HVDLIKE_NODE_NAMES": "a,a,b,b"})
    classes = sorted(n.bit_length() for n in sizes)
    for rank, r in enumerate(results):
        at = 0
        for nbytes in sizes:  # right during the trials and after the choice
            for i in range(r["calls"]):
                want = sum(inputs(nbytes, "float32", q + i) for q in range(4))
                np.testing.assert_array_equal(r["sums"][at], want, err_msg=f"rank {rank}")
                at += 1
        assert sorted(r["tried"]) == classes
        assert all(tried == (r["trials"], r["trials"]) for tried in r["tried"].values()), r
        assert r["trials"] >= 3
        assert sorted(r["picked"]) == classes
        assert r["picked"] == results[0]["picked"]  # one choice, the same everywhere


@pytest.mark.parametrize("nranks", [2, 4])
def test_cma_auto_tries_single_copy_and_the_window_per_size_then_every_rank_keeps_the_same(
        nranks, tmp_path):
    sizes = [MIB, 3 * MIB]
    results = run_mpi(nranks, "shm_cases:cma_auto_choice", timeout=120, sizes=sizes, after=2,
                      timeline=str(tmp_path / "timeline.json"),
                      env={"HVDLIKE_CMA": "auto", "HVDLIKE_CMA_THRESHOLD": str(MIB)})
    classes = sorted(n.bit_length() for n in sizes)
    for rank, r in enumerate(results):
        at, trials = 0, r["trials"]
        for nbytes in sizes:  # right during the trials and after the choice
            for i in range(r["calls"]):
                want = sum(inputs(nbytes, "float32", q + i) for q in range(nranks))
                np.testing.assert_array_equal(r["sums"][at], want, err_msg=f"rank {rank}")
                at += 1
        assert trials >= 3 and sorted(r["picked"]) == classes, r
        assert all(tried == (trials, trials) for tried in r["tried"].values()), r
        assert r["picked"] == results[0]["picked"]  # one choice, the same everywhere
        # what ran: one untimed single copy, the two alternating, then the one kept
        want_ran = []
        for nbytes in sizes:
            kept = "SHM_ALLREDUCE" if r["picked"][nbytes.bit_length()] else "CMA_ALLREDUCE"
            want_ran += (["CMA_ALLREDUCE"] + ["CMA_ALLREDUCE", "SHM_ALLREDUCE"] * trials
                         + [kept] * (r["calls"] - 1 - 2 * trials))
        assert r["ran"] == want_ran, (rank, r["ran"])


@pytest.mark.parametrize("nranks,keep_window", [(2, False), (4, True)],
                         ids=["np2-single_copy_kept", "np4-window_kept"])
def test_cma_auto_grows_the_window_only_for_the_buckets_it_runs(nranks, keep_window, tmp_path):
    first, larger = 4 * MIB, 6 * MIB  # one size class; the window takes 4 MiB at least
    results = run_mpi(nranks, "shm_cases:cma_auto_window_growth", timeout=120, first=first,
                      larger=larger, keep_window=keep_window,
                      timeline=str(tmp_path / "timeline.json"),
                      env={"HVDLIKE_CMA": "auto", "HVDLIKE_CMA_THRESHOLD": str(MIB)})
    want = sum(inputs(larger, "float32", q) for q in range(nranks))
    for rank, r in enumerate(results):
        np.testing.assert_array_equal(r["total"], want, err_msg=f"rank {rank}")
        assert r["before"] == first, r  # the window's trials ran at 4 MiB
        if keep_window:
            assert (r["ran"], r["after"]) == (["SHM_ALLREDUCE"], 8 * MIB), r
        else:
            assert (r["ran"], r["after"]) == (["CMA_ALLREDUCE"], first), r


def test_shared_memory_can_be_turned_off():
    results = run_mpi(4, "shm_cases:who_uses_shared_memory", timeout=120,
                      env={"HVDLIKE_SHM_BUFFER": "0"})
    for r in results:
        assert r["global"] == dict(shm=False, hierarchical=False, cma=False, sum=10.0)


def test_full_dev_shm_on_one_rank_makes_every_rank_fall_back_to_mpi():
    for r in run_mpi(2, "shm_cases:dev_shm_full_on_last_rank", timeout=60, env=WINDOW):
        assert r == dict(first=3.0, again=3.0, capacity=0, no_room=True)


@pytest.mark.skipif(platform.machine() not in SECCOMP_SYSCALLS,
                    reason=f"the test's seccomp filter knows no syscall numbers for "
                           f"{platform.machine()}")
@pytest.mark.parametrize("nodes", [None, "a,a,b,b"], ids=["one-node", "hierarchical"])
def test_a_rank_that_may_not_attach_makes_every_rank_use_the_window(nodes):
    # the kernel refuses the last rank (a seccomp filter); hierarchical: that is node b's last
    # rank, and node a must not go single-copy either
    env = {"HVDLIKE_CMA_THRESHOLD": "0", "HVDLIKE_HIERARCHICAL_ALLREDUCE": "1",
           **({"HVDLIKE_NODE_NAMES": nodes} if nodes else {})}
    results = run_mpi(4, "shm_cases:cma_refused_on_last_rank", timeout=120, env=env)
    if results[-1]["unfiltered"]:
        pytest.skip(f"this kernel took no seccomp filter: {results[-1]['unfiltered']}")
    for r in results:
        assert r == dict(unfiltered=None, cma=False, sum=10.0, capacity=4 * MIB)


@pytest.mark.parametrize("nodes", [None, "a,a,b,b"], ids=["one-node", "hierarchical"])
@pytest.mark.parametrize("how", ["copy", "error"])
def test_a_single_copy_failing_on_one_rank_is_an_error_on_every_rank_and_the_next_call_works(
        how, nodes):
    env = {"HVDLIKE_CMA_THRESHOLD": "0", "HVDLIKE_HIERARCHICAL_ALLREDUCE": "1",
           **({"HVDLIKE_NODE_NAMES": nodes} if nodes else {})}
    results = run_mpi(4, "shm_cases:cma_fails_on_last_rank", timeout=120, how=how, env=env)
    for rank, r in enumerate(results):
        assert r["after"] == 10.0
        where = "this" if rank == 3 else "another"
        assert r["error"] is not None and f"failed on {where} rank" in r["error"], r
        assert "HVDLIKE_CMA=0" in r["error"]
    cause = "Operation not permitted" if how == "copy" else "a bug in the reduction"
    assert cause in results[3]["error"]


@pytest.mark.parametrize("np_", [2, 4])
def test_a_peer_process_gone_in_a_single_copy_all_reduce_is_a_dead_rank_on_every_rank(np_):
    results = run_mpi(np_, "shm_cases:cma_peer_gone_on_last_rank", timeout=120)
    for rank, r in enumerate(results):
        error = r["error"]
        assert error is not None and error["type"] == "PeerGone", r
        assert error["errno"] == errno.ESRCH and "a rank's process is gone" in error["text"], r
        seen = "seen on this rank" if rank == np_ - 1 else "seen on another rank"
        assert seen in error["text"], r
    assert "No such process" in results[-1]["error"]["text"]


def test_the_engine_takes_a_peer_process_gone_for_a_dead_rank():
    from hvdlike.transport.failures import is_process_failure
    gone = cma.PeerGone(errno.ESRCH, "a rank's process is gone")
    assert is_process_failure(gone, comm=None)
    assert not is_process_failure(cma.CopyFailed(errno.EPERM, "refused"), comm=None)


def test_grouped_single_copy_results_are_never_changed_while_held():
    for r in run_mpi(4, "shm_cases:cma_grouped_results_stay_put", timeout=120,
                     env={"HVDLIKE_CMA_THRESHOLD": "0", "HVDLIKE_SHM_THRESHOLD": "0"}):
        assert r["kept"] == [10.0] and r["moved"], r  # 1+2+3+4, untouched by the second call
        assert r["third"] == [[10.0]] * 3 and not r["kept_memory_reused"], r
        assert r["dropped_memory_reused"], r  # the second's, let go of


@pytest.mark.parametrize("path", ["window", "single_copy"])
def test_grouped_views_of_one_array_reduce_right_and_results_lie_one_after_another(path):
    env = ({"HVDLIKE_CMA": "0", "HVDLIKE_SHM_THRESHOLD": "0"} if path == "window" else
           {"HVDLIKE_CMA_THRESHOLD": "0", "HVDLIKE_SHM_THRESHOLD": "0"})
    results = run_mpi(2, "shm_cases:grouped_views_of_one_array", timeout=120, env=env)
    shapes = [(3, 4), (), (0,), (7,), (100, 5)]
    flat = np.arange(sum(int(np.prod(s)) for s in shapes), dtype=np.float32)
    want, at = [], 0
    for s in shapes:
        n = int(np.prod(s))
        want.append((2 * flat[at:at + n] + 1).reshape(s).tolist())  # ranks 0 and 1: + r
        at += n
    for r in results:
        assert r["small"] == want and r["shapes"] == shapes, r
        assert r["big"] == [3.0] and r["inputs_unchanged"], r
        assert r["one_after_another"], r


def test_windows_are_freed_and_made_again_across_shutdown_and_init():
    results = run_mpi(4, "shm_cases:windows_survive_shutdown_and_init", timeout=120)
    for rank, r in enumerate(results):
        assert r == dict(first=4.0, second=4.0, third=2.0 if rank < 2 else None)


def test_a_transport_registered_in_on_node_takes_the_buckets_from_its_threshold(tmp_path):
    sizes = [4096, 512 * 1024, 2 * MIB]  # MPI, the window, the registered one
    results = run_mpi(2, "shm_cases:registered_transport", timeout=120, sizes=sizes,
                      timeline=str(tmp_path / "timeline.json"), env=WINDOW)
    for rank, r in enumerate(results):
        for nbytes, got in zip(sizes, r["sums"]):
            want = sum(inputs(nbytes, "float32", q) for q in range(2))
            np.testing.assert_array_equal(got, want, err_msg=f"{nbytes} rank {rank}")
        assert r["registered"] == ["reduce_bcast", "shm"], r
        assert r["ran"] == ["MPI_ALLREDUCE", "SHM_ALLREDUCE", "REDUCE_BCAST_ALLREDUCE"], r
        assert r["freed"] == [1], r  # shut down once after it was built
