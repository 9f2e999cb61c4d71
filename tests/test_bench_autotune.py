"""scripts/bench_autotune.py runs end to end on one node (tiny gradients, few steps and
samples) and writes its tables, JSON and PNG. Speed itself is judged by running the
benchmark, never in a test."""
import json
import sys

import pytest

from mpi_harness import launch

pytest.importorskip("optuna", reason="autotune needs optuna (pip install hvdlike[autotune])")


def test_bench_autotune_writes_its_table_json_and_png(tmp_path):
    out = tmp_path / "bench_autotune"
    job = launch(1, [sys.executable, "scripts/bench_autotune.py", "--where", "node",
                     "--scale", "0.001", "--backprop-ms", "4", "--steps", "3", "--repeats", "1",
                     "--warmup-samples", "0", "--samples", "2", "--steps-per-sample", "2",
                     "--confirm", "1", "--out", str(out)], timeout=300, mpi=False)
    assert job.returncode in (0, 1) and not job.timed_out, job.output[-5000:]  # 1: target missed
    assert "| where | autotune / best grid |" in job.output, job.output[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    names = [r["name"] for r in data["runs"]]
    assert names[:2] == ["poor", "defaults"] and names[8] == "autotune" and len(names) == 12
    tuned = data["runs"][8]
    # measured afresh: the first pass's best grid setting, autotune's choice held, defaults
    first = {r["name"]: r["steps_per_s"] for r in data["runs"][:9]}
    best = max((n for n in first if n.startswith("grid")), key=first.get)
    assert names[9:] == [f"confirm: {best}", "confirm: autotune's choice 0", "confirm: defaults"]
    held = data["runs"][10]["final"]
    assert {k: held[k] for k in ("fusion_threshold", "cma_threshold")} == {
        k: tuned["final"][k] for k in ("fusion_threshold", "cma_threshold")}
    assert held["cycle_time_ms"] == pytest.approx(tuned["final"]["cycle_time_ms"])
    summary = data["summary"][0]
    assert summary["confirmed"]["best_grid"] == best
    assert tuned["tuned_at"] is not None and [row["phase"] for row in tuned["log"]] == [
        "search", "search", "chosen"]
    assert all(r["steps_per_s"] > 0 and len(r["times"]) >= 3 for r in data["runs"])
    assert data["summary"][0]["where"] == "node"
    assert out.with_suffix(".png").stat().st_size > 1000
