"""scripts/bench_on_node.py runs end to end at np=2 (small sizes, two rounds), checks every
transport's result and writes its JSON and PNG. Speed itself is judged by running the
benchmark, never in a test."""
import json

from mpi_harness import run_script

TRANSPORTS = {"mpi", "window", "single_copy"}


def test_bench_on_node_writes_json_and_png(tmp_path):
    out = tmp_path / "on_node"
    job = run_script(2, "scripts/bench_on_node.py", "--sizes", "4KiB,300KiB", "--rounds", "2",
                     "--out", str(out), timeout=120)
    assert job.returncode == 0 and not job.timed_out, job.output[-5000:]
    assert "| size | MPI | window | single copy |" in job.output
    data = json.loads((tmp_path / "on_node.json").read_text())
    assert [r["bytes"] for r in data["results"]] == [4096, 300 * 1024]
    for r in data["results"]:
        assert set(r["median_s"]) == TRANSPORTS and all(v > 0 for v in r["median_s"].values())
        assert all(len(v) == 2 for v in r["all_s"].values())
        assert r["fastest"] in TRANSPORTS
    assert data["metadata"]["np"] == 2
    assert (tmp_path / "on_node.png").stat().st_size > 1000


def test_bench_on_node_refuses_a_job_without_single_copy(tmp_path):
    job = run_script(2, "scripts/bench_on_node.py", "--sizes", "4KiB", "--out",
                     str(tmp_path / "x"), timeout=60, env={"HVDLIKE_CMA": "0"})
    assert job.returncode != 0 and not job.timed_out
    assert "needs 2+ ranks on one node" in job.output
