"""Examples and Horovod-style scripts run unchanged with mpirun -np 2 and without mpirun."""
import os
import re
import sys

import pytest

from mpi_harness import launch, run_script, run_script_once

EXAMPLES = {
    "keras_mnist": ("examples/keras_mnist.py", ["--epochs", "2", "--train-size", "4096"]),
    "tf_custom_loop": ("examples/tf_custom_loop.py", ["--steps", "30"]),
    "keras_synthetic_benchmark": ("examples/keras_synthetic_benchmark.py",
                                  ["--num-iters", "2", "--num-batches-per-iter", "3"]),
    "keras_synthetic_benchmark_fit": ("examples/keras_synthetic_benchmark.py",
                                      ["--fit", "--num-iters", "1", "--num-batches-per-iter",
                                       "3", "--batch-size", "16"]),
}
EXPECT = {
    "keras_mnist": [r"Epoch 2/2", r"val_accuracy", r"final: val_loss=[\d.]+ val_accuracy="],
    "tf_custom_loop": [r"step +0 +loss [\d.]+", r"^done$"],
    "keras_synthetic_benchmark": [r"Total img/sec on \d rank\(s\): [\d.]+"],
    "keras_synthetic_benchmark_fit": [r"Total img/sec on \d rank\(s\): [\d.]+"],
}


# Every example runs at np=2. Without mpirun only the main one: the others reach the same
# single-process start (hvd.init without mpirun), which the np1_without_mpirun worlds of
# tests/tf/test_tf_training.py, test_tf_ops.py and test_tf_strategy.py check in full.
@pytest.mark.parametrize("name,nranks,mpi", [(name, 2, True) for name in EXAMPLES]
                         + [("keras_mnist", 1, False)],
                         ids=[f"{name}-np2" for name in EXAMPLES] + ["keras_mnist-no_mpirun"])
def test_example_runs_and_reports_progress_on_rank0(name, nranks, mpi):
    script, args = EXAMPLES[name]
    res = run_script_once(nranks, script, *args, timeout=240, mpi=mpi)
    assert res.returncode == 0, res.output[-5000:]
    for pattern in EXPECT[name]:
        assert re.search(pattern, res.output, re.M), (pattern, res.output[-5000:])
    if name == "keras_mnist":  # only rank 0 prints the progress bar
        assert res.output.count("Epoch 1/2") == 1, res.output[-5000:]
    if name.startswith("keras_synthetic_benchmark"):
        assert f"ranks: {nranks}" in res.output


def test_keras_mnist_example_learns_on_synthetic_data():
    # the same job as test_example_runs_and_reports_progress_on_rank0[keras_mnist-np2]
    script, args = EXAMPLES["keras_mnist"]
    res = run_script_once(2, script, *args, timeout=240)
    assert res.returncode == 0, res.output[-5000:]
    acc = float(re.search(r"final: val_loss=[\d.]+ val_accuracy=([\d.]+)", res.output).group(1))
    assert acc > 0.5, res.output[-3000:]  # 10 classes: chance is 0.1


