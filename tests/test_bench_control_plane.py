"""scripts/bench_control_plane.py runs the real negotiation for simulated worlds (a short run)
and writes its table, JSON and PNG; the old design is read from git. Speed itself is judged
by running the benchmark, never in a test."""
import json
import subprocess
import sys

import pytest

from mpi_harness import REPO

OLD = "e6b88e3"


def _has_old_commit() -> bool:
    return subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{OLD}^{{commit}}"],
                          capture_output=True).returncode == 0


def test_bench_control_plane_writes_rows_for_both_designs_json_and_png(tmp_path):
    if not _has_old_commit():
        pytest.skip(f"this clone has no commit {OLD} (a shallow clone): the old design is "
                    "read from it")
    out = tmp_path / "cp.json"
    job = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_control_plane.py"),
                          "--ranks", "2,64", "--rounds", "5", "--old-commit", OLD,
                          "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "| new | 64 |" in job.stdout and "| old | 64 |" in job.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [(r["design"], r["ranks"]) for r in rows] == [("new", 2), ("old", 2), ("new", 64),
                                                         ("old", 64)]
    new = [r for r in rows if r["design"] == "new"]
    old = [r for r in rows if r["design"] == "old"]
    # the new round hands the same bytes to its collectives at any world size; the old
    # all-gather's grow with it
    assert new[0]["round_bytes_per_rank"] == new[1]["round_bytes_per_rank"]
    assert old[1]["round_bytes_per_rank"] / old[0]["round_bytes_per_rank"] == \
        pytest.approx((1 + 64) / (1 + 2))
    for r in rows:
        assert r["round_cpu_ms"] > 0 and r["first_step_cpu_s"] > 0
        assert r["first_step_rounds"] == 2 and r["projected_round_us"] > 0
    assert out.with_suffix(".png").stat().st_size > 1000
