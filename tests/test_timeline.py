"""The timeline: each rank's Chrome-trace file shows every request's phases and buckets."""
from mpi_harness import run_mpi

PHASES = ("QUEUED", "NEGOTIATE")


def test_each_request_has_its_phases_and_bucket(tmp_path):
    path = str(tmp_path / "timeline.json")
    delay = 0.3
    results = run_mpi(2, "timeline_cases:phases", timeout=60,
                      env={"HVDLIKE_TIMELINE": path, "HVDLIKE_SHM_THRESHOLD": "100000"},
                      path=path, delay=delay)
    for rank, rows in enumerate(results):
        assert sorted(rows) == ["g0", "g1", "g2", "gather", "grp", "late"], rows
        for name, events in rows.items():
            assert [e[0] for e in events[:2]] == list(PHASES), (rank, name, events)
        # the three async all-reduces went in one fused bucket through the MPI buffer
        for name in ("g0", "g1", "g2"):
            kinds = [e[0] for e in rows[name]]
            assert "MPI_ALLREDUCE" in kinds, kinds
            bucket = next(e[2] for e in rows[name] if e[0] == "MPI_ALLREDUCE")
            assert bucket["tensors"] == 3 and bucket["members"] == ["g0", "g1", "g2"], bucket
            assert bucket["bytes"] == 4 * 600
            assert "MEMCPY_IN_FUSION_BUFFER" in kinds and "MEMCPY_OUT_FUSION_BUFFER" in kinds
        assert "SHM_ALLREDUCE" in [e[0] for e in rows["grp"]]
        assert "MPI_ALLGATHER" in [e[0] for e in rows["gather"]]
    # the early rank waited for the late one, and its timeline says so
    waited = [e for e in results[0]["late"] if e[0] == "WAIT_FOR_RANKS"]
    assert waited and waited[0][1] >= 0.8 * delay * 1e6, results[0]["late"]


def test_start_and_stop_timeline_bound_what_is_recorded(tmp_path):
    path = str(tmp_path / "t.json")
    for r in run_mpi(2, "timeline_cases:start_and_stop", timeout=60, path=path):
        assert r["rows"] == ["during"], r
        assert r["cycles"] >= 1
        assert "non-empty path" in r["error"]