def test_the_quickstarts_fit_script_runs_as_written_and_rank_0_saves_the_model(tmp_path):
    """docs/quickstart.md's first Python block, as a reader copies it, at np=2."""
    from mpi_harness import REPO
    page = (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8")
    script = tmp_path / "train.py"
    script.write_text(re.search(r"```python\n(.*?)```", page, re.S).group(1))
    run = f"import os, runpy; os.chdir({str(tmp_path)!r}); runpy.run_path({str(script)!r})"
    job = launch(2, [sys.executable, "-c", run], timeout=240)
    assert job.returncode == 0, job.output[-5000:]
    assert job.output.count("Epoch 2/2") == 1, job.output[-5000:]  # rank 0 alone reports
    assert "val_accuracy" in job.output, job.output[-5000:]  # validation_split ran
    # a reader's first run warns of nothing (Keras's or hvdlike's warnings, on any rank)
    assert not re.search(r"Warning|WARNING", job.output), job.output[-5000:]
    assert (tmp_path / "model.keras").stat().st_size > 0


@pytest.mark.parametrize("legacy", ["0", "1"], ids=["keras3", "tf_keras"])
def test_horovod_style_keras_fit_script_runs_with_only_import_changed(legacy):
    res = run_script(2, "horovod_style_keras.py", timeout=240,
                  env={"TF_USE_LEGACY_KERAS": legacy})
    assert res.returncode == 0, res.output[-5000:]
    assert len(re.findall(r"^HOROVOD_STYLE_KERAS_OK rank=\d", res.output, re.M)) == 2


@pytest.mark.parametrize("legacy", ["0", "1"], ids=["keras3", "tf_keras"])
def test_horovod_style_custom_loop_script_runs_with_only_import_changed(legacy):
    res = run_script(2, "horovod_style_custom_loop.py", timeout=240,
                  env={"TF_USE_LEGACY_KERAS": legacy})
    assert res.returncode == 0, res.output[-5000:]
    assert len(re.findall(r"^HOROVOD_STYLE_CUSTOM_LOOP_OK rank=\d", res.output, re.M)) == 2


LEGACY_TRAINING_CHECKS = [
    "fit_sgd_np_equals_single_process_global_batch",
    "fit_adam_np_equals_single_process_global_batch",
    "custom_loop_adam_tape_equals_single_process_global_batch",
    "backward_passes_per_step_2_equals_one_step_with_doubled_batch",
    "broadcast_callback_keeps_weights_and_slots_identical_every_step",
    "broadcast_callback_on_a_model_built_by_its_first_batch",
    "metric_average_callback_averages_epoch_logs",
    "load_model_restores_wrapped_optimizer_with_state",
    "bad_inputs_give_clear_errors",
    "sync_batch_norm_equals_one_process_on_the_global_batch",
    "optimizer_options_and_steps_per_execution_equals_single_process_global_batch",
    "tf_keras_computed_gradients_come_back_reduced_and_are_applied_once",
    "tf_keras_backward_passes_as_horovods_agg_helper_and_iterations",
    "mixed_precision_loss_scale_inside_outside_and_compile_wrapped",
]


@pytest.mark.parametrize("check", LEGACY_TRAINING_CHECKS)
def test_tf_keras_legacy_training_check_passes_on_every_rank(check):
    # the job runs only the checks asserted here
    res = run_script_once(2, "train_checks.py", timeout=300, env={
        "TF_USE_LEGACY_KERAS": "1", "HVDLIKE_TEST_CHECKS": ",".join(LEGACY_TRAINING_CHECKS)})
    assert res.passed(check, 2), res.output[-6000:]


@pytest.mark.parametrize("nranks", [2, 4])
def test_tf_keras_fit_in_a_v1_graph_equals_one_process(nranks):
    # Horovod's Keras examples' TF1 mode: fit builds its step with get_updates/get_gradients
    res = run_script_once(nranks, "tf_keras_v1_fit.py", timeout=300,
                          env={"TF_USE_LEGACY_KERAS": "1"})
    assert res.passed("v1_graph_fit_with_legacy_optimizer_equals_single_process_global_batch",
                      nranks), res.output[-6000:]
    assert res.returncode == 0, res.output[-6000:]


def test_bench_train_writes_table_json_and_png(tmp_path):
    import json
    res = run_script(1, "scripts/bench_train.py", "--nps", "1,2", "--steps", "3", "--repeats",
                     "1", "--warmup", "2", "--overlap", "both", "--timeline",
                     "--out", str(tmp_path), timeout=300, mpi=False)
    assert res.returncode == 0, res.output[-5000:]
    assert "dist/plain" in res.output and "scaling eff." in res.output
    data = json.loads((tmp_path / "bench_train.json").read_text())
    assert [(r["np"], r["overlap"]) for r in data] == [(1, True), (2, True), (2, False)]
    for overlap in ("1", "0"):
        for name in ("", ".rank1"):  # rank 0 writes the path given, rank 1 adds .rank1
            assert (tmp_path / f"timeline_np2_overlap{overlap}{name}.json").is_file()
    for r in data:
        assert r["overhead_ratio"] > 0 and r["distributed"]["img_per_s_total"] > 0
        assert r["scaling_efficiency"] > 0
    assert (tmp_path / "bench_train.png").stat().st_size > 1000


def test_bench_train_times_the_custom_loop_of_horovods_examples(tmp_path):
    """``--loop tape``: a tf.function step with DistributedGradientTape, on the many-gradient
    MLP, with the bucket size passed on to the ranks."""
    import json
    res = run_script(1, "scripts/bench_train.py", "--nps", "2", "--model", "mlp", "--loop",
                     "tape", "--steps", "3", "--repeats", "1", "--warmup", "2",
                     "--out", str(tmp_path), timeout=300, mpi=False,
                     env={"HVDLIKE_OVERLAP_BUCKET": "4096"})
    assert res.returncode == 0, res.output[-5000:]
    assert "48-layer MLP, tf.function step with DistributedGradientTape" in res.output
    (r,) = json.loads((tmp_path / "bench_train.json").read_text())
    assert (r["np"], r["loop"], r["model"], r["overlap_bucket"]) == (2, "tape", "mlp", 4096)
    assert r["distributed"]["step_time_s"] > 0 and r["plain"]["step_time_s"] > 0
    assert "CPU ms plain/dist" in res.output
    for kind in ("plain", "distributed"):  # a step's CPU time: some, and not wall time x 100
        assert 0 < r[kind]["cpu_s_per_step"] < 100 * r[kind]["median_step_time_s"]


def test_compare_tf_distribute_writes_table_json_and_png(tmp_path):
    import json
    out = tmp_path / "compare"
    res = run_script(1, "scripts/compare_tf_distribute.py", "--steps", "2", "--warmup", "1",
                     "--sizes", "1KiB,1MiB", "--batches", "1", "--out", str(out), timeout=400,
                     mpi=False)
    assert res.returncode == 0, res.output[-5000:]
    data = json.loads(out.with_suffix(".json").read_text())
    assert [r["mode"] for r in data["training"]] == ["hvd", "strategy", "native", "single"]
    for r in data["training"]:
        assert r["img_per_s"] > 0 and r["max_weight_diff_between_ranks"] == 0.0
    assert [r["bytes"] for r in data["allreduce"]["rows"]] == [1024, 1 << 20]
    assert all(r["strategy_over_native"] > 0 for r in data["allreduce"]["rows"])
    assert out.with_suffix(".png").stat().st_size > 1000


def test_a_rank_killed_while_writing_a_checkpoint_leaves_the_previous_one_intact(tmp_path):
    path = tmp_path / "ckpt.weights.h5"
    res = run_script(2, "checkpoint_kill.py", path, timeout=240)
    assert res.returncode != 0, res.output[-3000:]  # rank 0 died writing the 2nd checkpoint
    saved = re.search(r"^SAVED_SUM (\S+)", res.output, re.M)
    assert saved, res.output[-3000:]
    check = run_script(1, "checkpoint_kill.py", path, "--verify", timeout=240, mpi=False)
    assert check.returncode == 0, check.output[-3000:]
    assert re.search(r"^LOADED_SUM (\S+)", check.output, re.M).group(1) == saved.group(1)


def test_horovod_readme_tf1_script_runs_and_resumes_with_only_import_changed(tmp_path):
    """Horovod's README loop (tf.compat.v1, MonitoredTrainingSession, checkpoints on rank 0):
    the hook gives both ranks rank 0's start, training keeps them equal; a second run
    resumes from rank 0's checkpoint, and the hook hands it to rank 1."""
    def weights(output, what):
        found = dict(re.findall(rf"^{what} rank=(\d) w=(\[.*\])$", output, re.M))
        assert sorted(found) == ["0", "1"], output[-5000:]
        return found

    first = run_script(2, "horovod_style_tf1.py", tmp_path, 10, timeout=240)
    assert first.returncode == 0, first.output[-5000:]
    start, end = weights(first.output, "START"), weights(first.output, "END")
    assert start["0"] == start["1"] and end["0"] == end["1"] and end["0"] != start["0"]
    second = run_script(2, "horovod_style_tf1.py", tmp_path, 20, timeout=240)
    assert second.returncode == 0, second.output[-5000:]
    resumed = weights(second.output, "START")
    assert resumed["0"] == resumed["1"] == end["0"], (resumed, end)
    assert weights(second.output, "END")["1"] != end["0"]  # it trained on from there


# Where TensorFlow put a 16 MiB tensor: whether its mapping may get transparent huge pages
_PAGES = """
import numpy as np, tensorflow as tf, hvdlike.tensorflow as hvd
hvd.init()
tensor = tf.random.normal([1 << 22])
held = np.asarray(tensor)  # TensorFlow's memory (freed, and unmapped, with the tensor)
at = held.ctypes.data
eligible, inside = None, False
with open("/proc/self/smaps") as f:
    for line in f:
        head = line.split(" ", 1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= at < hi
        elif inside and line.startswith("THPeligible:"):
            eligible = int(line.split()[1])
print(f"THP_ELIGIBLE rank={hvd.rank()} {eligible}", flush=True)
"""


def _thp_mode():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            found = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        return None
    return found.group(1) if found else None


def test_glibcs_huge_page_advice_reaches_tensorflows_memory_under_hvdlikerun():
    # docs/performance.md recommends GLIBC_TUNABLES=glibc.malloc.hugetlb=1: hvdlikerun passes
    # it to the ranks, and TensorFlow's tensors then lie in mappings that may get huge pages
    mode, libc = _thp_mode(), os.confstr("CS_GNU_LIBC_VERSION") or ""
    if mode != "madvise":
        pytest.skip(f"transparent huge pages are {mode!r} here, not 'madvise': glibc's "
                    "advice changes nothing then")
    version = tuple(int(x) for x in re.findall(r"\d+", libc)[:2])
    if not libc.startswith("glibc") or version < (2, 35):
        pytest.skip(f"C library {libc!r}: glibc.malloc.hugetlb needs glibc 2.35 or later")
    for setting in ("1", "0"):
        job = launch(2, [sys.executable, "-c", _PAGES], timeout=120,
                     env={"GLIBC_TUNABLES": f"glibc.malloc.hugetlb={setting}"})
        assert job.returncode == 0, job.output[-3000:]
        found = sorted(re.findall(r"^THP_ELIGIBLE rank=(\d) (\S+)$", job.output, re.M))
        assert found == [("0", setting), ("1", setting)], (setting, job.output[-3000:])


def test_bench_packing_times_packed_against_unpacked_steps(tmp_path):
    """scripts/bench_packing.py at np=2, a few steps of each loop: its table, JSON and PNG."""
    import json
    for loop in ("tape", "fit"):
        out = tmp_path / loop
        res = run_script(2, "scripts/bench_packing.py", "--loop", loop, "--steps", "4",
                         "--skip", "2", "--repeats", "2", "--warmup", "2", "--out", out,
                         timeout=300)
        assert res.returncode == 0, res.output[-5000:]
        assert "packed / unpacked, per repeat: median" in res.output
        data = json.loads(out.with_suffix(".json").read_text())
        assert data["loop"] == loop and data["np"] == 2
        assert {k: len(v) for k, v in data["step_times_s"].items()} == {
            "plain": 2, "packed": 2, "unpacked": 2}
        assert all(t > 0 for ts in data["step_times_s"].values() for t in ts)
        assert out.with_suffix(".png").stat().st_size > 1000


def test_bench_packing_refuses_fit_steps_it_would_not_time(tmp_path):
    res = run_script(2, "scripts/bench_packing.py", "--loop", "fit", "--steps", "5", "--skip",
                     "5", "--out", tmp_path / "x", timeout=120)
    assert res.returncode != 0 and "--steps (5) must be larger than --skip (5)" in res.output


def test_bench_xla_times_both_settings_and_they_train_alike(tmp_path):
    """scripts/bench_xla.py at np=2, one fit of each setting: its table, JSON and PNG, and the
    models fitted with and without XLA end with the same weights."""
    import json
    res = run_script(1, "scripts/bench_xla.py", "--nps", "2", "--repeats", "1", "--steps", "2",
                     "--depth", "4", "--out", str(tmp_path), timeout=300, mpi=False)
    assert res.returncode == 0, res.output[-5000:]
    assert "XLA gain" in res.output
    (job,) = json.loads((tmp_path / "bench_xla.json").read_text())["jobs"]
    assert job["np"] == 2 and job["gain"] > 0, job
    assert job["max_weight_difference"] < 1e-4, job
    assert (tmp_path / "bench_xla.png").stat().st_size > 1000


def test_bench_vs_horovod_times_hvdlikes_side(tmp_path):
    """scripts/bench_vs_horovod.py without a Horovod Python: hvdlike's job at np=2 (results
    checked against NumPy inside), its table, JSON and PNG."""
    import json
    res = run_script(1, "scripts/bench_vs_horovod.py", "--pairs", "1", "--repeats", "1",
                     "--scale", "0.01", "--out", str(tmp_path), timeout=300, mpi=False)
    assert res.returncode == 0, res.output[-5000:]
    assert "resnet50 per-tensor tf.function" in res.output
    data = json.loads((tmp_path / "bench_vs_horovod.json").read_text())
    assert list(data["median_ms"]) == ["hvdlike"] and len(data["median_ms"]["hvdlike"]) == 7
    assert all(v > 0 for v in data["median_ms"]["hvdlike"].values()), data
    assert (tmp_path / "bench_vs_horovod.png").stat().st_size > 1000
