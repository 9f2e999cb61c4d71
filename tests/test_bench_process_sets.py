"""scripts/bench_process_sets.py runs end to end at np=3 and np=4 (short runs) and writes its
JSON and PNG; np=2 is refused with a clear message. Speed itself is judged by running the
benchmark, never in a test."""
import json

import pytest

from mpi_harness import run_script


@pytest.mark.parametrize("np_,cases", [(3, ["world", "set_idle"]),
                                       (4, ["world", "set_idle", "two_sets"])])
def test_bench_process_sets_writes_table_json_and_png(tmp_path, np_, cases):
    out = tmp_path / "ps"
    job = run_script(np_, "scripts/bench_process_sets.py", "--work-ms", "0,1", "--seconds",
                     "0.2", "--out", out, timeout=120)
    assert job.returncode == 0 and not job.timed_out, job.output[-5000:]
    assert "vs world" in job.output
    rows = json.loads(out.with_suffix(".json").read_text())
    assert [(r["case"], r["work_ms"]) for r in rows] == [(c, w) for w in (0.0, 1.0)
                                                           for c in cases]
    for r in rows:
        assert r["np"] == np_ and r["median_s"] > 0 and r["vs_world"] > 0
        want = {"world": list(range(np_)), "set_idle": [0, 1],
                "two_sets": list(range(np_))}[r["case"]]
        assert r["members"] == want
        assert all(r["calls"][m] > 0 for m in want)
    assert out.with_suffix(".png").stat().st_size > 1000


def test_bench_process_sets_needs_three_ranks(tmp_path):
    job = run_script(2, "scripts/bench_process_sets.py", "--out", tmp_path / "ps", timeout=60)
    assert job.returncode != 0 and "needs 3 or more ranks" in job.output, job.output[-3000:]
