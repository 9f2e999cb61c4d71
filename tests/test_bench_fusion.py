"""scripts/bench_fusion.py runs end to end at np=2 (tiny tensors, few steps) and writes its JSON
and PNG. Speed itself is judged by running the benchmark, never in a test."""
import json
import math
import sys

from mpi_harness import launch, run_script

VARIANTS = {"grouped", "loop", "async_loop", "flat", "raw_flat", "flat_4k", "grouped_huge"}


def test_resnet50_shapes_match_keras_counts():
    code = ("import sys, math; sys.path.insert(0, 'scripts'); from resnet50 import "
            "resnet50_shapes as f; s = f(); "
            "print(len(s), sum(math.prod(x) for x in s), 'tensorflow' in sys.modules)")
    job = launch(1, [sys.executable, "-c", code], timeout=60, mpi=False)
    assert job.returncode == 0 and not job.timed_out, job.output[-3000:]
    assert job.output.split()[-3:] == ["214", "25583592", "False"], job.output[-3000:]


def test_bench_fusion_writes_json_and_png(tmp_path):
    job = run_script(2, "scripts/bench_fusion.py", "--scale", "0.001", "--repeats", "2",
                     "--warmup", "1", "--out", str(tmp_path), timeout=120)
    assert job.returncode == 0 and not job.timed_out, job.output[-5000:]
    assert "| variant |" in job.output
    assert "grouped / flat = " in job.output and "loop / grouped = " in job.output
    data = json.loads((tmp_path / "bench_fusion_np2.json").read_text())
    assert set(data["results"]) == VARIANTS
    for r in data["results"].values():
        assert r["median_s"] > 0 and r["best_s"] > 0 and len(r["times_s"]) == 2
    meta = data["metadata"]
    assert meta["np"] == 2 and meta["tensors"] == 214
    assert meta["elements"] == sum(math.prod(s) for s in meta["shapes"])
    assert (tmp_path / "bench_fusion_np2.png").stat().st_size > 1000


def test_bench_huge_pages_compares_both_settings_and_writes_json_and_png(tmp_path):
    # runs bench_fusion.py --tf in two jobs: glibc.malloc.hugetlb=0 and =1
    job = launch(1, [sys.executable, "scripts/bench_huge_pages.py", "--scale", "0.001",
                     "--pairs", "1", "--repeats", "1", "--out", str(tmp_path)],
                 timeout=400, mpi=False)
    assert job.returncode == 0 and not job.timed_out, job.output[-5000:]
    assert "| variant | off ms (per job) |" in job.output
    data = json.loads((tmp_path / "bench_huge_pages.json").read_text())
    assert set(data["results"]) == {"grouped", "tf_function", "tf_eager", "flat"}
    for r in data["results"].values():
        assert len(r["off_ms"]) == len(r["on_ms"]) == 1 and r["median_off_over_on"] > 0
    for setting in ("off", "on"):  # each job checked its results and timed the TF variants
        fusion = json.loads((tmp_path / f"{setting}_0" / "bench_fusion_np2.json").read_text())
        assert set(fusion["results"]) == VARIANTS | {"tf_function", "tf_function_per_tensor",
                                                     "tf_eager"}
        assert set(fusion["tf_frontend"]) == {"tf_function_over_grouped",
                                              "tf_function_per_tensor_over_grouped",
                                              "tf_eager_over_grouped"}
    assert (tmp_path / "bench_huge_pages.png").stat().st_size > 1000
