"""hvdlike's asynchronous parameter-server training (tests/tf/workers/ps_checks.py): Keras 3
at np=4 (2 servers + 2 workers, the variables sharded over both) and tf_keras at np=3 (1 + 2);
a server or worker killed ends the job, naming its rank."""
import re
import sys
import time

import pytest

from mpi_harness import TESTS, launch, run_script_once

CHECKS = ["ps_staleness_0_equals_one_process_with_the_global_batch",
          "ps_async_applies_total_steps_and_every_rank_ends_with_the_servers_weights",
          "ps_async_push_is_one_step_of_the_optimizer_whatever_the_optimizer",
          "ps_async_learns_as_one_process_taking_the_same_steps_with_one_thread_in_mpi",
          "ps_lookahead_sends_a_stale_worker_the_weights_moved_on_by_the_last_update",
          "ps_staleness_bound_holds_with_a_slow_worker",
          "ps_a_fit_step_pulls_the_weights_once_its_batch_is_there",
          "ps_custom_loop_staleness_0_equals_one_process",
          "ps_fp16_compressed_pushes_stay_close_to_uncompressed",
          "ps_checkpoints_from_the_servers_resume_without_more_updates",
          "ps_workers_start_from_the_weights_the_servers_loaded",
          "ps_bad_arguments_raise_on_every_rank",
          "ps_an_error_in_train_or_on_a_server_ends_run_with_an_error_on_every_rank"]
# Keras 3 with one server is left out: its sharding is tf_keras's with one server (the same
# code), its Keras 3 handling the 2-server job's (and compare_async's test runs it, 1 + 2)
CONFIGS = {"np4_2servers": (4, "2", "0"), "np3_tf_keras": (3, "1", "1")}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("check", CHECKS)
def test_parameter_server_check_passes_on_every_rank(config, check):
    np_, servers, legacy = CONFIGS[config]
    job = run_script_once(np_, "ps_checks.py", servers, timeout=400,
                          env={"TF_USE_LEGACY_KERAS": legacy})
    assert not job.timed_out, job.output[-5000:]
    assert job.passed(check, np_), job.output[-5000:]


@pytest.mark.parametrize("victim,rank", [("server", 2), ("worker", 1)])
def test_a_killed_server_or_worker_ends_the_job_naming_its_rank(victim, rank):
    job = launch(3, [sys.executable, str(TESTS / "tf" / "workers" / "ps_kill.py"), victim],
                 timeout=180)
    ended = time.time()
    assert not job.timed_out, job.output[-5000:]
    assert job.returncode != 0 and "FINISHED" not in job.output, job.output[-3000:]
    killed = float(re.search(rf"^KILLING rank={rank} at (\S+)$", job.output, re.M).group(1))
    assert re.search(rf"^hvdlike: rank {rank} of 3 \(pid \d+ on host \S+\) ended without "
                     "hvdlike's shutdown", job.output, re.M), job.output[-3000:]
    assert ended - killed <= 10


def test_compare_async_writes_every_mode_with_its_figures(tmp_path):
    """scripts/compare_async.py, shrunk (1 server + 2 workers, 512 examples, only the runs
    with a slowed worker besides the equal sync run that sets its delay): sync, async and
    native ParameterServerStrategy (started by export_tf_config(num_ps=1)) all run, and the
    JSON has the fields the docs quote."""
    import json
    import subprocess
    from mpi_harness import REPO
    out = tmp_path / "compare_async"
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_async.py"),
                        "--configs", "1+2", "--examples", "512", "--no-warmup", "--only-slowed",
                        "--out", str(out)],
                       capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    runs = json.loads(out.with_suffix(".json").read_text())
    assert sorted((r["mode"], r["slowed"]) for r in runs) == [
        ("async", True), ("native_ps", True), ("sync", False), ("sync", True)]
    for r in runs:
        assert "error" not in r, r.get("error")
        assert r["examples_per_s"] > 0 and 0 <= r["final_accuracy"] <= 1, r
        assert r["examples"] >= 512 - 2 * 32, r
    assert out.with_suffix(".png").stat().st_size > 0


def test_a_servers_view_of_worker_progress_matches_recounting_it_after_every_message():
    """WorkerProgress (O(1) per message) against the plain recount over every worker, for
    random pushes, step sums and ends of 1 to 64 workers."""
    import random
    from hvdlike.tensorflow.ps_progress import WorkerProgress
    rng = random.Random(7)
    for trial in range(300):
        workers = rng.choice([1, 2, 3, 8, 64])
        p = WorkerProgress(workers)
        pushes, active, summed = [0] * workers, set(range(workers)), set()
        for _ in range(rng.randrange(1, 400)):
            if not active:
                break
            w = rng.choice(sorted(active))
            event = rng.random()
            if event < 0.05:
                p.done(w)
                active.discard(w)
            else:
                p.pushed(w)
                pushes[w] += 1
                if event < 0.6:
                    p.summed(w)
                    summed.add(w)
            if summed and summed >= active and rng.random() < 0.5:
                p.next_step()
                summed = set()
            assert p.pushes == pushes and p.active == active, trial
            assert p.slowest == min((pushes[v] for v in active), default=0), trial
            assert p.step_waits_for == active - summed, trial
