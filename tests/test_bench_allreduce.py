"""scripts/bench_allreduce.py runs end to end at np=2 and np=4 (a few sizes, few batches) and
writes its JSON and PNG. Speed itself is judged by running the benchmark, never in a test."""
import json

import pytest

from mpi_harness import run_script


@pytest.mark.parametrize("np_", [2, 4])
def test_bench_allreduce_writes_ratios_json_and_png(tmp_path, np_):
    out = tmp_path / "bench"
    job = run_script(np_, "scripts/bench_allreduce.py", "--sizes", "1KiB,1MiB", "--batches", "2",
                     "--warmup", "0", "--out", str(out), timeout=120)
    assert job.returncode == 0 and not job.timed_out, job.output[-5000:]
    assert "| size |" in job.output and "ratio" in job.output
    data = json.loads(out.with_suffix(".json").read_text())
    assert [r["bytes"] for r in data["results"]] == [1024, 1 << 20]
    for r in data["results"]:
        assert r["ratio"]["sum"] > 0 and r["raw"]["time_s"] > 0 and r["hvdlike"]["sum"]["time_s"] > 0
    assert data["targets"]["np"] == np_
    assert out.with_suffix(".png").stat().st_size > 1000


def test_bench_allreduce_together_mode_reports_its_targets(tmp_path):
    out = tmp_path / "together"
    job = run_script(2, "scripts/bench_allreduce.py", "--sizes", "1KiB,1MiB", "--batches", "2",
                     "--warmup", "0", "--together", "--no-plot", "--out", str(out), timeout=120)
    assert job.returncode == 0 and not job.timed_out, job.output[-5000:]
    targets = json.loads(out.with_suffix(".json").read_text())["targets"]
    assert targets["together"] is True
    assert targets["started_together"]["1 MiB"]["ratio"] > 0
    assert targets["started_together"]["64 MiB"]["met"] is None  # not measured in this run
    assert "started together, 1 MiB: >= 1.3x raw" in job.output
    submit = targets["async_submit"]
    assert submit["repeats"] == 30 and 0 < submit["median_s"] <= submit["max_s"]
    assert "allreduce_async returns in <= 50 us while the peers call 50 ms later" in job.output


def test_bench_allreduce_times_adasum_beside_sum(tmp_path):
    out = tmp_path / "adasum"
    job = run_script(2, "scripts/bench_allreduce.py", "--sizes", "1KiB,1MiB", "--batches", "2",
                     "--warmup", "0", "--op", "adasum", "--no-plot", "--out", str(out),
                     timeout=120)
    assert job.returncode == 0 and not job.timed_out, job.output[-5000:]
    data = json.loads(out.with_suffix(".json").read_text())
    for r in data["results"]:
        assert r["hvdlike"]["adasum"]["time_s"] > 0 and r["hvdlike"]["sum"]["time_s"] > 0
    assert data["targets"]["op"] == "adasum"
    assert "Adasum's verdicts are for comparison only" in job.output
